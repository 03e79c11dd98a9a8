package fleetclient

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/test/bufconntest"
)

// heartbeats is a stand-in for the authority's Heartbeat, used because
// the real handler is being written on another branch: it records each
// request and when it came, and answers with answer (nil: a fixed
// answer), or fails with Unavailable while failing is set.
type heartbeats struct {
	authorityv1.UnimplementedAuthorityServiceServer
	mu      sync.Mutex
	got     []*authorityv1.HeartbeatRequest
	at      []time.Time
	failing bool
	answer  *authorityv1.HeartbeatResponse
	arrived chan struct{} // gets a value on every request, if buffered room
}

func (h *heartbeats) Heartbeat(_ context.Context, req *authorityv1.HeartbeatRequest) (*authorityv1.HeartbeatResponse, error) {
	h.mu.Lock()
	defer func() {
		select {
		case h.arrived <- struct{}{}:
		default:
		}
	}()
	defer h.mu.Unlock()
	h.got, h.at = append(h.got, req), append(h.at, time.Now())
	if h.failing {
		return nil, status.Error(codes.Unavailable, "the stand-in authority is out of reach")
	}
	if h.answer != nil {
		return h.answer, nil
	}
	return &authorityv1.HeartbeatResponse{Name: "exec-b", Interval: durationpb.New(time.Second)}, nil
}

func (h *heartbeats) set(f func(h *heartbeats)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

// requests are the requests so far and when each came.
func (h *heartbeats) requests() ([]*authorityv1.HeartbeatRequest, []time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*authorityv1.HeartbeatRequest(nil), h.got...), append([]time.Time(nil), h.at...)
}

// wait waits for the n-th request.
func (h *heartbeats) wait(t *testing.T, n int, within time.Duration) *authorityv1.HeartbeatRequest {
	t.Helper()
	deadline := time.After(within)
	for {
		if got, _ := h.requests(); len(got) >= n {
			return got[n-1]
		}
		select {
		case <-h.arrived:
		case <-deadline:
			got, _ := h.requests()
			t.Fatalf("%d heartbeats within %v, want %d", len(got), within, n)
		}
	}
}

// gaps checks the time between the first heartbeats: about want each.
func (h *heartbeats) gaps(t *testing.T, want ...time.Duration) {
	t.Helper()
	_, at := h.requests()
	for i, w := range want {
		if gap := at[i+1].Sub(at[i]); gap < w-50*time.Millisecond || gap > w+time.Second {
			t.Errorf("heartbeat %d came %v after the one before; want about %v", i+2, gap, w)
		}
	}
}

// start runs a client of h over mgr for the test's life, opening fence
// (nil: a new one of a minute).
func start(t *testing.T, h *heartbeats, mgr *runs.Manager, fence *Fence) (*Client, *Fence) {
	t.Helper()
	h.arrived = make(chan struct{}, 1)
	cc := bufconntest.Dial(t, func(r grpc.ServiceRegistrar) { authorityv1.RegisterAuthorityServiceServer(r, h) })
	if fence == nil {
		fence = NewFence(time.Minute, nil)
	}
	c, err := New(Config{
		Authority: cc, Address: "10.77.0.2:7402", Runs: mgr, Classes: []sandbox.Class{sandbox.ClassRunc},
		Pools:   []netip.Prefix{netip.MustParsePrefix("10.200.4.0/22")},
		Version: "test", StartedAt: time.Unix(1700000000, 0), Fence: fence, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		c.Close()
	})
	return c, fence
}

// emptyManager is a run manager with no sandbox: enough for what it
// reports with no run.
func emptyManager(t *testing.T) *runs.Manager {
	t.Helper()
	m, err := runs.New(runs.Config{Dir: t.TempDir(), Capacity: runs.Capacity{MemoryBytes: 1 << 30, CPUMillis: 4000, DiskBytes: 8 << 30, Jobs: 4}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// The interval of the answer is honoured, bounded below by MinInterval;
// the drain it says is kept, and an answer opens the fence.
func TestInterval(t *testing.T) {
	h := &heartbeats{answer: &authorityv1.HeartbeatResponse{Name: "exec-b", Interval: durationpb.New(10 * time.Millisecond), Draining: true}}
	c, fence := start(t, h, emptyManager(t), nil)
	h.wait(t, 3, 5*time.Second)
	h.gaps(t, MinInterval, MinInterval) // the answer's 10ms, bounded
	if !c.Draining() {
		t.Error("the answer's drain was not kept")
	}
	if f, _ := fence.Fenced(); f {
		t.Error("fenced after answers")
	}
}

// After failures the heartbeat is retried after MinInterval, then twice
// as long, never longer than the interval; the first answer after them
// ends the back-off. Before that first answer the executor is fenced.
func TestBackoff(t *testing.T) {
	h := &heartbeats{failing: true}
	_, fence := start(t, h, emptyManager(t), nil)
	h.wait(t, 3, 6*time.Second)
	if f, _ := fence.Fenced(); !f {
		t.Error("not fenced before any answer")
	}
	h.set(func(h *heartbeats) { h.failing = false })
	h.wait(t, 5, 10*time.Second)
	h.gaps(t, time.Second, 2*time.Second)
	if f, _ := fence.Fenced(); f {
		t.Error("still fenced after the authority answered again")
	}
}

// An authority without a fleet (Heartbeat Unimplemented) answers: it
// never places a job elsewhere, so it fences nothing.
func TestNoFleet(t *testing.T) {
	cc := bufconntest.Dial(t, func(r grpc.ServiceRegistrar) {
		authorityv1.RegisterAuthorityServiceServer(r, authorityv1.UnimplementedAuthorityServiceServer{})
	})
	fence := NewFence(time.Minute, nil)
	c, err := New(Config{Authority: cc, Runs: emptyManager(t), Fence: fence, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.beat(context.Background()); status.Code(err) != codes.Unimplemented {
		t.Fatalf("beat: %v", err)
	}
	if f, _ := fence.Fenced(); f {
		t.Error("fenced by an authority that runs no fleet")
	}
}
