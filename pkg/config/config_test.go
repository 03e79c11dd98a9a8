package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
)

// file is a service-shaped config: the common part plus one peer.
type file struct {
	config.Server `yaml:",inline"`
	Executor      config.Peer `yaml:"executor"`
}

func (f *file) Common() *config.Server { return &f.Server }
func (f *file) ValidatePeers() error   { return config.ValidatePeer("executor", f.Executor) }

// writeConfig writes body to dir/config.yaml beside real (empty) TLS files.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"ca.crt", "svc.crt", "svc.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const good = `version: 1
trust_domain: airlock.test
listen: 127.0.0.1:7401
data_dir: data
tls: {ca: ca.crt, cert: svc.crt, key: svc.key}
executor: {address: 127.0.0.1:7402}
`

func TestLoadServiceGood(t *testing.T) {
	path := writeConfig(t, good)
	var f file
	if err := config.LoadService(path, &f, nil); err != nil {
		t.Fatalf("LoadService: %v", err)
	}
	dir := filepath.Dir(path)
	if f.DataDir != filepath.Join(dir, "data") || f.TLS.Cert != filepath.Join(dir, "svc.crt") {
		t.Errorf("relative paths not resolved against the config's directory: data_dir=%s cert=%s", f.DataDir, f.TLS.Cert)
	}
	if f.Log.Level != "info" || f.Log.Format != "json" || f.ShutdownTimeout != 10*time.Second {
		t.Errorf("defaults not filled: %+v %v", f.Log, f.ShutdownTimeout)
	}
	if f.Executor.Address != "127.0.0.1:7402" {
		t.Errorf("peer = %q", f.Executor.Address)
	}
}

func TestLoadServiceOverride(t *testing.T) {
	var f file
	err := config.LoadService(writeConfig(t, good), &f, func(s *config.Server) { s.Listen = "127.0.0.1:9999" })
	if err != nil || f.Listen != "127.0.0.1:9999" {
		t.Fatalf("override: listen=%q err=%v", f.Listen, err)
	}
}

func TestLoadServiceErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want []string // every substring must appear
	}{
		{"unknown field", good + "lisen: x\n", []string{"lisen (line 7): unknown field"}},
		{"unknown nested field", strings.Replace(good, "tls: {", "tls: {pem: x, ", 1), []string{"tls.pem (line 5): unknown field"}},
		{"no version", strings.Replace(good, "version: 1\n", "", 1), []string{"version: required"}},
		{"future version", strings.Replace(good, "version: 1", "version: 2", 1), []string{"version: 2 is not supported"}},
		{"bad listen", strings.Replace(good, "127.0.0.1:7401", "nonsense", 1), []string{"listen:", `"nonsense": must be host:port`}},
		{"missing host", strings.Replace(good, "127.0.0.1:7401", ":7401", 1), []string{"listen:", "host is required"}},
		{"missing cert file", strings.Replace(good, "cert: svc.crt", "cert: nope.crt", 1), []string{"tls.cert:", "nope.crt"}},
		{"bad trust domain", strings.Replace(good, "airlock.test", "Bad Domain", 1), []string{`trust_domain: invalid trust domain "Bad Domain": has character 'B', want only a-z 0-9 . - _`}},
		{"bad level", good + "log: {level: loud}\n", []string{"log.level:", `"loud"`}},
		{"bad format", good + "log: {format: xml}\n", []string{"log.format:", `"xml"`}},
		{"bad duration", good + "shutdown_timeout: soon\n", []string{"line 7", "soon"}},
		{"bad peer", strings.Replace(good, "127.0.0.1:7402", "", 1), []string{"executor.address: required"}},
		{"wrong type", strings.Replace(good, "version: 1", "version: one", 1), []string{"version (line 1)", `"one"`}},
		{"wrong nested type", good + "telemetry: {insecure: maybe}\n", []string{"telemetry.insecure (line 7)", `"maybe"`}},
		{"metrics address not host:port", good + "telemetry: {prometheus_listen: localhost}\n", []string{"telemetry.prometheus_listen:", `"localhost": must be host:port`}},
		{"metrics address without host", good + "telemetry: {prometheus_listen: \":9464\"}\n", []string{"telemetry.prometheus_listen:", "host is required"}},
		{"metrics port out of range", good + "telemetry: {prometheus_listen: \"127.0.0.1:70000\"}\n", []string{"telemetry.prometheus_listen:", "port must be a number"}},
		{"metrics on the gRPC address", good + "telemetry: {prometheus_listen: \"127.0.0.1:7401\"}\n", []string{"telemetry.prometheus_listen:", "also the gRPC listen address"}},
		{"not yaml", "version: 1\n\t- [", []string{"yaml"}},
		{"several at once", strings.Replace(strings.Replace(good, "127.0.0.1:7401", "x", 1), "cert: svc.crt", "cert: gone", 1), []string{"listen:", "tls.cert:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f file
			err := config.LoadService(writeConfig(t, tc.body), &f, nil)
			if err == nil {
				t.Fatal("accepted a bad config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// telemetry.prometheus_listen is off unless given, and kept as given.
func TestPrometheusListen(t *testing.T) {
	var f file
	if err := config.LoadService(writeConfig(t, good), &f, nil); err != nil {
		t.Fatal(err)
	}
	if f.Telemetry.PrometheusListen != "" {
		t.Errorf("prometheus_listen defaults to %q, want empty (no endpoint)", f.Telemetry.PrometheusListen)
	}
	f = file{}
	if err := config.LoadService(writeConfig(t, good+"telemetry: {prometheus_listen: \"127.0.0.1:9464\"}\n"), &f, nil); err != nil {
		t.Fatal(err)
	}
	if f.Telemetry.PrometheusListen != "127.0.0.1:9464" {
		t.Errorf("prometheus_listen = %q, want 127.0.0.1:9464", f.Telemetry.PrometheusListen)
	}
}

func TestFieldErrorsAreTyped(t *testing.T) {
	var f file
	err := config.LoadService(writeConfig(t, strings.Replace(good, "127.0.0.1:7401", "x", 1)), &f, nil)
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Field != "listen" {
		t.Fatalf("want a FieldError for listen, got %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	var f file
	if err := config.LoadService(filepath.Join(t.TempDir(), "absent.yaml"), &f, nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
