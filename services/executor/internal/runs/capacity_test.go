package runs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// wantRefusal checks that err wraps code and says msg.
func wantRefusal(t *testing.T, what string, err, code error, msg string) {
	t.Helper()
	if !errors.Is(err, code) || !strings.Contains(err.Error(), msg) {
		t.Fatalf("%s: %v; want %v saying %q", what, err, code, msg)
	}
}

// With 512 MiB of memory for jobs: two running jobs of 256 MiB fill it, so
// a third is refused for now (ResourceExhausted) and one asking more than
// the whole capacity for good (FailedPrecondition), neither leaving a run
// behind; Start of a job that has its run is answered with the run. A
// raise of a running job's memory beyond what the other leaves is refused
// and changes nothing; lowering it works and makes room; once a job ends
// its memory is free for the next.
func TestCapacityMemory(t *testing.T) {
	h, _ := newHarnessWith(t, false, Capacity{MemoryBytes: 512 << 20})
	g1, g2 := h.grantFor(waitForSignal+"echo done"), h.grantFor(waitForSignal+"echo done")
	for _, g := range []*Grant{g1, g2} {
		h.start(t, g)
		h.waitRunning(t, g.JobID, "ready")
	}

	g3 := h.grantFor(waitForSignal + "echo done")
	_, _, err := h.m.Start(h.seal(t, g3))
	wantRefusal(t, "a third job", err, errdefs.ErrResourceExhausted, "capacity: memory: 512.0MiB of 512.0MiB in use by 2 jobs; this job asks 256.0MiB")
	big := h.grantFor("true")
	big.Limits.MemoryBytes = 1 << 30
	_, _, err = h.m.Start(h.seal(t, big))
	wantRefusal(t, "a job larger than the capacity", err, errdefs.ErrFailedPrecondition,
		"capacity: memory: this job asks 1.0GiB, more than this executor's whole capacity of 512.0MiB")
	for _, id := range []string{g3.JobID, big.JobID} {
		if _, err := h.m.Get(id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("refused job %s has a run: %v", id, err)
		}
	}
	if run, created, err := h.m.Start(h.seal(t, g1)); err != nil || created || run.JobID != g1.JobID {
		t.Fatalf("Start of a job with a run: %s created %v, %v; want its run", run.JobID, created, err)
	}

	raised := next(g1, func(g *Grant) { g.Limits.MemoryBytes = 384 << 20 })
	_, err = h.m.Update(context.Background(), h.seal(t, raised))
	wantRefusal(t, "raising memory", err, errdefs.ErrResourceExhausted, "capacity: memory: 256.0MiB of 512.0MiB in use by 1 job; this job asks 384.0MiB")
	if r, _ := h.m.Get(g1.JobID); r.Grant.Generation != 1 {
		t.Errorf("a refused raise left the run under generation %d", r.Grant.Generation)
	}
	e := h.entry(g1.JobID)
	e.updateMu.Lock()
	got := e.sb.Limits().MemoryBytes
	e.updateMu.Unlock()
	if got != 256<<20 {
		t.Errorf("a refused raise left the sandbox's memory limit at %d", got)
	}
	lowered := next(g1, func(g *Grant) { g.Limits.MemoryBytes = 128 << 20 })
	if _, err := h.m.Update(context.Background(), h.seal(t, lowered)); err != nil {
		t.Fatalf("lowering memory: %v", err)
	}
	g4 := h.grantFor(waitForSignal + "echo done")
	g4.Limits.MemoryBytes = 128 << 20
	h.start(t, g4) // 128 + 256 + 128 MiB

	h.signal(t, g2.JobID)
	if run := h.waitEnd(t, g2.JobID); run.State != Finished {
		t.Fatalf("job 2 ended %s: %+v", run.State, run.Result)
	}
	h.start(t, g3) // in the 256 MiB job 2 held
	h.waitRunning(t, g3.JobID, "ready")
	for _, g := range []*Grant{g1, g3, g4} {
		h.waitRunning(t, g.JobID, "ready")
		h.signal(t, g.JobID)
	}
	for _, g := range []*Grant{g1, g3, g4} {
		if run := h.waitEnd(t, g.JobID); run.State != Finished {
			t.Errorf("job %s ended %s: %+v", g.JobID, run.State, run.Result)
		}
	}
}

// With room for 2 jobs at once: a third is refused while two run, Start
// of one of them again is not, and once one has ended the third starts.
func TestCapacityJobs(t *testing.T) {
	h, _ := newHarnessWith(t, false, Capacity{Jobs: 2})
	g1, g2, g3 := h.grantFor(waitForSignal+"echo done"), h.grantFor(waitForSignal+"echo done"), h.grantFor("true")
	for _, g := range []*Grant{g1, g2} {
		h.start(t, g)
		h.waitRunning(t, g.JobID, "ready")
	}
	_, _, err := h.m.Start(h.seal(t, g3))
	wantRefusal(t, "a third job", err, errdefs.ErrResourceExhausted, "capacity: jobs: 2 of 2 in use")
	if _, created, err := h.m.Start(h.seal(t, g2)); err != nil || created {
		t.Fatalf("Start of a running job again: created %v, %v", created, err)
	}
	h.signal(t, g1.JobID)
	if run := h.waitEnd(t, g1.JobID); run.State != Finished {
		t.Fatalf("job 1 ended %s: %+v", run.State, run.Result)
	}
	h.start(t, g3)
	h.signal(t, g2.JobID)
	for _, g := range []*Grant{g2, g3} {
		if run := h.waitEnd(t, g.JobID); run.State != Finished {
			t.Errorf("job %s ended %s: %+v", g.JobID, run.State, run.Result)
		}
	}
}

// The accounting: every bounded resource refuses past its capacity with
// its figures, a job larger than the whole capacity for good; a zero
// bound is none; a change is checked only for what it raises.
func TestCapacityChecks(t *testing.T) {
	c := Capacity{MemoryBytes: 4 << 30, CPUMillis: 2000, DiskBytes: 10 << 30, Jobs: 4}
	held := holding{memory: 3 << 30, cpu: 1500, disk: 8 << 30, jobs: 3}
	job := sandbox.Limits{MemoryBytes: 512 << 20, CPUMillis: 500, DiskBytes: 1 << 30}
	for _, tc := range []struct {
		name string
		edit func(*sandbox.Limits)
		code error
		msg  string
	}{
		{"fits", func(*sandbox.Limits) {}, nil, ""},
		{"memory", func(l *sandbox.Limits) { l.MemoryBytes = 2 << 30 }, errdefs.ErrResourceExhausted,
			"capacity: memory: 3.0GiB of 4.0GiB in use by 3 jobs; this job asks 2.0GiB"},
		{"cpu", func(l *sandbox.Limits) { l.CPUMillis = 1000 }, errdefs.ErrResourceExhausted,
			"capacity: cpu: 1.5 CPU of 2 CPU in use by 3 jobs; this job asks 1 CPU"},
		{"disk", func(l *sandbox.Limits) { l.DiskBytes = 3 << 30 }, errdefs.ErrResourceExhausted,
			"capacity: disk: 8.0GiB of 10.0GiB in use by 3 jobs; this job asks 3.0GiB"},
		{"whole memory", func(l *sandbox.Limits) { l.MemoryBytes = 5 << 30 }, errdefs.ErrFailedPrecondition,
			"capacity: memory: this job asks 5.0GiB, more than this executor's whole capacity of 4.0GiB"},
		{"whole cpu", func(l *sandbox.Limits) { l.CPUMillis = 2500 }, errdefs.ErrFailedPrecondition,
			"capacity: cpu: this job asks 2.5 CPU, more than this executor's whole capacity of 2 CPU"},
	} {
		l := job
		tc.edit(&l)
		err := c.admit(held, l)
		if tc.code == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.code) || !strings.HasSuffix(err.Error(), tc.msg) {
			t.Errorf("%s: %v; want %v saying %q", tc.name, err, tc.code, tc.msg)
		}
	}
	full := held
	full.jobs = 4
	if err := c.admit(full, job); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.HasSuffix(err.Error(), "capacity: jobs: 4 of 4 in use") {
		t.Errorf("a fifth job: %v", err)
	}
	if err := (Capacity{}).admit(holding{memory: 1 << 50, cpu: 1 << 40, disk: 1 << 50, jobs: 1 << 20}, job); err != nil {
		t.Errorf("no capacity bounds nothing: %v", err)
	}

	// A run of this job changing its limits, beside others holding held.
	over := held
	over.memory, over.cpu = 4<<30, 1000 // memory already full, say the capacity was lowered
	lower := job
	lower.MemoryBytes = 256 << 20
	if err := c.refit(over, job, lower); err != nil {
		t.Errorf("lowering memory: %v", err)
	}
	moreCPU := job
	moreCPU.CPUMillis = 600
	if err := c.refit(over, job, moreCPU); err != nil {
		t.Errorf("raising only cpu, which fits, when memory is over: %v", err)
	}
	moreMem := job
	moreMem.MemoryBytes = 2 << 30
	if err := c.refit(held, job, moreMem); !errors.Is(err, errdefs.ErrResourceExhausted) ||
		!strings.HasSuffix(err.Error(), "capacity: memory: 3.0GiB of 4.0GiB in use by 3 jobs; this job asks 2.0GiB") {
		t.Errorf("raising memory beyond the capacity: %v", err)
	}
}

// What runs hold is summed from the runs not yet ended; a run whose Update
// raises its limits holds the larger of each until it is done.
func TestCapacityHeld(t *testing.T) {
	limits := func(mem, cpu int64) Grant {
		return Grant{Limits: sandbox.Limits{MemoryBytes: mem, CPUMillis: cpu, DiskBytes: 1 << 20}}
	}
	raising := &sandbox.Limits{MemoryBytes: 300, CPUMillis: 50, DiskBytes: 1 << 20}
	a := &entry{run: Run{State: Running, Grant: limits(100, 100)}, raising: raising}
	b := &entry{run: Run{State: Staging, Grant: limits(10, 10)}}
	done := &entry{run: Run{State: Finished, Grant: limits(1000, 1000)}}
	m := &Manager{runs: map[string]*entry{"a": a, "b": b, "done": done}}
	if got, want := m.held(nil), (holding{memory: 310, cpu: 110, disk: 2 << 20, jobs: 2}); got != want {
		t.Errorf("held = %+v, want %+v", got, want)
	}
	if got, want := m.held(a), (holding{memory: 10, cpu: 10, disk: 1 << 20, jobs: 1}); got != want {
		t.Errorf("held without a = %+v, want %+v", got, want)
	}
}

// A VM job holds what its QEMU may take of the host: the guest's RAM and
// QEMU's own overhead beside it, as its cgroup bounds them.
func TestCapacityHeldVM(t *testing.T) {
	g := Grant{Class: sandbox.ClassVM, Limits: sandbox.Limits{MemoryBytes: 512 << 20, CPUMillis: 1000, DiskBytes: 1 << 30}}
	m := &Manager{runs: map[string]*entry{"vm": {run: Run{State: Running, Grant: g}}}}
	want := sandbox.HostLimits(sandbox.ClassVM, g.Limits).MemoryBytes
	if want <= g.Limits.MemoryBytes {
		t.Fatalf("HostLimits(vm) memory %d is not above the guest's %d", want, g.Limits.MemoryBytes)
	}
	if got := m.held(nil); got.memory != want || got.cpu != 1000 {
		t.Errorf("held = %+v, want memory %d", got, want)
	}
	c := Capacity{MemoryBytes: want + (512 << 20) - 1}
	if err := c.admit(m.held(nil), g.hostLimits()); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a second VM job where only its guest's RAM fits: %v", err)
	}
}
