package jobs

import (
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// The admission gate decides which queued job asks the executor next.
// Jobs wait here, not in the executor, for two reasons: their tenant is at
// its quota (running jobs, memory or CPU of the jobs it has dispatched),
// or the executor answered the last start with "no capacity". While jobs
// wait, a newer job never overtakes them and one job asks the executor at a
// time. The next to ask is the oldest waiting job of the tenant holding the
// fewest jobs (ties: the tenant whose oldest waiter came first), among
// tenants under their quota; a job the executor refused goes back to the
// head of its tenant's line. So one tenant submitting forty jobs cannot
// starve another's one: each time capacity frees, the other tenant's job
// goes first. Nor is a large job starved by smaller ones of other tenants
// that fit: once they hold more than its tenant does, it is the one asked
// for, and nobody else goes before it fits. A job holds
// its share from the moment it may ask the executor until its drive ends
// (the run ended, or the job did).

// use is what one job holds.
type use struct{ memory, cpu int64 }

func useOf(l policy.Limits) use { return use{memory: l.MemoryBytes, cpu: l.CPUMillis} }

type waiter struct {
	id     string
	tenant string
	need   use
}

type gate struct {
	now func() time.Time
	// quota returns tenant's quota (zero fields: no bound).
	quota func(tenant string) policy.Quota

	mu      sync.Mutex
	waiting []*waiter                 // in arrival order
	holding map[string]map[string]use // tenant → job → what it holds
	// full, until that time, says the executor had no capacity for the
	// last job that asked; no job asks before then unless one ends.
	full    time.Time
	changed chan struct{} // closed and replaced when a waiter may go
	// trying is the job asking the executor right now: one at a time, so
	// two jobs never race for the room one run left.
	trying string
	// looks counts the times a waiter looked again (for tests: waiting
	// must not spin).
	looks int
}

func newGate(now func() time.Time, quota func(string) policy.Quota) *gate {
	return &gate{now: now, quota: quota, holding: map[string]map[string]use{}, changed: make(chan struct{})}
}

// wakeLocked lets every waiter look again.
func (g *gate) wakeLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wake lets every waiter look again (the fleet changed).
func (g *gate) wake() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.full = time.Time{}
	g.wakeLocked()
}

// hold records that job id of tenant holds need: a run the executor has,
// found at start-up or followed.
func (g *gate) hold(id, tenant string, need use) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holding[tenant] == nil {
		g.holding[tenant] = map[string]use{}
	}
	g.holding[tenant][id] = need
}

// resize changes what job id holds, if it holds anything (a job whose
// drive has ended holds nothing, and a change does not make it).
func (g *gate) resize(id, tenant string, need use) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.holding[tenant][id]; ok {
		g.holding[tenant][id] = need
		g.wakeLocked()
	}
}

// release forgets job id, waiting or holding, and lets the waiters look
// again: what it held is free.
func (g *gate) release(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.removeWaiterLocked(id)
	for t, jobs := range g.holding {
		if _, ok := jobs[id]; ok {
			delete(jobs, id)
			if len(jobs) == 0 {
				delete(g.holding, t)
			}
			g.full = time.Time{}
		}
	}
	if g.trying == id {
		g.trying = ""
	}
	g.wakeLocked()
}

// withdraw takes job id out of the queue (it was cancelled); a wait of it
// in enter ends at once.
func (g *gate) withdraw(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.removeWaiterLocked(id)
	g.wakeLocked()
}

func (g *gate) removeWaiterLocked(id string) {
	for i, w := range g.waiting {
		if w.id == id {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

func (g *gate) waitingLocked(id string) *waiter {
	for _, w := range g.waiting {
		if w.id == id {
			return w
		}
	}
	return nil
}

// overQuotaLocked says which of tenant's quotas admitting need would pass,
// "" if none.
func (g *gate) overQuotaLocked(tenant string, need use) string {
	q := g.quota(tenant)
	var n int64
	var sum use
	for _, u := range g.holding[tenant] {
		n++
		sum.memory += u.memory
		sum.cpu += u.cpu
	}
	switch {
	case q.RunningJobs > 0 && n+1 > q.RunningJobs:
		return fmt.Sprintf("tenant %s is at its quota.running_jobs (%d of %d running)", tenant, n, q.RunningJobs)
	case q.MemoryBytes > 0 && sum.memory+need.memory > q.MemoryBytes:
		return fmt.Sprintf("tenant %s is at its quota.memory (%s of %s held by %d jobs; this job needs %s)",
			tenant, bytesText(sum.memory), bytesText(q.MemoryBytes), n, bytesText(need.memory))
	case q.CPUMillis > 0 && sum.cpu+need.cpu > q.CPUMillis:
		return fmt.Sprintf("tenant %s is at its quota.cpu_millis (%d of %d held by %d jobs; this job needs %d)",
			tenant, sum.cpu, q.CPUMillis, n, need.cpu)
	}
	return ""
}

// nextLocked is the waiter that may go now, nil when none may.
func (g *gate) nextLocked() *waiter {
	if g.trying != "" || g.now().Before(g.full) {
		return nil
	}
	var best *waiter
	seen := map[string]bool{}
	for _, w := range g.waiting {
		if seen[w.tenant] {
			continue // only a tenant's oldest waiter is a candidate
		}
		seen[w.tenant] = true
		if g.overQuotaLocked(w.tenant, w.need) != "" {
			continue
		}
		if best == nil || len(g.holding[w.tenant]) < len(g.holding[best.tenant]) {
			best = w
		}
	}
	return best
}

// enter waits, up to max, for job id's turn. It returns true when the job
// may ask the executor now (it then holds need until release or refused,
// and must call tried when its ask is over); else false and why it waits
// ("" when it was withdrawn), so the caller can look at the job again.
func (g *gate) enter(id, tenant string, need use, max time.Duration) (bool, string) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, held := g.holding[tenant][id]; !held && g.waitingLocked(id) == nil {
		g.waiting = append(g.waiting, &waiter{id: id, tenant: tenant, need: need})
	}
	for {
		g.looks++
		_, held := g.holding[tenant][id]
		switch {
		case held:
			// Admitted before and asking again (a retry): its turn as
			// soon as nobody else is asking.
			if g.trying == "" || g.trying == id {
				g.trying = id
				return true, ""
			}
		case g.waitingLocked(id) == nil:
			return false, "" // withdrawn
		default:
			if w := g.nextLocked(); w != nil && w.id == id {
				g.removeWaiterLocked(id)
				if g.holding[tenant] == nil {
					g.holding[tenant] = map[string]use{}
				}
				g.holding[tenant][id] = need
				g.trying = id
				return true, ""
			}
		}
		why := g.overQuotaLocked(tenant, need)
		if why == "" && g.now().Before(g.full) {
			why = "the executor has no capacity for it yet"
		}
		if why == "" {
			why = "jobs that came first, or of tenants holding fewer, go first"
		}
		changed := g.changed
		// Wake when the executor's hold-off ends, if one is in force.
		var holdOff <-chan time.Time
		stop := func() {}
		if d := g.full.Sub(g.now()); d > 0 {
			t := time.NewTimer(d + time.Millisecond)
			holdOff, stop = t.C, func() { t.Stop() }
		}
		g.mu.Unlock()
		select {
		case <-changed:
		case <-holdOff:
		case <-deadline.C:
			stop()
			g.mu.Lock()
			return false, why
		}
		stop()
		g.mu.Lock()
	}
}

// tried ends job id's turn at asking the executor.
func (g *gate) tried(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.trying == id {
		g.trying = ""
		g.wakeLocked()
	}
}

// refused returns job id, which the executor had no capacity for, to the
// front of the queue and holds every waiter back for wait (or until a job
// ends).
func (g *gate) refused(id, tenant string, need use, wait time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if jobs := g.holding[tenant]; jobs != nil {
		delete(jobs, id)
		if len(jobs) == 0 {
			delete(g.holding, tenant)
		}
	}
	g.removeWaiterLocked(id)
	g.waiting = append([]*waiter{{id: id, tenant: tenant, need: need}}, g.waiting...)
	g.full = g.now().Add(wait)
	if g.trying == id {
		g.trying = ""
	}
	g.wakeLocked()
}

// holdingOf sums what tenant's jobs other than except hold.
func (g *gate) holdingOf(tenant, except string) (jobs int64, total use) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, u := range g.holding[tenant] {
		if id == except {
			continue
		}
		jobs++
		total.memory += u.memory
		total.cpu += u.cpu
	}
	return jobs, total
}
