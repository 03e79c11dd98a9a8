package runs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// withNetwork gives h's manager a network manager of the test's own, with
// a pool from 10.216.0.0/16.
func withNetwork(t *testing.T, h *harness) *netpolicy.Manager {
	t.Helper()
	n := int(testSeq.Add(1))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(t.TempDir(), "net"),
		Name:   fmt.Sprintf("ruo%d_%d", os.Getpid(), n),
		Pool4:  netip.MustParsePrefix(fmt.Sprintf("10.216.%d.0/24", (os.Getpid()*7+n)%256)),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The runs, and with them their namespaces, go before the manager.
	t.Cleanup(func() {
		h.m.Close()
		if err := nm.Close(); err != nil {
			t.Errorf("netpolicy Close: %v", err)
		}
	})
	h.m.cfg.Network = nm
	return nm
}

func (h *harness) entry(jobID string) *entry {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	return h.m.runs[jobID]
}

// An update whose network step is refused for a reason known beforehand
// changes nothing, not even for a moment: its much shorter deadline does
// not end the job.
func TestUpdateRefusedNetworkLeavesLimits(t *testing.T) {
	h, _ := newHarness(t, false)
	withNetwork(t, h)
	g1 := h.grantFor("echo ready; exec sleep 300")
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")
	e := h.entry(g1.JobID)
	e.updateMu.Lock()
	n := e.net
	e.updateMu.Unlock()
	// A namespace already gone: netpolicy refuses any policy for it.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	g2 := next(g1, func(g *Grant) {
		g.Limits.Deadline = time.Millisecond
		g.Network = allowPolicy("192.0.2.0/24", 443)
		g.NetworkGeneration = 2
	})
	_, err := h.m.Update(context.Background(), h.seal(t, g2))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Update: %v; want failed precondition, the namespace is closed", err)
	}
	time.Sleep(time.Second)
	run, err := h.m.Get(g1.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != Running || run.Grant.Generation != 1 {
		t.Fatalf("after a refused update the job is %s under generation %d (%+v); want running under 1", run.State, run.Grant.Generation, run.Result)
	}
	if d := e.sb.Limits().Deadline; d != time.Minute {
		t.Errorf("deadline %s after a refused update, want the 1m in force", d)
	}
	if _, err := h.m.Cancel(g1.JobID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, g1.JobID)
}

// The job's namespace starts at the grant's network_policy_generation,
// which must be at least 1.
func TestStartNetworkGeneration(t *testing.T) {
	h, _ := newHarness(t, false)
	withNetwork(t, h)

	bad := h.grantFor("true")
	bad.NetworkGeneration = 0
	if _, _, err := h.m.Start(h.seal(t, bad)); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network_policy_generation") {
		t.Errorf("Start with network_policy_generation 0: %v; want invalid argument naming it", err)
	}

	g := h.grantFor("echo ready; exec sleep 300")
	g.NetworkGeneration = 3
	h.start(t, g)
	h.waitRunning(t, g.JobID, "ready")
	e := h.entry(g.JobID)
	e.updateMu.Lock()
	_, gen := e.net.Current()
	e.updateMu.Unlock()
	if gen != 3 {
		t.Errorf("the namespace is at policy generation %d, want the grant's 3", gen)
	}
	// And the next change applies at 4.
	g4 := next(g, func(g *Grant) {
		g.Network = allowPolicy("192.0.2.0/24", 443)
		g.NetworkGeneration = 4
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, g4)); err != nil {
		t.Fatalf("Update to network generation 4: %v", err)
	}
	if _, err := h.m.Cancel(g.JobID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(t, g.JobID)
}
