package runs

import (
	"fmt"
	"strconv"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Capacity is how much the runs not yet ended may hold together: the sum
// of their grants' limits stays within each field. A zero field bounds
// nothing.
type Capacity struct {
	MemoryBytes int64
	CPUMillis   int64
	DiskBytes   int64
	Jobs        int
}

// holding is what the runs not yet ended hold.
type holding struct {
	memory, cpu, disk int64
	jobs              int
}

// held sums the limits of every run not yet ended but skip (nil skips
// none). A run whose Update is putting larger limits in force holds the
// larger of each; a suspended session only its disk. Callers hold m.mu.
func (m *Manager) held(skip *entry) holding {
	var h holding
	for _, e := range m.runs {
		if e == skip || e.run.State.Terminal() {
			continue
		}
		l := e.run.Grant.hostLimits()
		if e.run.Suspended && !e.resumeAsked {
			// A suspended session runs nothing: it holds its disk and its
			// place, not memory or CPU, until Resume admits it again.
			h.disk += l.DiskBytes
			h.jobs++
			continue
		}
		if e.raising != nil {
			l.MemoryBytes, l.CPUMillis = max(l.MemoryBytes, e.raising.MemoryBytes), max(l.CPUMillis, e.raising.CPUMillis)
		}
		h.memory += l.MemoryBytes
		h.cpu += l.CPUMillis
		h.disk += l.DiskBytes
		h.jobs++
	}
	return h
}

// hostLimits are what g's job holds of the host: its limits, and for a VM
// QEMU's own memory beside the guest's (sandbox.HostLimits).
func (g Grant) hostLimits() sandbox.Limits { return sandbox.HostLimits(g.Class, g.Limits) }

// resource is one bounded quantity, for the checks and their messages.
type resource struct {
	name              string
	bound, held, asks int64
	format            func(int64) string
}

func (c Capacity) resources(h holding, l sandbox.Limits) []resource {
	return []resource{
		{"memory", c.MemoryBytes, h.memory, l.MemoryBytes, config.FormatByteSizeApprox},
		{"cpu", c.CPUMillis, h.cpu, l.CPUMillis, cpuText},
		{"disk", c.DiskBytes, h.disk, l.DiskBytes, config.FormatByteSizeApprox},
	}
}

// admit says whether a new run with limits l may start beside those that
// hold h. A run that could never fit, even alone, is refused for good
// (FailedPrecondition); one that does not fit now may fit later, once
// others end (ResourceExhausted).
func (c Capacity) admit(h holding, l sandbox.Limits) error {
	if err := c.fits(h, l, nil); err != nil {
		return err
	}
	if c.Jobs > 0 && h.jobs+1 > c.Jobs {
		return fmt.Errorf("%w: capacity: jobs: %d of %d in use", errdefs.ErrResourceExhausted, h.jobs, c.Jobs)
	}
	return nil
}

// fits checks the resources that check picks (every one when check is
// nil) for a run with limits l beside those that hold h, with admit's
// errors.
func (c Capacity) fits(h holding, l sandbox.Limits, check func(name string) bool) error {
	for _, r := range c.resources(h, l) {
		if r.bound <= 0 || (check != nil && !check(r.name)) {
			continue
		}
		if r.asks > r.bound {
			return fmt.Errorf("%w: capacity: %s: this job asks %s, more than this executor's whole capacity of %s",
				errdefs.ErrFailedPrecondition, r.name, r.format(r.asks), r.format(r.bound))
		}
		if r.held+r.asks > r.bound {
			return fmt.Errorf("%w: capacity: %s: %s of %s in use by %s; this job asks %s",
				errdefs.ErrResourceExhausted, r.name, r.format(r.held), r.format(r.bound), jobsText(h.jobs), r.format(r.asks))
		}
	}
	return nil
}

// refit says whether a run holding cur may hold next instead beside the
// others, which hold h: only what rises is checked, so lowering always
// fits.
func (c Capacity) refit(h holding, cur, next sandbox.Limits) error {
	rising := map[string]bool{"memory": next.MemoryBytes > cur.MemoryBytes, "cpu": next.CPUMillis > cur.CPUMillis, "disk": next.DiskBytes > cur.DiskBytes}
	return c.fits(h, next, func(name string) bool { return rising[name] })
}

// cpuText writes thousandths of a core as CPUs ("1.5 CPU").
func cpuText(millis int64) string {
	return strconv.FormatFloat(float64(millis)/1000, 'f', -1, 64) + " CPU"
}

func jobsText(n int) string {
	if n == 1 {
		return "1 job"
	}
	return fmt.Sprintf("%d jobs", n)
}
