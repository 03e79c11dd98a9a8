package netpolicy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// claimTestPool is a /24 of 10.212.0.0/16, which no other test uses.
func claimTestPool() netip.Prefix {
	_, n := tag()
	return netip.MustParsePrefix(fmt.Sprintf("10.212.%d.0/24", (os.Getpid()*11+n)%256))
}

func claimManager(t *testing.T, cfg Config) (*Manager, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the netpolicy tests must run as root, not uid %d", os.Geteuid())
	}
	tg, _ := tag()
	cfg.Dir, cfg.Name = t.TempDir(), "ncl"+tg
	m, err := New(cfg)
	if err == nil {
		t.Cleanup(func() {
			if err := m.Close(); err != nil {
				t.Errorf("Manager.Close: %v", err)
			}
		})
	}
	return m, err
}

// A manager holds its pool host-wide for its lifetime, even with no job
// running: another manager is refused the same or an overlapping pool if
// it was configured, moves on if it was a default, and gets the pool once
// the first is closed.
func TestPoolIsClaimedHostWide(t *testing.T) {
	pool := claimTestPool()
	first, err := claimManager(t, Config{Pool4: pool})
	if err != nil {
		t.Fatal(err)
	}
	if first.cfg.Pool4 != pool {
		t.Fatalf("pool %s, want %s", first.cfg.Pool4, pool)
	}
	for _, p := range []netip.Prefix{pool, netip.PrefixFrom(pool.Addr(), 23).Masked(), netip.PrefixFrom(pool.Addr(), 28)} {
		_, err := claimManager(t, Config{Pool4: p})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network.pool4") || !strings.Contains(err.Error(), "another executor") {
			t.Errorf("pool %s while %s is held: %v; want refused naming network.pool4 and another executor", p, pool, err)
		}
	}
	moved, err := claimManager(t, Config{Pool4: pool, MovablePool4: true})
	if err != nil {
		t.Fatalf("a default pool another manager holds: %v, want it moved", err)
	}
	if got := moved.cfg.Pool4; got.Overlaps(pool) || got.Bits() != pool.Bits() {
		t.Errorf("moved pool %s, want a /%d other than %s", got, pool.Bits(), pool)
	}

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(first.claim.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim file %s after Close: %v", first.claim.path, err)
	}
	again, err := claimManager(t, Config{Pool4: pool})
	if err != nil {
		t.Fatalf("the pool after its manager closed: %v", err)
	}
	if again.cfg.Pool4 != pool {
		t.Errorf("pool %s, want %s", again.cfg.Pool4, pool)
	}
}

// A claim whose manager died (its lock gone with the process) is no
// claim: its file is removed and the pool is free.
func TestDeadClaimIsFree(t *testing.T) {
	pool := claimTestPool()
	m, err := claimManager(t, Config{Pool4: pool})
	if err != nil {
		t.Fatal(err)
	}
	// What the kernel does when the process dies.
	path := m.claim.path
	m.claim.f.Close()
	m.claim.f = nil
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if _, err := claimManager(t, Config{Pool4: pool}); err != nil {
		t.Fatalf("a pool whose manager died: %v", err)
	}
}

// Managers starting at once with the same default pool all end up with
// pools of their own.
func TestConcurrentClaimsDoNotOverlap(t *testing.T) {
	pool := claimTestPool()
	ms := make([]*Manager, 4)
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tg, _ := tag()
			ms[i], errs[i] = New(Config{Dir: t.TempDir(), Name: "ncl" + tg, Pool4: pool, MovablePool4: true})
		}()
	}
	wg.Wait()
	for i, m := range ms {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(func() { _ = m.Close() })
		for _, o := range ms[:i] {
			if o.cfg.Pool4.Overlaps(m.cfg.Pool4) {
				t.Errorf("two managers got %s and %s", o.cfg.Pool4, m.cfg.Pool4)
			}
		}
	}
}

// A default pool also moves off a route of the host's, in any table, and
// off an always-denied prefix; a configured pool over a route is taken,
// with a warning.
func TestDefaultPoolMovesOffRoutesAndDeniedPrefixes(t *testing.T) {
	pool := claimTestPool()
	table := 30000 + os.Getpid()%10000
	route := &netlink.Route{Dst: &net.IPNet{IP: pool.Addr().AsSlice(), Mask: net.CIDRMask(25, 32)}, Table: table, Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netlink.RouteDel(route); err != nil {
			t.Errorf("delete the route: %v", err)
		}
	})
	m, err := claimManager(t, Config{Pool4: pool, MovablePool4: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.cfg.Pool4; got.Overlaps(pool) {
		t.Errorf("a default pool over a route in table %d stayed at %s", table, got)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	var mu sync.Mutex
	m, err = claimManager(t, Config{Pool4: pool, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatalf("a configured pool over a route: %v, want it taken", err)
	}
	mu.Lock()
	if !strings.Contains(logs.String(), "overlaps a route") {
		t.Errorf("no warning about the route in:\n%s", logs.String())
	}
	mu.Unlock()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// 100.100.100.200 is Alibaba Cloud's metadata address.
	meta := netip.MustParsePrefix("100.100.100.0/22")
	m, err = claimManager(t, Config{Pool4: meta, MovablePool4: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.cfg.Pool4; got.Overlaps(meta) {
		t.Errorf("a default pool over an always-denied address stayed at %s", got)
	}
	denied := claimTestPool()
	m, err = claimManager(t, Config{Pool4: denied, MovablePool4: true, AlwaysDeny: []netip.Prefix{netip.PrefixFrom(denied.Addr(), 28)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.cfg.Pool4; got.Overlaps(denied) {
		t.Errorf("a default pool over Config.AlwaysDeny stayed at %s", got)
	}
}

// When undoing a failed Create fails too, the namespace stays the
// manager's, with its address slot: Manager.Close reports it rather than
// the leftovers going unnoticed.
func TestFailedUndoKeepsTheNamespace(t *testing.T) {
	m := ctManager(t)
	m.nftOpts = refusingKernel
	id := fmt.Sprintf("ct-%d-%d", os.Getpid(), ctSeq.Add(1))
	_, err := m.Create(context.Background(), id, Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24")}}})
	m.nftOpts = nil
	if err == nil {
		t.Fatal("Create with nftables failing worked")
	}
	m.mu.Lock()
	n := m.live[id]
	slots := len(m.slots)
	m.mu.Unlock()
	if n == nil || slots != 1 {
		t.Fatalf("after a failed undo: live %v, %d slots taken; want the namespace kept with its slot", n, slots)
	}
	if err := m.Close(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Manager.Close with a leftover: %v, want failed precondition", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.nsDir, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace file: %v", err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
