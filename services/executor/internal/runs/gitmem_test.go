package runs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestExportGitBoundedByJobMemory: a job with 64 MiB of memory and a disk
// big enough leaves, in /work, what costs the executor's git far more
// memory than that to diff: 16 MiB of empty lines (a line diff takes
// tens of bytes a line: ~700 MB), or 80 MiB of random files (each cheap,
// but a patch of ~100 MB the executor would hold). The git used to run in
// the executor's own cgroup, bounded by nothing but the host; now every
// git over the job's files runs in the job's export cgroup under its
// memory limit, and the job ends oom saying the patch needed more than
// its limit, with nothing of /work or /out exported.
func TestExportGitBoundedByJobMemory(t *testing.T) {
	h, _ := newHarness(t, false)
	const memory = 64 << 20
	// The source is staged first (with the executor's own git, over the
	// repository's content, not the job's): only the export's git runs
	// while a job below is watched.
	warm := h.grantFor("true")
	h.start(t, warm)
	h.waitEnd(t, warm.JobID)
	for _, tc := range []struct{ name, script string }{
		{"lines", `head -c 16777216 /dev/zero | tr '\0' '\n' > /work/lines`},
		{"patch", `for i in 1 2 3 4 5 6 7 8; do head -c 10485760 /dev/urandom > /work/r$i; done`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop := watchGit(t)
			run, path, size := sparseJob(t, h, tc.script+" && echo kept > /out/x && echo left", func(l *sandbox.Limits) {
				l.MemoryBytes, l.DiskBytes = memory, 256<<20
			})
			gits := stop()
			if len(gits) == 0 {
				t.Fatal("no git of the executor's was seen")
			}
			for _, g := range gits {
				t.Logf("git %s: memory cgroup %s, peak RSS %d MiB", g.cmd, g.memcg, g.peak>>20)
				if !strings.Contains(g.memcg, "/"+run.JobID+"/export") {
					t.Errorf("git %s ran in memory cgroup %q, not the job's export cgroup", g.cmd, g.memcg)
				}
				if g.peak > memory+8<<20 {
					t.Errorf("git %s peaked at %d MiB of RSS; the job's limit is %d MiB", g.cmd, g.peak>>20, memory>>20)
				}
			}
			if run.State != Finished || run.Result.Reason != sandbox.ReasonOOM {
				t.Fatalf("the job ended %s/%s, want finished/oom: %+v", run.State, run.Result.Reason, run.Result)
			}
			msg := run.Result.Message
			if !strings.Contains(msg, "patch of the job's changes") || !strings.Contains(msg, fmt.Sprintf("memory limit of %d bytes", memory)) ||
				!strings.Contains(msg, "nothing of /work or /out was exported") || strings.Contains(msg, h.base) {
				t.Errorf("the message does not say the patch passed the memory limit: %q", msg)
			}
			wantNothingExported(t, run, path, size)
		})
	}
}

// seenGit is a git process the executor ran: its subcommand, memory
// cgroup and peak RSS as last read.
type seenGit struct {
	cmd, memcg string
	peak       int64
}

// watchGit watches, until the function it returns is called, for git
// processes whose parent is this process, and returns each one seen.
func watchGit(t *testing.T) func() []seenGit {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	var (
		mu   sync.Mutex
		seen = map[string]*seenGit{}
		done = make(chan struct{})
		over = make(chan struct{})
	)
	go func() {
		defer close(over)
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			pids, _ := filepath.Glob("/proc/[0-9]*")
			for _, p := range pids {
				stat, err := os.ReadFile(filepath.Join(p, "stat"))
				// "pid (comm) state ppid ..."
				_, rest, ok := bytes.Cut(stat, []byte(") "))
				if err != nil || !ok || !bytes.Contains(stat, []byte("(git)")) {
					continue
				}
				// A zombie has left its cgroup already.
				if f := strings.Fields(string(rest)); len(f) < 2 || f[0] == "Z" || f[1] != self {
					continue
				}
				status, _ := os.ReadFile(filepath.Join(p, "status"))
				cg, _ := os.ReadFile(filepath.Join(p, "cgroup"))
				cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
				// A process past exit_mm has no command line, and the
				// kernel has moved it to the root cgroup on its way out
				// (v1's cgroup_exit): what it reads then is not where it
				// ran. Read it only while it still runs.
				if len(cmdline) == 0 {
					continue
				}
				mu.Lock()
				g := seen[p]
				if g == nil {
					g = &seenGit{cmd: gitSubcommand(cmdline), memcg: memoryCgroup(cg)}
					seen[p] = g
				}
				g.peak = max(g.peak, statusBytes(status, "VmHWM:"))
				mu.Unlock()
			}
		}
	}()
	return func() []seenGit {
		close(done)
		<-over
		mu.Lock()
		defer mu.Unlock()
		var out []seenGit
		for _, g := range seen {
			out = append(out, *g)
		}
		return out
	}
}

// gitSubcommand is the first argument of a git command line that is not
// an option or an option's value.
func gitSubcommand(cmdline []byte) string {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	for i := 1; i < len(args); i++ {
		switch {
		case args[i] == "-c" || args[i] == "--work-tree":
			i++
		case !strings.HasPrefix(args[i], "-"):
			return args[i]
		}
	}
	return "?"
}

// memoryCgroup is the memory cgroup in a /proc/PID/cgroup: the v1
// memory hierarchy's, or the v2 one.
func memoryCgroup(cg []byte) string {
	v2 := ""
	for _, line := range strings.Split(string(cg), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				return f[2]
			}
		}
	}
	return v2
}

// statusBytes reads a "Key: N kB" line of /proc/PID/status in bytes.
func statusBytes(status []byte, key string) int64 {
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}
