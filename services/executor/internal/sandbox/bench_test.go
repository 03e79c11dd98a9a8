package sandbox

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The target: an end-to-end `true` job (Create+Run+Destroy) under
// 50 ms median and at most 2.5 times a raw `runc run` of the same bundle.
// Both benchmarks report their median besides the mean ns/op.

func BenchmarkSandboxTrue(b *testing.B) {
	e := newEnv(b)
	src := e.source(b, nil)
	ctx := context.Background()
	var times []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		sb, err := e.m.Create(ctx, Spec{ID: fmt.Sprintf("bench-%d", i), Class: ClassRunc, Source: src, Command: []string{"/bin/true"}, Limits: defaultLimits})
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
	}
	reportMedian(b, times)
}

// BenchmarkRawRuncTrue runs the same bundle with runc directly: no scratch,
// overlay or cgroup set-up, no teardown, no supervision.
func BenchmarkRawRuncTrue(b *testing.B) {
	e := newEnv(b)
	src := e.source(b, nil)
	ctx := context.Background()
	sb, err := e.m.Create(ctx, Spec{ID: "raw", Class: ClassRunc, Source: src, Command: []string{"/bin/true"}, Limits: defaultLimits})
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Destroy()
	var times []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		cmd := exec.Command(runcPath, "--root", filepath.Join(e.cfg.StateDir, "runc"), "run", "--bundle", sb.bundle, fmt.Sprintf("raw-%d", i))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runc run: %v: %s", err, out)
		}
		times = append(times, time.Since(start))
	}
	reportMedian(b, times)
}

func reportMedian(b *testing.B, times []time.Duration) {
	if len(times) == 0 {
		return
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
}
