package source_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/airlockhq/airlock/test/gittest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
)

// linearRepo is a repository of n commits on main, each changing
// README.md and adding a file.
func linearRepo(t *testing.T, n int) *gittest.Repo {
	t.Helper()
	r := gittest.Init(t, t.TempDir())
	for i := 1; i <= n; i++ {
		r.Write("README.md", fmt.Sprintf("version %d\n%s\n", i, strings.Repeat("x", 4096)))
		r.Write(fmt.Sprintf("f%d.txt", i), fmt.Sprintf("file %d\n", i))
		r.Commit(fmt.Sprintf("commit %d", i))
	}
	return r
}

// packed indexes pack into a fresh repository and returns the objects it
// holds.
func packed(t *testing.T, pack []byte) []string {
	t.Helper()
	dir := t.TempDir()
	r := gittest.At(t, dir)
	r.Run("init", "-q", "--bare")
	cmd := exec.Command("git", "index-pack", "--stdin")
	cmd.Dir, cmd.Stdin = dir, bytes.NewReader(pack)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("index-pack: %v: %s", err, out)
	}
	name := strings.TrimPrefix(strings.TrimSpace(string(out)), "pack\t")
	cmd = exec.Command("sh", "-c", "git show-index < objects/pack/pack-"+name+".idx")
	cmd.Dir = dir
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range strings.Lines(string(out)) {
		ids = append(ids, strings.Fields(line)[1])
	}
	slices.Sort(ids)
	return ids
}

// historyObjects is what the pack for commits must hold: their objects,
// less those of the base tree.
func historyObjects(r *gittest.Repo, commits ...string) []string {
	inTree := map[string]bool{}
	for line := range strings.Lines(r.Run("rev-list", "--objects", "HEAD^{tree}")) {
		inTree[strings.Fields(line)[0]] = true
	}
	var ids []string
	for line := range strings.Lines(r.Run(append([]string{"rev-list", "--objects", "--no-walk"}, commits...)...)) {
		if id := strings.Fields(line)[0]; !inTree[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// TestHistoryDepth3: over a 10-commit repository, depth 3 is the base's
// two parents and exactly their objects the tree does not carry, from a
// local path and from a mirror alike.
func TestHistoryDepth3(t *testing.T) {
	r := linearRepo(t, 10)
	s, _, _ := newSource(t)
	head := r.RevParse("HEAD")
	for kind, repo := range repos(r) {
		t.Run(kind, func(t *testing.T) {
			if _, err := s.Resolve(t.Context(), repo, "main"); err != nil {
				t.Fatal(err)
			}
			h, err := s.PlanHistory(t.Context(), repo, head, 3)
			if err != nil {
				t.Fatal(err)
			}
			if h.Depth != 3 || h.Commits != 2 {
				t.Fatalf("history: depth %d, %d commits; want 3 and 2", h.Depth, h.Commits)
			}
			var pack bytes.Buffer
			if err := s.WritePack(t.Context(), repo, h, &pack); err != nil {
				t.Fatal(err)
			}
			got, want := packed(t, pack.Bytes()), historyObjects(r, r.RevParse("HEAD~1"), r.RevParse("HEAD~2"))
			if !slices.Equal(got, want) {
				t.Fatalf("the pack holds %d objects %v, want %d %v", len(got), got, len(want), want)
			}
			for _, absent := range []string{head, r.RevParse("HEAD~3"), r.RevParse("HEAD:f1.txt")} {
				if slices.Contains(got, absent) {
					t.Errorf("the pack holds %s, which the executor already has or must not get", absent)
				}
			}
			one, err := s.PlanHistory(t.Context(), repo, head, 1)
			if err != nil || one.Depth != 1 || one.Commits != 0 {
				t.Errorf("depth 1: %+v, %v; want nothing beyond the base", one, err)
			}
		})
	}
}

// TestHistoryMerge: every parent of a merge is followed, as git clone
// --depth does, so the shallow file can describe the history.
func TestHistoryMerge(t *testing.T) {
	r := linearRepo(t, 3)
	r.Run("checkout", "-q", "-b", "side", "HEAD~1")
	r.Write("side.txt", "side\n")
	r.Commit("side")
	r.Run("checkout", "-q", "main")
	r.Run("merge", "-q", "--no-ff", "-m", "merge", "side")
	s, _, _ := newSource(t)
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: r.Dir}
	h, err := s.PlanHistory(t.Context(), repo, r.RevParse("HEAD"), 2)
	if err != nil {
		t.Fatal(err)
	}
	var pack bytes.Buffer
	if err := s.WritePack(t.Context(), repo, h, &pack); err != nil {
		t.Fatal(err)
	}
	got := packed(t, pack.Bytes())
	if h.Commits != 2 || !slices.Contains(got, r.RevParse("HEAD^1")) || !slices.Contains(got, r.RevParse("HEAD^2")) {
		t.Fatalf("depth 2 of a merge: %d commits, objects %v; want both parents", h.Commits, got)
	}
}

// TestHistoryCutBySize: a history above the size bound is cut to half its
// depth until it fits, and the cut is logged.
func TestHistoryCutBySize(t *testing.T) {
	r := linearRepo(t, 10)
	s, logs, _ := newSource(t)
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: r.Dir}
	// Each commit's README.md is just over 4 KiB: 3 ancestors fit, 7 do not.
	source.SetMaxHistoryBytes(s, 20<<10)
	h, err := s.PlanHistory(t.Context(), repo, r.RevParse("HEAD"), 8)
	if err != nil {
		t.Fatal(err)
	}
	if h.Depth != 4 || h.Commits != 3 || h.Bytes > 20<<10 {
		t.Fatalf("cut history: depth %d, %d commits, %d bytes; want depth 4", h.Depth, h.Commits, h.Bytes)
	}
	if !strings.Contains(logs.String(), "git history cut") || !strings.Contains(logs.String(), "depth=8") {
		t.Errorf("the cut is not logged:\n%s", logs)
	}
	source.SetMaxHistoryBytes(s, 1)
	if h, err := s.PlanHistory(t.Context(), repo, r.RevParse("HEAD"), 8); err != nil || h.Depth != 1 || h.Commits != 0 {
		t.Errorf("nothing fits: %+v, %v; want the base alone", h, err)
	}
}

// TestHistoryOnlyTheTenantsRepository: a commit of another repository is
// not found in the tenant's, and a depth out of policy's range is refused.
func TestHistoryOnlyTheTenantsRepository(t *testing.T) {
	r, other := linearRepo(t, 3), linearRepo(t, 2)
	other.Write("secret.txt", "another tenant's\n")
	foreign := other.Commit("secret")
	s, _, _ := newSource(t)
	for kind, repo := range repos(r) {
		if _, err := s.PlanHistory(t.Context(), repo, foreign, 2); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: another repository's commit: %v", kind, err)
		}
	}
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: r.Dir}
	for _, d := range []int{0, policy.MaxGitHistoryDepth + 1} {
		if _, err := s.PlanHistory(t.Context(), repo, r.RevParse("HEAD"), d); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("depth %d: %v", d, err)
		}
	}
}
