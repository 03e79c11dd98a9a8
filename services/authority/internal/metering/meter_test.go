package metering

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// guideShape is the guide's example: 2 vCPU, 4 GB memory, 4 GB disk.
var guideShape = Shape{CPUMillis: 2000, MemoryBytes: 4 * GB, DiskBytes: 4 * GB}

func ended(class string, shape Shape, start time.Time, awake time.Duration) Job {
	return Job{ID: "j", Tenant: "dev", Class: class, Shape: shape, Start: start, End: start.Add(awake), Awake: awake, Wall: awake}
}

// TestGuideExample: the guide's shape awake a whole 730-hour month costs
// $4.76 in a sandbox and $11.36 in a VM, to the micro-dollar.
func TestGuideExample(t *testing.T) {
	month := 730 * time.Hour
	for _, c := range []struct {
		class string
		want  Micros
	}{{"runc", 4_760_000}, {"runsc", 4_760_000}, {"vm", 11_360_000}} {
		j := ended(c.class, guideShape, t0, month)
		u := Meter(j, t0, t0.Add(month), t0.Add(month), DefaultRates())
		if u.Cost != c.want || u.Cost.String() != c.want.String() {
			t.Errorf("%s: cost %d (%s), want %d (%s)", c.class, u.Cost, u.Cost, c.want, c.want)
		}
		if u.AwakeMinutes != MonthMinutes || u.Alloc.VCPUMinutes() != 2*MonthMinutes ||
			u.Alloc.MemoryByteMinutes.GBMinutes() != 4*MonthMinutes || u.Alloc.DiskByteMinutes.GBMinutes() != 4*MonthMinutes {
			t.Errorf("%s: quantities %+v", c.class, u)
		}
	}
}

// TestMinuteRounding: a started minute counts whole, and only started ones.
func TestMinuteRounding(t *testing.T) {
	for _, c := range []struct {
		awake time.Duration
		want  int64
	}{{0, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {time.Minute, 1}, {time.Minute + time.Millisecond, 2}, {90 * time.Minute, 90}} {
		j := ended("runc", Shape{CPUMillis: 1000, MemoryBytes: GB, DiskBytes: GB}, t0, c.awake)
		if c.awake == 0 {
			j.End = t0 // ended at once, nothing awake
		}
		u := Meter(j, t0, t0.Add(24*time.Hour), t0.Add(24*time.Hour), DefaultRates())
		if u.AwakeMinutes != c.want || u.Alloc.CPUMilliMinutes != 1000*c.want {
			t.Errorf("awake %v: %d minutes, %d milli-vCPU-minutes; want %d minutes", c.awake, u.AwakeMinutes, u.Alloc.CPUMilliMinutes, c.want)
		}
	}
	// One vCPU-minute at $0.80 a month: 0.8/43800 dollars = 18.26... micros.
	j := ended("runc", Shape{CPUMillis: 1000}, t0, 30*time.Second)
	if u := Meter(j, t0, t0.Add(time.Hour), t0.Add(time.Hour), DefaultRates()); u.Cost != 18 {
		t.Errorf("one vCPU-minute: %d micros, want 18", u.Cost)
	}
}

// TestMultiplier: the class multiplies compute, not disk; a class the
// rates do not name is 1x.
func TestMultiplier(t *testing.T) {
	r := Rates{VCPUMonth: 1_000_000, MemoryGBMonth: 1_000_000, DiskGBMonth: 1_000_000, ClassCompute: map[string]int64{"vm": 3000, "runsc": 1500}}
	month := 730 * time.Hour
	for _, c := range []struct {
		class string
		shape Shape
		want  Micros
	}{
		{"runc", Shape{CPUMillis: 1000}, 1_000_000},
		{"vm", Shape{CPUMillis: 1000}, 3_000_000},
		{"runsc", Shape{MemoryBytes: 2 * GB}, 3_000_000},
		{"vm", Shape{DiskBytes: GB}, 1_000_000},
		{"other", Shape{CPUMillis: 500}, 500_000},
	} {
		u := Meter(ended(c.class, c.shape, t0, month), t0, t0.Add(month), t0.Add(month), r)
		if u.Cost != c.want {
			t.Errorf("%s %+v: %d, want %d", c.class, c.shape, u.Cost, c.want)
		}
	}
}

// TestDaySplit: a job across UTC midnight is split by the minute, and its
// days add up to the whole exactly, network bytes and cost included.
func TestDaySplit(t *testing.T) {
	start := t0.Add(23*time.Hour + 30*time.Minute) // 23:30 on the 1st
	j := ended("runc", guideShape, start, 90*time.Minute)
	j.NetSent, j.NetReceived, j.CPUTime = 9000, 3, 45*time.Minute
	now := start.Add(2 * time.Hour)
	days := Days(j, t0, now, now, DefaultRates())
	if len(days) != 2 || days[0].Day != "2026-12-01" || days[1].Day != "2026-12-02" {
		t.Fatalf("days = %+v", days)
	}
	if days[0].AwakeMinutes != 30 || days[1].AwakeMinutes != 60 {
		t.Fatalf("awake minutes %d + %d, want 30 + 60", days[0].AwakeMinutes, days[1].AwakeMinutes)
	}
	if days[0].NetSent != 3000 || days[1].NetSent != 6000 || days[0].NetReceived+days[1].NetReceived != 3 {
		t.Fatalf("network %d/%d and %d/%d", days[0].NetSent, days[0].NetReceived, days[1].NetSent, days[1].NetReceived)
	}
	whole := Meter(j, t0, now, now, DefaultRates())
	if sum := days[0].Add(days[1]); sum.Cost != whole.Cost || sum.Alloc.CPUMilliMinutes != whole.Alloc.CPUMilliMinutes {
		t.Fatalf("days sum to %d micros, %d; the whole is %d, %d", sum.Cost, sum.Alloc.CPUMilliMinutes, whole.Cost, whole.Alloc.CPUMilliMinutes)
	}
	// The window clips: from midnight on, the 60 minutes of the 2nd.
	if u := Meter(j, t0.Add(24*time.Hour), now, now, DefaultRates()); u.AwakeMinutes != 60 {
		t.Fatalf("since midnight: %d minutes, want 60", u.AwakeMinutes)
	}
}

// TestRunningAndFallbacks: a running job counts until now; an ended one
// without awake time takes its wall time, then its span.
func TestRunningAndFallbacks(t *testing.T) {
	shape := Shape{CPUMillis: 1000}
	running := Job{Tenant: "dev", Class: "runc", Shape: shape, Start: t0}
	u := Meter(running, t0, t0.Add(time.Hour), t0.Add(10*time.Minute+time.Second), DefaultRates())
	if !u.Running || u.AwakeMinutes != 11 {
		t.Fatalf("running: %+v, want 11 minutes running", u)
	}
	wall := Job{Class: "runc", Shape: shape, Start: t0, End: t0.Add(time.Hour), Wall: 5 * time.Minute}
	if u := Meter(wall, t0, t0.Add(2*time.Hour), t0.Add(2*time.Hour), DefaultRates()); u.AwakeMinutes != 5 {
		t.Fatalf("wall fallback: %d minutes, want 5", u.AwakeMinutes)
	}
	lost := Job{Class: "runc", Shape: shape, Start: t0, End: t0.Add(7 * time.Minute)}
	if u := Meter(lost, t0, t0.Add(2*time.Hour), t0.Add(2*time.Hour), DefaultRates()); u.AwakeMinutes != 7 {
		t.Fatalf("span fallback: %d minutes, want 7", u.AwakeMinutes)
	}
	// Asleep: disk for awake and asleep, compute for awake alone.
	slept := Job{Class: "runc", Shape: Shape{CPUMillis: 1000, DiskBytes: GB}, Start: t0, End: t0.Add(time.Hour), Awake: 10 * time.Minute, Asleep: 50 * time.Minute}
	u = Meter(slept, t0, t0.Add(2*time.Hour), t0.Add(2*time.Hour), DefaultRates())
	if u.AwakeMinutes != 10 || u.AsleepMinutes != 50 || u.Alloc.CPUMilliMinutes != 10_000 || u.Alloc.DiskByteMinutes.GBMinutes() != 60 {
		t.Fatalf("asleep: %+v", u)
	}
}

func TestParseDollars(t *testing.T) {
	for in, want := range map[string]Micros{"0.80": 800_000, "100": 100_000_000, "$12.5": 12_500_000, "0.000001": 1, ".5": 500_000} {
		if got, err := ParseDollars(in); err != nil || got != want {
			t.Errorf("ParseDollars(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.0000001", "abc", "1e3", "+1", "1.-5", "$"} {
		if _, err := ParseDollars(in); err == nil {
			t.Errorf("ParseDollars(%q): no error", in)
		}
	}
	if m, err := ParseMultiplier("2.5"); err != nil || m != 2500 {
		t.Errorf("ParseMultiplier(2.5) = %d, %v", m, err)
	}
	for _, in := range []string{"0", "2.5001", "1001"} {
		if _, err := ParseMultiplier(in); err == nil {
			t.Errorf("ParseMultiplier(%q): no error", in)
		}
	}
	if s := Micros(100_015_000).String(); s != "$100.02" {
		t.Errorf("String = %s, want $100.02", s)
	}
}
