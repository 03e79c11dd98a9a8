package gitobj

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// bigRepo makes, with git fast-import, a repository of commits commits
// touching ten files each (about 15 objects a commit), packed by gc.
func bigRepo(b *testing.B, commits int) string {
	dir := b.TempDir()
	runGit(b, dir, nil, "init", "-q", "-b", "main", ".")
	var stream bytes.Buffer
	data := func(s string) { fmt.Fprintf(&stream, "data %d\n%s\n", len(s), s) }
	for c := 1; c <= commits; c++ {
		fmt.Fprintf(&stream, "commit refs/heads/main\nmark :%d\ncommitter C <c@example.com> %d +0000\n", c, 1700000000+c)
		data(fmt.Sprintf("commit %d", c))
		if c > 1 {
			fmt.Fprintf(&stream, "from :%d\n", c-1)
		}
		for f := 0; f < 10; f++ {
			fmt.Fprintf(&stream, "M 100644 inline d%d/f%d.txt\n", (c+f)%7, (c*3+f)%40)
			data(strings.Repeat(fmt.Sprintf("line of file %d, ", f), 50) + fmt.Sprint(c))
		}
	}
	runGit(b, dir, stream.Bytes(), "fast-import", "--quiet")
	runGit(b, dir, nil, "gc", "-q", "--prune=now")
	return dir
}

// BenchmarkReadCommit reads commits of a packed repository of thousands
// of objects, round the history.
func BenchmarkReadCommit(b *testing.B) {
	dir := bigRepo(b, 400)
	var commits []string
	for _, l := range strings.Fields(string(runGit(b, dir, nil, "rev-list", "main"))) {
		commits = append(commits, l)
	}
	n := strings.Count(string(runGit(b, dir, nil, "cat-file", "--batch-all-objects", "--batch-check")), "\n")
	s, err := Open(filepath.Join(dir, ".git", "objects"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.Logf("%d objects, %d commits", n, len(commits))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := s.Read(commits[i%len(commits)], 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
