//go:build linux

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

func TestForeignCARefused(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	dev := identity.MustParse("spiffe://" + trustDomain + "/client/dev")

	// A second CA for the same trust domain issuing the same SPIFFE ID: the
	// only thing wrong with its certificate is who signed it.
	foreignDir := filepath.Join(t.TempDir(), "foreign-pki")
	if _, err := pki.Init(foreignDir, trustDomain, []identity.ID{dev}); err != nil {
		t.Fatal(err)
	}
	foreignCert, foreignKey := pki.Paths(foreignDir, dev)
	realCert, realKey := pki.Paths(s.pkiDir, dev)
	log := s.services[identity.ServiceAuthority].Log

	// How a refused client certificate looks to a gRPC client depends on
	// timing (TLS 1.3 refuses it after the client's side of the handshake
	// is done: the client may read the alert, or find the connection gone
	// while writing), so the gRPC check asks only for Unavailable not of the
	// client's own making; a plain TLS connection, which writes nothing
	// after the handshake, then reads the server's alert itself.
	cases := []struct {
		name      string
		ca        string
		cert      string
		key       string
		wantCode  codes.Code
		wantMsg   string // in the gRPC status message
		notMsg    string // must not be in it
		wantAlert string // in the error of a plain TLS read; "" for none
	}{
		{
			// The client trusts the real CA, so only the server's verdict on
			// the client's certificate can fail this call.
			name: "client certificate from a foreign CA", ca: pki.CAPath(s.pkiDir), cert: foreignCert, key: foreignKey,
			wantCode: codes.Unavailable, notMsg: "tlsconfig", wantAlert: "remote error: tls: bad certificate",
		},
		{
			// And the other way round: a client of the foreign CA does not
			// accept the real authority.
			name: "client trusting only a foreign CA", ca: pki.CAPath(foreignDir), cert: foreignCert, key: foreignKey,
			wantCode: codes.Unavailable, wantMsg: "tlsconfig: peer rejected: server", wantAlert: "tlsconfig: peer rejected: server",
		},
		{
			name: "real certificate", ca: pki.CAPath(s.pkiDir), cert: realCert, key: realKey,
			wantCode: codes.OK,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, err := tlsconfig.NewFileSource(tc.ca, tc.cert, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			before := countMsg(logLines(t, log), "finished call")
			cc := s.dialWith(t, src, identity.ServiceAuthority)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) || (tc.notMsg != "" && strings.Contains(st.Message(), tc.notMsg)) {
				t.Errorf("health check: %v, want code %v with a message containing %q and not %q", err, tc.wantCode, tc.wantMsg, tc.notMsg)
			}
			after := countMsg(logLines(t, log), "finished call")
			if tc.wantCode == codes.OK {
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("health check: %v, want SERVING", resp.GetStatus())
				}
				if after != before+1 {
					t.Errorf("authority logged %d calls for one health check, want 1", after-before)
				}
			} else if after != before {
				// Refused at the handshake: no RPC reached the server's
				// interceptor chain, which logs every call it sees.
				t.Errorf("authority logged %d calls during a refused handshake, want none", after-before)
			}

			err = firstRead(s.services[identity.ServiceAuthority].Address, tlsconfig.ClientConfig(src, identity.Service(trustDomain, identity.ServiceAuthority)))
			switch {
			case tc.wantAlert == "" && err != nil:
				t.Errorf("plain TLS read: %v, want the server's first bytes", err)
			case tc.wantAlert != "" && (err == nil || !strings.Contains(err.Error(), tc.wantAlert)):
				t.Errorf("plain TLS read: %v, want an error containing %q", err, tc.wantAlert)
			}
		})
	}
}

// firstRead makes a TLS connection to addr with cfg and reads once. A
// server that accepts the connection sends its HTTP/2 settings; one that
// refuses the client's certificate sends an alert instead.
func firstRead(addr string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

func TestCertificateRotationLive(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	auth := s.services[identity.ServiceAuthority]
	certFile, _ := pki.Paths(s.pkiDir, identity.Service(trustDomain, identity.ServiceAuthority))
	oldSerial := fileSerial(t, certFile)

	oldSeen := &serverSerials{}
	oldConn := s.dialRecording(t, "client/dev", identity.ServiceAuthority, oldSeen)
	checkServing(t, oldConn, "first connection")
	if got := oldSeen.get(); len(got) != 1 || got[0].Cmp(oldSerial) != 0 {
		t.Fatalf("first connection saw server serials %v, want [%v]", got, oldSerial)
	}

	res := runCommand(t, nil, bin("airlock"), "pki", "issue", "--dir", s.pkiDir, "--id", "service/authority", "-o", "json")
	if res.code != 0 {
		t.Fatalf("airlock pki issue: exit %d\n%s", res.code, res.stderr)
	}
	var issued struct {
		Issued []struct {
			ID   string `json:"id"`
			Cert string `json:"cert"`
		} `json:"issued"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &issued); err != nil {
		t.Fatalf("airlock pki issue: %v\n%s", err, res.stdout)
	}
	wantID := identity.Service(trustDomain, identity.ServiceAuthority).String()
	if len(issued.Issued) != 1 || issued.Issued[0].ID != wantID || issued.Issued[0].Cert != certFile {
		t.Fatalf("airlock pki issue reported %+v, want one certificate for %s at %s", issued.Issued, wantID, certFile)
	}
	newSerial := fileSerial(t, certFile)
	if newSerial.Cmp(oldSerial) == 0 {
		t.Fatalf("pki issue left the serial at %v", oldSerial)
	}

	newSeen := &serverSerials{}
	newConn := s.dialRecording(t, "client/dev", identity.ServiceAuthority, newSeen)
	checkServing(t, newConn, "connection after rotation")
	if got := newSeen.get(); len(got) != 1 || got[0].Cmp(newSerial) != 0 {
		t.Errorf("connection after rotation saw server serials %v, want the new certificate's [%v] (old was %v)", got, newSerial, oldSerial)
	}

	// The connection made before the rotation keeps working on its
	// original handshake.
	checkServing(t, oldConn, "first connection after rotation")
	if got := oldSeen.get(); len(got) != 1 || got[0].Cmp(oldSerial) != 0 {
		t.Errorf("first connection saw server serials %v after rotation, want still only [%v]", got, oldSerial)
	}

	// And the authority was not restarted to get there.
	checkServiceProcess(t, s, auth)
	if n := countMsg(logLines(t, auth.Log), "serving"); n != 1 {
		t.Errorf("authority logged \"serving\" %d times, want once (no restart)", n)
	}
}

// serverSerials records the serial of every server certificate a client
// accepted, one per completed handshake.
type serverSerials struct {
	mu      sync.Mutex
	serials []*big.Int
}

func (r *serverSerials) add(n *big.Int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.serials = append(r.serials, n)
}

func (r *serverSerials) get() []*big.Int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.serials)
}

// dialRecording is dial with the same pkg/tlsconfig client config, wrapped
// to record the serial of each server certificate it accepts.
func (s *stack) dialRecording(t *testing.T, as, service string, rec *serverSerials) *grpc.ClientConn {
	t.Helper()
	src := s.source(t, as)
	cfg := tlsconfig.ClientConfig(src, identity.Service(trustDomain, service))
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return err
		}
		rec.add(cs.PeerCertificates[0].SerialNumber)
		return nil
	}
	// A later WithTransportCredentials replaces grpcclient's own.
	return s.dialWith(t, src, service, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

func checkServing(t *testing.T, cc *grpc.ClientConn, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("%s: health check %v %v, want SERVING", what, resp.GetStatus(), err)
	}
}

func fileSerial(t *testing.T, path string) *big.Int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ParseCertificatePEM(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert.SerialNumber
}
