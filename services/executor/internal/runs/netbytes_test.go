package runs

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// waitBytes waits up to 10 seconds for the sink's count to reach want,
// and returns it.
func waitBytes(got *atomic.Int64, want int64) int64 {
	for end := time.Now().Add(10 * time.Second); got.Load() < want && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	return got.Load()
}

// sendTo is a script that sends n bytes to dest over TCP, trying up to
// three times (a connect that fails sends a SYN or two, far less than n),
// and then waits for the sink (Sink with perConn n) to close the
// connection: the bytes have arrived before the job ends. (runsc drops
// what its network stack has not yet sent when the sandbox ends.)
func sendTo(dest netip.AddrPort, n int) string {
	return fmt.Sprintf(`for i in 1 2 3; do timeout 20 bash -c 'exec 3<>/dev/tcp/%s/%d && head -c %d /dev/zero >&3 && cat <&3 >/dev/null' && { echo sent; exit 0; }; sleep 1; done; echo refused`, dest.Addr(), dest.Port(), n)
}

// sentBytes is how much a job sends in the tests below: far above what
// anything but the job's own traffic could add to its veth.
const sentBytes = 1 << 20

// TestNetworkBytes: a job's network bytes are its veth's, under runc and
// runsc: one under an allow (CIDR) policy that sends sentBytes to a test
// host reports at least that much sent (and the ACKs it got back as
// received, far less); a deny-all job that tries the same has no
// interface and reports nothing.
func TestNetworkBytes(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			if st, ok := h.m.cfg.Sandbox.Available(class); !ok {
				t.Fatalf("%s is not available: %s (build it with tools/sandbox/build.sh)", class, st.Reason)
			}
			withNetwork(t, h)
			ln := listenOnTestHost(t)
			got := nettest.Sink(t, ln, sentBytes)
			dest := netip.MustParseAddrPort(ln.Addr().String())

			g := h.grantFor(sendTo(dest, sentBytes))
			g.Class = class
			g.Network = allowPolicy(dest.Addr().String()+"/32", dest.Port())
			h.start(t, g)
			run := h.waitEnd(t, g.JobID)
			if out := stdoutOf(t, h, run); run.State != Finished || out != "sent\n" {
				t.Fatalf("allow job: %s %+v, stdout %q", run.State, run.Result, out)
			}
			if n := waitBytes(got, sentBytes); n != sentBytes {
				t.Fatalf("the test host read %d bytes, want %d", n, sentBytes)
			}
			r := run.Result
			t.Logf("allow: %d sent, %d received", r.NetworkSentBytes, r.NetworkReceivedBytes)
			if r.NetworkSentBytes < sentBytes || r.NetworkSentBytes > 2*sentBytes || r.NetworkReceivedBytes <= 0 || r.NetworkReceivedBytes > sentBytes/4 {
				t.Errorf("allow job sent %d bytes: result says %d sent, %d received", sentBytes, r.NetworkSentBytes, r.NetworkReceivedBytes)
			}

			g = h.grantFor(sendTo(dest, sentBytes))
			g.Class = class
			h.start(t, g)
			run = h.waitEnd(t, g.JobID)
			if out := stdoutOf(t, h, run); run.State != Finished || out != "refused\n" {
				t.Fatalf("deny-all job: %s %+v, stdout %q", run.State, run.Result, out)
			}
			r = run.Result
			t.Logf("deny-all: %d sent, %d received", r.NetworkSentBytes, r.NetworkReceivedBytes)
			if r.NetworkSentBytes != 0 || r.NetworkReceivedBytes != 0 {
				t.Errorf("deny-all job: %d sent, %d received; want none", r.NetworkSentBytes, r.NetworkReceivedBytes)
			}
			if got.Load() != sentBytes {
				t.Errorf("the deny-all job reached the test host: %d bytes in all", got.Load())
			}
		})
	}
}

// TestSessionNetworkBytes: a session's network bytes add up over its
// sandbox's runs: before a suspension (and live, while it runs), after
// its resume, and after an executor restart (a new namespace, new
// counters; the earlier ones are in the run record).
func TestSessionNetworkBytes(t *testing.T) {
	h, _ := newHarness(t, false)
	withNetwork(t, h)
	ln := listenOnTestHost(t)
	got := nettest.Sink(t, ln, sentBytes)
	dest := netip.MustParseAddrPort(ln.Addr().String())
	g := h.sessionGrant(sandbox.ClassRunc, 5*time.Minute)
	g.Network = allowPolicy(dest.Addr().String()+"/32", dest.Port())
	sid := h.startSession(t, g)
	send := func(what string) {
		t.Helper()
		if x := h.execWait(t, sid, ExecSpec{ID: what, Argv: []string{"bash", "-c", sendTo(dest, sentBytes)}}); string(x.StdoutTail) != "sent\n" {
			t.Fatalf("%s: %q", what, x.StdoutTail)
		}
	}
	send("first")
	// Live, as GetRun reports them.
	if sent, _, err := h.m.NetworkBytes(sid); err != nil || sent < sentBytes {
		t.Fatalf("while it runs: %d sent, %v; want at least %d", sent, err, sentBytes)
	}
	h.suspendResume(t, sid)
	send("after-resume")

	h.m.Close()
	m2 := h.restart(t, nil)
	h.waitRun(t, sid, "suspended after the restart", func(r Run, _ bool) bool { return r.Suspended })
	if r, _ := m2.Get(sid); r.NetSentBefore < 2*sentBytes {
		t.Fatalf("the run record kept %d bytes sent across the restart, want at least %d", r.NetSentBefore, 2*sentBytes)
	}
	if _, err := m2.Resume(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "resumed after the restart", func(r Run, up bool) bool { return !r.Suspended && up })
	send("after-restart")
	if _, err := m2.Finish(sid); err != nil {
		t.Fatal(err)
	}
	run := h.waitEnd(t, sid)
	r := run.Result
	t.Logf("session: %d sent, %d received; the test host read %d", r.NetworkSentBytes, r.NetworkReceivedBytes, got.Load())
	if n := waitBytes(got, 3*sentBytes); n != 3*sentBytes {
		t.Fatalf("the test host read %d bytes, want %d", n, 3*sentBytes)
	}
	if r.NetworkSentBytes < 3*sentBytes || r.NetworkSentBytes > 6*sentBytes || r.NetworkReceivedBytes <= 0 {
		t.Errorf("session sent %d bytes in three runs: result says %d sent, %d received", 3*sentBytes, r.NetworkSentBytes, r.NetworkReceivedBytes)
	}
}

// suspendResume suspends session sid and resumes it, waiting for each.
func (h *harness) suspendResume(t *testing.T, sid string) {
	t.Helper()
	if _, err := h.m.Suspend(sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "suspended", func(r Run, up bool) bool { return r.Suspended && !up })
	if _, err := h.m.Resume(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	h.waitRun(t, sid, "resumed", func(r Run, up bool) bool { return !r.Suspended && up })
}
