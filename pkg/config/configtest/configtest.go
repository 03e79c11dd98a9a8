// Package configtest builds, for the services' --check-config tests, a
// directory of the real files a service config names (a PKI from
// pki.Init, a grant key pair) and runs a table of configs through a
// service's Check, proving each good one creates nothing on disk and binds
// nothing. Only tests import it.
package configtest

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// Fixture is a directory holding a service's files.
type Fixture struct {
	// Dir holds pki/ (CA and every service's pair), grant.key and
	// grant.key.pub, and the config files the cases write.
	Dir string
	// Listen is an address this test holds bound: a Check that tried to
	// bind it would fail.
	Listen string
	// Metrics is another address held bound, for telemetry.prometheus_listen.
	Metrics string
	service string
}

// New makes the files of service under a temp dir.
func New(t *testing.T, service string) *Fixture {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.Init(filepath.Join(dir, "pki"), "airlock.test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateEd25519(filepath.Join(dir, "grant.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "not-pem.crt"), []byte("this is not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Fixture{Dir: dir, Listen: holdAddr(t), Metrics: holdAddr(t), service: service}
}

// holdAddr binds a loopback address until the test ends.
func holdAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// Common is the part of the config every service has, with the
// service's own certificate, relative to Dir.
func (f *Fixture) Common() string {
	cert, key := pki.Paths("pki", identity.Service("airlock.test", f.service))
	return fmt.Sprintf("version: 1\ntrust_domain: airlock.test\nlisten: %s\ndata_dir: data/%s\ntls: {ca: %s, cert: %s, key: %s}\n",
		f.Listen, f.service, pki.CAPath("pki"), cert, key)
}

// Case is one config: Field is the field a problem must name, "" for a
// good config, whose summary must hold Summary.
type Case struct {
	Name, Body, Field, Summary string
}

// BadCommon are the bad configs every service refuses, made from good (a
// whole good config of the service).
func (f *Fixture) BadCommon(good string) []Case {
	cert, key := pki.Paths("pki", identity.Service("airlock.test", f.service))
	other := identity.ServiceAuthority
	if f.service == other {
		other = identity.ServiceExecutor
	}
	otherCert, otherKey := pki.Paths("pki", identity.Service("airlock.test", other))
	return []Case{
		{"unknown field", good + "colour: blue\n", "colour", ""},
		{"wrong version", strings.Replace(good, "version: 1", "version: 2", 1), "version", ""},
		{"missing cert file", strings.Replace(good, "cert: "+cert, "cert: pki/gone.crt", 1), "tls.cert", ""},
		{"cert not PEM", strings.Replace(good, "cert: "+cert, "cert: not-pem.crt", 1), "tls.cert", ""},
		{"another service's cert", strings.NewReplacer("cert: "+cert, "cert: "+otherCert, "key: "+key, "key: "+otherKey).Replace(good), "tls.cert", ""},
		{"out of range", good + "telemetry: {sample_ratio: 2}\n", "telemetry.sample_ratio", ""},
		{"metrics address not host:port", good + "telemetry: {prometheus_listen: nonsense}\n", "telemetry.prometheus_listen", ""},
		{"metrics on the gRPC address", good + "telemetry: {prometheus_listen: \"" + f.Listen + "\"}\n", "telemetry.prometheus_listen", ""},
	}
}

// GoodCommon are good configs made from good that every service accepts:
// one serving metrics on an address the test holds bound, which the check
// must not try to bind.
func (f *Fixture) GoodCommon(good string) []Case {
	return []Case{
		{Name: "metrics endpoint", Body: good + "telemetry: {prometheus_listen: \"" + f.Metrics + "\"}\n", Summary: "metrics http://" + f.Metrics + "/metrics"},
	}
}

// Check is a service's config.Check.
type Check func(path string, override func(*config.Server)) (string, []error)

// Run writes each case as Dir/<service>.yaml and checks it: a good one
// gives a summary and no problem, a bad one problems of which one names
// its field; neither changes anything under Dir.
func (f *Fixture) Run(t *testing.T, check Check, cases []Case) {
	t.Helper()
	path := filepath.Join(f.Dir, f.service+".yaml")
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.Body), 0o600); err != nil {
				t.Fatal(err)
			}
			before := Tree(t, f.Dir)
			summary, problems := check(path, nil)
			t.Logf("summary %q, problems %v", summary, problems)
			if after := Tree(t, f.Dir); !reflect.DeepEqual(before, after) {
				t.Errorf("the check changed %s:\nbefore %v\nafter  %v", f.Dir, before, after)
			}
			if tc.Field == "" {
				if len(problems) > 0 || summary == "" {
					t.Fatalf("good config: summary %q, problems %v", summary, problems)
				}
				if !strings.Contains(summary, tc.Summary) {
					t.Errorf("summary %q, want it to hold %q", summary, tc.Summary)
				}
				return
			}
			if len(problems) == 0 {
				t.Fatalf("no problem found, summary %q; want one naming %s", summary, tc.Field)
			}
			for _, p := range problems {
				if strings.HasPrefix(p.Error(), tc.Field) || strings.Contains(p.Error(), " "+tc.Field) {
					return
				}
			}
			t.Errorf("no problem names %s: %v", tc.Field, problems)
		})
	}
}

// Tree lists every path under dir with its mode and size.
func Tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %v %d", p, info.Mode(), info.Size()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
