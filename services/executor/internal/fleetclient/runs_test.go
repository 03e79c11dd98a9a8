package fleetclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/provenance"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/test/gittest"
)

// These tests run real jobs, as package runs' do: they need root, cgroups,
// git and runc (AIRLOCK_RUNC).

// source serves one commit's tree as the authority's FetchSource does.
type source struct {
	hdr     stage.Header
	archive []byte
}

func (s *source) FetchSource(context.Context, string) (stage.Header, io.ReadCloser, error) {
	return s.hdr, io.NopCloser(bytes.NewReader(s.archive)), nil
}
func (s *source) ReportResult(context.Context, runs.Report) error { return nil }
func (s *source) FetchImageBlob(context.Context, string, string, bool) (images.Blob, io.ReadCloser, error) {
	return images.Blob{}, nil, fmt.Errorf("no images here")
}

// sandboxed is a run manager over a real sandbox, fenced by fence (nil:
// never), with capacity, and a grant maker of jobs running script.
func sandboxed(t *testing.T, fence runs.Fence, capacity runs.Capacity) (*runs.Manager, func(id, script string) runs.Grant) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to run sandboxes, not uid %d", os.Geteuid())
	}
	runc := os.Getenv("AIRLOCK_RUNC")
	if runc == "" {
		t.Skip("AIRLOCK_RUNC names no runc binary")
	}
	base := t.TempDir()
	repo := gittest.Init(t, filepath.Join(base, "repo"))
	repo.Write("README", "hello\n")
	commit := repo.Commit("base")
	src := &source{
		hdr: stage.Header{
			Commit: commit, TreeHash: strings.TrimSpace(gittest.Run(t, repo.Dir, "rev-parse", "HEAD^{tree}")),
			CommitObject: []byte(gittest.Run(t, repo.Dir, "cat-file", "commit", "HEAD")),
		},
		archive: []byte(gittest.Run(t, repo.Dir, "archive", "--format=tar", "HEAD")),
	}
	uidBase := uint32(1500000 + (os.Getpid()%7)*65536)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sb, err := sandbox.New(sandbox.Config{
		StateDir: filepath.Join(base, "sandbox"), RuncPath: runc, UIDBase: uidBase,
		CgroupParent: fmt.Sprintf("/airlock-fleetclient-test-%d", os.Getpid()), Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	sources, err := stage.New(filepath.Join(base, "sources"), int(uidBase), int(uidBase))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := runs.New(runs.Config{
		Dir: filepath.Join(base, "runs"), Sandbox: sb, Sources: sources, Authority: src,
		Sign:     func(string, string, provenance.Run) ([]byte, error) { return []byte(`{}`), nil },
		Executor: "spiffe://test.example/service/executor/exec-b", Capacity: capacity, Fence: fence, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		if err := sb.Close(); err != nil {
			t.Errorf("sandbox Close: %v", err)
		}
	})
	return mgr, func(id, script string) runs.Grant {
		return runs.Grant{
			JobID: id, Tenant: "acme", Repository: "widgets", Commit: commit, Command: []string{"sh", "-c", script},
			Limits:            sandbox.Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 32 << 20, Deadline: time.Minute},
			NetworkGeneration: 1, Generation: 1, Class: sandbox.ClassRunc, Signed: []byte(id),
		}
	}
}

// waitState waits until job id's run is in one of states.
func waitState(t *testing.T, mgr *runs.Manager, id string, within time.Duration, states ...runs.State) runs.Run {
	t.Helper()
	end := time.Now().Add(within)
	for {
		r, err := mgr.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(states, r.State) {
			return r
		}
		if time.Now().After(end) {
			t.Fatalf("job %s is %s after %v, want one of %v (result %+v)", id, r.State, within, states, r.Result)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The report says what the run manager admits against, after it admitted
// a run: the totals of its capacity, what the run leaves free, and the
// run; and what the executor runs and where it is reached. An answer
// naming the run in cancel_runs cancels it, saying why.
func TestReportAndCancelRuns(t *testing.T) {
	mgr, grantFor := sandboxed(t, nil, runs.Capacity{MemoryBytes: 1 << 30, CPUMillis: 4000, DiskBytes: 1 << 30, Jobs: 4})
	if _, _, err := mgr.Start(grantFor("job-held", "sleep 60")); err != nil {
		t.Fatal(err)
	}
	waitState(t, mgr, "job-held", time.Minute, runs.Running)
	h := &heartbeats{}
	start(t, h, mgr, nil)
	req := h.wait(t, 1, 5*time.Second)
	want := &authorityv1.ExecutorCapacity{
		MemoryBytes: 1 << 30, MemoryFreeBytes: 1<<30 - 256<<20, CpuMillis: 4000, CpuFreeMillis: 3000,
		DiskBytes: 1 << 30, DiskFreeBytes: 1<<30 - 32<<20, Jobs: 4, JobsFree: 3,
	}
	rep := req.GetReport()
	if got := rep.GetCapacity(); got.String() != want.String() {
		t.Errorf("capacity %v, want %v", got, want)
	}
	if req.GetAddress() != "10.77.0.2:7402" || !slices.Equal(rep.GetRuns(), []string{"job-held"}) || rep.GetRunsTruncated() ||
		len(rep.GetRuntimeClasses()) != 1 || rep.GetRuntimeClasses()[0].String() != "RUNTIME_CLASS_RUNC" ||
		!slices.Equal(rep.GetNetworkPools(), []string{"10.200.4.0/22"}) || rep.GetVersion() != "test" || rep.GetStartedAt().GetSeconds() != 1700000000 {
		t.Errorf("report %v", req)
	}

	h.set(func(h *heartbeats) {
		h.answer = &authorityv1.HeartbeatResponse{Name: "exec-b", Interval: durationpb.New(time.Second), CancelRuns: []string{"job-held", "job-elsewhere"}}
	})
	r := waitState(t, mgr, "job-held", time.Minute, runs.Cancelled, runs.Failed, runs.Finished)
	if r.State != runs.Cancelled || !strings.Contains(r.Result.Message, CancelReason) {
		t.Errorf("the cancelled run ended %s: %+v; want cancelled saying %q", r.State, r.Result, CancelReason)
	}
	// A job the executor has no run of is remembered: its StartJob, if
	// still on its way, is refused.
	if _, _, err := mgr.Start(grantFor("job-elsewhere", "true")); err == nil {
		t.Error("a job the authority cancelled before it had a run here started")
	}
}

// A fenced executor starts no sandbox: after the authority stops
// answering for longer than the fence's bound, a new run waits in
// staging; once a heartbeat is answered again, it runs. A run already
// running keeps running meanwhile.
func TestFence(t *testing.T) {
	fence := NewFence(time.Second, nil)
	mgr, grantFor := sandboxed(t, fence, runs.Capacity{})
	h := &heartbeats{}
	start(t, h, mgr, fence)
	h.wait(t, 1, 5*time.Second)
	if _, _, err := mgr.Start(grantFor("job-before", "sleep 60")); err != nil {
		t.Fatal(err)
	}
	waitState(t, mgr, "job-before", time.Minute, runs.Running)

	h.set(func(h *heartbeats) { h.failing = true })
	for f, _ := fence.Fenced(); !f; f, _ = fence.Fenced() {
		time.Sleep(50 * time.Millisecond)
	}
	if _, _, err := mgr.Start(grantFor("job-fenced", "echo ran")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if r, _ := mgr.Get("job-fenced"); r.State != runs.Staging {
		t.Fatalf("a run accepted while fenced is %s, want staging (no sandbox)", r.State)
	}
	if r, _ := mgr.Get("job-before"); r.State != runs.Running {
		t.Fatalf("a run running before the fence is %s, want running", r.State)
	}

	h.set(func(h *heartbeats) { h.failing = false })
	if r := waitState(t, mgr, "job-fenced", time.Minute, runs.Finished, runs.Failed, runs.Cancelled); r.State != runs.Finished {
		t.Fatalf("the run once the fence opened ended %s: %+v", r.State, r.Result)
	}
}
