package sandbox

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkClassTrue is boot-to-exit of `true` in each runtime class, in
// one run: Create, Run and Destroy of a job that runs /bin/true. It
// reports the median and the host cgroup's peak memory (what the class
// costs the host for a job that does nothing: runc's own, gVisor's sentry
// and gofer, QEMU with the guest's RAM touched by its kernel and agent).
// The vm class runs under KVM where the host has it, else under TCG
// emulation (the sub-benchmark's class says which: vm-kvm or vm-tcg).
// benchstat -col /class shows the ratios.
func BenchmarkClassTrue(b *testing.B) {
	for _, c := range []Class{ClassRunc, ClassRunsc, ClassVM} {
		// The vm class's name says its accelerator, so a KVM host's
		// figures are never read as an emulated one's; the rest of the
		// name is the same, and benchstat -col /class lines them up.
		name := string(c)
		if c == ClassVM {
			name = "vm-kvm"
			if kvmUsable() != nil {
				name = "vm-tcg"
			}
		}
		b.Run("class="+name, func(b *testing.B) {
			var e *env
			if c == ClassVM {
				e = vmEnv(b)
			} else {
				e = newEnv(b)
			}
			src := e.source(b, nil)
			l := defaultLimits
			if c == ClassVM {
				l = vmLimits
			}
			var times []time.Duration
			var peak int64
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				sb, err := e.m.Create(ctx, Spec{ID: fmt.Sprintf("bench-%d", i), Class: c, Source: src, Command: []string{"/bin/true"}, Limits: l})
				if err != nil {
					b.Fatal(err)
				}
				res, err := sb.Run(ctx)
				if err != nil || res.Reason != ReasonExited || res.ExitCode != 0 {
					b.Fatalf("run: %v %+v", err, res)
				}
				if err := sb.Destroy(); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
				peak = max(peak, res.Usage.PeakMemoryBytes)
			}
			reportMedian(b, times)
			b.ReportMetric(float64(peak)/(1<<20), "peak-host-MiB")
		})
	}
}
