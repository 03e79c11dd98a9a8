package runs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// newWarmHarness is a harness whose manager keeps up to max pooled
// sandboxes, with the exec helper and a network manager of its own, and
// the pool running (as after Recover).
func newWarmHarness(t *testing.T, max int, capacity Capacity) *harness {
	t.Helper()
	execd := filepath.Join(filepath.Dir(runcPath(t)), "airlock-execd")
	if _, err := os.Stat(execd); err != nil {
		t.Fatalf("the exec helper: %v (make runtimes builds it)", err)
	}
	h, _ := newHarnessMeter(t, false, capacity, nil, func(c *sandbox.Config) { c.ExecdPath = execd })
	withNetwork(t, h)
	if ok, why := h.m.cfg.Sandbox.ExecHelper(); !ok {
		t.Fatalf("no exec helper on this kernel (%s): sandboxes are not pooled here", why)
	}
	h.m.cfg.WarmPool = WarmPool{MaxSandboxes: max}
	if err := h.m.newPool(); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}

// poolOf is the pool's status for tenant's shapes.
func (h *harness) poolOf(tenant string) (ready, target int, hits, misses int64) {
	for _, s := range h.m.WarmPools() {
		if s.Tenant == tenant {
			ready, target, hits, misses = ready+s.Ready, target+s.Target, hits+s.Hits, misses+s.Misses
		}
	}
	return
}

func (h *harness) waitPool(t *testing.T, tenant string, ready int) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, _, _, _ := h.poolOf(tenant); r == ready {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("tenant %s's pool did not reach %d ready: %+v", tenant, ready, h.m.WarmPools())
		}
	}
}

// TestWarmPoolSession: a tenant's first session misses and teaches the
// executor its shape; the pool fills; the next session of that shape
// claims a pooled sandbox and works like a fresh one (its /work, its
// .git, its user, its network policy); another tenant's session of the
// same shape never gets the first tenant's; a finished claimed session
// leaves nothing behind; a tenant whose policy asks for none gets none.
func TestWarmPoolSession(t *testing.T) {
	h := newWarmHarness(t, 3, Capacity{})
	first := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	first.WarmPool = 1
	sid := h.startSession(t, first)
	if name := h.entry(sid).sb.Name(); strings.HasPrefix(name, sandbox.PoolPrefix) {
		t.Errorf("the first session of its shape got pooled sandbox %s", name)
	}
	h.waitPool(t, "acme", 1)

	second := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	second.WarmPool = 1
	began := time.Now()
	sid2 := h.startSession(t, second)
	t.Logf("a pooled session running %v after its start", time.Since(began))
	name := h.entry(sid2).sb.Name()
	if !strings.HasPrefix(name, sandbox.PoolPrefix) {
		t.Fatalf("the second session of the shape got sandbox %s, not a pooled one", name)
	}
	x := h.execWait(t, sid2, sh("look", `cat /work/README; pwd; git -C /work log --format=%H -1; grep -c : /proc/net/dev; echo "$GREETING"`))
	// Its interfaces: lo alone (deny-all).
	want := "hello\n/work\n" + h.commit + "\n1\nhi\n"
	if x.ExitCode != 0 || string(x.StdoutTail) != want {
		t.Errorf("in the pooled session: exit %d, %q; want %q", x.ExitCode, x.StdoutTail, want)
	}
	if _, _, hits, misses := h.poolOf("acme"); hits != 1 || misses != 1 {
		t.Errorf("acme's hits %d and misses %d, want 1 and 1", hits, misses)
	}
	// The refill.
	h.waitPool(t, "acme", 1)

	other := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	other.Tenant, other.WarmPool = "other", 1
	sid3 := h.startSession(t, other)
	if name := h.entry(sid3).sb.Name(); strings.HasPrefix(name, sandbox.PoolPrefix) {
		t.Errorf("tenant other's first session got pooled sandbox %s (acme's?)", name)
	}
	if r, _, hits, _ := h.poolOf("acme"); r != 1 || hits != 1 {
		t.Errorf("acme's pool after another tenant's session: %d ready, %d hits", r, hits)
	}

	none := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	none.Tenant = "frugal"
	sid4 := h.startSession(t, none)
	if name := h.entry(sid4).sb.Name(); strings.HasPrefix(name, sandbox.PoolPrefix) {
		t.Errorf("a tenant asking for no pool got %s", name)
	}
	for _, id := range []string{sid, sid2, sid3, sid4} {
		if _, err := h.m.Finish(id); err != nil {
			t.Fatal(err)
		}
		if r := h.waitEnd(t, id); r.State != Finished {
			t.Errorf("session %s ended %s: %+v", id, r.State, r.Result)
		}
	}
	if r, _, _, _ := h.poolOf("frugal"); r != 0 {
		t.Errorf("a pool for a tenant that asks for none: %d", r)
	}
}

// TestWarmPoolYieldsToRuns: pooled sandboxes count against the
// executor's capacity, never make a run wait: a run that fits only
// without them is admitted, and the pool gives back its room.
func TestWarmPoolYieldsToRuns(t *testing.T) {
	// Disk for three runs' limits, the pool asking for two.
	h := newWarmHarness(t, 2, Capacity{DiskBytes: 3 * baseLimits.DiskBytes})
	teach := h.sessionGrant(sandbox.ClassRunc, time.Minute)
	teach.WarmPool = 2
	sid := h.startSession(t, teach)
	// One session holds a third; the pool may hold the rest.
	h.waitPool(t, "acme", 2)
	// A job of another shape (another user), which the pool has none of.
	job := h.grantFor("echo ran; exec sleep 300")
	job.WarmPool, job.User = 2, runspec.User{UID: 1000, GID: 1000}
	h.start(t, job)
	h.waitRunning(t, job.JobID, "ran")
	// It runs, and the pool gave back one sandbox's room.
	h.waitPool(t, "acme", 1)
	if _, err := h.m.Cancel(job.JobID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, job.JobID)
	// Its room back, the pool fills again.
	h.waitPool(t, "acme", 2)
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, sid)
}

// TestWarmPoolJob: a batch job of a warm shape claims a pooled sandbox,
// runs its command as the sandbox's main exec, and reports as it would
// have: its status, its output, its patch.
func TestWarmPoolJob(t *testing.T) {
	h := newWarmHarness(t, 2, Capacity{})
	teach := h.grantFor("true")
	teach.WarmPool = 1
	h.start(t, teach)
	if r := h.waitEnd(t, teach.JobID); r.State != Finished {
		t.Fatalf("the first job: %s %+v", r.State, r.Result)
	}
	h.waitPool(t, "acme", 1)
	g := h.grantFor(`echo "$GREETING from $(pwd)"; echo changed >> README; echo oops >&2; exit 4`)
	g.WarmPool = 1
	h.start(t, g)
	r := h.waitEnd(t, g.JobID)
	if r.State != Finished || r.Result.Reason != sandbox.ReasonExited || r.Result.ExitCode != 4 || r.Result.FilesChanged != 1 {
		t.Fatalf("the pooled job: %s %+v", r.State, r.Result)
	}
	out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
	errOut, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stderr.log"))
	if string(out) != "hi from /work\n" || string(errOut) != "oops\n" {
		t.Errorf("the pooled job's output: %q %q", out, errOut)
	}
	if _, _, hits, _ := h.poolOf("acme"); hits != 1 {
		t.Errorf("acme's hits: %d, want 1", hits)
	}
}

// TestWarmPoolShapes: a tenant keeps at most two shapes warm; a third
// within a minute of the older one's learning is made cold (no pool
// churns between them), and after that minute replaces the oldest; a
// grant asking for no pool drops its shape; the executor's bounds cap
// what a tenant asks.
func TestWarmPoolShapes(t *testing.T) {
	h, _ := newHarness(t, false)
	now := time.Unix(1e9, 0)
	h.m.cfg.Now = func() time.Time { return now }
	h.m.cfg.WarmPool = WarmPool{MaxSandboxes: 8, PerTenant: 3}
	// The pool is not run: targets only, no sandbox is made.
	if err := h.m.newPool(); err != nil {
		t.Fatal(err)
	}
	shape := func(disk int64) poolKey {
		return poolKey{Tenant: "acme", Class: sandbox.ClassRunc, DiskBytes: disk, ShmBytes: 64 << 20}
	}
	a, b, c := shape(1<<30), shape(2<<30), shape(3<<30)
	h.m.learnPool(a, 16)
	h.m.learnPool(b, 2)
	h.m.learnPool(c, 2)
	if ta, tb, tc := h.m.pool.Target(a), h.m.pool.Target(b), h.m.pool.Target(c); ta != 3 || tb != 2 || tc != 0 {
		t.Errorf("targets %d, %d, %d; want 3 (capped by per_tenant), 2, and 0 (a third shape within a minute)", ta, tb, tc)
	}
	now = now.Add(2 * time.Minute)
	h.m.learnPool(c, 2)
	if ta, tb, tc := h.m.pool.Target(a), h.m.pool.Target(b), h.m.pool.Target(c); ta != 0 || tb != 2 || tc != 2 {
		t.Errorf("a minute on: targets %d, %d, %d; want 0 (the oldest replaced), 2, 2", ta, tb, tc)
	}
	h.m.learnPool(b, 0)
	if tb := h.m.pool.Target(b); tb != 0 {
		t.Errorf("a grant asking for none left its shape's target at %d", tb)
	}
	if got := len(h.m.poolShapes["acme"]); got != 1 {
		t.Errorf("acme keeps %d shapes, want 1", got)
	}
}
