package netpolicy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/nettest"
)

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newManager makes a manager with a name, directory and address pools of
// this test's own, and checks at cleanup that nothing of it is left.
func newManager(t *testing.T, v6 bool) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the netpolicy tests must run as root, not uid %d", os.Geteuid())
	}
	_, n := tag()
	cfg := Config{
		Dir:    t.TempDir(),
		Name:   fmt.Sprintf("npt%d_%d", os.Getpid(), n),
		Pool4:  netip.MustParsePrefix(fmt.Sprintf("10.214.%d.0/24", (os.Getpid()*7+n)%256)),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	if v6 {
		cfg.Pool6 = netip.MustParsePrefix(fmt.Sprintf("fd8e:7a1d:%x::/48", (os.Getpid()*7+n)&0xffff))
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Manager.Close: %v", err)
		}
		assertNothingLeft(t, m)
	})
	return m
}

// assertNothingLeft checks the host for m's veths, tables and mounts.
func assertNothingLeft(t *testing.T, m *Manager) {
	t.Helper()
	links, err := m.ourLinks()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) > 0 {
		t.Errorf("veths left: %v", links)
	}
	tables, err := m.ourTables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) > 0 {
		t.Errorf("nftables tables left: %v", tables)
	}
	if mounts := mountsUnder(t, m.cfg.Dir); len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v", m.cfg.Dir, mounts)
	}
	ents, _ := os.ReadDir(m.nsDir)
	for _, e := range ents {
		t.Errorf("left in %s: %s", m.nsDir, e.Name())
	}
}

func create(t *testing.T, m *Manager, p Policy, opts ...CreateOption) *Net {
	t.Helper()
	_, n := tag()
	id := fmt.Sprintf("job-%d-%d", os.Getpid(), n)
	nt, err := m.Create(context.Background(), id, p, opts...)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := nt.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := nt.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	return nt
}

// refusingKernel are connection options under which every nftables
// request fails.
var refusingKernel = []nftables.ConnOption{nftables.WithTestDial(func([]netlink.Message) ([]netlink.Message, error) {
	return nil, errors.New("refused by the test")
})}

func allow(rules ...Rule) Policy { return Policy{Allow: rules} }

func rule(a netip.Addr, bits int, ports ...int) Rule {
	r := Rule{Prefix: netip.PrefixFrom(a, bits).Masked()}
	for _, p := range ports {
		r.Ports = append(r.Ports, uint16(p))
	}
	return r
}

// probe is one connection attempt from a job and whether it must work.
type probe struct {
	addr string
	want bool
	why  string
}

// check runs the probes at once (a refused one waits for its timeout).
func check(t *testing.T, n *Net, probes ...probe) {
	t.Helper()
	errs := make([]error, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A refusal is a drop: wait less for it than a working
			// connection gets to retransmit its first packet.
			timeout := 700 * time.Millisecond
			if p.want {
				timeout = 3 * time.Second
			}
			errs[i] = dialFrom(n.Path(), p.addr, timeout)
		}()
	}
	wg.Wait()
	for i, p := range probes {
		switch {
		case p.want && errs[i] != nil:
			t.Errorf("%s (%s): want connected, got %v", p.addr, p.why, errs[i])
		case !p.want && errs[i] == nil:
			t.Errorf("%s (%s): ALLOWED, want refused", p.addr, p.why)
		default:
			t.Logf("%s (%s): %v", p.addr, p.why, errs[i])
		}
	}
}

// The test host is reachable from the host itself on every address the
// jobs probe: each refusal below is then the rules' doing.
func checkControl(t *testing.T, th *testHost) {
	t.Helper()
	for _, a := range []string{th.addr(th.ip, th.ports[0]), th.addr(th.other, th.ports[1]), th.addr(th.meta, th.ports[0]), th.addr(th.ll, th.ports[0]), th.addr(th.hostIP, th.hostPort), th.addr(netip.MustParseAddr("127.0.0.1"), th.hostPort)} {
		d := net.Dialer{Timeout: 700 * time.Millisecond}
		src := th.hostIP
		if strings.HasPrefix(a, "127.") {
			src = netip.MustParseAddr("127.0.0.1")
		}
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		c, err := d.Dial("tcp", a)
		if err != nil {
			t.Fatalf("control: the host cannot reach %s itself: %v", a, err)
		}
		c.Close()
	}
}

func TestDenyAll(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	checkControl(t, th)
	n := create(t, m, Policy{})
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo"}) {
		t.Errorf("links in a deny-all namespace: %v, want only lo", got)
	}
	if p, gen := n.Current(); !p.DenyAll() || gen != 1 {
		t.Errorf("Current = %+v, %d", p, gen)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), false, "test host"},
		probe{th.addr(th.hostIP, th.hostPort), false, "host address"},
		probe{th.addr(th.meta, th.ports[0]), false, "metadata"},
	)
	// Loopback works inside.
	err := nettest.InPath(n.Path(), func() error {
		c, err := dialHost("127.0.0.1:1")
		if err == nil {
			c.Close()
			return errors.New("something listens on port 1")
		}
		if !strings.Contains(err.Error(), "refused") {
			return fmt.Errorf("loopback is not up: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// Nothing of ours on the host for a deny-all job.
	if links, _ := m.ourLinks(); len(links) > 0 {
		t.Errorf("a deny-all job has host links: %v", links)
	}
	if tables, _ := m.ourTables(context.Background()); len(tables) > 0 {
		t.Errorf("a deny-all job has tables: %v", tables)
	}
}

func TestAllowPrefixAndPort(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	checkControl(t, th)
	n := create(t, m, allow(rule(th.ip, 32, th.ports[0])))
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo", jobIf}) {
		t.Errorf("links: %v, want lo and %s", got, jobIf)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "allowed prefix and port"},
		probe{th.addr(th.ip, th.ports[1]), false, "allowed prefix, other port"},
		probe{th.addr(th.other, th.ports[0]), false, "other prefix, allowed port"},
		probe{th.addr(th.hostIP, th.hostPort), false, "the host's address on the test host link"},
		probe{th.addr(n.addr.host4.Addr(), th.hostPort), false, "the host end of the job's own veth"},
	)
}

// However wide the policy, the host, link-local and metadata addresses
// stay out of reach.
func TestAlwaysDenied(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	checkControl(t, th)
	n := create(t, m, allow(rule(netip.IPv4Unspecified(), 0)))
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "0.0.0.0/0 allows the test host"},
		probe{th.addr(th.other, th.ports[1]), true, "0.0.0.0/0 allows the test host's other address"},
		probe{th.addr(th.meta, th.ports[0]), false, "metadata"},
		probe{th.addr(th.ll, th.ports[0]), false, "link-local"},
		probe{th.addr(th.hostIP, th.hostPort), false, "a host address"},
		probe{th.addr(n.addr.host4.Addr(), th.hostPort), false, "the job's gateway"},
	)
	// Another job's address in the pool.
	other := create(t, m, allow(rule(netip.IPv4Unspecified(), 0)))
	var ln net.Listener
	err := nettest.InPath(other.Path(), func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(other.addr.job4.Addr().String(), "0"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	nettest.Echo(t, ln)
	check(t, n, probe{ln.Addr().String(), false, "another job"})
}

func TestApplyNarrowWidenAndGenerations(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	ctx := context.Background()
	n := create(t, m, allow(rule(th.ip, 32)))
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "prefix without ports: port A"},
		probe{th.addr(th.ip, th.ports[1]), true, "prefix without ports: port B"},
	)
	held, err := nettest.DialFrom(n.Path(), th.addr(th.ip, th.ports[0]), 700*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	r := bufio.NewReader(held)
	echo := func(s string) error {
		_ = held.SetDeadline(time.Now().Add(time.Second))
		if _, err := fmt.Fprintln(held, s); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if line != s+"\n" {
			return fmt.Errorf("echo %q", line)
		}
		return nil
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := echo("one"); err != nil {
		t.Fatalf("held connection before narrowing: %v", err)
	}

	// Narrow to port B only.
	if err := n.Apply(ctx, allow(rule(th.ip, 32, th.ports[1])), 2); err != nil {
		t.Fatal(err)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), false, "narrowed away"},
		probe{th.addr(th.ip, th.ports[1]), true, "still allowed"},
	)
	if err := echo("two"); err == nil {
		t.Errorf("a connection the new policy no longer allows still passes data")
	}

	// Stale and equal generations are refused and change nothing.
	for _, gen := range []int64{2, 1} {
		err := n.Apply(ctx, allow(rule(th.ip, 32)), gen)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "generation") {
			t.Errorf("Apply at generation %d: %v, want a generation error", gen, err)
		}
	}
	if p, gen := n.Current(); gen != 2 || len(p.Allow) != 1 || !slices.Equal(p.Allow[0].Ports, []uint16{uint16(th.ports[1])}) {
		t.Errorf("Current = %+v, %d", p, gen)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[0]), false, "a refused Apply changed nothing"})

	// Deny-all removes the interface; widening brings it back.
	if err := n.Apply(ctx, Policy{}, 5); err != nil {
		t.Fatal(err)
	}
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo"}) {
		t.Errorf("links after deny-all: %v", got)
	}
	if links, _ := m.ourLinks(); len(links) > 0 {
		t.Errorf("veth left after deny-all: %v", links)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[1]), false, "deny-all"})
	if err := n.Apply(ctx, allow(rule(th.ip, 30), rule(th.other, 32, th.ports[0])), 6); err != nil {
		t.Fatal(err)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "widened: /30 any port"},
		probe{th.addr(th.ip, th.ports[1]), true, "widened: /30 any port"},
		probe{th.addr(th.other, th.ports[0]), true, "widened: other prefix, its port"},
		probe{th.addr(th.other, th.ports[1]), false, "widened: other prefix, not its port"},
		probe{th.addr(th.hostIP, th.hostPort), false, "the host, inside the allowed /30"},
	)

	// A transaction the kernel refuses changes nothing, however much of
	// it the kernel took before the part it refused: here the job's table
	// is deleted and made again with deny-all rules, and then comes a
	// chain of a table that does not exist.
	err = m.commit(ctx, func(c *nftables.Conn) error {
		if err := m.jobRules(n, Policy{}).queue(c); err != nil {
			return err
		}
		c.AddChain(&nftables.Chain{Name: "x", Table: &nftables.Table{Name: n.table + "_none", Family: nftables.TableFamilyINet}})
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "nftables transaction") || !errors.Is(err, unix.ENOENT) {
		t.Errorf("a refused transaction: %v, want the kernel's ENOENT", err)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[1]), true, "unchanged after a refused transaction"})
}

// Under FixedInterfaces (runsc) the veth stays for a deny-all policy,
// whose rules drop everything; a deny-all job cannot gain one.
func TestFixedInterfaces(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	ctx := context.Background()
	n := create(t, m, allow(rule(th.ip, 32, th.ports[0])), FixedInterfaces())
	check(t, n, probe{th.addr(th.ip, th.ports[0]), true, "allowed"})
	if err := n.Apply(ctx, Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo", jobIf}) {
		t.Errorf("links: %v, want the veth kept", got)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[0]), false, "deny-all at the host end"})
	if err := n.Apply(ctx, allow(rule(th.ip, 32, th.ports[1])), 3); err != nil {
		t.Fatal(err)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[1]), true, "allowed again"},
		probe{th.addr(th.ip, th.ports[0]), false, "not this port"},
	)

	d := create(t, m, Policy{}, FixedInterfaces())
	err := d.Apply(ctx, allow(rule(th.ip, 32)), 2)
	if !errors.Is(err, ErrFixedInterfaces) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), d.ID()) {
		t.Errorf("widening a fixed deny-all namespace: %v, want ErrFixedInterfaces naming the job", err)
	}
	if p, gen := d.Current(); !p.DenyAll() || gen != 1 {
		t.Errorf("Current after a refused Apply = %+v, %d", p, gen)
	}
}

func TestIPv6(t *testing.T) {
	m := newManager(t, true)
	th := startTestHost(t, m)
	n := create(t, m, allow(rule(th.ip6, 128, th.ports[0]), rule(netip.IPv6Unspecified(), 0, th.ports[1])))
	check(t, n,
		probe{th.addr(th.ip6, th.ports[0]), true, "allowed IPv6 address and port"},
		probe{th.addr(th.ip6, th.ports[1]), true, "::/0 on port B"},
		probe{th.addr(th.ip6.Prev(), th.ports[1]), false, "the host's IPv6 address on the test host link"},
		probe{th.addr(n.addr.host6.Addr(), th.ports[1]), false, "the job's IPv6 gateway"},
		probe{th.addr(th.ip, th.ports[0]), false, "IPv4 is not allowed"},
	)
}

func TestRecover(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	ctx := context.Background()
	a, err := m.Create(ctx, "recover-a", allow(rule(th.ip, 32)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, "recover-b", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Recover with live namespaces: %v", err)
	}
	// A new executor with the same configuration, after a crash, which
	// took the first one's claim on the pool with it.
	m.claim.f.Close()
	m.claim.f = nil
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"recover-a", "recover-b"}) {
		t.Errorf("Recover = %v", ids)
	}
	assertNothingLeft(t, m2)
	if ids, err := m2.Recover(ctx); err != nil || len(ids) != 0 {
		t.Errorf("second Recover = %v, %v", ids, err)
	}
	// The old handles close cleanly over nothing.
	for _, n := range []*Net{a, b} {
		if err := n.Close(); err != nil {
			t.Errorf("Close after Recover: %v", err)
		}
	}
	// A veth whose id file is gone is still found by its alias.
	c, err := m2.Create(ctx, "recover-c", allow(rule(th.ip, 32)))
	if err != nil {
		t.Fatal(err)
	}
	// Something still holds the namespace (as a job's runtime would), so
	// removing its file does not take the veth with it: without the
	// hold the kernel destroys the namespace, and the veth, at a time of
	// its choosing, and the test would race it.
	hold, err := os.Open(c.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if err := removeNetns(c.Path()); err != nil {
		t.Fatal(err)
	}
	m2.forget(c)
	ids, err = m2.Recover(ctx)
	if err != nil || !slices.Equal(ids, []string{"recover-c"}) {
		t.Errorf("Recover = %v, %v, want recover-c", ids, err)
	}
	hold.Close()
	assertNothingLeft(t, m2)
	if err := m2.Close(); err != nil {
		t.Error(err)
	}
}

func TestCreateErrors(t *testing.T) {
	m := newManager(t, false)
	ctx := context.Background()
	if _, err := m.Create(ctx, "bad/id", Policy{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
	if _, err := m.Create(ctx, "x", allow(Rule{})); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("invalid prefix: %v", err)
	}
	n := create(t, m, Policy{})
	if _, err := m.Create(ctx, n.ID(), Policy{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("duplicate: %v", err)
	}
	// A leftover file from an earlier executor.
	if err := os.WriteFile(filepath.Join(m.nsDir, "stale"), nil, 0o400); err != nil {
		t.Fatal(err)
	}
	_, err := m.Create(ctx, "stale", Policy{})
	if !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "Recover") {
		t.Errorf("leftover: %v", err)
	}
	if ids, err := (&Manager{cfg: m.cfg, nsDir: m.nsDir, live: map[string]*Net{}, slots: map[int]bool{}, log: m.log}).Recover(ctx); err != nil || !slices.Contains(ids, "stale") {
		t.Errorf("Recover = %v, %v", ids, err)
	}
	if err := m.Close(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Close with a live namespace: %v", err)
	}
}

func dialHost(addr string) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, 700*time.Millisecond)
}

// TestPooledClaim: a pooled namespace is deny-all and has no interface
// but lo until a job claims it; its claim puts the job's policy in force
// as the grant's generation (1 or more), and a later Apply goes on from
// there. A second claim, a claim of a namespace not pooled, and a pooled
// namespace made with an allow policy are refused.
func TestPooledClaim(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	ctx := context.Background()
	if _, err := m.Create(ctx, "pool_allow", allow(rule(th.ip, 32)), Pooled()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a pooled namespace with an allow policy: %v", err)
	}
	n := create(t, m, Policy{}, Pooled())
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo"}) {
		t.Errorf("a pooled namespace's links: %v", got)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[0]), false, "pooled, before the claim"})
	if err := n.Claim(ctx, "claimer", allow(rule(th.ip, 32, th.ports[0])), 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a claim at generation 0: %v", err)
	}
	if err := n.Claim(ctx, "claimer", allow(rule(th.ip, 32, th.ports[0])), 1); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	check(t, n,
		probe{th.addr(th.ip, th.ports[0]), true, "claimed: allowed"},
		probe{th.addr(th.ip, th.ports[1]), false, "claimed: another port"},
		probe{th.addr(th.hostIP, th.hostPort), false, "claimed: the host"},
	)
	if _, gen := n.Current(); gen != 1 {
		t.Errorf("generation after the claim: %d, want the grant's 1", gen)
	}
	if err := n.Claim(ctx, "second", Policy{}, 2); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a second claim: %v", err)
	}
	if err := n.Apply(ctx, Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	check(t, n, probe{th.addr(th.ip, th.ports[0]), false, "deny-all after the claim"})
	plain := create(t, m, Policy{})
	if err := plain.Claim(ctx, "claimer", Policy{}, 2); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a claim of a namespace not pooled: %v", err)
	}
}
