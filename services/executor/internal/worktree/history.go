package worktree

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/pkg/githistory"
)

// A job's .git may hold history beyond its base commit, as deep as its
// tenant's policy says: the authority sends it as a git pack after the
// tree. Nothing of it reaches a job unchecked: the pack is indexed into a
// quarantine (where a pack that is not one, or leans on objects outside
// it, fails), the history is walked from the base commit exactly as the
// authority must have chosen it (package githistory), and the pack must
// hold every object that history reaches and nothing else, so no object of
// another repository or another tenant can ride along. The shallow
// boundary is what the walk found, never what the sender says.

// ErrBadHistory is wrapped when a history pack is not the base commit's
// history at the promised depth.
var ErrBadHistory = errors.New("the git history is not the base commit's")

// MaxHistoryPack bounds the history pack the executor takes, above the
// authority's own bound on what it sends (256 MiB of content, which packs
// smaller).
const MaxHistoryPack = 512 << 20

// AddHistory checks that pack is exactly the history of commit at depth
// beyond what dir (an objects directory PackCommit wrote for commit)
// holds, and only then adds it to dir. commits is how many ancestors the
// sender says the pack holds. It returns the history's shallow boundary:
// the commits whose parents are cut.
func (r *Repo) AddHistory(ctx context.Context, commit string, depth, commits int, pack io.Reader, dir string) ([]string, error) {
	if depth < 2 {
		return nil, fmt.Errorf("%w: depth %d: a history pack needs a depth above 1", ErrBadHistory, depth)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if commits == 0 {
		// The base commit is a root: there is no history to send.
		if _, err := io.ReadFull(pack, make([]byte, 1)); err == nil {
			return nil, fmt.Errorf("%w: the sender said no commits but sent a pack", ErrBadHistory)
		}
		obj, err := r.git(ctx, "", []string{"GIT_OBJECT_DIRECTORY=" + abs}, "cat-file", "commit", commit)
		if err != nil {
			return nil, fmt.Errorf("%w: the base commit: %v", ErrBadHistory, err)
		}
		if p := githistory.Parents(obj); len(p) > 0 {
			return nil, fmt.Errorf("%w: the sender said no commits, but the base commit %s has parent %s", ErrBadHistory, commit, p[0])
		}
		return nil, nil
	}
	quarantine := dir + ".quarantine"
	if err := os.RemoveAll(quarantine); err != nil {
		return nil, err
	}
	defer os.RemoveAll(quarantine)
	if err := os.MkdirAll(filepath.Join(quarantine, "pack"), 0o755); err != nil {
		return nil, err
	}
	// Only the quarantine and the base commit's objects: never the
	// executor's own store, which holds what jobs left behind.
	env := []string{"GIT_OBJECT_DIRECTORY=" + quarantine, "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + abs}
	run := func(stdin io.Reader, args ...string) ([]byte, error) {
		c := gitcmd.Cmd{Dir: r.home, Env: append(r.env(""), env...), Stdin: stdin}
		return c.Run(ctx, args...)
	}
	// No --fix-thin: a delta against anything outside the pack fails here.
	out, err := run(pack, "index-pack", "--stdin", fmt.Sprintf("--max-input-size=%d", MaxHistoryPack))
	if err != nil {
		return nil, fmt.Errorf("%w: not a valid git pack: %v", ErrBadHistory, err)
	}
	name, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "pack\t")
	if !ok || !isHex(name) {
		return nil, fmt.Errorf("%w: index-pack printed %q", ErrBadHistory, out)
	}
	idx := filepath.Join(quarantine, "pack", "pack-"+name+".idx")
	inPack, err := packObjects(ctx, run, idx)
	if err != nil {
		return nil, err
	}
	base, err := r.baseParents(ctx, run, commit)
	if err != nil {
		return nil, err
	}
	if len(base) > 0 && !inPack[base[0]] {
		return nil, fmt.Errorf("%w: the pack does not start at the base commit %s: its parent %s is not in it", ErrBadHistory, commit, base[0])
	}
	git, err := gitcmd.Path()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, git, "cat-file", "--batch")
	cmd.Dir, cmd.Env = r.home, append(r.env(""), env...)
	g, err := githistory.WalkBatch(ctx, cmd, commit, depth)
	if errors.Is(err, githistory.ErrMissing) {
		return nil, fmt.Errorf("%w: a commit within depth %d is missing (%v)", ErrBadHistory, depth, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHistory, err)
	}
	ancestors := g.Ancestors()
	if len(ancestors) != commits {
		return nil, fmt.Errorf("%w: the sender said %d commits; depth %d from %s holds %d", ErrBadHistory, commits, depth, commit, len(ancestors))
	}
	// Every object the history reaches, the base's among them; --no-walk
	// stops at the boundary, whose parents are not there.
	reach := map[string]bool{}
	var ids bytes.Buffer
	for _, list := range []struct {
		args []string
		in   io.Reader
	}{
		{[]string{"rev-list", "--objects", "--no-walk", "--stdin"}, strings.NewReader(strings.Join(ancestors, "\n") + "\n")},
		{[]string{"rev-list", "--objects", "--no-walk", "--end-of-options", commit}, nil},
	} {
		out, err := run(list.in, list.args...)
		if err != nil {
			return nil, fmt.Errorf("%w: its objects cannot be listed: %v", ErrBadHistory, err)
		}
		for line := range strings.Lines(string(out)) {
			id, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if id != "" && !reach[id] {
				reach[id] = true
				ids.WriteString(id + "\n")
			}
		}
	}
	var foreign []string
	for id := range inPack {
		if !reach[id] {
			foreign = append(foreign, id)
		}
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		return nil, fmt.Errorf("%w: the pack holds %d objects the history within depth %d does not reach (%s)", ErrBadHistory,
			len(foreign), depth, strings.Join(foreign[:min(3, len(foreign))], ", "))
	}
	// rev-list names blobs without reading them: each must be there.
	out, err = run(&ids, "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHistory, err)
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) != 2 || f[1] == "missing" {
			return nil, fmt.Errorf("%w: the pack lacks object %s of the history", ErrBadHistory, f[0])
		}
	}
	for _, ext := range []string{".idx", ".pack"} {
		from := filepath.Join(quarantine, "pack", "pack-"+name+ext)
		if err := os.Rename(from, filepath.Join(dir, "pack", "pack-"+name+ext)); err != nil {
			return nil, err
		}
	}
	return g.Shallow, nil
}

// packObjects lists the objects a pack's index names.
func packObjects(ctx context.Context, run func(io.Reader, ...string) ([]byte, error), idx string) (map[string]bool, error) {
	f, err := os.Open(idx)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := run(f, "show-index")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHistory, err)
	}
	objects := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "<offset> <object> (<crc>)"
		if f := strings.Fields(sc.Text()); len(f) >= 2 {
			objects[f[1]] = true
		}
	}
	return objects, ctx.Err()
}

// baseParents reads the base commit's parents from its stored object.
func (r *Repo) baseParents(ctx context.Context, run func(io.Reader, ...string) ([]byte, error), commit string) ([]string, error) {
	obj, err := run(nil, "cat-file", "commit", commit)
	if err != nil {
		return nil, fmt.Errorf("%w: the base commit: %v", ErrBadHistory, err)
	}
	return githistory.Parents(obj), nil
}

func isHex(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9') && !('a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
