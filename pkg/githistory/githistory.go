// Package githistory owns the shape of the git history a job's .git holds:
// which commits a history of depth N from a base commit takes, counted as
// `git clone --depth N` counts them, and which of them are its shallow
// boundary. The authority uses it to choose what it sends and the executor
// to check what it received, so the two cannot disagree. It reads commits
// through a caller's `git cat-file --batch`, since each side runs git in
// its own sealed environment.
package githistory

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// ErrMissing is wrapped when a commit the history needs is not there.
var ErrMissing = errors.New("commit not found")

// Graph is a history of depth Depth from Levels[0][0], the base commit.
type Graph struct {
	// Levels are the commits by their distance from the base: Levels[0] is
	// the base alone, Levels[d] the commits first reached d parents away.
	// A history that reaches root commits early has fewer than Depth.
	Levels [][]string
	// Shallow are the commits of the last level that have parents: the
	// boundary git's shallow file names, beyond which nothing is there.
	Shallow []string
}

// Commits is every commit of the history, the base first.
func (g Graph) Commits() []string {
	var all []string
	for _, l := range g.Levels {
		all = append(all, l...)
	}
	return all
}

// Ancestors is every commit of the history but the base.
func (g Graph) Ancestors() []string { return g.Commits()[1:] }

// Parents returns the parents a commit object names, in order. Only the
// header is read: a "parent" line in the message is not one.
func Parents(object []byte) []string {
	var parents []string
	for line := range bytes.Lines(object) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) == 0 {
			break
		}
		if p, ok := bytes.CutPrefix(line, []byte("parent ")); ok {
			parents = append(parents, string(p))
		}
	}
	return parents
}

// Walk returns base's history of the given depth (at least 1), reading
// each commit object with read. Parents are followed breadth first, all of
// them, so a commit reached by two paths counts at the shorter; a merge's
// parents are all inside the history or all beyond it, which is what
// git's shallow file can say (it cuts every parent of a commit or none).
func Walk(base string, depth int, read func(commit string) ([]byte, error)) (Graph, error) {
	if depth < 1 {
		return Graph{}, fmt.Errorf("githistory: depth %d: must be at least 1", depth)
	}
	seen := map[string]bool{base: true}
	g := Graph{Levels: [][]string{{base}}}
	for d := 1; ; d++ {
		var next, shallow []string
		for _, c := range g.Levels[d-1] {
			obj, err := read(c)
			if err != nil {
				return Graph{}, err
			}
			parents := Parents(obj)
			if d == depth {
				// Shallow cuts all of a commit's parents, so a commit with
				// one parent beyond the history is cut from all of them.
				for _, p := range parents {
					if !seen[p] {
						shallow = append(shallow, c)
						break
					}
				}
				continue
			}
			for _, p := range parents {
				if !seen[p] {
					seen[p] = true
					next = append(next, p)
				}
			}
		}
		if d == depth {
			g.Shallow = shallow
			return g, nil
		}
		if len(next) == 0 {
			return g, nil
		}
		g.Levels = append(g.Levels, next)
	}
}

// Batch reads commit objects through one `git cat-file --batch` process.
type Batch struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// StartBatch starts cmd, which must run `git cat-file --batch` in the
// caller's environment; Close ends it.
func StartBatch(cmd *exec.Cmd) (*Batch, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("githistory: start cat-file: %w", err)
	}
	return &Batch{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

// Commit returns the commit object named id; ErrMissing when there is no
// such object, and an error when it is not a commit.
func (b *Batch) Commit(id string) ([]byte, error) {
	if strings.ContainsAny(id, " \n") || id == "" {
		return nil, fmt.Errorf("githistory: %q is not an object id", id)
	}
	if _, err := io.WriteString(b.in, id+"\n"); err != nil {
		return nil, fmt.Errorf("githistory: cat-file: %w", err)
	}
	line, err := b.out.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("githistory: cat-file: %w", err)
	}
	f := strings.Fields(line)
	if len(f) == 2 && f[1] == "missing" {
		return nil, fmt.Errorf("%w: %s", ErrMissing, id)
	}
	if len(f) != 3 {
		return nil, fmt.Errorf("githistory: cat-file printed %q", line)
	}
	size, err := strconv.Atoi(f[2])
	if err != nil || size < 0 {
		return nil, fmt.Errorf("githistory: cat-file printed %q", line)
	}
	data := make([]byte, size+1)
	if _, err := io.ReadFull(b.out, data); err != nil {
		return nil, fmt.Errorf("githistory: cat-file: %w", err)
	}
	if f[0] != id || f[1] != "commit" {
		return nil, fmt.Errorf("githistory: %s is a %s, not a commit", id, f[1])
	}
	return data[:size], nil
}

// Close ends the process.
func (b *Batch) Close() error {
	b.in.Close()
	return b.cmd.Wait()
}

// WalkBatch is Walk reading through a `git cat-file --batch` that cmd
// runs.
func WalkBatch(ctx context.Context, cmd *exec.Cmd, base string, depth int) (Graph, error) {
	b, err := StartBatch(cmd)
	if err != nil {
		return Graph{}, err
	}
	g, err := Walk(base, depth, func(c string) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return b.Commit(c)
	})
	cerr := b.Close()
	if err != nil {
		return Graph{}, err
	}
	if cerr != nil {
		return Graph{}, fmt.Errorf("githistory: cat-file: %w", cerr)
	}
	return g, nil
}
