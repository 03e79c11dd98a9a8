// Package registrytest runs the reference OCI registry (distribution's
// cmd/registry, pinned in tools/go.mod) for tests: on loopback, over TLS
// with a throwaway CA, with htpasswd basic auth when asked, its storage in
// the test's temporary directory and its access log readable as Requests.
// It also builds images to push to it (layers from files, images, indexes,
// a Debian root filesystem made with mmdebstrap). No mock: every request is
// served by the real server. Only tests import it.
package registrytest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/registryserver"
)

// Options configure a registry.
type Options struct {
	// Users maps user names to passwords. Empty means no authentication:
	// anyone may pull and push.
	Users map[string]string
}

// Registry is a running registry server.
type Registry struct {
	// Host is 127.0.0.1:PORT, the registry part of an image reference.
	Host string
	// CAFile is the PEM file of the CA that issued the server's
	// certificate; CAPEM is its content.
	CAFile string
	CAPEM  []byte
	// Users are the accounts of Options.Users.
	Users map[string]string
	// Dir is the storage root (storage.filesystem.rootdirectory).
	Dir string
	// LogFile holds the server's standard output and error.
	LogFile string

	pool *x509.CertPool
	sync atomic.Int64
}

// Start runs a registry until the end of t.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	bin := Binary(t)
	base := t.TempDir()
	r := &Registry{
		Users:   opts.Users,
		Dir:     filepath.Join(base, "storage"),
		LogFile: filepath.Join(base, "registry.log"),
		CAFile:  filepath.Join(base, "ca.crt"),
	}
	ca, err := pki.NewCA("registry.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	r.pool = x509.NewCertPool()
	r.pool.AddCert(ca.Cert)
	host, err := ca.IssueHost(pki.IssueOptions{Validity: time.Hour, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(base, "server.crt"), filepath.Join(base, "server.key")
	if err := pki.WriteHostPair(certFile, keyFile, host); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.CAFile, r.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var htpasswd string
	if len(opts.Users) > 0 {
		htpasswd = filepath.Join(base, "htpasswd")
		if err := registryserver.WriteHtpasswd(htpasswd, opts.Users); err != nil {
			t.Fatal(err)
		}
	}

	// The port is picked here and handed over, so another process may
	// take it in between: a registry that fails to listen is started
	// again on a new port.
	for attempt := 1; ; attempt++ {
		r.Host = freePort(t)
		config := filepath.Join(base, "config.yml")
		err := registryserver.WriteConfig(config, registryserver.Config{
			Addr: r.Host, CertFile: certFile, KeyFile: keyFile,
			Htpasswd: htpasswd, Realm: "airlock-test", StorageDir: r.Dir, Delete: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		err = r.run(t, bin, config)
		if err == nil {
			return r
		}
		if attempt == 3 || !strings.Contains(readTail(r.LogFile), "address already in use") {
			t.Fatalf("registrytest: start registry: %v\n%s", err, readTail(r.LogFile))
		}
	}
}

// run starts the binary, waits until /v2/ answers and registers its stop.
func (r *Registry) run(t testing.TB, bin, config string) error {
	log, err := os.OpenFile(r.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, registryserver.Args(config)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = registryserver.Env(config)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	client := &http.Client{Transport: r.Transport(), Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("https://" + r.Host + "/v2/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("registry exited: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("registry did not answer on %s within 30s: %v", r.Host, err)
		}
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("registry log: %s", r.LogFile)
		}
	})
	return nil
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// Transport is a fresh transport that trusts only the registry's CA and
// never uses a proxy.
func (r *Registry) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.TLSClientConfig = &tls.Config{RootCAs: r.pool, MinVersion: tls.VersionTLS12}
	return tr
}

// Auth is user's basic credential (with the password of Users), or
// anonymous for "".
func (r *Registry) Auth(user string) authn.Authenticator {
	if user == "" {
		return authn.Anonymous
	}
	return &authn.Basic{Username: user, Password: r.Users[user]}
}

// Remote is the remote options that reach this registry as user ("" is
// anonymous): its transport, the credential and ctx.
func (r *Registry) Remote(ctx context.Context, user string) []remote.Option {
	return []remote.Option{remote.WithTransport(r.Transport()), remote.WithAuth(r.Auth(user)), remote.WithContext(ctx)}
}

// Ref is the reference HOST/repo plus suffix, which is ":TAG", "@DIGEST"
// or empty.
func (r *Registry) Ref(t testing.TB, repo, suffix string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(r.Host+"/"+repo+suffix, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// pushUser is the first user (by name), who pushes and tags for the
// helpers.
func (r *Registry) pushUser() string {
	if len(r.Users) == 0 {
		return ""
	}
	return slices.Sorted(maps.Keys(r.Users))[0]
}

// Push writes img (a v1.Image or a v1.ImageIndex with everything it
// refers to) to repo, tagged tag unless tag is empty, and returns its
// digest ("sha256:...").
func (r *Registry) Push(t testing.TB, repo, tag string, img remote.Taggable) string {
	t.Helper()
	var digest v1.Hash
	var err error
	switch m := img.(type) {
	case v1.ImageIndex:
		digest, err = m.Digest()
	case v1.Image:
		digest, err = m.Digest()
	default:
		t.Fatalf("registrytest: push %T: neither an image nor an index", img)
	}
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref(t, repo, "@"+digest.String())
	if tag != "" {
		ref = r.Ref(t, repo, ":"+tag)
	}
	opts := r.Remote(t.Context(), r.pushUser())
	switch m := img.(type) {
	case v1.ImageIndex:
		err = remote.WriteIndex(ref, m, opts...)
	case v1.Image:
		err = remote.Write(ref, m, opts...)
	}
	if err != nil {
		t.Fatalf("registrytest: push %s: %v", ref, err)
	}
	return digest.String()
}

// Tag points repo:tag at the manifest digest (already in repo), moving the
// tag if it exists.
func (r *Registry) Tag(t testing.TB, repo, tag, digest string) {
	t.Helper()
	opts := r.Remote(t.Context(), r.pushUser())
	desc, err := remote.Get(r.Ref(t, repo, "@"+digest), opts...)
	if err != nil {
		t.Fatalf("registrytest: tag %s:%s: %v", repo, tag, err)
	}
	tagRef, err := name.NewTag(r.Host+"/"+repo+":"+tag, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Tag(tagRef, desc, opts...); err != nil {
		t.Fatalf("registrytest: tag %s:%s: %v", repo, tag, err)
	}
}

// BlobPath is where the registry keeps the bytes of digest
// (docker/registry/v2/blobs/sha256/XX/HEX/data under Dir).
func (r *Registry) BlobPath(digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	if len(hex) < 2 {
		return ""
	}
	return filepath.Join(r.Dir, "docker", "registry", "v2", "blobs", algo, hex[:2], hex, "data")
}

// CorruptBlob flips every byte of the blob digest, a layer, config or
// manifest of repo, keeping its size: the registry serves the tampered
// bytes under the old digest, as a compromised registry or disk would, and
// only a client that checks digests notices.
func (r *Registry) CorruptBlob(t testing.TB, repo, digest string) {
	t.Helper()
	b, err := os.ReadFile(r.linkedBlob(t, repo, digest))
	if err != nil {
		t.Fatalf("registrytest: corrupt %s: %v", digest, err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	r.ReplaceBlob(t, repo, digest, b)
}

// ReplaceBlob makes the registry serve data as the blob or manifest digest
// of repo: for a manifest, a valid manifest of other content is served
// where flipped bytes would only be refused by the registry's parser.
func (r *Registry) ReplaceBlob(t testing.TB, repo, digest string, data []byte) {
	t.Helper()
	if err := os.WriteFile(r.linkedBlob(t, repo, digest), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// linkedBlob is BlobPath(digest), failing t unless repo holds digest as a
// layer or config (_layers) or a manifest (_manifests/revisions).
func (r *Registry) linkedBlob(t testing.TB, repo, digest string) string {
	t.Helper()
	algo, hex, _ := strings.Cut(digest, ":")
	repoDir := filepath.Join(r.Dir, "docker", "registry", "v2", "repositories", filepath.FromSlash(repo))
	for _, link := range []string{
		filepath.Join(repoDir, "_layers", algo, hex, "link"),
		filepath.Join(repoDir, "_manifests", "revisions", algo, hex, "link"),
	} {
		if _, err := os.Stat(link); err == nil {
			return r.BlobPath(digest)
		}
	}
	t.Fatalf("registrytest: %s is not a blob or manifest of %s", digest, repo)
	return ""
}

// Request is one request in the registry's access log.
type Request struct {
	Method string
	// Path is the request's path, without the query.
	Path   string
	Query  string
	Status int
}

// accessLine is a line of the registry's access log, which is Apache's
// combined format (gorilla/handlers.CombinedLoggingHandler):
//
//	127.0.0.1 - - [04/Dec/2026:19:39:06 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "curl/7.88.1"
//
// Its user field is always "-": the registry authenticates inside the
// handler the access log wraps.
var accessLine = regexp.MustCompile(`^\S+ \S+ \S+ \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3}) `)

// syncQuery marks Requests' own request, which Requests leaves out.
const syncQuery = "airlock-registrytest-sync="

// Requests are the requests the registry has served so far, in the order it
// finished them. The log line of a request is written after its response,
// so Requests first makes a request of its own and waits for its line; the
// lines of requests whose responses a client had received before are then
// there too.
func (r *Registry) Requests(t testing.TB) []Request {
	t.Helper()
	marker := syncQuery + strconv.FormatInt(r.sync.Add(1), 10)
	client := &http.Client{Transport: r.Transport(), Timeout: 10 * time.Second}
	resp, err := client.Get("https://" + r.Host + "/v2/?" + marker)
	if err != nil {
		t.Fatalf("registrytest: requests: %v", err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		reqs, found, err := r.parseLog(marker)
		if err != nil {
			t.Fatalf("registrytest: requests: %v", err)
		}
		if found {
			return reqs
		}
		if time.Now().After(deadline) {
			t.Fatalf("registrytest: requests: own request %s not in the access log after 10s", marker)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// parseLog reads the access log's requests, leaving out Requests' own;
// found says whether the one with marker was there.
func (r *Registry) parseLog(marker string) (reqs []Request, found bool, err error) {
	f, err := os.Open(r.LogFile)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		req, ok := ParseAccessLine(sc.Text())
		if !ok {
			continue
		}
		if strings.HasPrefix(req.Query, syncQuery) {
			found = found || req.Query == marker
			continue
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	return reqs, found, nil
}

// ParseAccessLine parses one line of the registry's access log; ok is false
// for its other lines (the application log).
func ParseAccessLine(line string) (req Request, ok bool) {
	m := accessLine.FindStringSubmatch(line)
	if m == nil {
		return Request{}, false
	}
	status, err := strconv.Atoi(m[3])
	if err != nil {
		return Request{}, false
	}
	path, query, _ := strings.Cut(m[2], "?")
	return Request{Method: m[1], Path: path, Query: query, Status: status}, true
}

// Count is how many of reqs have method and a path starting with prefix.
func Count(reqs []Request, method, prefix string) int {
	n := 0
	for _, req := range reqs {
		if req.Method == method && strings.HasPrefix(req.Path, prefix) {
			n++
		}
	}
	return n
}
