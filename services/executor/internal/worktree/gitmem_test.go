package worktree_test

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// TestJobAttributesNeverApply: a job's .gitattributes names a filter and a
// diff driver that exist (defined in the executor's own repository
// configuration, as an operator's git-lfs or any future default could be,
// and in the job's own .git/config), and the conversions git has built in:
// ident, text with eol=crlf, working-tree-encoding. Before, git add in the
// job's work tree honoured them: the clean filter ran a command on the
// host and the patch recorded bytes the job never wrote ("$Id$" for
// "$Id: planted $", LF for CRLF, UTF-8 for UTF-16). Now no attribute
// applies: no marker is written and every file's blob in the patch is
// exactly the job's bytes.
func TestJobAttributesNeverApply(t *testing.T) {
	b := newBase(t)
	gitDir := filepath.Join(t.TempDir(), "git")
	r, err := worktree.Open(context.Background(), gitDir)
	if err != nil {
		t.Fatal(err)
	}
	lower := b.export(t)
	tree := treeHash(t, r, lower)
	markers := t.TempDir()
	script := func(name string) string {
		p := filepath.Join(t.TempDir(), name)
		writeFile(t, p, fmt.Sprintf("#!/bin/sh\necho ran >> %s/%s\ncat\n", markers, name), 0o755)
		return p
	}
	drivers := fmt.Sprintf("[filter \"marker\"]\n\tclean = %s\n\tsmudge = %s\n\tprocess = %s\n[diff \"marker\"]\n\ttextconv = %s\n\tcommand = %s\n",
		script("clean"), script("smudge"), script("process"), script("textconv"), script("command"))
	f, err := os.OpenFile(filepath.Join(gitDir, "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(drivers); err != nil {
		t.Fatal(err)
	}
	f.Close()
	files := map[string]string{
		".gitattributes": "* filter=marker diff=marker\n*.id ident\n*.crlf text eol=crlf\n*.u16 working-tree-encoding=UTF-16\n",
		"job.id":         "$Id: planted $\n",
		"job.crlf":       "one\r\ntwo\r\n",
		"job.u16":        "\xff\xfeh\x00i\x00\n\x00",
		"README.md":      "changed\n",
		".git/config":    drivers,
	}
	check := func(t *testing.T, patch []byte) {
		if entries, _ := os.ReadDir(markers); len(entries) > 0 {
			t.Errorf("a driver the job's attributes named ran: %s", entries[0].Name())
		}
		for name, content := range files {
			if strings.HasPrefix(name, ".git/") {
				continue
			}
			blob := fmt.Sprintf("%x", sha1.Sum([]byte(fmt.Sprintf("blob %d\x00%s", len(content), content))))
			if !strings.Contains(string(patch), ".."+blob) {
				t.Errorf("%s: the patch does not record the job's bytes %q (blob %s):\n%s", name, content, blob, patch)
			}
		}
	}
	write := func(t *testing.T, dir string) {
		for name, content := range files {
			writeFile(t, filepath.Join(dir, name), content, 0o644)
		}
	}
	t.Run("Diff", func(t *testing.T) {
		work := b.export(t)
		write(t, work)
		patch, _, err := r.Diff(context.Background(), tree, work)
		if err != nil {
			t.Fatal(err)
		}
		check(t, patch)
	})
	t.Run("DiffUpper", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Fatal("this test mounts overlayfs and needs root (CI runs as root)")
		}
		merged, upper := overlay(t, lower)
		write(t, merged)
		patch, _, err := r.DiffUpper(context.Background(), tree, "", merged, upper, &bundle.Tally{Limit: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		check(t, patch)
	})
}

// limitOnly is a Confinement with no cgroup: only its memory limit, which
// bounds what git prints.
type limitOnly int64

func (limitOnly) CgroupProcs() []string { return nil }
func (l limitOnly) MemoryBytes() int64  { return int64(l) }
func (limitOnly) OOMKills() int64       { return 0 }

// TestPatchHeldToTheMemoryLimit: each of a job's files is cheap to diff,
// but together their patch (which the executor holds) is larger than the
// job's memory limit. DiffUpper stops git there and returns a
// *MemoryError saying so, and no patch.
func TestPatchHeldToTheMemoryLimit(t *testing.T) {
	b := newBase(t)
	r := openRepo(t)
	lower := b.export(t)
	tree := treeHash(t, r, lower)
	const limit = 1 << 20
	merged, upper := overlay(t, lower)
	for i := range 4 {
		data := make([]byte, 512<<10)
		rand.Read(data)
		writeFile(t, filepath.Join(merged, fmt.Sprintf("random%d", i)), string(data), 0o644)
	}
	patch, stat, err := r.Confined(limitOnly(limit)).DiffUpper(context.Background(), tree, "", merged, upper, &bundle.Tally{Limit: 1 << 30})
	var mem *worktree.MemoryError
	if !errors.As(err, &mem) || !mem.Output || mem.Limit != limit || patch != nil || stat.FilesChanged != 0 {
		t.Fatalf("a 2.7 MB patch under a 1 MiB limit: %d bytes, %d files, %v", len(patch), stat.FilesChanged, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "larger than its memory limit of 1048576 bytes") {
		t.Errorf("the error does not say what passed the limit: %q", msg)
	}
	// Within the limit, the same repository makes the patch as before.
	patch, stat, err = r.Confined(limitOnly(64<<20)).DiffUpper(context.Background(), tree, "", merged, upper, &bundle.Tally{Limit: 1 << 30})
	if err != nil || stat.FilesChanged != 4 || len(patch) < 2<<20 {
		t.Fatalf("within the limit: %d bytes, %d files, %v", len(patch), stat.FilesChanged, err)
	}
}
