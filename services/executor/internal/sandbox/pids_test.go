package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Under runc the cgroup holds the job's limits as given; under runsc all
// but pids, which bound gVisor's host tasks with room to spare.
func TestCgroupLimitsOf(t *testing.T) {
	if got := cgroupLimitsOf(ClassRunc, defaultLimits); got != defaultLimits {
		t.Errorf("runc: %+v, want %+v", got, defaultLimits)
	}
	for _, tc := range []struct{ pids, host int64 }{
		{64, 64*64 + 1024},
		{100, 100*64 + 1024},
		{112, 8192},
		{128, 8192},
		{1024, 8192},
		{runspec.MaxRunscPids, 8192},
		// Above runspec's maximum (refused before a job is made) the
		// bound still holds.
		{8192, 8192},
		{1 << 40, 8192},
	} {
		l := defaultLimits
		l.Pids = tc.pids
		want := l
		want.Pids = tc.host
		if got := cgroupLimitsOf(ClassRunsc, l); got != want {
			t.Errorf("runsc, pids %d: %+v, want %+v", tc.pids, got, want)
		}
	}
	// Every limit runspec allows leaves at least two host tasks per job
	// task, and none takes more than the cap.
	for n := int64(runspec.MinRunscPids); n <= runspec.MaxRunscPids; n++ {
		l := defaultLimits
		l.Pids = n
		if got := cgroupLimitsOf(ClassRunsc, l).Pids; got < 2*n+runscHostPidsBase || got > runscHostPidsMax {
			t.Fatalf("runsc, pids %d: host bound %d", n, got)
		}
	}
}

// A runsc job's bundle holds it to its pids limit inside gVisor, soft and
// hard alike (the job can lower but never raise it); its cgroup holds the
// host bound. A running runsc job's pids cannot change: the sentry keeps
// the limit it started with. A runc job has no RLIMIT_NPROC: there it
// would count the host user's tasks, not the job's.
func TestRunscPidsLimit(t *testing.T) {
	e := newEnv(t)
	for _, c := range []Class{ClassRunc, ClassRunsc} {
		t.Run(string(c), func(t *testing.T) {
			sb, err := e.m.Create(context.Background(), Spec{ID: "pids-" + string(c), Class: c, Source: e.source(t, nil),
				Command: []string{"true"}, Limits: defaultLimits})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sb.Destroy(); err != nil {
					t.Errorf("Destroy: %v", err)
				}
			})
			data, err := os.ReadFile(filepath.Join(sb.bundle, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var spec specs.Spec
			if err := json.Unmarshal(data, &spec); err != nil {
				t.Fatal(err)
			}
			var nproc []specs.POSIXRlimit
			for _, r := range spec.Process.Rlimits {
				if r.Type == "RLIMIT_NPROC" {
					nproc = append(nproc, r)
				}
			}
			want := cgroupLimits{MemoryBytes: defaultLimits.MemoryBytes, Pids: defaultLimits.Pids, CPUMillis: defaultLimits.CPUMillis}
			if c == ClassRunsc {
				n := uint64(defaultLimits.Pids)
				if len(nproc) != 1 || nproc[0].Soft != n || nproc[0].Hard != n {
					t.Errorf("RLIMIT_NPROC %+v, want soft and hard %d", nproc, n)
				}
				want.Pids = cgroupLimitsOf(ClassRunsc, defaultLimits).Pids
			} else if len(nproc) != 0 {
				t.Errorf("RLIMIT_NPROC %+v under runc", nproc)
			}
			if got := jobLimits(t, e, sb); got != want {
				t.Errorf("cgroup limits %+v, want %+v", got, want)
			}
			more := defaultLimits
			more.Pids *= 2
			err = sb.UpdateLimits(more)
			if c == ClassRunc {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "limits.pids") {
				t.Fatalf("UpdateLimits of a runsc job's pids: %v, want invalid argument naming limits.pids", err)
			}
			if got := jobLimits(t, e, sb); got != want {
				t.Errorf("cgroup limits %+v after a refused update, want %+v", got, want)
			}
			// The other limits still change, the host bound staying.
			more = defaultLimits
			more.MemoryBytes *= 2
			if err := sb.UpdateLimits(more); err != nil {
				t.Fatal(err)
			}
			want.MemoryBytes = more.MemoryBytes
			if got := jobLimits(t, e, sb); got != want {
				t.Errorf("cgroup limits %+v after a memory update, want %+v", got, want)
			}
		})
	}
}

// At the host-task bound only runsc's exit as a panicking sentry (status
// 2) is taken for the sandbox's failure; a job that met the bound and then
// exited on its own keeps its status (its Result says the bound was met).
func TestSentryDiedAtHostPids(t *testing.T) {
	for _, tc := range []struct {
		hit  bool
		code int
		want bool
	}{
		{true, 2, true},
		{true, 1, false},
		{true, 3, false},
		{true, 137, false},
		{true, 0, false},
		{false, 2, false},
		{false, 1, false},
	} {
		if got := sentryDiedAtHostPids(tc.hit, tc.code); got != tc.want {
			t.Errorf("bound reached %v, exit %d: sandbox error %v, want %v", tc.hit, tc.code, got, tc.want)
		}
	}
}
