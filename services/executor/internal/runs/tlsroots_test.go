package runs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// The package the test's registry serves, and what its index.js says.
const (
	probePkg   = "airlock-tls-probe"
	probeHello = "hello from the test registry"
	registry   = "registry.test"
)

// httpsScript is the job: a stock curl and a stock npm, neither told to
// trust anything, through the job's domains policy.
const httpsScript = `cd /work
curl -sS --max-time 30 https://` + registry + `/hello 2>&1; echo "curl rc=$?"
npm install --registry https://` + registry + `/ --cache /tmp/npm-cache --no-audit --no-fund --no-update-notifier --loglevel=error ` + probePkg + ` 2>&1; echo "npm rc=$?"
test -f node_modules/` + probePkg + `/index.js && echo installed
node -e 'console.log(require("` + probePkg + `"))' 2>&1
`

// HTTPS from a job works with a stock client: a registry served over TLS
// by a CA of the test's own, in a network namespace the test makes, is
// reached by curl and by npm install under a domains policy, under runc
// and runsc, once the operator adds that CA (sandbox.extra_cas, appended
// to the host's bundle as the executor does); without it, curl fails on
// the certificate, so the success is the trust store's doing.
func TestHTTPSWithOperatorCA(t *testing.T) {
	ca, err := pki.NewCA("tlsroots.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{registry}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	reg := startRegistry(t, cert)
	dns := nettest.StartDNS(t, map[string][]netip.Addr{registry: {reg.IP, reg.IP6}})

	// The executor's trust store: the host's bundle, then the extra CA,
	// each read as the config reads sandbox.ca_bundle and extra_cas.
	extra := filepath.Join(t.TempDir(), "egress-ca.pem")
	if err := os.WriteFile(extra, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	var bundle []byte
	for _, f := range []string{sandbox.DefaultCABundle, extra} {
		b, err := sandbox.ReadCAFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, b...)
	}
	withCA, _ := newHarnessMeter(t, false, Capacity{}, nil, func(c *sandbox.Config) { c.CABundle = bundle })
	withDomainsNetwork(t, withCA, dns.Addr)
	hostOnly, _ := newHarness(t, false)
	withDomainsNetwork(t, hostOnly, dns.Addr)

	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			start := time.Now()
			out, run := httpsJob(t, withCA, class, httpsScript)
			t.Logf("with the CA, in %v:\n%s", time.Since(start).Round(time.Millisecond), out)
			for _, want := range []string{"hello over TLS " + registry + "\ncurl rc=0\n", "npm rc=0\ninstalled\n" + probeHello + "\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("with the CA: stdout lacks %q", want)
				}
			}
			if run.State != Finished || run.Result == nil || run.Result.ExitCode != 0 {
				t.Errorf("with the CA: run %s, %+v", run.State, run.Result)
			}

			out, _ = httpsJob(t, hostOnly, class, `curl -sS --max-time 30 https://`+registry+`/hello 2>&1; echo "curl rc=$?"`)
			t.Logf("without it:\n%s", out)
			if !strings.Contains(out, "SSL certificate problem: unable to get local issuer certificate") || !strings.Contains(out, "curl rc=60\n") {
				t.Errorf("without the CA: %q; want curl to fail on the certificate (exit 60)", out)
			}
		})
	}
	if got := reg.requests(); !strings.Contains(got, "GET /"+probePkg+"/-/"+probePkg+"-1.0.0.tgz") {
		t.Errorf("the registry served %s; want the tarball among them", got)
	}
}

// httpsJob runs script in a class's job allowed to reach the registry, and
// returns its stdout and run.
func httpsJob(t *testing.T, h *harness, class sandbox.Class, script string) (string, Run) {
	t.Helper()
	g := h.grantFor(script)
	g.Network = domainsPolicy(registry)
	g.Class = class
	g.Limits.Pids = 256
	g.Limits.MemoryBytes = 1 << 30
	g.Limits.DiskBytes = 256 << 20
	g.Limits.Deadline = 3 * time.Minute
	h.start(t, g)
	run := h.waitEndWithin(t, g.JobID, 4*time.Minute)
	return stdoutOf(t, h, run), run
}

// testRegistry is an npm registry of one package on a test host, over TLS.
type testRegistry struct {
	*nettest.Host
	mu   sync.Mutex
	reqs []string
}

func (r *testRegistry) requests() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.reqs, ", ")
}

// startRegistry serves, on port 443 of a test host, with cert: /hello, a
// greeting; /PKG, the package's document (its one version's tarball URL,
// sha1 and sha512 integrity); and the tarball, a package.json and an
// index.js exporting probeHello.
func startRegistry(t *testing.T, cert tls.Certificate) *testRegistry {
	t.Helper()
	tgz := packageTarball(t, [][2]string{
		{"package/package.json", `{"name": "` + probePkg + `", "version": "1.0.0", "main": "index.js"}` + "\n"},
		{"package/index.js", `module.exports = "` + probeHello + `";` + "\n"},
	})
	sha := sha1.Sum(tgz)
	integrity := sha512.Sum512(tgz)
	tarPath := "/" + probePkg + "/-/" + probePkg + "-1.0.0.tgz"
	doc, err := json.Marshal(map[string]any{
		"name":      probePkg,
		"dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": probePkg, "version": "1.0.0", "main": "index.js",
			"dist": map[string]string{
				"tarball":   "https://" + registry + tarPath,
				"shasum":    hex.EncodeToString(sha[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(integrity[:]),
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &testRegistry{Host: nettest.Start(t, webHostConfig())}
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		switch req.URL.Path {
		case "/hello":
			w.Write([]byte("hello over TLS " + req.TLS.ServerName + "\n"))
		case "/" + probePkg:
			w.Header().Set("Content-Type", "application/json")
			w.Write(doc)
		case tarPath:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(tgz)
		default:
			http.NotFound(w, req)
		}
	})
	// A job without the CA aborts its handshakes, which the server would
	// log, after the test too.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	t.Cleanup(func() { srv.Close() })
	ln := tls.NewListener(r.Listen(t, "tcp", ":443"), &tls.Config{Certificates: []tls.Certificate{cert}})
	go srv.Serve(ln)
	return r
}

// packageTarball is an npm package: a gzipped tar of files (name, body).
func packageTarball(t *testing.T, files [][2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		name, body := f[0], f[1]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1e9, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
