package runs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// startTestHost makes a test host (package nettest) with a TCP listener
// that greets and hangs up, and returns its address. The addresses are a
// /30 of 203.0.113.0/25 (TEST-NET-3; the end-to-end tests take the other
// half), which exists only inside the pair.
func startTestHost(t *testing.T) netip.AddrPort {
	t.Helper()
	ln := listenOnTestHost(t)
	nettest.Greet(t, ln)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// listenOnTestHost makes a test host as startTestHost does and returns
// its TCP listener, for the caller to serve.
func listenOnTestHost(t *testing.T) net.Listener {
	t.Helper()
	n := int(testSeq.Add(1))
	th := nettest.Start(t, nettest.Config{
		Name:   fmt.Sprintf("rt%04x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, (os.Getpid()+n)%32),
	})
	return th.Listen(t, "tcp4", net.JoinHostPort(th.IP.String(), "0"))
}

// A newer grant's network policy is in force when Update returns: a job
// started deny-all cannot reach the test host, can once generation 2 allows
// it, and cannot again under generation 3's deny-all. The run reports
// each policy applied with its generation.
func TestUpdateNetworkPolicy(t *testing.T) {
	h, _ := newHarness(t, false)
	withNetwork(t, h)
	dest := startTestHost(t)

	try := fmt.Sprintf(`if timeout 5 bash -c 'cat </dev/tcp/%s/%d'; then echo "reached $1"; else echo "refused $1"; fi`, dest.Addr(), dest.Port())
	script := "try() { " + try + "; }\n" + stepHandler + "\n"
	for i := 1; i <= 3; i++ {
		script += awaitSignal(i) + fmt.Sprintf("try %d\n", i)
	}
	g1 := h.grantFor(script)
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")

	step := func(i int, want string) {
		t.Helper()
		h.signal(t, g1.JobID)
		end := time.Now().Add(30 * time.Second)
		for {
			out, _ := os.ReadFile(filepath.Join(h.m.runDir(g1.JobID), "stdout.log"))
			if strings.Contains(string(out), fmt.Sprintf("reached %d", i)) || strings.Contains(string(out), fmt.Sprintf("refused %d", i)) {
				if !strings.Contains(string(out), fmt.Sprintf("%s %d", want, i)) {
					t.Fatalf("step %d: want %q; stdout %q (a job that never reaches an allowed host may not be in its Net's namespace: sandbox.Spec.NetNS)", i, want, out)
				}
				return
			}
			if time.Now().After(end) {
				t.Fatalf("step %d: no answer; stdout %q", i, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// What the API reports (convert.NetworkPolicyStatus): the grant's
	// policy and generation, applied at NetworkUpdatedAt.
	var applied time.Time
	check := func(r Run, gen int64) {
		t.Helper()
		g := r.Grant
		if g.NetworkGeneration != gen || r.NetworkFailure != "" || !r.NetworkUpdatedAt.After(applied) {
			t.Fatalf("run under network generation %d (failure %q, applied at %s); want %d applied after %s",
				g.NetworkGeneration, r.NetworkFailure, r.NetworkUpdatedAt, gen, applied)
		}
		applied = r.NetworkUpdatedAt
	}
	check(must2(h.m.Get(g1.JobID)), 1)
	step(1, "refused")

	g2 := next(g1, func(g *Grant) {
		g.Network = allowPolicy(dest.Addr().String()+"/32", dest.Port())
		g.NetworkGeneration = 2
	})
	r2, err := h.m.Update(context.Background(), h.seal(t, g2))
	if err != nil {
		t.Fatal(err)
	}
	check(r2, 2)
	step(2, "reached")

	g3 := next(g2, func(g *Grant) {
		g.Network = NetworkPolicy{}
		g.NetworkGeneration = 3
	})
	r3, err := h.m.Update(context.Background(), h.seal(t, g3))
	if err != nil {
		t.Fatal(err)
	}
	check(r3, 3)
	step(3, "refused")
	if run := h.waitEnd(t, g1.JobID); run.State != Finished || run.Result.ExitCode != 0 {
		t.Fatalf("run ended %s %+v", run.State, run.Result)
	}
}

func must2(r Run, err error) Run {
	if err != nil {
		panic(err)
	}
	return r
}
