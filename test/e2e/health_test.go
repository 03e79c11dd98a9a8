//go:build linux

package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// grpc-health-probe's exit codes (its main.go).
const (
	probeOK                = 0
	probeConnectionFailure = 2
)

func TestHealthProbe(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	ca := pki.CAPath(s.pkiDir)
	cert, key := pki.Paths(s.pkiDir, identity.MustParse("spiffe://"+trustDomain+"/client/dev"))
	if filepath.Dir(cert) != filepath.Join(s.pkiDir, "client") {
		t.Fatalf("client/dev certificate at %s, want under %s/client", cert, s.pkiDir)
	}

	// A refused connection makes the probe retry until its connect timeout,
	// so the failing cases are kept short; the passing case gets room for a
	// loaded machine.
	cases := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{
			name:     "mTLS with client certificate",
			args:     []string{"-tls", "-tls-ca-cert", ca, "-tls-client-cert", cert, "-tls-client-key", key, "-tls-server-name", "localhost", "-connect-timeout", "10s", "-rpc-timeout", "10s"},
			wantCode: probeOK,
			wantOut:  "status: SERVING",
		},
		{
			name:     "TLS without client certificate",
			args:     []string{"-tls", "-tls-ca-cert", ca, "-tls-server-name", "localhost", "-connect-timeout", "1s"},
			wantCode: probeConnectionFailure,
			wantOut:  "failed to connect service",
		},
		{
			name:     "plaintext",
			args:     []string{"-connect-timeout", "1s"},
			wantCode: probeConnectionFailure,
			wantOut:  "failed to connect service",
		},
	}
	for _, name := range identity.ServiceNames() {
		addr := s.services[name].Address
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				res := runCommand(t, nil, bin("grpc-health-probe"), append([]string{"-addr", addr}, tc.args...)...)
				out := res.stdout + res.stderr
				if res.code != tc.wantCode {
					t.Errorf("exit %d, want %d\n%s", res.code, tc.wantCode, out)
				}
				if !strings.Contains(out, tc.wantOut) {
					t.Errorf("output %q, want it to contain %q", out, tc.wantOut)
				}
				if tc.wantCode != probeOK && strings.Contains(out, "SERVING") {
					t.Errorf("refused probe still reported a status: %q", out)
				}
			})
		}
	}
}
