package runs

import (
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Real jobs move the executor's metrics, each with its fixed attributes:
// a start counted by class and kind and seen running in the gauges with
// what it holds of the capacity; a start past the capacity counted
// refused; a job that exits and one cancelled counted ended by reason,
// with their durations; the gauges back at zero after; a session's execs
// counted and its end by its own reason.
func TestMetrics(t *testing.T) {
	rd := metricstest.NewReader(t)
	h, _ := newHarnessMeter(t, false, Capacity{Jobs: 1, MemoryBytes: 1 << 30}, rd.Provider)
	runc := func(kv ...string) map[string]string {
		m := map[string]string{"runtime_class": "runc"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	want := func(got metricstest.Recorded, name string, attrs map[string]string, v float64) {
		t.Helper()
		if n, ok := got.Value(name, attrs); !ok || n != v {
			t.Errorf("%s %v = %v (recorded %v), want %v\n%s", name, attrs, n, ok, v, got.Points(name))
		}
	}

	g1 := h.grantFor(waitForSignal + "echo done")
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")
	got := rd.Collect(t)
	want(got, "airlock.executor.jobs.started", runc("kind", "job"), 1)
	want(got, "airlock.executor.jobs.active", runc("state", "running"), 1)
	want(got, "airlock.executor.jobs.active", runc("state", "staging"), 0)
	want(got, "airlock.executor.capacity.jobs.reserved", map[string]string{}, 1)
	want(got, "airlock.executor.capacity.jobs.limit", map[string]string{}, 1)
	want(got, "airlock.executor.capacity.memory.reserved", map[string]string{}, float64(baseLimits.MemoryBytes))
	want(got, "airlock.executor.capacity.memory.limit", map[string]string{}, 1<<30)
	want(got, "airlock.executor.capacity.cpu.reserved", map[string]string{}, float64(baseLimits.CPUMillis)/1000)
	if _, ok := got.Value("airlock.executor.capacity.cpu.limit", map[string]string{}); ok {
		t.Errorf("an unbounded CPU capacity has a limit:\n%s", got.Points("airlock.executor.capacity.cpu.limit"))
	}
	if n, _, ok := got.Histogram("airlock.executor.sandbox.create.duration", runc("outcome", "ok")); !ok || n != 1 {
		t.Errorf("sandbox.create.duration count %d (%v), want 1\n%s", n, ok, got.Points("airlock.executor.sandbox.create.duration"))
	}

	g2 := h.grantFor("true")
	if _, _, err := h.m.Start(h.seal(t, g2)); err == nil {
		t.Fatal("a second job started past a capacity of one job")
	}
	want(rd.Collect(t), "airlock.executor.jobs.refused", map[string]string{"cause": "capacity"}, 1)

	h.signal(t, g1.JobID)
	if run := h.waitEnd(t, g1.JobID); run.State != Finished {
		t.Fatalf("job 1 ended %s: %+v", run.State, run.Result)
	}
	g3 := h.grantFor(waitForSignal + "echo done")
	h.start(t, g3)
	h.waitRunning(t, g3.JobID, "ready")
	if _, err := h.m.Cancel(g3.JobID); err != nil {
		t.Fatal(err)
	}
	if run := h.waitEnd(t, g3.JobID); run.State != Cancelled {
		t.Fatalf("job 3 ended %s: %+v", run.State, run.Result)
	}

	got = rd.Collect(t)
	want(got, "airlock.executor.jobs.started", runc("kind", "job"), 2)
	want(got, "airlock.executor.jobs.ended", runc("kind", "job", "reason", "exited"), 1)
	want(got, "airlock.executor.jobs.ended", runc("kind", "job", "reason", "cancelled"), 1)
	want(got, "airlock.executor.jobs.active", runc("state", "running"), 0)
	want(got, "airlock.executor.capacity.jobs.reserved", map[string]string{}, 0)
	want(got, "airlock.executor.capacity.memory.reserved", map[string]string{}, 0)
	if n, sum, ok := got.Histogram("airlock.executor.job.duration", runc("kind", "job")); !ok || n != 2 || sum <= 0 {
		t.Errorf("job.duration count %d sum %v (%v), want 2 runs of some time\n%s", n, sum, ok, got.Points("airlock.executor.job.duration"))
	}

	// A session: its execs counted, its end by its own reason.
	sid := h.startSession(t, h.sessionGrant(sandbox.ClassRunc, time.Minute))
	for _, id := range []string{"a", "b"} {
		h.execWait(t, sid, ExecSpec{ID: id, Argv: []string{"true"}})
	}
	want(rd.Collect(t), "airlock.executor.jobs.active", runc("state", "running"), 1)
	if _, err := h.m.Finish(sid); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, sid)
	got = rd.Collect(t)
	want(got, "airlock.executor.jobs.started", runc("kind", "session"), 1)
	want(got, "airlock.executor.execs.started", map[string]string{}, 2)
	want(got, "airlock.executor.jobs.ended", runc("kind", "session", "reason", "finished"), 1)
	want(got, "airlock.executor.jobs.active", runc("state", "running"), 0)
}
