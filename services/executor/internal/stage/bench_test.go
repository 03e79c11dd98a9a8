package stage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
	"github.com/airlockhq/airlock/test/gittest"
)

// BenchmarkStageLargeTree stages a tree the size of issue 27's (6,813
// files, 66 MB, a third of it incompressible) from a real git repository
// the way the executor does, beside `git clone` of the same repository, in
// one run:
//
//   - op=git-clone: `git clone file://…`, what a user would compare with;
//   - op=stage: Cache.Get, fetching `git archive` of the commit as the
//     authority serves it (the gRPC hop between them is left out);
//   - op=phases: the same steps one by one, each timed: archive (the
//     authority's git archive), extract (the executor unpacks the tar),
//     index (git add + write-tree: hashing and storing every blob, the
//     tree-hash check), pack (the job's .git objects: one pack of the
//     commit's objects).
//
// go test -run '^$' -bench StageLargeTree -benchtime 1x, once per round
// (see docs/performance.md), then benchstat -col /op.
func BenchmarkStageLargeTree(b *testing.B) {
	r := largeRepo(b)
	ctx := context.Background()
	b.Run("op=git-clone", func(b *testing.B) {
		for b.Loop() {
			dst := filepath.Join(b.TempDir(), "clone")
			gittest.Run(b, r.dir, "clone", "--quiet", "file://"+r.dir, dst)
			os.RemoveAll(dst)
		}
	})
	b.Run("op=stage", func(b *testing.B) {
		for b.Loop() {
			root := b.TempDir()
			c, err := New(root, os.Getuid(), os.Getgid())
			if err != nil {
				b.Fatal(err)
			}
			src, err := c.Get(ctx, Key{Tenant: "t", Repository: "r", Commit: r.commit, Depth: 1}, r.fetch)
			if err != nil {
				b.Fatal(err)
			}
			if src.TreeHash != r.tree || src.GitObjects == "" {
				b.Fatalf("staged %+v", src)
			}
			os.RemoveAll(root)
		}
	})
	b.Run("op=phases", func(b *testing.B) {
		var phases [5]time.Duration
		n := 0
		for b.Loop() {
			root := b.TempDir()
			c, err := New(root, os.Getuid(), os.Getgid())
			if err != nil {
				b.Fatal(err)
			}
			repo, err := worktree.Open(ctx, filepath.Join(root, "git"))
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			var archive bytes.Buffer
			if err := r.archive(&archive); err != nil {
				b.Fatal(err)
			}
			phases[0] += time.Since(start)
			dir := filepath.Join(root, "tree")
			start = time.Now()
			if err := c.extract(&archive, dir); err != nil {
				b.Fatal(err)
			}
			phases[1] += time.Since(start)
			start = time.Now()
			tree, err := repo.TreeHashIndex(ctx, dir, dir+".index")
			if err != nil || tree != r.tree {
				b.Fatalf("tree %s, %v; want %s", tree, err, r.tree)
			}
			phases[2] += time.Since(start)
			start = time.Now()
			if err := repo.PackCommit(ctx, r.commit, tree, r.commitObject, dir+".objects"); err != nil {
				b.Fatal(err)
			}
			phases[3] += time.Since(start)
			// The same pack with git's default delta search, as
			// PackCommit made it before --window=0, for the ratio.
			start = time.Now()
			list := gittest.Cmd(root, "--git-dir", filepath.Join(root, "git"), "rev-list", "--objects", "--no-object-names", r.commit)
			names, err := list.Output()
			if err != nil {
				b.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "old"), 0o755); err != nil {
				b.Fatal(err)
			}
			pack := gittest.Cmd(root, "--git-dir", filepath.Join(root, "git"), "pack-objects", "--quiet", filepath.Join(root, "old", "pack"))
			pack.Stdin = bytes.NewReader(names)
			if out, err := pack.CombinedOutput(); err != nil {
				b.Fatalf("pack-objects: %v: %s", err, out)
			}
			phases[4] += time.Since(start)
			n++
			os.RemoveAll(root)
		}
		for i, name := range []string{"archive", "extract", "index", "pack", "pack-delta-search"} {
			b.ReportMetric(phases[i].Seconds()/float64(n), name+"-s")
		}
	})
}

type largeTree struct {
	dir, commit, tree string
	commitObject      []byte
}

// archive writes the commit's tar as the authority makes it.
func (r *largeTree) archive(w io.Writer) error {
	cmd := gittest.Cmd(r.dir, "archive", "--format=tar", r.commit)
	cmd.Stdout = w
	return cmd.Run()
}

// fetch streams the archive from a running git archive, as the
// authority's FetchSource does.
func (r *largeTree) fetch(ctx context.Context) (Header, io.ReadCloser, error) {
	cmd := gittest.Cmd(r.dir, "archive", "--format=tar", r.commit)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Header{}, nil, err
	}
	if err := cmd.Start(); err != nil {
		return Header{}, nil, err
	}
	return Header{Commit: r.commit, TreeHash: r.tree, CommitObject: r.commitObject}, &waitCloser{out, cmd}, nil
}

type waitCloser struct {
	io.ReadCloser
	cmd *exec.Cmd
}

func (w *waitCloser) Close() error {
	io.Copy(io.Discard, w.ReadCloser)
	w.ReadCloser.Close()
	return w.cmd.Wait()
}

// largeRepo commits 6,813 files of about 66 MB in all: 6,700 text files of 1 to
// 12 KB in 3 levels of directories, and 113 files of random bytes (about
// 22 MB) that no compression shrinks.
func largeRepo(b *testing.B) *largeTree {
	b.Helper()
	dir := b.TempDir()
	gittest.Run(b, dir, "init", "--quiet", "-b", "main")
	rng := rand.New(rand.NewPCG(27, 5))
	words := strings.Fields("func return if else for range struct type package import var const err nil string int byte map chan go defer select case switch")
	var total int64
	write := func(name string, data []byte) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(data))
	}
	for i := range 6700 {
		var s strings.Builder
		size := 1000 + rng.IntN(11000)
		for s.Len() < size {
			s.WriteString(words[rng.IntN(len(words))])
			if rng.IntN(8) == 0 {
				fmt.Fprintf(&s, " %d\n", rng.IntN(100000))
			} else {
				s.WriteByte(' ')
			}
		}
		write(fmt.Sprintf("pkg%02d/mod%d/file%04d.go", i%40, i%7, i), []byte(s.String()))
	}
	for i := range 113 {
		data := make([]byte, 100<<10+rng.IntN(200<<10))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		write(fmt.Sprintf("assets/blob%03d.bin", i), data)
	}
	gittest.Run(b, dir, "add", "--all")
	gittest.Run(b, dir, "commit", "--quiet", "-m", "large tree")
	if err := os.WriteFile(filepath.Join(dir, ".git", "info", "attributes"), []byte(gitcmd.PlainAttributes), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("tree: 6813 files, %.1f MB", float64(total)/1e6)
	return &largeTree{
		dir:          dir,
		commit:       strings.TrimSpace(gittest.Run(b, dir, "rev-parse", "HEAD")),
		tree:         strings.TrimSpace(gittest.Run(b, dir, "rev-parse", "HEAD^{tree}")),
		commitObject: []byte(gittest.Run(b, dir, "cat-file", "commit", "HEAD")),
	}
}
