package source_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// Every loose ref outranks its packed value, as in git, not only branches
// and tags (a stale packed refs/remotes/origin/x won before).
func TestHostileLooseRemoteRef(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	first := r.RevParse("main~1")
	r.Run("update-ref", "refs/remotes/origin/x", first)
	r.Run("pack-refs", "--all")
	main := r.RevParse("main")
	r.Run("update-ref", "refs/remotes/origin/x", main)
	want := r.RevParse("origin/x^{commit}")
	got, err := s.Resolve(t.Context(), repos(r)["local"], "origin/x")
	t.Logf("git: %s; Resolve: %s %v", want, got.Commit, err)
	if err != nil || got.Commit != want {
		t.Errorf("Resolve(origin/x) = %s, %v; git says %s", got.Commit, err, want)
	}
}

// A packed-refs peel line is not trusted: the objects are peeled, as git
// does (a planted peel line on a branch redirected it before).
func TestHostilePeeledBranch(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	main, first := r.RevParse("main"), r.RevParse("main~1")
	pr := filepath.Join(r.Dir, ".git", "packed-refs")
	old, _ := os.ReadFile(pr)
	data := string(old) + main + " refs/heads/pb\n^" + first + "\n"
	if !strings.HasPrefix(data, "#") {
		data = "# pack-refs with: peeled fully-peeled sorted \n" + data
	}
	if err := os.WriteFile(pr, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	want := r.RevParse("pb^{commit}")
	got, err := s.Resolve(t.Context(), repos(r)["local"], "pb")
	t.Logf("git: %s; Resolve: %s %v", want, got.Commit, err)
	if err != nil || got.Commit != want {
		t.Errorf("Resolve(pb) = %s, %v; git says %s", got.Commit, err, want)
	}
}

// A SHA in capitals resolves, as git takes it.
func TestHostileUppercaseSHA(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	up := strings.ToUpper(r.RevParse("main"))
	want := r.RevParse(up + "^{commit}")
	got, err := s.Resolve(t.Context(), repos(r)["local"], up)
	if err != nil || got.Commit != want {
		t.Errorf("Resolve(%s) = %s, %v; git says %s", up, got.Commit, err, want)
	}
}

// A short SHA shared by a commit and a blob resolves to the commit, as
// git's rev^{commit} does (it was called ambiguous before).
func TestHostileShortCommitAndBlob(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	main := r.RevParse("main")
	prefix := main[:5]
	var content string
	for i := 0; ; i++ {
		c := fmt.Sprint("x", i)
		h := sha1.Sum([]byte(fmt.Sprintf("blob %d\x00%s", len(c), c)))
		if strings.HasPrefix(hex.EncodeToString(h[:]), prefix) {
			content = c
			break
		}
	}
	r.Write("collide.txt", content)
	r.Run("hash-object", "-w", "collide.txt")
	out, _ := exec.Command("git", "-C", r.Dir, "rev-parse", "--verify", "--quiet", prefix+"^{commit}").CombinedOutput()
	got, err := s.Resolve(t.Context(), repos(r)["local"], prefix)
	t.Logf("git: %q; Resolve: %s %v", out, got.Commit, err)
	if err != nil || got.Commit != main {
		t.Errorf("Resolve(%s) = %s, %v; git says %q", prefix, got.Commit, err, out)
	}
}

// A FIFO where packed-refs belongs is refused at once (it blocked Resolve
// for ever before, whatever ctx said).
func TestHostileFIFOPackedRefs(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	pr := filepath.Join(r.Dir, ".git", "packed-refs")
	os.Remove(pr)
	if err := syscall.Mkfifo(pr, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Resolve(ctx, repos(r)["local"], "main")
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("returned: %v", err)
	case <-time.After(3 * time.Second):
		t.Errorf("Resolve still blocked 3s after a 300ms deadline")
		f, _ := os.OpenFile(pr, os.O_WRONLY, 0)
		f.Close()
		<-done
	}
}

// The caller that starts a listing gives up at its own deadline (it waited
// past it for the server before).
func TestHostileLeaderIgnoresDeadline(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * time.Second)
		http.Error(w, "no", http.StatusForbidden)
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	s, _, _ := newSource(t)
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: srv.URL + "/demo.git", CA: ca}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Resolve(ctx, repo, "main")
	if d := time.Since(start); d > time.Second {
		t.Errorf("Resolve with a 200ms deadline took %v: %v", d, err)
	}
}

// A file:// URL is unescaped, as git reads it.
func TestHostilePercentFileURL(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	spaced := filepath.Join(t.TempDir(), "a b")
	if out, err := exec.Command("git", "clone", "-q", "--bare", r.Dir, spaced).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	repo := policy.Repository{Tenant: "dev", Name: "sp", URL: "file://" + strings.ReplaceAll(spaced, " ", "%20")}
	if _, err := exec.Command("git", "ls-remote", repo.URL).Output(); err != nil {
		t.Fatalf("git ls-remote refuses it too: %v", err)
	}
	if _, err := s.Resolve(t.Context(), repo, "main"); err != nil {
		t.Errorf("Resolve over %s: %v (git ls-remote reads it)", repo.URL, err)
	}
}

// A linked worktree's HEAD and branches resolve from its own and its
// common directory.
func TestHostileLinkedWorktree(t *testing.T) {
	r := newRepo(t)
	s, _, _ := newSource(t)
	wt := filepath.Join(t.TempDir(), "wt")
	r.Run("worktree", "add", "-q", "--detach", wt, "main~1")
	repo := policy.Repository{Tenant: "dev", Name: "wt", URL: wt}
	want := r.RevParse("main~1")
	got, err := s.Resolve(t.Context(), repo, "HEAD")
	if err != nil || got.Commit != want {
		t.Errorf("Resolve(HEAD) in a linked worktree = %s, %v; want %s", got.Commit, err, want)
	}
	got, err = s.Resolve(t.Context(), repo, "feature")
	if err != nil || got.Commit != r.RevParse("feature") {
		t.Errorf("Resolve(feature) in a linked worktree = %s, %v", got.Commit, err)
	}
}

// A server that reflects the Authorization header gets none of it into the
// error (its Content-Type carried it there before).
func TestHostileReflectedCredential(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	cred := filepath.Join(t.TempDir(), "cred")
	os.WriteFile(cred, []byte("sekrit-token-value-123\n"), 0o600)
	s, _, _ := newSource(t)
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: srv.URL + "/demo.git", CA: ca, Credential: cred}
	_, err := s.Resolve(t.Context(), repo, "main")
	if err == nil {
		t.Fatal("resolved against a server that is not a git server")
	}
	for _, form := range []string{"sekrit", "Basic ", "eC1hY2Nlc3Mt"} {
		if strings.Contains(err.Error(), form) {
			t.Errorf("the server's echo of the credential (%q) is in the error: %v", form, err)
		}
	}
}
