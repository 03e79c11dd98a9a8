package fleet

import (
	"context"
	"errors"

	"fmt"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"slices"
	"strings"
	"time"
)

// snapTTL is how long one read of the fleet (and of the unfinished jobs
// placed on each executor) serves placements: executors report every few
// seconds, and what this replica placed since is counted by its
// reservations.
const snapTTL = 500 * time.Millisecond

// Need is what a job asks of the executor it is placed on.
type Need struct {
	Tenant string
	// Class is its runtime class.
	Class string
	// MemoryBytes, CPUMillis and DiskBytes are its limits.
	MemoryBytes, CPUMillis, DiskBytes int64
	// Image is its image's manifest digest ("" for the host template);
	// Source its TENANT/REPOSITORY: an executor holding them is preferred.
	Image, Source string
	// Exclude names executors (SPIFFE IDs) not to place it on.
	Exclude []string
}

// reservation is a job this replica placed on an executor.
type reservation struct {
	job  string
	need Need
	at   time.Time
}

// Place chooses the executor for a job needing need: one that is up, not
// drained, runs its class and has room for its limits (by its last report,
// less what this replica placed on it since), preferring one holding its
// image and source and running fewer of its tenant's jobs, then the one
// with the most memory free. The job is reserved there until Release or
// the executor's next report. With no such executor it returns why, for
// the waiting job's message.
func (f *Fleet) Place(ctx context.Context, job string, need Need) (Member, string, error) {
	members, err := f.snapshot(ctx)
	if err != nil {
		return Member{}, "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The tenant's unfinished jobs per executor, as last read, and what
	// this replica placed since.
	tenantJobs := map[string]int64{}
	for _, p := range f.placements {
		if p.Tenant == need.Tenant {
			tenantJobs[p.Executor] += p.Jobs
		}
	}
	for _, m := range members {
		for _, r := range f.reserved[m.Name] {
			if r.need.Tenant == need.Tenant {
				tenantJobs[m.ID]++
			}
		}
	}
	best, why := choose(members, need, tenantJobs, f.reservedLocked, f.full)
	if best == nil {
		return Member{}, why, nil
	}
	f.reserved[best.Name] = append(f.reserved[best.Name], reservation{job: job, need: need, at: f.now()})
	return *best, "", nil
}

// Lookup returns the executor with SPIFFE ID id as read within snapTTL
// (read again when it is not in that read).
func (f *Fleet) Lookup(ctx context.Context, id string) (Member, bool, error) {
	for fresh := false; ; fresh = true {
		if fresh {
			f.forget()
		}
		members, err := f.snapshot(ctx)
		if err != nil {
			return Member{}, false, err
		}
		for _, m := range members {
			if m.ID == id {
				return m, true, nil
			}
		}
		if fresh {
			return Member{}, false, nil
		}
	}
}

// Current returns the executor with SPIFFE ID id as the store holds it
// now: whether another replica drained it a moment ago, say.
func (f *Fleet) Current(ctx context.Context, id string) (Member, bool, error) {
	x, err := identity.Parse(id)
	if err != nil {
		return Member{}, false, nil
	}
	rec, err := f.cfg.Store.GetExecutor(ctx, NameOf(x))
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return Member{}, false, nil
	case err != nil:
		return Member{}, false, err
	case rec.ID != id:
		return Member{}, false, nil
	}
	m, err := memberOf(rec)
	return m, err == nil, err
}

// Release drops job's reservation (it ended, or was refused, or was
// placed anew).
func (f *Fleet) Release(job string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, rs := range f.reserved {
		f.reserved[name] = slices.DeleteFunc(rs, func(r reservation) bool { return r.job == job })
	}
}

// Ended tells the fleet that job, placed on executor id (a SPIFFE ID)
// with need, ended: what it held there is free now. Its reservation is
// dropped; and when the executor's last report still counted it as
// running, that much is counted free until the executor reports again —
// else short jobs would hold their room for a whole heartbeat interval.
func (f *Fleet) Ended(job, id string, need Need) {
	x, err := identity.Parse(id)
	if err != nil {
		return
	}
	name := NameOf(x)
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.reserved[name]); n > 0 {
		f.reserved[name] = slices.DeleteFunc(f.reserved[name], func(r reservation) bool { return r.job == job })
		if len(f.reserved[name]) < n {
			return // the report never counted it
		}
	}
	for _, m := range f.snap {
		if m.Name == name && slices.Contains(m.Report.Runs, job) && !slices.ContainsFunc(f.freed[name], func(r reservation) bool { return r.job == job }) {
			f.freed[name] = append(f.freed[name], reservation{job: job, need: need, at: f.now()})
		}
	}
}

// Full records that executor name refused a job for lack of capacity:
// nothing more is placed on it by this replica until it reports again.
func (f *Fleet) Full(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.snap {
		if m.Name == name {
			f.full[name] = m.LastSeen
		}
	}
}

// forget drops the cached read of the fleet after a change, so the next
// placement reads it anew.
func (f *Fleet) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapAt = time.Time{}
}

// snapshot is the fleet as read within snapTTL.
func (f *Fleet) snapshot(ctx context.Context) ([]Member, error) {
	f.mu.Lock()
	if !f.snapAt.IsZero() && f.cfg.Now().Sub(f.snapAt) < snapTTL {
		defer f.mu.Unlock()
		return f.snap, nil
	}
	f.mu.Unlock()
	members, placements, err := f.read(ctx)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap, f.placements, f.snapAt = members, placements, f.cfg.Now()
	// Reservations the executors' reports now count, and hold-offs their
	// reports ended, are dropped.
	seen := map[string]time.Time{}
	for _, m := range members {
		seen[m.Name] = m.LastSeen
	}
	for name, rs := range f.reserved {
		f.reserved[name] = slices.DeleteFunc(rs, func(r reservation) bool { return r.at.Before(seen[name]) })
	}
	for name, rs := range f.freed {
		f.freed[name] = slices.DeleteFunc(rs, func(r reservation) bool { return r.at.Before(seen[name]) })
	}
	for name, at := range f.full {
		if seen[name].After(at) {
			delete(f.full, name)
		}
	}
	return members, nil
}

// held is what reservations hold of an executor.
type held struct{ memory, cpu, disk, jobs int64 }

// reservedLocked sums what this replica reserved on executor name since
// its report, less what jobs its report counted have freed since.
func (f *Fleet) reservedLocked(name string) held {
	var sum held
	for _, r := range f.reserved[name] {
		sum.memory += r.need.MemoryBytes
		sum.cpu += r.need.CPUMillis
		sum.disk += r.need.DiskBytes
		sum.jobs++
	}
	for _, r := range f.freed[name] {
		sum.memory -= r.need.MemoryBytes
		sum.cpu -= r.need.CPUMillis
		sum.disk -= r.need.DiskBytes
		sum.jobs--
	}
	return sum
}

// choose is Place's decision over a read of the fleet: the best member for
// need, or nil and why none fits. tenantJobs counts need's tenant's
// unfinished jobs by executor ID; reserved sums this replica's
// reservations on an executor by name; full holds executors back.
func choose(members []Member, need Need, tenantJobs map[string]int64, reserved func(string) held, full map[string]time.Time) (*Member, string) {
	var (
		best             *Member
		bestScore        float64
		runsClass, upNow int
		drained, fullNow int
	)
	for i := range members {
		m := &members[i]
		if !slices.Contains(m.Report.Classes, need.Class) {
			continue
		}
		runsClass++
		if m.Lost || slices.Contains(need.Exclude, m.ID) {
			continue
		}
		upNow++
		if m.Draining {
			drained++
			continue
		}
		r := reserved(m.Name)
		c := m.Report.Capacity
		if _, heldOff := full[m.Name]; heldOff ||
			c.MemoryFree-r.memory < need.MemoryBytes || c.CPUFree-r.cpu < need.CPUMillis ||
			c.DiskFree-r.disk < need.DiskBytes || c.JobsFree-r.jobs < 1 {
			fullNow++
			continue
		}
		score := 0.0
		if need.Image != "" && slices.Contains(m.Report.Images, need.Image) {
			score += 4
		}
		if need.Source != "" && slices.Contains(m.Report.Sources, need.Source) {
			score += 2
		}
		score -= float64(tenantJobs[m.ID])
		if c.MemoryBytes > 0 {
			// At most 1: a report of more free than total is refused, and
			// this only orders otherwise equal executors.
			score += min(float64(c.MemoryFree-r.memory)/float64(c.MemoryBytes), 1)
		}
		if best == nil || score > bestScore || (score == bestScore && m.Name < best.Name) {
			best, bestScore = m, score
		}
	}
	if best != nil {
		return best, ""
	}
	var why []string
	switch {
	case runsClass == 0:
		return nil, fmt.Sprintf("no executor of the fleet runs runtime class %s", need.Class)
	case upNow == 0:
		return nil, fmt.Sprintf("every executor that runs runtime class %s is lost", need.Class)
	}
	if drained > 0 {
		why = append(why, fmt.Sprintf("%d drained", drained))
	}
	if fullNow > 0 {
		why = append(why, fmt.Sprintf("%d without room for %s of memory, %d millicores and %s of disk", fullNow,
			config.FormatByteSize(need.MemoryBytes), need.CPUMillis, config.FormatByteSize(need.DiskBytes)))
	}
	return nil, fmt.Sprintf("no executor has room for it yet (of %d that run %s: %s)", upNow, need.Class, strings.Join(why, ", "))
}

// Address returns where the executor with SPIFFE ID id is reached
// (executorclient.Resolver).
func (f *Fleet) Address(ctx context.Context, id string) (string, bool, error) {
	m, ok, err := f.Lookup(ctx, id)
	return m.Address, ok, err
}
