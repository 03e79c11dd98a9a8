package stage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/airlockhq/airlock/test/gittest"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// historyRepo is a real repository of n commits on main, each changing
// one file and adding another.
func historyRepo(t *testing.T, n int) *repo {
	t.Helper()
	dir := t.TempDir()
	gittest.Run(t, dir, "init", "--quiet", "-b", "main")
	for i := 1; i <= n; i++ {
		writeFiles(t, dir, map[string]string{"README.md": fmt.Sprintf("version %d\n", i), fmt.Sprintf("f%d.txt", i): fmt.Sprintf("file %d\n", i)})
		gittest.Run(t, dir, "add", "--all")
		gittest.Run(t, dir, "commit", "--quiet", "-m", fmt.Sprintf("commit %d", i))
	}
	return &repo{
		dir:     dir,
		commit:  strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD")),
		tree:    strings.TrimSpace(gittest.Run(t, dir, "rev-parse", "HEAD^{tree}")),
		archive: []byte(gittest.Run(t, dir, "archive", "--format=tar", "HEAD")),
	}
}

func (r *repo) rev(t *testing.T, expr string) string {
	t.Helper()
	return strings.TrimSpace(gittest.Run(t, r.dir, "rev-parse", "--verify", expr))
}

// pack is what the authority sends: the objects of the given commits
// (their own trees, not their parents'), less the base tree's, plus any
// extra objects, as one git pack made by git itself.
func (r *repo) pack(t *testing.T, commits []string, extra ...string) []byte {
	t.Helper()
	inTree := map[string]bool{}
	for _, line := range strings.Split(gittest.Run(t, r.dir, "rev-list", "--objects", "HEAD^{tree}"), "\n") {
		id, _, _ := strings.Cut(line, " ")
		inTree[id] = true
	}
	var list []string
	if len(commits) > 0 {
		for _, line := range strings.Split(strings.TrimSpace(gittest.Run(t, r.dir, append([]string{"rev-list", "--objects", "--no-walk"}, commits...)...)), "\n") {
			id, _, _ := strings.Cut(line, " ")
			if !inTree[id] {
				list = append(list, id)
			}
		}
	}
	list = append(list, extra...)
	return packOf(t, r.dir, list)
}

func packOf(t *testing.T, dir string, ids []string) []byte {
	t.Helper()
	cmd := gittest.Cmd(dir, "pack-objects", "--stdout", "--quiet")
	cmd.Stdin = strings.NewReader(strings.Join(ids, "\n") + "\n")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pack-objects: %v: %s", err, stderr.String())
	}
	return out.Bytes()
}

// historyFetcher is a fetcher whose header promises depth and whose
// history part is hist.
func historyFetcher(r *repo, depth int, hist stage.History, pack []byte) *fetcher {
	f := &fetcher{hdr: stage.Header{Commit: r.commit, TreeHash: r.tree, HistoryDepth: depth}, data: r.archive}
	f.hdr.CommitObject = []byte(gitOut(r.dir, "cat-file", "commit", "HEAD"))
	if depth > 1 {
		f.hdr.History = func() (stage.History, error) {
			h := hist
			h.Pack = bytes.NewReader(pack)
			return h, nil
		}
	}
	return f
}

// jobGitDir is a repository borrowing src's objects, shallow at the
// boundary the stage found: the .git a job gets, outside a sandbox.
func jobGitDir(t *testing.T, src *stage.Source) string {
	t.Helper()
	gitDir := filepath.Join(t.TempDir(), "job.git")
	gittest.Run(t, t.TempDir(), "init", "--quiet", "--bare", gitDir)
	writeFiles(t, gitDir, map[string]string{"objects/info/alternates": src.GitObjects + "\n"})
	if len(src.Shallow) > 0 {
		writeFiles(t, gitDir, map[string]string{"shallow": strings.Join(src.Shallow, "\n") + "\n"})
	}
	return gitDir
}

// logOf runs git args... commit in a job's .git over src.
func logOf(t *testing.T, src *stage.Source, commit string, args ...string) string {
	t.Helper()
	gitDir := jobGitDir(t, src)
	return gittest.Run(t, gitDir, append([]string{"--git-dir", gitDir}, append(args, commit)...)...)
}

// TestHistoryDepth3: a tenant of depth 3 over a 10-commit repository gets
// exactly the base and its two parents, shallow at the third, with the
// trees git diff needs; a depth-1 tenant on the same commit keeps its own
// objects, and the tree is fetched once for both.
func TestHistoryDepth3(t *testing.T) {
	r := historyRepo(t, 10)
	c, _ := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit}

	one, err := c.Get(context.Background(), k, historyFetcher(r, 1, stage.History{}, nil).fetch)
	k.Depth = 3
	if err != nil {
		t.Fatalf("depth 1: %v", err)
	}
	if got := strings.Fields(logOf(t, one, r.commit, "log", "--format=%H")); !slices.Equal(got, []string{r.commit}) || !slices.Equal(one.Shallow, []string{r.commit}) {
		t.Fatalf("depth 1: log %v, shallow %v; want the base alone", got, one.Shallow)
	}

	ancestors := []string{r.rev(t, "HEAD~1"), r.rev(t, "HEAD~2")}
	f := historyFetcher(r, 3, stage.History{Depth: 3, Commits: 2}, r.pack(t, ancestors))
	three, err := c.Get(context.Background(), k, f.fetch)
	if err != nil {
		t.Fatalf("depth 3: %v", err)
	}
	want := append([]string{r.commit}, ancestors...)
	if got := strings.Fields(logOf(t, three, r.commit, "log", "--format=%H")); !slices.Equal(got, want) {
		t.Fatalf("depth 3: log %v, want %v", got, want)
	}
	if !slices.Equal(three.Shallow, []string{r.rev(t, "HEAD~2")}) || three.HistoryDepth != 3 {
		t.Errorf("depth 3: shallow %v (depth %d), want HEAD~2", three.Shallow, three.HistoryDepth)
	}
	if stat := logOf(t, three, r.commit, "diff", "--stat", r.rev(t, "HEAD~2")); !strings.Contains(stat, "f10.txt") || !strings.Contains(stat, "README.md") {
		t.Errorf("diff against HEAD~2: %q", stat)
	}
	if !three.Cached || f.opened.Load() != 0 {
		t.Errorf("the retained tree was fetched again for another depth (cached %v, %d archive reads)", three.Cached, f.opened.Load())
	}
	if three.GitObjects == one.GitObjects {
		t.Errorf("depths 1 and 3 share %s", one.GitObjects)
	}
	// HEAD~3 and beyond are not there at all.
	gitDir := jobGitDir(t, three)
	for _, beyond := range []string{"HEAD~3", "HEAD~3^{tree}", "HEAD~3:README.md"} {
		if gittest.Cmd(gitDir, "--git-dir", gitDir, "cat-file", "-e", r.rev(t, beyond)).Run() == nil {
			t.Errorf("%s is in the depth-3 objects", beyond)
		}
	}
	noFetch := func(context.Context) (stage.Header, io.ReadCloser, error) {
		t.Error("a retained tree and depth fetched again")
		return stage.Header{}, nil, errors.New("no fetch")
	}
	again, err := c.Get(context.Background(), k, noFetch)
	if err != nil || again.GitObjects != three.GitObjects || !slices.Equal(again.Shallow, three.Shallow) || !again.Cached {
		t.Fatalf("depth 3 again: %+v, %v; want the retained objects", again, err)
	}
	// An authority whose header names another depth than the grant's is
	// refused.
	c2, _ := newCache(t)
	if _, err := c2.Get(context.Background(), k, historyFetcher(r, 5, stage.History{}, nil).fetch); err == nil || !strings.Contains(err.Error(), "depth of 5; the job's grant says 3") {
		t.Fatalf("a header of another depth: %v", err)
	}
	// The depth-1 staging is untouched by the depth-3 one.
	if got := strings.Fields(logOf(t, one, r.commit, "log", "--format=%H")); len(got) != 1 {
		t.Errorf("depth 1 after depth 3: log %v", got)
	}
}

// TestHistoryCutByAuthority: an authority that cut the history to a
// smaller depth (its size bound) sends that depth, and the job's .git has
// it; one that claims more than the header's depth is refused.
func TestHistoryCutByAuthority(t *testing.T) {
	r := historyRepo(t, 10)
	c, _ := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit, Depth: 8}
	src, err := c.Get(context.Background(), k, historyFetcher(r, 8, stage.History{Depth: 2, Commits: 1}, r.pack(t, []string{r.rev(t, "HEAD~1")})).fetch)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(logOf(t, src, r.commit, "log", "--format=%H")); len(got) != 2 {
		t.Errorf("cut to depth 2: log %v", got)
	}
	c2, _ := newCache(t)
	k.Depth = 2
	_, err = c2.Get(context.Background(), k, historyFetcher(r, 2, stage.History{Depth: 3, Commits: 2}, r.pack(t, []string{r.rev(t, "HEAD~1"), r.rev(t, "HEAD~2")})).fetch)
	if !errors.Is(err, worktree.ErrBadHistory) || !strings.Contains(err.Error(), "sent depth 3 for a policy depth of 2") {
		t.Fatalf("a history deeper than promised: %v", err)
	}
}

// TestHistoryRefusals: what a hostile or broken authority could send as
// history is refused with a clear error before any job sees it, and
// leaves no git objects staged for the depth (the tree itself, verified,
// stays).
func TestHistoryRefusals(t *testing.T) {
	r := historyRepo(t, 10)
	other := historyRepo(t, 4)
	writeFiles(t, other.dir, map[string]string{"secret.txt": "another tenant's secret\n"})
	gittest.Run(t, other.dir, "add", "--all")
	gittest.Run(t, other.dir, "commit", "--quiet", "-m", "secret")
	foreignBlob := strings.TrimSpace(gittest.Run(t, other.dir, "rev-parse", "HEAD:secret.txt"))
	// other's blob must be packable from r's directory for the splice.
	otherPack := packOf(t, other.dir, []string{foreignBlob})
	cmd := gittest.Cmd(r.dir, "index-pack", "--stdin")
	cmd.Stdin = bytes.NewReader(otherPack)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("splice: %v: %s", err, out)
	}
	p1, p2, p3 := r.rev(t, "HEAD~1"), r.rev(t, "HEAD~2"), r.rev(t, "HEAD~3")
	for _, tc := range []struct {
		name string
		hist stage.History
		pack []byte
		want string
	}{
		{"missing parent", stage.History{Depth: 3, Commits: 2}, r.pack(t, []string{p1}), "a commit within depth 3 is missing"},
		{"object of another repository", stage.History{Depth: 3, Commits: 2}, r.pack(t, []string{p1, p2}, foreignBlob), "holds 1 objects the history within depth 3 does not reach (" + foreignBlob + ")"},
		{"commit beyond the depth", stage.History{Depth: 3, Commits: 2}, r.pack(t, []string{p1, p2, p3}), "objects the history within depth 3 does not reach"},
		{"garbage", stage.History{Depth: 3, Commits: 2}, []byte("PACK\x00\x00\x00\x02 this is not a pack at all"), "not a valid git pack"},
		{"empty", stage.History{Depth: 3, Commits: 2}, nil, "not a valid git pack"},
		{"chain not from the base", stage.History{Depth: 3, Commits: 2}, other.pack(t, []string{other.rev(t, "HEAD~1"), other.rev(t, "HEAD~2")}),
			"does not start at the base commit " + r.commit + ": its parent " + p1},
		{"commits miscounted", stage.History{Depth: 3, Commits: 5}, r.pack(t, []string{p1, p2}), "the sender said 5 commits; depth 3"},
		{"no commits for a commit with parents", stage.History{Depth: 3, Commits: 0}, nil, "has parent " + p1},
		{"history missing", stage.History{Depth: 0}, nil, "sent depth 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, root := newCache(t)
			k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit, Depth: 3}
			f := historyFetcher(r, 3, tc.hist, tc.pack)
			_, err := c.Get(context.Background(), k, f.fetch)
			if !errors.Is(err, worktree.ErrBadHistory) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want ErrBadHistory saying %q", err, tc.want)
			}
			objects := treeDir(root, k) + ".objects-3"
			for _, p := range []string{objects, objects + ".ready", objects + ".quarantine"} {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after a refused history (%v)", p, err)
				}
			}
			// The next Get, with an honest history, stages it.
			good := historyFetcher(r, 3, stage.History{Depth: 3, Commits: 2}, r.pack(t, []string{p1, p2}))
			if src, err := c.Get(context.Background(), k, good.fetch); err != nil || !slices.Equal(src.Shallow, []string{p2}) {
				t.Fatalf("an honest history after a refusal: %+v, %v", src, err)
			}
		})
	}
	t.Run("history part absent", func(t *testing.T) {
		c, _ := newCache(t)
		f := historyFetcher(r, 3, stage.History{}, nil)
		f.hdr.History = func() (stage.History, error) { return stage.History{}, io.ErrUnexpectedEOF }
		_, err := c.Get(context.Background(), stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit, Depth: 3}, f.fetch)
		if err == nil || !strings.Contains(err.Error(), "history: unexpected EOF") {
			t.Fatalf("a stream without its history: %v", err)
		}
	})
}

// TestHistoryOfARootCommit: a depth beyond the repository's first commit
// is the whole history, with no shallow boundary.
func TestHistoryOfARootCommit(t *testing.T) {
	r := historyRepo(t, 2)
	c, _ := newCache(t)
	k := stage.Key{Tenant: "acme", Repository: "widgets", Commit: r.commit, Depth: 5}
	src, err := c.Get(context.Background(), k, historyFetcher(r, 5, stage.History{Depth: 5, Commits: 1}, r.pack(t, []string{r.rev(t, "HEAD~1")})).fetch)
	if err != nil {
		t.Fatal(err)
	}
	if len(src.Shallow) != 0 {
		t.Errorf("shallow %v for a history that reaches its root", src.Shallow)
	}
	if got := strings.Fields(logOf(t, src, r.commit, "log", "--format=%H")); len(got) != 2 {
		t.Errorf("log %v, want both commits", got)
	}
}
