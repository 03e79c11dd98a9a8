package sandbox

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// ddScript writes 16 MiB to the scratch disk and reads it back, both with
// direct I/O (which cgroup v1 throttles too), and prints each one's
// nanoseconds.
const ddScript = `t0=$(date +%s%N)
dd if=/dev/zero of=/tmp/f bs=1M count=16 oflag=direct 2>/dev/null || exit 3
t1=$(date +%s%N)
dd if=/tmp/f of=/dev/null bs=1M iflag=direct 2>/dev/null || exit 4
t2=$(date +%s%N)
echo "write $((t1-t0)) read $((t2-t1))"`

func ddRates(t *testing.T, r ran) (write, read float64) {
	t.Helper()
	wantExit(t, r, 0)
	f := strings.Fields(r.stdout)
	if len(f) != 4 || f[0] != "write" || f[2] != "read" {
		t.Fatalf("dd job printed %q", r.stdout)
	}
	w, _ := strconv.ParseFloat(f[1], 64)
	rd, _ := strconv.ParseFloat(f[3], 64)
	if w <= 0 || rd <= 0 {
		t.Fatalf("dd job printed %q", r.stdout)
	}
	return 16 << 20 / (w / 1e9), 16 << 20 / (rd / 1e9)
}

// sandbox.disk_read_bps and disk_write_bps bound a job's disk bandwidth on
// its scratch device (cgroup v2 io.max, v1 blkio throttling): a dd runs at
// no more than the bound, where the same dd unbounded, measured in the same
// test, runs well above it. runc only: under runsc the sentry and gofer,
// not the job, do the I/O, through gVisor's own file systems.
func TestDiskBandwidthBound(t *testing.T) {
	const bound = 4 << 20 // bytes per second
	free := newEnv(t)
	src := free.source(t, nil)
	fw, fr := ddRates(t, free.run(t, context.Background(), job{src: src, cmd: []string{"sh", "-c", ddScript}}))
	t.Logf("unbounded: write %.1f MiB/s, read %.1f MiB/s", fw/(1<<20), fr/(1<<20))
	if fw < 2*bound || fr < 2*bound {
		t.Fatalf("the unbounded dd ran at write %.1f, read %.1f MiB/s, not well above the %d MiB/s bound: this test would prove nothing", fw/(1<<20), fr/(1<<20), bound>>20)
	}

	e := newEnv(t, func(c *Config) { c.DiskReadBPS, c.DiskWriteBPS = bound, bound })
	l := e.start(t, waitForSignal+ddScript, defaultLimits)
	l.waitOutput(t, "ready")
	got, err := e.m.cg.readLimits(l.sb.cgRel)
	if err != nil {
		t.Fatal(err)
	}
	if got.ReadBPS != bound || got.WriteBPS != bound {
		t.Errorf("the job's cgroups bound reads to %d, writes to %d bytes/s; want %d each", got.ReadBPS, got.WriteBPS, bound)
	}
	l.signal(t)
	r := l.wait(t)
	r.stdout = strings.TrimPrefix(r.stdout, "ready\n")
	w, rd := ddRates(t, r)
	t.Logf("bounded at %d MiB/s: write %.1f MiB/s, read %.1f MiB/s", bound>>20, w/(1<<20), rd/(1<<20))
	// The kernel lets a short burst through; over 16 MiB that is within
	// a quarter of the bound.
	if w > 1.25*bound || rd > 1.25*bound {
		t.Errorf("bounded dd ran at write %.1f, read %.1f MiB/s; the bound is %d MiB/s", w/(1<<20), rd/(1<<20), bound>>20)
	}
}

// A negative bound is refused naming the field.
func TestDiskBandwidthConfig(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), DiskWriteBPS: -1})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "sandbox.disk_read_bps") {
		t.Fatalf("New with a negative disk bound: %v", err)
	}
}
