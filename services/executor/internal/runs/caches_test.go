package runs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

var goBuild = CacheGrant{Name: "go-build", Path: "/root/.cache/go-build", MaxSize: 1 << 20}

// cacheJob runs script with the go-build cache in a real runc sandbox and
// returns its run.
func (h *harness) cacheJob(t *testing.T, tenant, repo, script string, caches ...CacheGrant) Run {
	t.Helper()
	return h.cacheJobIn(t, sandbox.ClassRunc, tenant, repo, script, caches...)
}

func (h *harness) cacheJobIn(t *testing.T, class sandbox.Class, tenant, repo, script string, caches ...CacheGrant) Run {
	t.Helper()
	g := h.grantFor(script)
	g.Tenant, g.Repository, g.Caches, g.Class = tenant, repo, caches, class
	if class == sandbox.ClassRunsc {
		g.Limits.Pids = 256
	}
	h.start(t, g)
	return h.waitEnd(t, g.JobID)
}

func stdoutOf(t *testing.T, h *harness, r Run) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.m.runDir(r.JobID), "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The second job of a repository finds the first's cache file; another
// tenant's job and another repository's job find an empty cache; each
// result says what it did with the cache.
func TestCacheSurvivesBetweenJobsOfOneRepository(t *testing.T) {
	h, _ := newHarness(t, false)
	first := h.cacheJob(t, "acme", "widgets", `mkdir -p /root/.cache/go-build/ab && echo compiled > /root/.cache/go-build/ab/out && echo wrote`, goBuild)
	if first.State != Finished || len(first.Result.Caches) != 1 {
		t.Fatalf("first job: %s %+v", first.State, first.Result)
	}
	u := first.Result.Caches[0]
	if !u.Committed || u.SizeBefore != 0 || u.SizeAfter == 0 || u.Name != "go-build" || u.Path != goBuild.Path {
		t.Fatalf("first job's cache use %+v", u)
	}
	read := `cat /root/.cache/go-build/ab/out 2>/dev/null || echo cold`
	second := h.cacheJob(t, "acme", "widgets", read, goBuild)
	if out := stdoutOf(t, h, second); strings.TrimSpace(out) != "compiled" {
		t.Errorf("the second job of the repository reads %q, want the first's file", out)
	}
	if u := second.Result.Caches[0]; u.SizeBefore != first.Result.Caches[0].SizeAfter {
		t.Errorf("second job's size before %d, want %d", u.SizeBefore, first.Result.Caches[0].SizeAfter)
	}
	for _, other := range []struct{ tenant, repo string }{{"evil", "widgets"}, {"acme", "gadgets"}} {
		r := h.cacheJob(t, other.tenant, other.repo, read, goBuild)
		if out := stdoutOf(t, h, r); strings.TrimSpace(out) != "cold" {
			t.Errorf("tenant %s repository %s reads %q from acme/widgets' cache", other.tenant, other.repo, out)
		}
	}
	// A job without the cache sees nothing there.
	none := h.cacheJob(t, "acme", "widgets", read)
	if out := stdoutOf(t, h, none); strings.TrimSpace(out) != "cold" || len(none.Result.Caches) != 0 {
		t.Errorf("a job without the cache reads %q, caches %+v", out, none.Result.Caches)
	}
}

// A cancelled job's (and a timed-out job's) writes are not committed.
func TestCacheNotCommittedWhenCancelledOrTimedOut(t *testing.T) {
	h, _ := newHarness(t, false)
	g := h.grantFor(`echo partial > /root/.cache/go-build/half && echo ready && sleep 600`)
	g.Caches = []CacheGrant{goBuild}
	h.start(t, g)
	h.waitRunning(t, g.JobID, "ready")
	if _, err := h.m.Cancel(g.JobID); err != nil {
		t.Fatal(err)
	}
	run := h.waitEnd(t, g.JobID)
	if run.State != Cancelled || len(run.Result.Caches) != 1 || run.Result.Caches[0].Committed {
		t.Fatalf("cancelled job: %s, caches %+v", run.State, run.Result.Caches)
	}
	if !strings.Contains(run.Result.Caches[0].Message, "cancelled") {
		t.Errorf("message %q does not say why", run.Result.Caches[0].Message)
	}
	g = h.grantFor(`echo partial > /root/.cache/go-build/late && sleep 600`)
	g.Caches, g.Limits.Deadline = []CacheGrant{goBuild}, 2*time.Second
	h.start(t, g)
	if run := h.waitEnd(t, g.JobID); run.Result.Reason != sandbox.ReasonTimeout || run.Result.Caches[0].Committed {
		t.Fatalf("timed-out job: %s, caches %+v", run.Result.Reason, run.Result.Caches)
	}
	r := h.cacheJob(t, "acme", "widgets", `ls -A /root/.cache/go-build; echo end`, goBuild)
	if out := stdoutOf(t, h, r); strings.TrimSpace(out) != "end" {
		t.Errorf("the next job finds %q in the cache", out)
	}
}

// A cache over its bound after a commit is evicted, and the result says
// so; a failing job (exit 1) still commits.
func TestCacheOverItsBoundIsEvicted(t *testing.T) {
	h, _ := newHarness(t, false)
	small := CacheGrant{Name: "small", Path: "/tmp/small", MaxSize: 64 << 10}
	r := h.cacheJob(t, "acme", "widgets", `echo keep > /tmp/small/a; exit 1`, small)
	if u := r.Result.Caches[0]; r.Result.ExitCode != 1 || !u.Committed || u.Evicted {
		t.Fatalf("first: exit %d, %+v", r.Result.ExitCode, u)
	}
	r = h.cacheJob(t, "acme", "widgets", `head -c 200000 /dev/zero > /tmp/small/big`, small)
	if u := r.Result.Caches[0]; !u.Committed || !u.Evicted || u.SizeAfter != 0 || !strings.Contains(u.Message, "wiped") {
		t.Fatalf("over the bound: %+v", u)
	}
	r = h.cacheJob(t, "acme", "widgets", `ls -A /tmp/small; echo end`, small)
	if out := stdoutOf(t, h, r); strings.TrimSpace(out) != "end" {
		t.Errorf("after eviction the cache holds %q", out)
	}
}

// What a malicious job plants in its cache does not reach the next job as
// it was: no FIFO, no device, no setuid bit; a link to the host's files
// resolves inside the next sandbox; a whiteout removes the file.
func TestCachePlantedEntriesDefused(t *testing.T) {
	h, _ := newHarness(t, false)
	c := CacheGrant{Name: "c", Path: "/root/c", MaxSize: 1 << 20}
	h.cacheJob(t, "acme", "widgets", `cd /root/c && echo old > gone && echo x > keep`, c)
	plant := `cd /root/c && rm gone && mkfifo fifo && cp /bin/sh suid && chmod 6755 suid && ln -s /etc/passwd link && ` +
		`ln -s ../../../../../../../../ up && mkdir d && chmod 1777 d && ls -l`
	r := h.cacheJob(t, "acme", "widgets", plant, c)
	if r.Result.ExitCode != 0 || !r.Result.Caches[0].Committed {
		t.Fatalf("plant: %+v; stdout %s", r.Result, stdoutOf(t, h, r))
	}
	look := `cd /root/c && for f in gone fifo suid link up d keep; do if [ -e $f ] || [ -L $f ]; then stat -c '%n %F %a %u' $f; else echo "$f none"; fi; done; ` +
		`head -c 5 link/ 2>/dev/null; head -1 up/etc/passwd`
	out := stdoutOf(t, h, h.cacheJob(t, "acme", "widgets", look, c))
	t.Logf("the next job sees:\n%s", out)
	for _, want := range []string{"gone none", "fifo none", "suid regular file 755 0", "link symbolic link", "up symbolic link", "d directory 777 0", "keep regular file 644 0",
		"root:x:0:0:root:/root:/bin/sh"} {
		if !strings.Contains(out, want) {
			t.Errorf("the next job's view lacks %q", want)
		}
	}
}

// Under runsc too, the second job finds the first's cache, whichever
// class wrote it.
func TestCacheUnderRunsc(t *testing.T) {
	h, _ := newHarness(t, false)
	if st, ok := h.m.cfg.Sandbox.Available(sandbox.ClassRunsc); !ok {
		t.Fatalf("runsc is not available: %s (build it with tools/sandbox/build.sh)", st.Reason)
	}
	r := h.cacheJobIn(t, sandbox.ClassRunsc, "acme", "widgets", `mkdir -p /root/.cache/go-build/x && echo gvisor > /root/.cache/go-build/x/f && rm -f /root/.cache/go-build/none`, goBuild)
	if r.State != Finished || r.Result.ExitCode != 0 || !r.Result.Caches[0].Committed {
		t.Fatalf("runsc job: %s %+v, stdout %q", r.State, r.Result, stdoutOf(t, h, r))
	}
	for _, class := range []sandbox.Class{sandbox.ClassRunsc, sandbox.ClassRunc} {
		r = h.cacheJobIn(t, class, "acme", "widgets", `cat /root/.cache/go-build/x/f`, goBuild)
		if out := stdoutOf(t, h, r); strings.TrimSpace(out) != "gvisor" {
			t.Errorf("%s job reads %q", class, out)
		}
	}
}

// A session's cache survives its suspension (the cache's layer lives with
// its /work, not its emptied $HOME) and is committed when its client
// finishes it; the next job of the repository finds it.
func TestSessionCacheSurvivesSuspendAndCommitsOnFinish(t *testing.T) {
	h, _ := newHarness(t, false)
	g := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	g.Caches = []CacheGrant{goBuild}
	sid := h.startSession(t, g)
	h.execWait(t, sid, sh("write", "echo from-session > /root/.cache/go-build/s"))
	h.suspendResume(t, sid)
	if x := h.execWait(t, sid, sh("read", "cat /root/.cache/go-build/s")); string(x.StdoutTail) != "from-session\n" {
		t.Fatalf("after resume the cache reads %q", x.StdoutTail)
	}
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	run := h.waitEnd(t, sid)
	if len(run.Result.Caches) != 1 || !run.Result.Caches[0].Committed {
		t.Fatalf("finished session: %s, caches %+v", run.Result.Reason, run.Result.Caches)
	}
	r := h.cacheJob(t, "acme", "widgets", `cat /root/.cache/go-build/s`, goBuild)
	if out := stdoutOf(t, h, r); out != "from-session\n" {
		t.Errorf("the next job reads %q", out)
	}
}

// A session kept across an executor restart keeps its cache layer and the
// generation it started with, even after another job committed a newer
// one meanwhile: its writes are committed when it is finished.
func TestKeptSessionKeepsItsCache(t *testing.T) {
	h, _ := newHarness(t, false)
	g := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	g.Caches = []CacheGrant{goBuild}
	sid := h.startSession(t, g)
	h.execWait(t, sid, sh("write", "echo kept > /root/.cache/go-build/k"))
	h.cacheJob(t, "acme", "widgets", `echo other > /root/.cache/go-build/o`, goBuild)
	h.m.Close()
	h.restart(t, nil)
	h.waitRun(t, sid, "kept, suspended", func(r Run, _ bool) bool { return r.Suspended })
	if _, err := h.m.Resume(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "resumed", func(r Run, up bool) bool { return !r.Suspended && up })
	x := h.execWait(t, sid, sh("read", "cat /root/.cache/go-build/k; ls /root/.cache/go-build"))
	if string(x.StdoutTail) != "kept\nk\n" {
		t.Fatalf("after the restart the session's cache reads %q; want its own write and not the newer commit", x.StdoutTail)
	}
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	if run := h.waitEnd(t, sid); len(run.Result.Caches) != 1 || !run.Result.Caches[0].Committed {
		t.Fatalf("finished: %+v", run.Result.Caches)
	}
	r := h.cacheJob(t, "acme", "widgets", `cat /root/.cache/go-build/k /root/.cache/go-build/o`, goBuild)
	if out := stdoutOf(t, h, r); out != "kept\nother\n" {
		t.Errorf("the next job reads %q, want both commits", out)
	}
}

// A real build cache: the repository's first job builds a Go program cold
// with GOCACHE in the go-build cache; the second builds nothing again.
// Their wall times go to the log.
func TestGoBuildCacheWarmsTheSecondJob(t *testing.T) {
	if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
		t.Fatalf("this test builds with the host's Go at /usr/local/go (bound read-only in the sandbox): %v", err)
	}
	h, _ := newHarness(t, false)
	build := `mkdir -p /tmp/hello && cd /tmp/hello && printf 'module hello\ngo 1.21\n' > go.mod && ` +
		`printf 'package main\nimport "fmt"\nfunc main() { fmt.Println("hi") }\n' > main.go && ` +
		`/usr/local/go/bin/go build -v -o /tmp/hello/hello . 2>&1 | wc -l && /tmp/hello/hello`
	c := CacheGrant{Name: "go-build", Path: "/root/.cache/go-build", MaxSize: 1 << 30}
	var wall [2]time.Duration
	var compiled [2]string
	for i := range 2 {
		g := h.grantFor(build)
		g.Caches = []CacheGrant{c}
		g.Env = map[string]string{"GOCACHE": c.Path, "GOTOOLCHAIN": "local", "GOTELEMETRY": "off", "GOFLAGS": "-buildvcs=false"}
		g.Limits = sandbox.Limits{CPUMillis: 2000, MemoryBytes: 1 << 30, Pids: 512, DiskBytes: 1 << 30, Deadline: 5 * time.Minute}
		h.start(t, g)
		r := h.waitEnd(t, g.JobID)
		out := stdoutOf(t, h, r)
		if r.Result.ExitCode != 0 || !strings.HasSuffix(out, "hi\n") {
			t.Fatalf("build %d: %+v\n%s", i+1, r.Result, out)
		}
		wall[i], compiled[i] = r.Result.Usage.WallTime, strings.TrimSpace(strings.TrimSuffix(out, "hi\n"))
		t.Logf("build %d: %s packages compiled, wall %s, cache %+v", i+1, compiled[i], wall[i].Round(time.Millisecond), r.Result.Caches[0])
	}
	if compiled[0] == "0" || compiled[1] != "0" {
		t.Fatalf("packages compiled: first %s, second %s; want some, then none", compiled[0], compiled[1])
	}
}
