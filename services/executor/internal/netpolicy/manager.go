package netpolicy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Defaults for Config's optional fields.
const (
	DefaultName           = "airlock"
	DefaultMaxConnections = 1024
)

// DefaultPool4 is the IPv4 pool every job's veth pair takes a /30 from
// when Config.Pool4 is unset. Executors sharing a host need pools of their
// own: the executor's config derives one from its data directory.
var DefaultPool4 = netip.MustParsePrefix("10.213.0.0/16")

// Config configures the Manager.
type Config struct {
	// Dir holds the namespaces' bind mounts and the manager's state; it
	// must be the executor's alone.
	Dir string
	// Logger receives what the manager does.
	Logger *slog.Logger
	// Name names this manager's objects on the host: its nftables tables
	// are "inet <Name>_<hash of the job id>" and its veths carry the alias
	// "<Name>:<job id>". Recover removes every such table and veth, so two
	// managers on one host need different names. 1 to 32 of [a-z0-9_],
	// default "airlock".
	Name string
	// Pool4 is split into one /30 per job with a veth: the host end takes
	// the first address, the job the second. At most /30; default
	// 10.213.0.0/16 (16384 jobs at once). Jobs can never reach the pool.
	// The manager claims it host-wide until Close (a lock file under
	// /run/airlock/netpolicy), so no other manager on the host can use an
	// overlapping pool even while neither has a job. New refuses a pool
	// that another manager holds or that overlaps the subnet of an
	// address on one of the host's interfaces (other than this manager's
	// own veths), unless MovablePool4 is set; it only warns about one
	// that overlaps a route (which may be intended).
	Pool4 netip.Prefix
	// MovablePool4 says Pool4 is a default, not the operator's choice: if
	// another manager holds it, or it overlaps the host's networks (an
	// interface's subnet or a route other than a default one) or an
	// always-denied prefix, New moves it to the first free prefix of the
	// same size after it in 10.200.0.0/13, then in 172.16.0.0/12, then
	// in 100.64.0.0/10, and logs where.
	MovablePool4 bool
	// Pool6, if set, gives each job with a veth a /64 of it as well (host
	// end ::1, job ::2), and New turns on IPv6 forwarding. It is unset by
	// default, so jobs have IPv4 only (IPv6 allow rules are installed but
	// there is no route to use them): with forwarding on, Linux ignores
	// router advertisements on every interface whose accept_ra is 1, which
	// would take the default route away from a host configured by SLAAC.
	// Set it where the host's IPv6 is static or accept_ra is 2. At most
	// /64; jobs can never reach the pool.
	Pool6 netip.Prefix
	// AlwaysDeny are further destinations no policy can open, on top of
	// link-local (169.254.0.0/16, fe80::/10), cloud metadata
	// (169.254.169.254, fd00:ec2::254, 168.63.129.16, 100.100.100.200,
	// 192.0.0.192), loopback, the pools, and every address of the host
	// itself.
	AlwaysDeny []netip.Prefix
	// MaxConnections caps the connections a job may have open at once
	// through its veth (counted by connection tracking, so closed TCP
	// connections stop counting at once, UDP flows when their entries
	// expire): beyond it a new one is rejected. It keeps one job from
	// filling the host's connection tracking table. The count lives in
	// the job's rules, so it starts afresh when Apply replaces them (the
	// connections open then no longer count). Default 1024.
	MaxConnections int
}

// alwaysDeny is refused whatever a policy says. The host's own addresses
// are refused by a fib lookup instead, so they follow address changes.
var alwaysDeny = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("169.254.169.254/32"),
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure's WireServer
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud's metadata
	netip.MustParsePrefix("192.0.0.192/32"),     // Oracle Cloud's metadata
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::ffff:0:0/96"),
}

// Manager makes and tracks the network namespaces of jobs.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	nsDir string
	deny  []netip.Prefix
	// nftOpts are added to every nftables connection's options; tests
	// use them to make the kernel's answers fail.
	nftOpts []nftables.ConnOption
	// claim holds Pool4 for this manager until Close.
	claim *poolClaim

	mu    sync.Mutex
	live  map[string]*Net
	slots map[int]bool
	// nextSlot is where takeSlot looks first: slots are handed out in
	// turn, so a freed one is the last to be taken again.
	nextSlot int
}

// ErrUnavailable is returned when this machine cannot enforce policies.
var ErrUnavailable = errors.New("netpolicy: not available")

// ErrFixedInterfaces is returned by Apply when the new policy needs an
// interface the job's namespace does not have, and the namespace was
// created with FixedInterfaces: its sandbox (gVisor's runsc) read the
// namespace's interfaces when it started and would never see a new one.
// It wraps errdefs.ErrFailedPrecondition.
var ErrFixedInterfaces = fmt.Errorf("%w: netpolicy: the sandbox reads its network interfaces only when it starts", errdefs.ErrFailedPrecondition)

var (
	idFormat   = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	nameFormat = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)
)

// New checks the host can enforce policies and prepares Dir. It turns on
// IPv4 forwarding (and IPv6 forwarding when Config.Pool6 is set): see the
// package documentation.
func New(cfg Config) (_ *Manager, err error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if !cfg.Pool4.IsValid() {
		cfg.Pool4 = DefaultPool4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) || filepath.Clean(cfg.Dir) != cfg.Dir:
		return nil, fmt.Errorf("%w: netpolicy.dir %q: must be a clean absolute path", errdefs.ErrInvalidArgument, cfg.Dir)
	case !nameFormat.MatchString(cfg.Name):
		return nil, fmt.Errorf("%w: netpolicy.name %q: want 1 to 32 of [a-z0-9_]", errdefs.ErrInvalidArgument, cfg.Name)
	case !cfg.Pool4.Addr().Is4() || cfg.Pool4.Bits() > 30:
		return nil, fmt.Errorf("%w: netpolicy.pool4 %s: want an IPv4 prefix of at most /30", errdefs.ErrInvalidArgument, cfg.Pool4)
	case cfg.Pool6.IsValid() && (!cfg.Pool6.Addr().Is6() || cfg.Pool6.Addr().Is4In6() || cfg.Pool6.Bits() > 64):
		return nil, fmt.Errorf("%w: netpolicy.pool6 %s: want an IPv6 prefix of at most /64", errdefs.ErrInvalidArgument, cfg.Pool6)
	case cfg.MaxConnections < 1:
		return nil, fmt.Errorf("%w: netpolicy.max_connections %d: want at least 1", errdefs.ErrInvalidArgument, cfg.MaxConnections)
	}
	cfg.Pool4 = cfg.Pool4.Masked()
	if cfg.Pool6.IsValid() {
		cfg.Pool6 = cfg.Pool6.Masked()
	}
	for i, p := range cfg.AlwaysDeny {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: netpolicy.always_deny[%d]: invalid prefix", errdefs.ErrInvalidArgument, i)
		}
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: must run as root (uid 0), not uid %d", ErrUnavailable, os.Geteuid())
	}
	pool, claim, err := claimPool4(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if rerr := claim.release(); rerr != nil {
				cfg.Logger.Error("netpolicy: give up the pool after a failed start", "pool4", pool, "error", rerr)
			}
		}
	}()
	cfg.Pool4 = pool
	m := &Manager{
		cfg:   cfg,
		log:   cfg.Logger,
		nsDir: filepath.Join(cfg.Dir, "ns"),
		claim: claim,
		live:  map[string]*Net{},
		slots: map[int]bool{},
	}
	m.deny = append(slices.Clone(alwaysDeny), cfg.Pool4)
	if cfg.Pool6.IsValid() {
		m.deny = append(m.deny, cfg.Pool6)
	}
	for _, p := range cfg.AlwaysDeny {
		m.deny = append(m.deny, p.Masked())
	}
	if err := os.MkdirAll(m.nsDir, 0o700); err != nil {
		return nil, fmt.Errorf("netpolicy.dir: %w", err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("netpolicy.dir: %w", err)
	}
	// A job's packets are routed from its veth to the host's other
	// interfaces: without forwarding, no allow rule could ever match.
	sysctls := []string{"net/ipv4/ip_forward"}
	if cfg.Pool6.IsValid() {
		sysctls = append(sysctls, "net/ipv6/conf/all/forwarding")
	}
	for _, s := range sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte("1\n"), 0o644); err != nil {
			return nil, fmt.Errorf("%w: turn on %s: %v", ErrUnavailable, strings.ReplaceAll(s, "/", "."), err)
		}
	}
	// A whole job's rules, committed where they harm nothing: the kernel
	// loads the modules they need, or says which it lacks.
	if err := m.probeKernel(Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Ports: []uint16{443, 80}}}, Proxied: true}); err != nil {
		return nil, fmt.Errorf("%w: the kernel refuses a job's nftables rules: %v", ErrUnavailable, err)
	}
	// Narrowing a policy and releasing addresses remove conntrack
	// entries; without that, a narrowed policy would not cut replies.
	if _, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET); err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("%w: connection tracking over netlink (kernel module nf_conntrack_netlink): %v", ErrUnavailable, err)
	}
	return m, nil
}

// movableRanges are where a default Pool4 may move, in order.

func (m *Manager) Refused() ([]netip.Prefix, error) {
	out := slices.Clone(m.deny)
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("%w: list the host's addresses: %v", ErrUnavailable, err)
	}
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			ip = ip.Unmap()
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out, nil
}

// Pools are the prefixes the jobs' addresses come from: the IPv4 pool the
// manager claimed (a default one may have moved at start) and the IPv6
// one, if any.
func (m *Manager) Pools() []netip.Prefix {
	out := []netip.Prefix{m.cfg.Pool4}
	if m.cfg.Pool6.IsValid() {
		out = append(out, m.cfg.Pool6)
	}
	return out
}

// Close releases the manager and its claim on Pool4; jobs' namespaces
// must be closed first. A manager that has namespaces left keeps its
// claim until the process ends.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live) > 0 {
		return fmt.Errorf("%w: netpolicy: Close with %d namespace(s) not closed", errdefs.ErrFailedPrecondition, len(m.live))
	}
	return m.claim.release()
}

// takeSlot reserves the next free address slot after the one it took
// last, so a freed slot is taken again as late as possible.
func (m *Manager) takeSlot() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.slotCount()
	for k := 0; k < n; k++ {
		i := (m.nextSlot + k) % n
		if !m.slots[i] {
			m.slots[i] = true
			m.nextSlot = (i + 1) % n
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: netpolicy: all %d address slots of pool %s are in use", errdefs.ErrResourceExhausted, n, m.cfg.Pool4)
}

func (m *Manager) freeSlot(i int) {
	if i < 0 {
		return
	}
	m.mu.Lock()
	delete(m.slots, i)
	m.mu.Unlock()
}

func (m *Manager) slotCount() int {
	n := 1 << min(30-m.cfg.Pool4.Bits(), 24)
	if m.cfg.Pool6.IsValid() {
		n = min(n, 1<<min(64-m.cfg.Pool6.Bits(), 24))
	}
	return n
}

// jobAddrs are the addresses of one veth pair.
type jobAddrs struct {
	host4, job4 netip.Prefix // /30
	host6, job6 netip.Prefix // /64, invalid without Pool6
}

func (m *Manager) addrs(slot int) jobAddrs {
	b := m.cfg.Pool4.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(slot) * 4
	at := func(off uint32) netip.Prefix {
		x := v + off
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}), 30)
	}
	a := jobAddrs{host4: at(1), job4: at(2)}
	if m.cfg.Pool6.IsValid() {
		b6 := m.cfg.Pool6.Addr().As16()
		// The slot goes into bits 32..63 (the pool is at most /64).
		s := uint32(slot)
		for i := 7; i >= 4 && s > 0; i-- {
			b6[i] |= byte(s)
			s >>= 8
		}
		h, j := b6, b6
		h[15], j[15] = 1, 2
		a.host6 = netip.PrefixFrom(netip.AddrFrom16(h), 64)
		a.job6 = netip.PrefixFrom(netip.AddrFrom16(j), 64)
	}
	return a
}
