package gitserve_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/gitserve"
)

// countingGit is a git that counts its runs in a file, then runs git.
func countingGit(t *testing.T) (path string, runs func() int) {
	t.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	count := filepath.Join(dir, "runs")
	path = filepath.Join(dir, "git")
	script := "#!/bin/sh\necho run >> '" + count + "'\nexec '" + real + "' \"$@\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, func() int {
		data, _ := os.ReadFile(count)
		return strings.Count(string(data), "run\n")
	}
}

// listing GETs sample's upload-pack ref advertisement, as the authority
// does (git's original protocol, no Git-Protocol header), or in protocol v2.
func (f *fixture) listing(v2 bool) (string, http.Header) {
	f.t.Helper()
	pool := x509.NewCertPool()
	data, err := os.ReadFile(f.CAFile)
	if err != nil {
		f.t.Fatal(err)
	}
	pool.AppendCertsFromPEM(data)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, f.URL("sample")+"/info/refs?service=git-upload-pack", nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", basic(readToken))
	if v2 {
		req.Header.Set("Git-Protocol", "version=2")
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		f.t.Fatalf("listing: status %d, %v", resp.StatusCode, err)
	}
	return string(body), resp.Header
}

func TestRefListingAnsweredFromTheRefsState(t *testing.T) {
	t.Parallel()
	git, runs := countingGit(t)
	f := start(t, func(c *gitserve.Config) { c.Git = git })

	first, h1 := f.listing(false)
	if !strings.Contains(first, f.main+" refs/heads/main") {
		t.Fatalf("the listing does not name main at %s:\n%q", f.main, first)
	}
	n := runs()
	second, h2 := f.listing(false)
	if second != first || h2.Get("Content-Type") != h1.Get("Content-Type") || h2.Get("Cache-Control") != h1.Get("Cache-Control") {
		t.Fatalf("a second listing of unchanged refs differs:\n%q\n%q\n%v\n%v", first, second, h1, h2)
	}
	if got := runs(); got != n {
		t.Errorf("a listing of unchanged refs ran git %d times; want it answered from the kept listing", got-n)
	}

	// A real git client reads the kept listing (original protocol).
	if out, err := f.git("", readToken, "-c", "protocol.version=0", "ls-remote", f.URL("sample"), "main"); err != nil || !strings.Contains(out, f.main) {
		t.Fatalf("ls-remote over the kept listing: %v\n%s", err, out)
	}

	// A push moves main: the next listing names the new commit at once.
	dir, out, err := f.clone(pushToken)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	next := commitIn(t, dir, "b.txt", 10)
	if out, err := f.git(dir, pushToken, "push", "-q", f.URL("sample"), "HEAD:main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	third, _ := f.listing(false)
	if !strings.Contains(third, next+" refs/heads/main") {
		t.Fatalf("after the push the listing does not name main at %s:\n%q", next, third)
	}

	// The same refs packed read as another state: listed afresh, the same.
	gitIn(t, "", "--git-dir="+filepath.Join(f.root, "sample.git"), "pack-refs", "--all")
	n = runs()
	fourth, _ := f.listing(false)
	if fourth != third {
		t.Errorf("the listing changed with packing alone:\n%q\n%q", third, fourth)
	}
	if runs() == n {
		t.Errorf("a listing after the refs were packed did not run git")
	}

	// A new tag is a change too.
	gitIn(t, "", "--git-dir="+filepath.Join(f.root, "sample.git"), "tag", "v1", next)
	if fifth, _ := f.listing(false); !strings.Contains(fifth, next+" refs/tags/v1") {
		t.Errorf("the listing after a tag does not name it:\n%q", fifth)
	}

	// Protocol v2 always goes to git.
	n = runs()
	if v2, _ := f.listing(true); !strings.Contains(v2, "version 2") {
		t.Errorf("a v2 request was not answered in v2:\n%q", v2)
	}
	if runs() == n {
		t.Errorf("a protocol v2 request was answered without git")
	}
}
