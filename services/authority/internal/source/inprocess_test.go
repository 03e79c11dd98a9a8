package source_test

import (
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// gitCalls puts a git on PATH that logs each invocation before it runs the
// real one, and returns a function counting those whose subcommand is in
// want (all of them when want is empty) since the last call.
func gitCalls(t *testing.T) func(want ...string) int {
	t.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\nexec %s \"$@\"\n", log, real)
	if err := os.WriteFile(filepath.Join(dir, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	seen := 0
	return func(want ...string) int {
		data, _ := os.ReadFile(log)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(data) == 0 {
			lines = nil
		}
		n := 0
		for _, l := range lines[seen:] {
			// The git server's own processes are not the authority's.
			if strings.HasPrefix(l, "http-backend") || strings.HasPrefix(l, "upload-pack") || strings.Contains(l, "--stateless-rpc") {
				continue
			}
			if len(want) == 0 {
				n++
				continue
			}
			for _, w := range want {
				if strings.Contains(" "+l+" ", " "+w+" ") {
					n++
					break
				}
			}
		}
		seen = len(lines)
		return n
	}
}

// requests counts the git server's logged requests since the last call.
func requests(logs interface{ String() string }) func() int {
	seen := 0
	return func() int {
		n := strings.Count(logs.String(), `"msg":"git request"`)
		d := n - seen
		seen = n
		return d
	}
}

// A submission costs no process: once the mirror holds a commit, a branch
// resolves with one request to the git server (the ref listing) and a
// commit SHA with none, and neither runs git. A branch that moved to a
// commit the mirror lacks is fetched once, however many submissions want
// it at the same moment.
func TestResolveRunsNoGit(t *testing.T) {
	r := newRepo(t)
	repo, bare, serverLogs := httpsRemote(t, r)
	s, _, _ := newSource(t)
	main := r.RevParse("main")
	if got, err := s.Resolve(t.Context(), repo, "main"); err != nil || got.Commit != main {
		t.Fatalf("first Resolve: %v, %v", got, err)
	}
	cases := []struct {
		rev, want string
		requests  int
	}{
		{"main", main, 1},
		{"feature", r.RevParse("feature"), 1},
		{"v2", r.RevParse("v2^{commit}"), 1},
		{"HEAD", main, 1},
		{main, main, 0},
		// An abbreviation is looked up among the refs first, as git does.
		{main[:9], main, 1},
	}
	trees := map[string]string{}
	for _, tc := range cases {
		trees[tc.want] = r.RevParse(tc.want + "^{tree}")
	}
	calls, reqs := gitCalls(t), requests(serverLogs)
	reqs()
	for _, tc := range cases {
		got, err := s.Resolve(t.Context(), repo, tc.rev)
		if err != nil || got.Commit != tc.want || got.Tree != trees[tc.want] {
			t.Errorf("Resolve(%s) = %+v, %v; want %s", tc.rev, got, err, tc.want)
		}
		if n := calls(); n != 0 {
			t.Errorf("Resolve(%s) ran git %d times", tc.rev, n)
		}
		if n := reqs(); n != tc.requests {
			t.Errorf("Resolve(%s) made %d requests to the git server, want %d", tc.rev, n, tc.requests)
		}
	}

	// main moves on the server: 8 submissions at once fetch it once.
	r.Write("moved.txt", "moved\n")
	moved := r.Commit("moved")
	if out, err := exec.Command("git", "-C", r.Dir, "push", "-q", bare, "main").CombinedOutput(); err != nil {
		t.Fatalf("push to the served repository: %v\n%s", err, out)
	}
	var wg sync.WaitGroup
	var bad atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := s.Resolve(t.Context(), repo, "main"); err != nil || got.Commit != moved {
				t.Errorf("Resolve(main) after it moved: %+v, %v; want %s", got, err, moved)
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := calls("fetch"); n != 1 {
		t.Errorf("8 submissions of a moved branch fetched %d times, want 1", n)
	}
	if got, err := s.Resolve(t.Context(), repo, "main"); err != nil || got.Commit != moved {
		t.Fatalf("Resolve(main): %+v, %v", got, err)
	}
	if n := calls(); n != 0 {
		t.Errorf("Resolve(main) once the mirror had it ran git %d times", n)
	}
}

// The same holds for a local repository, read in place, and for a
// file:// URL: no git process for a branch, a tag or a SHA.
func TestResolveLocalRunsNoGit(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	for kind, repo := range repos(r) {
		if _, err := s.Resolve(t.Context(), repo, "main"); err != nil {
			t.Fatal(err)
		}
		revs := []string{"main", "v1", "v2", "HEAD", "refs/heads/feature", r.RevParse("feature")}
		want := map[string]string{}
		for _, rev := range revs {
			want[rev] = r.RevParse(rev + "^{commit}")
		}
		calls := gitCalls(t)
		for _, rev := range revs {
			got, err := s.Resolve(t.Context(), repo, rev)
			if err != nil || got.Commit != want[rev] {
				t.Errorf("%s: Resolve(%s) = %+v, %v", kind, rev, got, err)
			}
		}
		if n := calls(); n != 0 {
			t.Errorf("%s: resolving ran git %d times", kind, n)
		}
	}
}

// What the repository's refs and objects cannot give is refused as
// unknown, naming why where git would: an abbreviation two objects share,
// a tag of a tree.
func TestResolveAmbiguousAndNonCommits(t *testing.T) {
	r := newRepo(t)
	tree := r.RevParse("main^{tree}")
	r.Run("tag", "-a", "-m", "a tree", "treetag", tree)
	s, _, _ := newSource(t)
	for kind, repo := range repos(r) {
		for _, rev := range []string{"treetag", tree, "nosuchbranch", "0000000000000000000000000000000000000000"} {
			if _, err := s.Resolve(t.Context(), repo, rev); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: Resolve(%s) = %v, want an unknown revision", kind, rev, err)
			}
		}
	}
	// Two commits whose ids share 4 hex digits: made with commit-tree on
	// one tree until their prefixes meet (a few hundred, by the birthday
	// bound). A blob sharing a commit's prefix does not count, as with
	// git's rev^{commit}.
	byPrefix := map[string]string{}
	shared := ""
	for i := 0; shared == "" && i < 5000; i++ {
		out, err := exec.Command("git", "-C", r.Dir, "commit-tree", "-m", fmt.Sprint("c", i), tree).Output()
		if err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(string(out))
		if _, ok := byPrefix[id[:4]]; ok {
			shared = id[:4]
		}
		byPrefix[id[:4]] = id
	}
	if shared == "" {
		t.Fatal("no two commits share a prefix")
	}
	_, err := s.Resolve(t.Context(), repos(r)["local"], shared)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("Resolve(%s), shared by two commits: %v; want ambiguous", shared, err)
	}
}

// A redirect is never followed (it could carry the credential to another
// host): the listing fails naming it, and the other host sees nothing. A
// server that does not speak git's smart protocol is named as such.
func TestRefListingRefusals(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusMovedPermanently)
		}, "redirect is not followed"},
		{"dumb", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintln(w, "0000000000000000000000000000000000000000\trefs/heads/main")
		}, "does not speak git's smart HTTP protocol"},
		{"huge packet", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
			fmt.Fprint(w, "001e# service=git-upload-pack\n0000ffff")
		}, "packet length"},
		{"truncated", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
			fmt.Fprint(w, "001e# service=git-upload-pack\n00000040abc")
		}, "truncated"},
		{"denied", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusForbidden) }, "403 Forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(tc.handler)
			defer srv.Close()
			ca := filepath.Join(t.TempDir(), "ca.pem")
			if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
				t.Fatal(err)
			}
			cred := filepath.Join(t.TempDir(), "cred")
			if err := os.WriteFile(cred, []byte("sekrit-token-value-123\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			s, logs, _ := newSource(t)
			repo := policy.Repository{Tenant: "dev", Name: "demo", URL: srv.URL + "/demo.git", CA: ca, Credential: cred}
			_, err := s.Resolve(t.Context(), repo, "main")
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Resolve: %v; want unavailable saying %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error()+logs.String(), "sekrit") {
				t.Errorf("the credential leaked: %v", err)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests", n)
	}
}
