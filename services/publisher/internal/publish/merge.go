package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// A change approved on one base and landed on a branch that has moved is
// re-applied by a three-way merge whose merge base is the approved base,
// never by placing the patch's hunks by line number and context: where the
// same context occurs twice in a file, `git apply` on the moved tip lands a
// hunk in whichever copy is nearest, which is not the one approved.
//
// The approved change is made into a commit A = base + patch (the patch
// applies exactly at the base, where it was made) whose only parent is
// the base; `git merge-tree --write-tree TIP A` then merges with the base
// as the merge base, since the base is an ancestor of the tip (Prepare
// checks that) and A's only parent. (git 2.39, on Debian 12, has no
// --merge-base; this needs none.)
//
// git's merge follows renames and merges lines by its own rules, so its
// result is then proved exact by verifyMerge before it is committed.

// reapply returns the tree of applied (the approved base with the patch)
// merged onto tip, or a refusal naming the paths that conflict.
func (r *Repo) reapply(ctx context.Context, c Change, tip, applied string) (string, error) {
	out, err := r.git(ctx, commitEnv(c), []byte("Airlock: approved change of job "+c.JobID+"\n"), "commit-tree", applied, "-p", c.Base)
	if err != nil {
		return "", err
	}
	approved := strings.TrimSpace(string(out))
	out, err = r.git(ctx, nil, nil, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", tip, approved)
	var ee *exec.ExitError
	conflicted := errors.As(err, &ee) && ee.ExitCode() == 1
	if err != nil && !conflicted {
		return "", err
	}
	fields := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if !fullSHA.MatchString(fields[0]) {
		return "", fmt.Errorf("publish: merge-tree: unexpected output %q", truncate(string(out), 200))
	}
	merged := fields[0]
	conflicts, wrong, err := r.verifyMerge(ctx, c, tip, approved, merged)
	switch {
	case err != nil:
		return "", err
	case len(conflicts) > 0:
		return "", r.conflict(c, tip, conflicts, "checked against the approved base")
	case conflicted:
		paths := fields[1:]
		sort.Strings(paths)
		return "", r.conflict(c, tip, slices.Compact(paths), "git's merge found conflicts")
	case len(wrong) > 0:
		return "", r.conflict(c, tip, wrong, "git's merge placed the change elsewhere than approved")
	}
	return merged, nil
}

// conflict is the refusal of a re-apply: nothing is spent by it.
func (r *Repo) conflict(c Change, tip string, paths []string, why string) error {
	return fmt.Errorf("%w: the approved patch does not apply as approved on branch %s, which moved from the approved base %s to %s (%s); conflicting paths: %s",
		errdefs.ErrFailedPrecondition, c.Branch, c.Base, tip, why, strings.Join(paths, ", "))
}

// treeEntry is one path's mode and blob in a tree; mode 0 is no entry.
type treeEntry struct {
	mode uint32
	oid  string
}

// sideChange is one path changed between two trees.
type sideChange struct{ from, to treeEntry }

// verifyMerge proves that merged, the tree git's merge made of tip and
// approved (base + patch), is exactly tip with the approved change: for
// every path,
//   - one the patch does not touch is as on the tip (so no change was
//     carried along a rename, of the branch's or of the patch's making);
//   - one the branch did not touch is as the patch made it;
//   - one both changed is a regular file on all three sides, and its
//     content is the tip's with the approved change applied through the
//     branch's own change: both changes are taken as line diffs of the
//     base (git diff -U0, blocks of base lines each side replaced), no
//     block of one side may overlap or touch a block of the other (git's
//     merge calls that a conflict, and so does this), and the expected
//     file is the base with the blocks of both sides replaced, each by its
//     own side's lines. That file equals the tip with the approved blocks
//     replaced, each at its base position moved by the lines the branch
//     added or removed above it: the approved change, mapped through the
//     base onto the tip, and nothing else. It is compared byte for byte.
//
// A path the branch deleted or renamed that the patch changes is refused
// as a conflict, as is a binary file or symlink both sides changed.
// conflicts names the paths whose changes conflict, wrong those the merge
// did not make as they must be.
// Where the branch's own change is itself ambiguous (it inserted lines
// identical to lines it sits beside), the line diff names one reading of
// it, as git's merge does; a reading under which the approved change
// touches what the branch changed is a conflict.
func (r *Repo) verifyMerge(ctx context.Context, c Change, tip, approved, merged string) (conflicts, wrong []string, err error) {
	ours, err := r.treeChanges(ctx, c.Base, approved)
	if err != nil {
		return nil, nil, err
	}
	theirs, err := r.treeChanges(ctx, c.Base, tip)
	if err != nil {
		return nil, nil, err
	}
	result, err := r.treeChanges(ctx, tip, merged)
	if err != nil {
		return nil, nil, err
	}
	for path := range result {
		if _, ok := ours[path]; !ok {
			wrong = append(wrong, path+" (changed by the merge but not by the approved patch)")
		}
	}
	for path, o := range ours {
		b, a := o.from, o.to
		t := b
		if th, ok := theirs[path]; ok {
			t = th.to
		}
		m := t
		if rs, ok := result[path]; ok {
			m = rs.to
		}
		want, why, err := r.expected(ctx, b, t, a)
		if err != nil {
			return nil, nil, err
		}
		if why != "" {
			conflicts = append(conflicts, path+" ("+why+")")
			continue
		}
		same := m.mode == want.mode
		if same && want.mode != 0 {
			if want.content != nil {
				got, err := r.git(ctx, nil, nil, "cat-file", "blob", m.oid)
				if err != nil {
					return nil, nil, err
				}
				same = bytes.Equal(got, want.content)
			} else {
				same = m.oid == want.oid
			}
		}
		if !same {
			wrong = append(wrong, path+" (the merge does not hold exactly the approved change)")
		}
	}
	sort.Strings(conflicts)
	sort.Strings(wrong)
	return conflicts, wrong, nil
}

// want is what a path must be after the merge: mode (0: absent) and the
// blob oid, or the whole content when it was merged by lines.
type want struct {
	mode    uint32
	oid     string
	content []byte
}

// expected is what the merge must make of a path that the patch changed
// from b to a while the branch changed it from b to t; why is set when
// the two changes conflict.
func (r *Repo) expected(ctx context.Context, b, t, a treeEntry) (want, string, error) {
	switch {
	case t == b:
		return want{mode: a.mode, oid: a.oid}, "", nil
	case t.mode == 0 && b.mode != 0:
		return want{}, "deleted or renamed on the branch", nil
	case b.mode == 0:
		return want{}, "added on both sides", nil
	case a.mode == 0:
		return want{}, "the patch deletes what the branch changed", nil
	case !regular(b.mode) || !regular(t.mode) || !regular(a.mode):
		return want{}, "not a regular file on every side", nil
	}
	w := want{mode: t.mode}
	if a.mode != b.mode {
		if t.mode != b.mode && t.mode != a.mode {
			return want{}, "the mode changed on both sides", nil
		}
		w.mode = a.mode
	}
	switch {
	case a.oid == b.oid:
		w.oid = t.oid
		return w, "", nil
	case t.oid == b.oid:
		w.oid = a.oid
		return w, "", nil
	}
	base, err := r.git(ctx, nil, nil, "cat-file", "blob", b.oid)
	if err != nil {
		return want{}, "", err
	}
	ours, binary, err := r.lineBlocks(ctx, b.oid, a.oid)
	if err != nil || binary {
		return want{}, "a binary file changed on both sides", err
	}
	theirs, binary, err := r.lineBlocks(ctx, b.oid, t.oid)
	if err != nil || binary {
		return want{}, "a binary file changed on both sides", err
	}
	content, ok := mergeBlocks(splitLines(base), theirs, ours)
	if !ok {
		return want{}, "the same lines changed on both sides", nil
	}
	w.content = content
	return w, "", nil
}

func regular(mode uint32) bool { return mode == 0o100644 || mode == 0o100755 }

// treeChanges lists the paths that differ between two trees, renames not
// followed.
func (r *Repo) treeChanges(ctx context.Context, from, to string) (map[string]sideChange, error) {
	out, err := r.git(ctx, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--raw", "--no-abbrev", from, to)
	if err != nil {
		return nil, err
	}
	changes := map[string]sideChange{}
	recs := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(recs) == 1 && recs[0] == "" {
		return changes, nil
	}
	if len(recs)%2 != 0 {
		return nil, fmt.Errorf("publish: diff-tree: unexpected output")
	}
	for i := 0; i < len(recs); i += 2 {
		f := strings.Fields(strings.TrimPrefix(recs[i], ":"))
		if len(f) != 5 {
			return nil, fmt.Errorf("publish: diff-tree: unexpected line %q", truncate(recs[i], 200))
		}
		var e [2]treeEntry
		for j := range e {
			mode, err := strconv.ParseUint(f[j], 8, 32)
			if err != nil {
				return nil, fmt.Errorf("publish: diff-tree: mode %q", f[j])
			}
			if mode != 0 {
				e[j] = treeEntry{mode: uint32(mode), oid: f[2+j]}
			}
		}
		changes[recs[i+1]] = sideChange{from: e[0], to: e[1]}
	}
	return changes, nil
}

// block is a run of base lines [start, start+n) one side replaced by
// lines.
type block struct {
	start, n int
	lines    [][]byte
}

var hunkHeaderRE = regexp.MustCompile(`^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@`)

// lineBlocks is git's line diff from blob from to blob to as blocks of
// from's lines; binary when git diffs them as binary.
func (r *Repo) lineBlocks(ctx context.Context, from, to string) ([]block, bool, error) {
	out, err := r.git(ctx, nil, nil, "diff", "--no-ext-diff", "--no-textconv", "--no-color", "--diff-algorithm=myers", "-U0", from, to)
	if err != nil {
		return nil, false, err
	}
	content, err := r.git(ctx, nil, nil, "cat-file", "blob", to)
	if err != nil {
		return nil, false, err
	}
	newLines := splitLines(content)
	var blocks []block
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Binary files ") || strings.HasPrefix(line, "GIT binary patch") {
			return nil, true, nil
		}
		m := hunkHeaderRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		num := func(s string) int {
			if s == "" {
				return 1
			}
			n, _ := strconv.Atoi(s)
			return n
		}
		oldStart, oldN, newStart, newN := num(m[1]), num(m[2]), num(m[3]), num(m[4])
		b := block{start: oldStart, n: oldN}
		if oldN > 0 {
			b.start-- // a count of 0 names the line after which lines are inserted
		}
		if newN > 0 {
			if newStart < 1 || newStart-1+newN > len(newLines) {
				return nil, false, fmt.Errorf("publish: diff: hunk %q is outside the file", line)
			}
			b.lines = newLines[newStart-1 : newStart-1+newN]
		}
		blocks = append(blocks, b)
	}
	return blocks, false, nil
}

// splitLines splits data after each newline, keeping it: a last line
// without one stays as it is, as git diffs it.
func splitLines(data []byte) [][]byte {
	var lines [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n') + 1
		if i == 0 {
			i = len(data)
		}
		lines = append(lines, data[:i])
		data = data[i:]
	}
	return lines
}

// mergeBlocks replaces in base the blocks of both sides (each ordered and
// disjoint, as a diff gives them); ok is false when a block of one side
// overlaps or touches a block of the other.
func mergeBlocks(base [][]byte, theirs, ours []block) ([]byte, bool) {
	for i, j := 0, 0; i < len(theirs) && j < len(ours); {
		t, o := theirs[i], ours[j]
		switch {
		case t.start+t.n < o.start:
			i++
		case o.start+o.n < t.start:
			j++
		default:
			return nil, false
		}
	}
	all := append(append([]block(nil), theirs...), ours...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].start < all[j].start })
	var out bytes.Buffer
	pos := 0
	for _, b := range all {
		if b.start < pos || b.start+b.n > len(base) {
			return nil, false
		}
		for _, l := range base[pos:b.start] {
			out.Write(l)
		}
		for _, l := range b.lines {
			out.Write(l)
		}
		pos = b.start + b.n
	}
	for _, l := range base[pos:] {
		out.Write(l)
	}
	return out.Bytes(), true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// commitEnv is the fixed identity and time every commit made for c
// carries, so the same approval on the same parent is the same commit.
func commitEnv(c Change) []string {
	at := c.At.UTC().Format(time.RFC3339)
	return []string{
		"GIT_AUTHOR_NAME=" + authorName, "GIT_AUTHOR_EMAIL=" + authorEmail, "GIT_AUTHOR_DATE=" + at,
		"GIT_COMMITTER_NAME=" + authorName, "GIT_COMMITTER_EMAIL=" + authorEmail, "GIT_COMMITTER_DATE=" + at,
	}
}
