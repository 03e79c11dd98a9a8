package source_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"github.com/airlockhq/airlock/test/gittest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitserve"
	"github.com/airlockhq/airlock/pkg/gitserve/gitservetest"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

const (
	httpsReadToken = "demo-read-token-4c1f9e2a7b"
	httpsPushToken = "demo-push-token-8e3d0a6c5f"
)

// httpsRemote serves origin as demo.git from a real git server over TLS
// with a throwaway CA (gitservetest), and returns the repository as the
// authority's config would give it (URL, read credential, CA), the bare
// repository the server serves, and the server's log.
func httpsRemote(t testing.TB, origin *gittest.Repo) (policy.Repository, string, *logtest.Buffer) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "served")
	bare := filepath.Join(root, "demo.git")
	if err := gitserve.CloneBare(t.Context(), "", origin.Dir, bare); err != nil {
		t.Fatal(err)
	}
	remote := gitservetest.Start(t, gitserve.Config{
		Root:         root,
		Repositories: []gitserve.Repository{{Name: "demo", ReadTokens: []string{httpsReadToken}, PushTokens: []string{httpsPushToken}}},
	})
	credFile := filepath.Join(t.TempDir(), "demo.read")
	if err := os.WriteFile(credFile, []byte(httpsReadToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: remote.URL("demo"), Credential: credFile, CA: remote.CAFile}
	return repo, bare, remote.Logs
}

// TestFetchOverHTTPS fetches from a real git server over TLS with the
// repository's read credential and CA, the way the dev stack's authority
// does, and is refused without either.
func TestFetchOverHTTPS(t *testing.T) {
	r := newRepo(t)
	repo, bare, serverLogs := httpsRemote(t, r)
	s, logs, dir := newSource(t)

	for rev, want := range map[string]string{"main": r.RevParse("main"), "feature": r.RevParse("feature"), "HEAD": r.RevParse("main")} {
		got, err := s.Resolve(t.Context(), repo, rev)
		if err != nil {
			t.Fatalf("Resolve(%s) over https: %v\nserver log:\n%s", rev, err, serverLogs.String())
		}
		if got.Commit != want {
			t.Errorf("Resolve(%s) = %s, want %s", rev, got.Commit, want)
		}
	}
	if !strings.Contains(serverLogs.String(), `"access":"read"`) {
		t.Errorf("the server did not see the read credential:\n%s", serverLogs.String())
	}
	var buf bytes.Buffer
	if err := s.Archive(t.Context(), repo, r.RevParse("main"), &buf); err != nil {
		t.Fatalf("Archive: %v", err)
	}
	if !tarHas(t, buf.Bytes(), "README.md") {
		t.Error("the archive fetched over https lacks README.md")
	}

	// The remote's default branch moves: HEAD follows it.
	if out, err := exec.Command("git", "--git-dir="+bare, "symbolic-ref", "HEAD", "refs/heads/feature").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, err := s.Resolve(t.Context(), repo, "HEAD"); err != nil || got.Commit != r.RevParse("feature") {
		t.Errorf("HEAD after the remote's HEAD moved to feature: %v, %v; want %s", got.Commit, err, r.RevParse("feature"))
	}

	wrong := filepath.Join(t.TempDir(), "wrong.token")
	if err := os.WriteFile(wrong, []byte("not-the-token-at-all-0000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		adjust    func(*policy.Repository)
		serverLog string
	}{
		{"no credential", func(r *policy.Repository) { r.Credential = "" }, `"reason":"no credential"`},
		{"wrong credential", func(r *policy.Repository) { r.Credential = wrong }, `"reason":"unknown credential"`},
		// The system's roots do not know the dev CA: the handshake fails.
		{"no CA", func(r *policy.Repository) { r.CA = "" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := repo
			tc.adjust(&bad)
			fresh, _, _ := newSource(t)
			if _, err := fresh.Resolve(t.Context(), bad, "main"); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("Resolve: %v, want unavailable", err)
			}
			if tc.serverLog != "" && !strings.Contains(serverLogs.String(), tc.serverLog) {
				t.Errorf("the server did not refuse it (%s):\n%s", tc.serverLog, serverLogs.String())
			}
		})
	}

	for what, text := range map[string]string{"the authority's log": logs.String(), "the git server's log": serverLogs.String()} {
		if strings.Contains(text, httpsReadToken) {
			t.Errorf("the credential appears in %s", what)
		}
	}
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if data, _ := os.ReadFile(path); bytes.Contains(data, []byte(httpsReadToken)) {
				t.Errorf("the credential is on disk in %s", path)
			}
		}
		return nil
	})
}

func tarHas(t *testing.T, data []byte, name string) bool {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			return true
		}
	}
}
