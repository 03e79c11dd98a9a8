package registryserver_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/registryserver"
	"github.com/airlockhq/airlock/test/registrytest"
)

// TestConfigServes: the reference registry accepts the config and htpasswd
// files this package writes and serves what they say: TLS with the given
// certificate, 401 without a credential or with a wrong password, 200 for
// the htpasswd user, and a line per request in the access log.
func TestConfigServes(t *testing.T) {
	bin := registrytest.Binary(t)
	dir := t.TempDir()
	ca, err := pki.NewCA("registryserver.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	host, err := ca.IssueHost(pki.IssueOptions{Validity: time.Hour, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := pki.WriteHostPair(cert, key, host); err != nil {
		t.Fatal(err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := registryserver.WriteHtpasswd(htpasswd, map[string]string{"dev": "s3cret", "other": "x"}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(htpasswd); strings.Contains(string(data), "s3cret") || !strings.HasPrefix(string(data), "dev:$2") {
		t.Fatalf("htpasswd is not bcrypt lines:\n%s", data)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	config := filepath.Join(dir, "config.yml")
	err = registryserver.WriteConfig(config, registryserver.Config{Addr: addr, CertFile: cert, KeyFile: key, Htpasswd: htpasswd, StorageDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(config); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config: %v, mode %v; want 0600", err, st.Mode())
	}

	logFile := filepath.Join(dir, "registry.log")
	log, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, registryserver.Args(config)...)
	cmd.Env = registryserver.Env(config)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(user, password string) (int, error) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/v2/", nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := get("", ""); err == nil {
			break
		} else if time.Now().After(deadline) {
			data, _ := os.ReadFile(logFile)
			t.Fatalf("registry did not answer: %v\n%s", err, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, tc := range []struct {
		user, password string
		want           int
	}{{"", "", 401}, {"dev", "wrong", 401}, {"dev", "s3cret", 200}, {"other", "x", 200}} {
		if got, err := get(tc.user, tc.password); err != nil || got != tc.want {
			t.Errorf("GET /v2/ as %q: %d %v, want %d", tc.user, got, err, tc.want)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(logFile)
		reqs := 0
		for _, line := range strings.Split(string(data), "\n") {
			if req, ok := registrytest.ParseAccessLine(line); ok && req.Path == "/v2/" {
				reqs++
			}
		}
		if reqs >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("access log has %d requests for /v2/, want at least 5:\n%s", reqs, data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWriteConfigRefusesMissingFields(t *testing.T) {
	err := registryserver.WriteConfig(filepath.Join(t.TempDir(), "config.yml"), registryserver.Config{Addr: "127.0.0.1:1"})
	for _, want := range []string{"CertFile", "KeyFile", "StorageDir"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("WriteConfig without %s: %v", want, err)
		}
	}
	if err := registryserver.WriteHtpasswd(filepath.Join(t.TempDir(), "h"), map[string]string{"a:b": "x"}); err == nil {
		t.Error("WriteHtpasswd took a user name with ':'")
	}
}

func TestEnvHasNoProxy(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
	for _, kv := range registryserver.Env("/x/config.yml") {
		if strings.Contains(strings.ToLower(kv), "proxy") {
			t.Errorf("Env passes %s", kv)
		}
	}
}
