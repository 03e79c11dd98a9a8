//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// authorityConfig is the part of an authority config file the cases vary.
type authorityConfig struct {
	version   string // "" leaves the line out
	listenKey string
	listen    string
	cert      string
}

func TestServiceConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	dev := identity.MustParse("spiffe://" + trustDomain + "/client/dev")
	if _, err := pki.Init(pkiDir, trustDomain, []identity.ID{dev}); err != nil {
		t.Fatal(err)
	}
	ca := pki.CAPath(pkiDir)
	cert, key := pki.Paths(pkiDir, identity.Service(trustDomain, identity.ServiceAuthority))
	missing := filepath.Join(pkiDir, "service", "nobody.crt")
	valid := authorityConfig{version: "1", listenKey: "listen", listen: "127.0.0.1:0", cert: cert}
	render := func(c authorityConfig) string {
		var b strings.Builder
		if c.version != "" {
			fmt.Fprintf(&b, "version: %s\n", c.version)
		}
		fmt.Fprintf(&b, "trust_domain: %s\n", trustDomain)
		fmt.Fprintf(&b, "%s: %q\n", c.listenKey, c.listen)
		fmt.Fprintf(&b, "data_dir: data\n")
		fmt.Fprintf(&b, "tls:\n  ca: %q\n  cert: %q\n  key: %q\n", ca, c.cert, key)
		fmt.Fprintf(&b, "fleet:\n  heartbeat_interval: 1s\n")
		return b.String()
	}
	write := func(t *testing.T, c authorityConfig) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "authority.yaml")
		if err := os.WriteFile(path, []byte(render(c)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	// The control: the config every case below breaks in one place starts
	// and serves, so each failure is down to that one place.
	t.Run("valid config serves", func(t *testing.T) {
		t.Parallel()
		path := write(t, valid)
		addr := runUntilServing(t, path)
		src, err := tlsconfig.NewFileSource(ca, filepath.Join(pkiDir, "client", "dev.crt"), filepath.Join(pkiDir, "client", "dev.key"))
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpcclient.Dial(addr, src, identity.Service(trustDomain, identity.ServiceAuthority))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		checkServing(t, cc, "authority with the valid config")
	})

	cases := []struct {
		name   string
		change func(*authorityConfig)
		// want are fragments of the one error line: the field's name and
		// the gist of the complaint, not its exact wording.
		want []string
	}{
		{
			name:   "unknown field",
			change: func(c *authorityConfig) { c.listenKey = "lisen" },
			want:   []string{"lisen", "unknown field"},
		},
		{
			name:   "missing version",
			change: func(c *authorityConfig) { c.version = "" },
			want:   []string{"version", "required"},
		},
		{
			name:   "unsupported version",
			change: func(c *authorityConfig) { c.version = "2" },
			want:   []string{"version", "2 is not supported"},
		},
		{
			name:   "listen not host:port",
			change: func(c *authorityConfig) { c.listen = "nonsense" },
			want:   []string{"listen", `"nonsense"`, "host:port"},
		},
		{
			name:   "missing tls.cert file",
			change: func(c *authorityConfig) { c.cert = missing },
			want:   []string{"tls.cert: ", missing, "no such file or directory"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := valid
			tc.change(&c)
			path := write(t, c)
			res := runCommand(t, nil, bin("authority"), "--config", path)
			if res.code != 1 {
				t.Errorf("exit %d, want 1\nstderr:\n%s", res.code, res.stderr)
			}
			if res.elapsed > 5*time.Second {
				t.Errorf("took %v to reject its config, want well under 5s", res.elapsed)
			}
			if prefix := "authority: config " + path + ": "; !strings.HasPrefix(res.stderr, prefix) {
				t.Errorf("stderr %q, want it to start with %q", res.stderr, prefix)
			}
			for _, w := range tc.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr %q, want it to contain %q", res.stderr, w)
				}
			}
			if strings.Contains(res.stderr, `"serving"`) {
				t.Errorf("authority started serving with a bad config:\n%s", res.stderr)
			}
		})
	}

	t.Run("no --config", func(t *testing.T) {
		t.Parallel()
		res := runCommand(t, nil, bin("authority"))
		if res.code != 2 {
			t.Errorf("exit %d, want 2\nstderr:\n%s", res.code, res.stderr)
		}
		if want := "authority: --config is required"; !strings.Contains(res.stderr, want) {
			t.Errorf("stderr %q, want it to contain %q", res.stderr, want)
		}
	})
}

// runUntilServing starts the authority binary with config, waits for its
// "serving" log record and returns the address it listens on. Cleanup
// stops it with SIGTERM and fails the test unless it then exits 0 with a
// clean "stopped" record.
func runUntilServing(t *testing.T, config string) string {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "authority.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin("authority"), "--config", config)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("SIGTERM authority: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("authority exited with %v after SIGTERM, want 0", err)
			}
			checkStoppedLog(t, identity.ServiceAuthority, logFile)
		case <-time.After(stopTimeout):
			cmd.Process.Kill()
			<-done
			t.Errorf("authority still running %v after SIGTERM", stopTimeout)
		}
	})

	deadline := time.Now().Add(commandTimeout)
	for {
		if addr := servingAddress(logFile); addr != "" {
			return addr
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			data, _ := os.ReadFile(logFile)
			t.Fatalf("authority exited (%v) before serving:\n%s", err, data)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("authority did not log \"serving\" within %v", commandTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// servingAddress returns the address of the "serving" record in a service
// log, or "" if there is none yet.
func servingAddress(logFile string) string {
	data, err := os.ReadFile(logFile)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var rec struct {
			Msg     string `json:"msg"`
			Address string `json:"address"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
			return rec.Address
		}
	}
	return ""
}
