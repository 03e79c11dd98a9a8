package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// policyHost is a network namespace of the test's own with two TCP
// listeners, joined to the host by a veth pair. Everything from the
// netpolicy pool is routed into it (a policy-routing rule, whatever the
// destination), so nothing a job sends leaves the machine even if the
// rules were wrong.
type policyHost struct {
	ip           netip.Addr
	portA, portB int
}

func startPolicyHost(t *testing.T, pool netip.Prefix) policyHost {
	t.Helper()
	th := newTestHost(t, pool)
	ph := policyHost{ip: th.IP}
	for _, port := range []*int{&ph.portA, &ph.portB} {
		ln := th.Listen(t, "tcp4", net.JoinHostPort(th.IP.String(), "0"))
		nettest.Greet(t, ln)
		*port = ln.Addr().(*net.TCPAddr).Port
	}
	return ph
}

func (ph policyHost) addr(port int) string { return fmt.Sprintf("%s:%d", ph.ip, port) }

// runInNet runs script in a sandbox of class c that joins nn's namespace;
// during, if set, runs beside the job.
func (e *env) runInNet(t *testing.T, c Class, nn *netpolicy.Net, src, script string, during func(*Sandbox)) ran {
	t.Helper()
	var out, errb syncBuffer
	// Each refused dial waits out the probe's 3 s, and a loaded machine
	// (make test runs packages side by side) slows runsc's every process:
	// the live change's job once passed 30 s in CI with nothing wrong.
	lim := defaultLimits
	lim.Deadline = 90 * time.Second
	sb, err := e.m.Create(context.Background(), Spec{ID: nn.ID(), Class: c, Source: src, Command: []string{"/bin/sh", "-c", script},
		Limits: lim, NetNS: nn.Path(), Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	done := make(chan struct{})
	if during != nil {
		go func() {
			defer close(done)
			during(sb)
		}()
	} else {
		close(done)
	}
	res, err := sb.Run(context.Background())
	<-done
	r := ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("%s in %s: reason=%s exit=%d msg=%q\nstdout: %s\nstderr: %s", c, nn.Path(), res.Reason, res.ExitCode, res.Message, trunc(r.stdout), trunc(r.stderr))
	return r
}

// A job joins the namespace package netpolicy made for it: with an allow
// rule it reaches the allowed port of the test host and nothing else;
// deny-all leaves it loopback only. Both runtimes.
func TestNetworkPolicyNamespace(t *testing.T) {
	e := newEnv(t)
	pool := netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", os.Getpid()%256))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(e.base, "netpolicy"),
		Name:   fmt.Sprintf("sbt%d", os.Getpid()),
		Pool4:  pool,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nm.Close(); err != nil {
			t.Errorf("netpolicy Close: %v", err)
		}
	})
	ph := startPolicyHost(t, pool)
	src := e.source(t, nil)
	// The probe prints ALLOWED (exit 1) when it connects, "denied" (exit
	// 0) when it cannot.
	script := fmt.Sprintf(`./probe dial %s; echo "a=$?"; ./probe dial %s; echo "b=$?"; ./probe loopback; echo "lo=$?"; cat /proc/net/dev`,
		ph.addr(ph.portA), ph.addr(ph.portB))

	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			var opts []netpolicy.CreateOption
			if c == ClassRunsc {
				// gVisor copies the interfaces once, at start.
				opts = append(opts, netpolicy.FixedInterfaces())
			}
			newNet := func(p netpolicy.Policy) *netpolicy.Net {
				nn, err := nm.Create(context.Background(), fmt.Sprintf("job-%d", testSeq.Add(1)), p, opts...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := nn.Close(); err != nil {
						t.Errorf("netpolicy Net.Close: %v", err)
					}
				})
				return nn
			}

			allowA := netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(ph.ip, 32), Ports: []uint16{uint16(ph.portA)}}}}
			r := e.runInNet(t, c, newNet(allowA), src, script, nil)
			wantExit(t, r, 0)
			for _, want := range []string{"ALLOWED: dial " + ph.addr(ph.portA), "a=1", "denied: dial " + ph.addr(ph.portB), "b=0", "loopback ok", "lo=0", "eth0:"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("allow port A: output lacks %q", want)
				}
			}

			r = e.runInNet(t, c, newNet(netpolicy.Policy{}), src, script, nil)
			wantExit(t, r, 0)
			for _, want := range []string{"denied: dial " + ph.addr(ph.portA), "a=0", "b=0", "loopback ok", "lo=0"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("deny-all: output lacks %q", want)
				}
			}
			if strings.Contains(r.stdout, "eth0") {
				t.Errorf("deny-all: the job sees an interface besides lo")
			}

			// A running job's rules change from port A to port B; under
			// runsc too, since only the host's rules change.
			live := newNet(allowA)
			liveScript := fmt.Sprintf(`./probe dial %[1]s; echo "before_a=$?"; touch /out/ready
i=0; while [ ! -f /out/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
./probe dial %[1]s; echo "after_a=$?"; ./probe dial %[2]s; echo "after_b=$?"`, ph.addr(ph.portA), ph.addr(ph.portB))
			var applyErr error
			r = e.runInNet(t, c, live, src, liveScript, func(sb *Sandbox) {
				for i := 0; i < 900; i++ {
					if _, err := os.Stat(filepath.Join(sb.OutDir(), "ready")); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				allowB := netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(ph.ip, 32), Ports: []uint16{uint16(ph.portB)}}}}
				applyErr = live.Apply(context.Background(), allowB, 2)
				_ = os.WriteFile(filepath.Join(sb.OutDir(), "go"), nil, 0o644)
			})
			if applyErr != nil {
				t.Fatalf("Apply: %v", applyErr)
			}
			wantExit(t, r, 0)
			for _, want := range []string{"before_a=1", "after_a=0", "after_b=1"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("live change A to B: output lacks %q", want)
				}
			}
		})
	}
}
