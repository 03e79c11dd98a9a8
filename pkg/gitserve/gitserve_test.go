package gitserve_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/gitserve"
	"github.com/airlockhq/airlock/pkg/gitserve/gitservetest"
)

// Tokens of the fixture's two repositories; all long enough for New.
const (
	readToken   = "read-token-5b1e0c8d2f9a4e77"
	pushToken   = "push-token-a83f61c2d04b9e15"
	secondToken = "second-token-0d9c7b3a51e2f846"
)

// fixture is a real server on loopback over TLS from a throwaway CA,
// serving "sample" (main and feature branches) and "second".
type fixture struct {
	*gitservetest.Remote
	t    *testing.T
	root string
	main string // sample's main commit
}

func start(t *testing.T, adjust ...func(*gitserve.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, root: filepath.Join(t.TempDir(), "repos")}
	src := filepath.Join(t.TempDir(), "src")
	gitIn(t, "", "init", "-q", "-b", "main", src)
	writeFile(t, filepath.Join(src, "README.md"), "hello\n")
	gitIn(t, src, "add", "-A")
	gitIn(t, src, "commit", "-q", "-m", "first")
	gitIn(t, src, "branch", "feature")
	f.main = strings.TrimSpace(gitIn(t, src, "rev-parse", "main"))
	for _, name := range []string{"sample", "second"} {
		if err := gitserve.CloneBare(t.Context(), "", src, filepath.Join(f.root, name+".git")); err != nil {
			t.Fatal(err)
		}
	}
	cfg := gitserve.Config{
		Root: f.root,
		Repositories: []gitserve.Repository{
			{Name: "sample", ReadTokens: []string{readToken}, PushTokens: []string{pushToken}},
			{Name: "second", ReadTokens: []string{secondToken}},
		},
	}
	for _, a := range adjust {
		a(&cfg)
	}
	// Registered first, so it runs after the server has stopped.
	t.Cleanup(f.checkLogHasNoSecret)
	f.Remote = gitservetest.Start(t, cfg)
	return f
}

// git runs git as a client of the server in dir: trusting only the test
// CA, with the token (if any) sent the way Airlock sends it, through
// http.extraHeader in the environment. It returns the combined output.
func (f *fixture) git(dir, token string, args ...string) (string, error) {
	f.t.Helper()
	cfg := [][2]string{{"http.sslCAInfo", f.CAFile}, {"credential.helper", ""}, {"protocol.allow", "never"}, {"protocol.https.allow", "always"}}
	if token != "" {
		cfg = append(cfg, [2]string{"http.extraHeader", "Authorization: " + basic(token)})
	}
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = clientEnv(f.t, cfg)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// clone clones sample with the token into a fresh directory.
func (f *fixture) clone(token string) (string, string, error) {
	f.t.Helper()
	dir := filepath.Join(f.t.TempDir(), "clone")
	out, err := f.git("", token, "clone", "-q", f.URL("sample"), dir)
	return dir, out, err
}

// serverRef is where ref points in the served repository, or "" if nowhere.
func (f *fixture) serverRef(ref string) string {
	f.t.Helper()
	out, err := exec.Command("git", "--git-dir="+filepath.Join(f.root, "sample.git"), "rev-parse", "--verify", "--quiet", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// request sends one request with exactly this request target (no client
// library cleaning it), and a git content type if given, and returns the
// status.
func (f *fixture) request(method, target, token string, contentType ...string) int {
	f.t.Helper()
	pool := x509.NewCertPool()
	data, err := os.ReadFile(f.CAFile)
	if err != nil {
		f.t.Fatal(err)
	}
	pool.AppendCertsFromPEM(data)
	conn, err := tls.Dial("tcp", f.Addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close()
	auth := ""
	if token != "" {
		auth = "Authorization: " + basic(token) + "\r\n"
	}
	for _, ct := range contentType {
		auth += "Content-Type: " + ct + "\r\n"
	}
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n", method, target, f.Addr, auth)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkLogHasNoSecret fails if any token, in any form git or the server
// could have written it, is in the server's log.
func (f *fixture) checkLogHasNoSecret() {
	logs := f.Logs.String()
	if !strings.Contains(logs, `"msg":"git request`) {
		f.t.Errorf("the server logged no request; the log check checks nothing:\n%s", logs)
	}
	for _, tok := range []string{readToken, pushToken, secondToken, "wrong-token-0000000000000000"} {
		for _, form := range []string{tok, basic(tok), base64.StdEncoding.EncodeToString([]byte(tok))} {
			if strings.Contains(logs, form) {
				f.t.Errorf("the server's log holds a credential (%q):\n%s", form, logs)
			}
		}
	}
}

// logged reports whether a denial with this reason was logged.
func (f *fixture) logged(reason string) bool {
	return strings.Contains(f.Logs.String(), `"reason":"`+reason)
}

func TestCloneWithReadOrPushCredential(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, token := range []string{readToken, pushToken} {
		dir, out, err := f.clone(token)
		if err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(gitIn(t, dir, "rev-parse", "HEAD")); got != f.main {
			t.Errorf("cloned HEAD %s, want main's %s", got, f.main)
		}
	}
	if !strings.Contains(f.Logs.String(), `"access":"read"`) || !strings.Contains(f.Logs.String(), `"git_service":"git-upload-pack"`) {
		t.Errorf("the log does not say who fetched:\n%s", f.Logs.String())
	}
}

func TestCloneRefused(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, tc := range []struct {
		name, token string
		status      int
		reason      string
	}{
		{"no credential", "", http.StatusUnauthorized, "no credential"},
		{"wrong credential", "wrong-token-0000000000000000", http.StatusUnauthorized, "unknown credential"},
		{"another repository's credential", secondToken, http.StatusNotFound, "no such repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := f.request("GET", "/sample.git/info/refs?service=git-upload-pack", tc.token); got != tc.status {
				t.Errorf("info/refs: status %d, want %d", got, tc.status)
			}
			if _, out, err := f.clone(tc.token); err == nil {
				t.Errorf("git clone succeeded:\n%s", out)
			}
			if !f.logged(tc.reason) {
				t.Errorf("no denial %q in the log:\n%s", tc.reason, f.Logs.String())
			}
		})
	}
}

// commitIn makes a commit in the clone at dir, of a file of the given size
// (random, so it does not compress), and returns it.
func commitIn(t *testing.T, dir, name string, size int) string {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	writeFile(t, filepath.Join(dir, name), base64.StdEncoding.EncodeToString(data))
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "-q", "-m", "change "+name)
	return strings.TrimSpace(gitIn(t, dir, "rev-parse", "HEAD"))
}

func TestPushNeedsTheDeployCredential(t *testing.T) {
	t.Parallel()
	f := start(t)
	dir, out, err := f.clone(readToken)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	next := commitIn(t, dir, "a.txt", 100)

	for _, tc := range []struct {
		name, token string
		status      int
	}{
		{"no credential", "", http.StatusUnauthorized},
		{"read credential", readToken, http.StatusForbidden},
		{"another repository's credential", secondToken, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := f.request("GET", "/sample.git/info/refs?service=git-receive-pack", tc.token); got != tc.status {
				t.Errorf("info/refs for receive-pack: status %d, want %d", got, tc.status)
			}
			if got := f.request("POST", "/sample.git/git-receive-pack", tc.token, "application/x-git-receive-pack-request"); got != tc.status {
				t.Errorf("receive-pack: status %d, want %d", got, tc.status)
			}
			if out, err := f.git(dir, tc.token, "push", f.URL("sample"), "HEAD:main"); err == nil {
				t.Errorf("push succeeded:\n%s", out)
			}
			if got := f.serverRef("main"); got != f.main {
				t.Errorf("main moved to %s on the server", got)
			}
		})
	}
	if !f.logged("git-receive-pack needs the push credential") {
		t.Errorf("the read credential's push was not logged as denied:\n%s", f.Logs.String())
	}

	t.Run("deploy credential, fast-forward", func(t *testing.T) {
		if out, err := f.git(dir, pushToken, "push", f.URL("sample"), "HEAD:main"); err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		if got := f.serverRef("main"); got != next {
			t.Errorf("main is %s on the server, want the pushed %s", got, next)
		}
	})
}

func TestForcePushRefused(t *testing.T) {
	t.Parallel()
	f := start(t)
	dir, out, err := f.clone(pushToken)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	// A history that does not contain main: a rewrite of its commit.
	gitIn(t, dir, "commit", "-q", "--amend", "-m", "rewritten")
	out, err = f.git(dir, pushToken, "push", "--force", f.URL("sample"), "HEAD:main")
	if err == nil {
		t.Fatalf("force push succeeded:\n%s", out)
	}
	if !strings.Contains(out, "remote rejected") || !strings.Contains(out, "non-fast-forward") {
		t.Errorf("force push was not refused by the server's receive-pack:\n%s", out)
	}
	if got := f.serverRef("main"); got != f.main {
		t.Errorf("main is %s on the server after a refused force push, want %s", got, f.main)
	}
}

func TestDeleteRefused(t *testing.T) {
	t.Parallel()
	f := start(t)
	dir, out, err := f.clone(pushToken)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	for _, branch := range []string{"main", "feature"} {
		out, err := f.git(dir, pushToken, "push", f.URL("sample"), ":"+branch)
		if err == nil {
			t.Errorf("deleting %s succeeded:\n%s", branch, out)
		}
		if !strings.Contains(out, "deletion prohibited") {
			t.Errorf("deleting %s was not refused by the server's receive-pack:\n%s", branch, out)
		}
		if f.serverRef(branch) != f.main {
			t.Errorf("%s is gone from the server", branch)
		}
	}
}

func TestOnlyServedEndpoints(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, tc := range []struct {
		method, target string
		status         int
	}{
		{"GET", "/../x", http.StatusNotFound},
		{"GET", "/%2e%2e/x", http.StatusNotFound},
		{"GET", "/other.git/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/sample.git/../second.git/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/sample.git/info/refs/../../../etc/passwd", http.StatusNotFound},
		{"GET", "//sample.git/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/sample.git.git/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/.git/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/sample/info/refs?service=git-upload-pack", http.StatusNotFound},
		{"GET", "/sample.git/HEAD", http.StatusNotFound},
		{"GET", "/sample.git/config", http.StatusNotFound},
		{"GET", "/sample.git/objects/info/packs", http.StatusNotFound},
		{"GET", "/sample.git/info/refs", http.StatusForbidden}, // the dumb protocol
		{"GET", "/sample.git/info/refs?service=git-upload-pack&x=1", http.StatusForbidden},
		{"PUT", "/sample.git/info/refs?service=git-upload-pack", http.StatusMethodNotAllowed},
		{"GET", "/sample.git/git-upload-pack", http.StatusMethodNotAllowed},
		{"POST", "/sample.git/git-upload-pack", http.StatusBadRequest}, // no git content type
		{"GET", "/sample.git/info/refs?service=git-upload-pack", http.StatusOK},
	} {
		if got := f.request(tc.method, tc.target, pushToken); got != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.target, got, tc.status)
		}
	}
}

// TestPushBodyBounds pushes a pack larger than git's 1 MiB post buffer,
// which git sends chunked: under the bound it lands, over it it is refused
// before git sees it.
func TestPushBodyBounds(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *gitserve.Config) { c.MaxPush = 3 << 20 })
	dir, out, err := f.clone(pushToken)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	next := commitIn(t, dir, "big.txt", 3<<19) // 2 MiB once in base64
	if out, err := f.git(dir, pushToken, "push", f.URL("sample"), "HEAD:main"); err != nil {
		t.Fatalf("push of 2 MiB: %v\n%s", err, out)
	}
	if got := f.serverRef("main"); got != next {
		t.Fatalf("main is %s on the server, want the pushed %s", got, next)
	}
	commitIn(t, dir, "bigger.txt", 3<<20) // 4 MiB
	if out, err := f.git(dir, pushToken, "push", f.URL("sample"), "HEAD:main"); err == nil {
		t.Errorf("push of 4 MiB over a 3 MiB bound succeeded:\n%s", out)
	}
	if got := f.serverRef("main"); got != next {
		t.Errorf("main moved to %s on the server", got)
	}
	if !f.logged("request body over") {
		t.Errorf("the oversized push was not refused for its size:\n%s", f.Logs.String())
	}
}

// TestBackendNeverSeesTheCredential runs the server's git through a wrapper
// that records its environment: the backend learns what access the caller
// has, never the credential that proved it.
func TestBackendNeverSeesTheCredential(t *testing.T) {
	t.Parallel()
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	wrap := t.TempDir()
	envLog := filepath.Join(wrap, "env.log")
	script := "#!/bin/sh\nenv >> " + envLog + "\nexec " + realGit + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrap, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f := start(t, func(c *gitserve.Config) { c.Git = filepath.Join(wrap, "git") })
	if _, out, err := f.clone(readToken); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	env, err := os.ReadFile(envLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "REMOTE_USER=airlock-read") {
		t.Fatalf("the wrapper never ran the backend; the test tests nothing:\n%s", env)
	}
	for _, form := range []string{readToken, basic(readToken), "HTTP_AUTHORIZATION"} {
		if strings.Contains(string(env), form) {
			t.Errorf("the backend's environment holds %q", form)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	src := filepath.Join(t.TempDir(), "src")
	gitIn(t, "", "init", "-q", "-b", "main", src)
	if err := gitserve.CloneBare(t.Context(), "", src, filepath.Join(root, "ok.git")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "plain.git"), 0o700); err != nil {
		t.Fatal(err)
	}
	tokens := func(name string, read ...string) gitserve.Repository {
		return gitserve.Repository{Name: name, ReadTokens: read}
	}
	for _, tc := range []struct {
		name  string
		repos []gitserve.Repository
		want  string
	}{
		{"no repositories", nil, "no repositories"},
		{"path in a name", []gitserve.Repository{tokens("../ok", readToken)}, "repository name"},
		{"name ending in .git", []gitserve.Repository{tokens("ok.git", readToken)}, "repository name"},
		{"missing", []gitserve.Repository{tokens("gone", readToken)}, "not a bare git repository"},
		{"not a repository", []gitserve.Repository{tokens("plain", readToken)}, "not a bare git repository"},
		{"no token", []gitserve.Repository{tokens("ok")}, "has no token"},
		{"short token", []gitserve.Repository{tokens("ok", "short")}, "at least 16"},
		{"token twice", []gitserve.Repository{{Name: "ok", ReadTokens: []string{readToken}, PushTokens: []string{readToken}}}, "give each its own"},
		{"listed twice", []gitserve.Repository{tokens("ok", readToken), tokens("ok", pushToken)}, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gitserve.New(t.Context(), gitserve.Config{Root: root, Repositories: tc.repos})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
			for _, r := range tc.repos {
				for _, tok := range append(r.ReadTokens, r.PushTokens...) {
					if strings.Contains(err.Error(), tok) {
						t.Errorf("the error names the token %q: %v", tok, err)
					}
				}
			}
		})
	}
	// CloneBare protected the clone in its own config.
	for _, key := range []string{"receive.denyNonFastForwards", "receive.denyDeletes"} {
		if got := strings.TrimSpace(gitIn(t, "", "config", "--file", filepath.Join(root, "ok.git", "config"), key)); got != "true" {
			t.Errorf("%s = %q in the bare repository's config, want true", key, got)
		}
	}
}

func basic(token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
}

// clientEnv is a git client's whole environment: no user config, a fixed
// author, and cfg as command-line config.
func clientEnv(t *testing.T, cfg [][2]string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + os.DevNull,
		"GIT_TERMINAL_PROMPT=0", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		fmt.Sprintf("GIT_CONFIG_COUNT=%d", len(cfg)),
	}
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	return env
}

// gitIn runs git locally (no server) in dir and returns its output.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = clientEnv(t, nil)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
