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
// wait, a newer job never overtakes them: whenever one may go, it is the
// oldest waiting job of the tenant with the fewest jobs holding resources
// (ties: the tenant whose oldest waiter came first), among tenants under
// their quota. So one tenant submitting forty jobs cannot starve another's
// one: each time capacity frees, the other tenant's job goes first. A job
// holds its share from the moment it may ask the executor until its drive
// ends (the run ended, or the job did).

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
}

func newGate(now func() time.Time, quota func(string) policy.Quota) *gate {
	return &gate{now: now, quota: quota, holding: map[string]map[string]use{}, changed: make(chan struct{})}
}

// wakeLocked lets every waiter look again.
func (g *gate) wakeLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// hold records that job id of tenant holds need (a job the executor has,
// found at start-up or just admitted).
func (g *gate) hold(id, tenant string, need use) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holding[tenant] == nil {
		g.holding[tenant] = map[string]use{}
	}
	g.holding[tenant][id] = need
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

// tried ends job id's turn at asking the executor.
func (g *gate) tried(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.trying == id {
		g.trying = ""
		g.wakeLocked()
	}
}

func (g *gate) removeWaiterLocked(id string) {
	for i, w := range g.waiting {
		if w.id == id {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

// overQuota says which of tenant's quotas admitting need would pass, "" if
// none.
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
// may ask the executor now (it then holds need until release or refused);
// else false and why it waits, so the caller can look at the job again.
func (g *gate) enter(id, tenant string, need use, max time.Duration) (bool, string) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	_, held := g.holding[tenant][id]
	found := false
	for _, w := range g.waiting {
		found = found || w.id == id
	}
	if !found && !held {
		g.waiting = append(g.waiting, &waiter{id: id, tenant: tenant, need: need})
	}
	for {
		if _, held := g.holding[tenant][id]; held {
			// Admitted before and asking again (a retry): its turn as
			// soon as nobody else is asking.
			if g.trying == "" || g.trying == id {
				g.trying = id
				return true, ""
			}
		} else if w := g.nextLocked(); w != nil && w.id == id {
			g.removeWaiterLocked(id)
			if g.holding[tenant] == nil {
				g.holding[tenant] = map[string]use{}
			}
			g.holding[tenant][id] = need
			g.trying = id
			return true, ""
		}
		why := g.overQuotaLocked(tenant, need)
		if why == "" && g.now().Before(g.full) {
			why = "the executor has no capacity for it yet"
		}
		if why == "" {
			why = "other tenants' jobs waiting for capacity go first"
		}
		changed := g.changed
		retry := time.NewTimer(max)
		if !g.full.IsZero() {
			retry.Reset(g.full.Sub(g.now()) + time.Millisecond)
		}
		g.mu.Unlock()
		select {
		case <-changed:
		case <-retry.C:
		case <-deadline.C:
			retry.Stop()
			g.mu.Lock()
			return false, why
		}
		retry.Stop()
		g.mu.Lock()
	}
}

// refused returns job id, which the executor had no capacity for, to the
// head of the queue, and holds every waiter back for wait (or until a job
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
