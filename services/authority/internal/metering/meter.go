package metering

import (
	"math/big"
	"time"
)

// ByteMinutes is bytes allocated times minutes: exact, however many jobs
// are summed.
type ByteMinutes struct{ n *big.Int }

func byteMinutes(bytes, minutes int64) ByteMinutes {
	return ByteMinutes{new(big.Int).Mul(big.NewInt(bytes), big.NewInt(minutes))}
}

func (b ByteMinutes) int() *big.Int {
	if b.n == nil {
		return new(big.Int)
	}
	return b.n
}

// Plus is b + c.
func (b ByteMinutes) Plus(c ByteMinutes) ByteMinutes {
	return ByteMinutes{new(big.Int).Add(b.int(), c.int())}
}

// GBMinutes is b in GB-minutes, for people.
func (b ByteMinutes) GBMinutes() float64 {
	f, _ := new(big.Rat).SetFrac(b.int(), big.NewInt(GB)).Float64()
	return f
}

// Alloc is what was allocated and is billed.
type Alloc struct {
	// CPUMilliMinutes is thousandths of a vCPU times awake minutes.
	CPUMilliMinutes int64
	// MemoryByteMinutes is the memory limit times awake minutes.
	MemoryByteMinutes ByteMinutes
	// DiskByteMinutes is the disk limit times retained (awake and asleep)
	// minutes.
	DiskByteMinutes ByteMinutes
}

// VCPUMinutes is CPUMilliMinutes in vCPU-minutes.
func (a Alloc) VCPUMinutes() float64 { return float64(a.CPUMilliMinutes) / 1000 }

func (a Alloc) plus(b Alloc) Alloc {
	return Alloc{CPUMilliMinutes: a.CPUMilliMinutes + b.CPUMilliMinutes,
		MemoryByteMinutes: a.MemoryByteMinutes.Plus(b.MemoryByteMinutes), DiskByteMinutes: a.DiskByteMinutes.Plus(b.DiskByteMinutes)}
}

// Shape is a job's allocation: its granted limits.
type Shape struct {
	CPUMillis, MemoryBytes, DiskBytes int64
}

// Job is one job or session as metering reads it.
type Job struct {
	ID, Tenant string
	// Class is the runtime class that ran it: "runc", "runsc", "vm".
	Class string
	Shape Shape
	// Start is when it began staging or running; End when it ended (or
	// its late result was recorded), zero while it
	// runs.
	Start, End time.Time
	// Awake and Asleep are the run's time awake and asleep as the
	// executor reported them; Wall its wall time (the fallback for an
	// Awake of zero, from an older executor).
	Awake, Asleep, Wall time.Duration
	// CPUTime and PeakMemoryBytes are what the run used.
	CPUTime         time.Duration
	PeakMemoryBytes int64
	// NetSent and NetReceived are its network bytes.
	NetSent, NetReceived int64
	// Reported says its run's result is recorded: the quantities above
	// are the executor's. A job that ended without one may get it later.
	Reported bool
}

// Running reports whether j has not ended.
func (j Job) Running() bool { return j.End.IsZero() }

// Usage is what one row metered.
type Usage struct {
	// JobID is set for a row of one job; Day ("2026-12-05") for a row of a
	// tenant's UTC day and class.
	JobID, Tenant, Day, Class string
	Alloc                     Alloc
	// AwakeMinutes and AsleepMinutes are whole minutes, a started minute
	// counting whole.
	AwakeMinutes, AsleepMinutes int64
	// CPUUsedMinutes is CPU time; MemoryUsedGBMinutes the peak memory
	// times awake minutes.
	CPUUsedMinutes, MemoryUsedGBMinutes float64
	NetSent, NetReceived                int64
	// Cost is Alloc at the rates, rounded to micro-dollars; cost is
	// exact, so sums round once.
	Cost    Micros
	cost    *big.Rat
	Running bool
	// Start orders rows of jobs, newest first.
	Start time.Time
}

// ceilMinutes is d in minutes, a started minute counting whole.
func ceilMinutes(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Minute - 1) / time.Minute)
}

// totals are a job's whole quantities before they are placed in time.
type totals struct {
	awake, asleep int64 // minutes
	cpu           time.Duration
	peak          int64
	sent, recv    int64
}

// whole is what job j used in all, as of now: a running job counts from
// its start until now, all awake (an upper bound, since a session may have
// slept); a job whose executor reported no awake time its wall time; one
// that reported neither (lost with its executor) its span.
func whole(j Job, now time.Time) totals {
	t := totals{cpu: j.CPUTime, peak: j.PeakMemoryBytes, sent: j.NetSent, recv: j.NetReceived}
	awake := j.Awake
	switch {
	case j.Running():
		awake = max(now.Sub(j.Start)-j.Asleep, 0)
	case awake <= 0 && j.Wall > 0:
		awake = j.Wall
	case awake <= 0 && j.Asleep <= 0:
		awake = j.End.Sub(j.Start)
	}
	t.awake, t.asleep = ceilMinutes(awake), ceilMinutes(j.Asleep)
	return t
}

// span is the job's time in minute slots from its start: slot k is
// [Start+k min, Start+(k+1) min).
func span(j Job, now time.Time) (start time.Time, slots int64) {
	end := j.End
	if j.Running() {
		end = now
	}
	return j.Start, max(ceilMinutes(end.Sub(j.Start)), 1)
}

// part is the share of a job's totals that falls in the slots [from, to)
// of its n slots: each quantity apportioned by the minute, the first slots
// rounding down and the last taking what is left, so the parts of a job
// add up to its whole exactly.
func part(t totals, from, to, n int64) totals {
	share := func(x int64) int64 {
		return mulDiv(x, to, n) - mulDiv(x, from, n)
	}
	p := totals{awake: share(t.awake), asleep: share(t.asleep), sent: share(t.sent), recv: share(t.recv), peak: t.peak}
	p.cpu = time.Duration(share(int64(t.cpu)))
	return p
}

// mulDiv is x*a/b rounded down, exact for any int64 operands.
func mulDiv(x, a, b int64) int64 {
	r := new(big.Int).Mul(big.NewInt(x), big.NewInt(a))
	return r.Quo(r, big.NewInt(b)).Int64()
}

// usageOf turns a job's part into a row at rates r.
func usageOf(j Job, p totals, r Rates) Usage {
	u := Usage{JobID: j.ID, Tenant: j.Tenant, Class: j.Class, AwakeMinutes: p.awake, AsleepMinutes: p.asleep,
		NetSent: p.sent, NetReceived: p.recv, Running: j.Running(), Start: j.Start,
		CPUUsedMinutes:      p.cpu.Minutes(),
		MemoryUsedGBMinutes: float64(p.peak) / GB * float64(p.awake),
		Alloc: Alloc{
			CPUMilliMinutes:   j.Shape.CPUMillis * p.awake,
			MemoryByteMinutes: byteMinutes(j.Shape.MemoryBytes, p.awake),
			DiskByteMinutes:   byteMinutes(j.Shape.DiskBytes, p.awake+p.asleep),
		},
	}
	u.cost = r.cost(j.Class, u.Alloc)
	u.Cost = round(u.cost)
	return u
}

// Meter is job j's usage within [since, until) as of now, at rates r:
// the minute slots of its span that start in the window.
func Meter(j Job, since, until, now time.Time, r Rates) Usage {
	start, n := span(j, now)
	from, to := slotsIn(start, n, since, until)
	return usageOf(j, part(whole(j, now), from, to, n), r)
}

// slotsIn is the range of a span's slots that start within [since, until).
func slotsIn(start time.Time, n int64, since, until time.Time) (from, to int64) {
	first := func(t time.Time) int64 { // the first slot starting at or after t
		if !t.After(start) {
			return 0
		}
		return min(ceilMinutes(t.Sub(start)), n)
	}
	return first(since), max(first(until), first(since))
}

// Days is job j's usage within [since, until) split by UTC day, as of
// now: one row per day the job's slots start in, oldest first.
func Days(j Job, since, until, now time.Time, r Rates) []Usage {
	start, n := span(j, now)
	from, to := slotsIn(start, n, since, until)
	t := whole(j, now)
	var out []Usage
	for from < to {
		day := start.Add(time.Duration(from) * time.Minute).UTC().Truncate(24 * time.Hour)
		next := min(to, max(from+1, ceilSlots(start, day.Add(24*time.Hour))))
		u := usageOf(j, part(t, from, next, n), r)
		u.Day = day.Format(time.DateOnly)
		out = append(out, u)
		from = next
	}
	return out
}

// ceilSlots is the first slot of a span starting at start that starts at
// or after t.
func ceilSlots(start, t time.Time) int64 {
	if !t.After(start) {
		return 0
	}
	return ceilMinutes(t.Sub(start))
}

// Add sums b into a row: quantities and exact cost; the row's identity
// (job, day, class) is a's.
func (a Usage) Add(b Usage) Usage {
	a.Alloc = a.Alloc.plus(b.Alloc)
	a.AwakeMinutes += b.AwakeMinutes
	a.AsleepMinutes += b.AsleepMinutes
	a.CPUUsedMinutes += b.CPUUsedMinutes
	a.MemoryUsedGBMinutes += b.MemoryUsedGBMinutes
	a.NetSent += b.NetSent
	a.NetReceived += b.NetReceived
	a.Running = a.Running || b.Running
	c := new(big.Rat)
	if a.cost != nil {
		c.Set(a.cost)
	}
	if b.cost != nil {
		c.Add(c, b.cost)
	}
	a.cost, a.Cost = c, round(c)
	return a
}
