// Package netpolicy enforces a job's network policy from outside its
// sandbox. Every job gets a network namespace the executor makes (the
// sandbox joins it, so it is owned by the host's user namespace and nothing
// inside can reconfigure it). Deny-all is loopback only: the namespace has
// no other interface. An allow policy adds a veth pair to the host, and
// nftables rules in the host's namespace — out of the job's reach — let
// through exactly the listed destinations and ports; link-local, metadata,
// other jobs' and the executor's own addresses are always refused. A
// Proxied policy (a domains job's) adds the way to the executor's egress
// services at the host end of the veth and redirects the job's TCP 80
// and 443 there, and lets nothing else through. Apply
// replaces a running job's rules atomically and returns only once they are
// in the kernel.
//
// The rules accept replies by connection state, so Apply also removes the
// kernel's connection tracking entries of the job's connections the new
// policy no longer allows (a peer can then no longer answer on them), and
// a job's addresses are released only once none of their entries is left;
// they are handed out again in turn, not at once.
//
// Host side effects: New turns on IPv4 forwarding (net.ipv4.ip_forward=1),
// and IPv6 forwarding too when Config.Pool6 is set, because a job's packets
// are routed from its veth to the host's other interfaces. The host then
// forwards for every interface; a host that relies on forwarding being off
// must drop forwarded traffic in its own firewall. Each job with a veth has
// one nftables table of its own, "inet <Name>_<hash>", whose chains match
// only packets from or to that job's veth, so other traffic keeps its fate.
// (A drop in another table still wins over our accepts: a host firewall
// that drops forwarded traffic must let the jobs' veths through.) New also
// claims Pool4 host-wide until Close, with a lock file under
// /run/airlock/netpolicy (see claim.go).
//
// The rules are programmed over netlink from the executor's own process
// (package github.com/google/nftables): each change of a job's rules is one
// nftables transaction, which the kernel commits whole or not at all.
//
// Only the executor's run manager and composition root import it. It needs
// root and a kernel with nf_tables, its fib, masquerade, connlimit and
// reject expressions, connection tracking over netlink
// (nf_conntrack_netlink), and veth; no command-line tool.
package netpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

// Rule permits egress to one prefix.
type Rule struct {
	Prefix netip.Prefix
	// Ports are TCP destination ports; empty means every port and protocol.
	Ports []uint16
}

// Policy is what a job may reach. No rules and not Proxied means
// deny-all: loopback only.
type Policy struct {
	Allow []Rule
	// Proxied gives the job the executor's egress services at the host
	// end of its veth (ProxyAddrs), and nothing else beyond Allow: its
	// explicit proxy (TCP ExplicitProxyPort), its DNS server (UDP and TCP
	// 53, redirected to DNSPort) and, for tools that ignore proxy
	// variables, its transparent listener, to which every TCP connection
	// to port 80 or 443 of any address is redirected (TransparentPort).
	// The rules only carry the traffic there: what serves it, and decides
	// on names, is the caller's (packages egressproxy and jobdns).
	Proxied bool
}

// The ports of the egress services on the host end of a proxied job's
// veth, on its own addresses (ProxyAddrs): every job has addresses of its
// own, so the same ports serve every job. A host process that listens on
// one of them on every address keeps proxied jobs from starting.
const (
	ExplicitProxyPort = 15128
	TransparentPort   = 15129
	DNSPort           = 15053
)

// DenyAll reports whether p permits nothing but loopback.
func (p Policy) DenyAll() bool { return len(p.Allow) == 0 && !p.Proxied }

// normalize validates p and returns a copy with masked prefixes and sorted,
// de-duplicated ports, which the caller can no longer change.
// Validate checks p as Create and Apply would: valid, masked prefixes
// and ports 1 to 65535.
func (p Policy) Validate() error {
	_, err := p.normalize()
	return err
}

func (p Policy) normalize() (Policy, error) {
	out := Policy{Proxied: p.Proxied}
	for i, r := range p.Allow {
		// The form the authority checks too (pkg/runspec).
		if err := runspec.CheckPrefix(r.Prefix); err != nil {
			return Policy{}, fmt.Errorf("%w: netpolicy: allow[%d]: %v", errdefs.ErrInvalidArgument, i, err)
		}
		ports := slices.Clone(r.Ports)
		for _, port := range ports {
			if port == 0 {
				return Policy{}, fmt.Errorf("%w: netpolicy: allow[%d]: port 0", errdefs.ErrInvalidArgument, i)
			}
		}
		slices.Sort(ports)
		out.Allow = append(out.Allow, Rule{Prefix: r.Prefix.Masked(), Ports: slices.Compact(ports)})
	}
	return out, nil
}

func (p Policy) clone() Policy {
	out := Policy{Proxied: p.Proxied}
	for _, r := range p.Allow {
		out.Allow = append(out.Allow, Rule{Prefix: r.Prefix, Ports: slices.Clone(r.Ports)})
	}
	return out
}

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
var movableRanges = []netip.Prefix{
	netip.MustParsePrefix("10.200.0.0/13"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// claimPool4 checks the pools against the host's networks and the other
// managers' claims, moves a movable Pool4 if it must, and claims the pool
// it returns.
func claimPool4(cfg Config) (netip.Prefix, *poolClaim, error) {
	cl, err := lockClaims()
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	defer cl.unlock()
	if cfg.MovablePool4 {
		p, err := freePool4(cfg, cl)
		if err != nil {
			return netip.Prefix{}, nil, err
		}
		if p != cfg.Pool4 {
			cfg.Logger.Info("netpolicy: the default pool is another executor's or overlaps the host's networks; using another", "default", cfg.Pool4, "pool4", p)
			cfg.Pool4 = p
		}
	}
	if err := checkPoolsFree(cfg, cl); err != nil {
		return netip.Prefix{}, nil, err
	}
	pc, err := cl.claim(cfg.Pool4)
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	return cfg.Pool4, pc, nil
}

// freePool4 returns cfg.Pool4 if it is free (no other manager holds an
// overlapping pool, and no host subnet, route other than a default one,
// or always-denied prefix overlaps it), else the first free prefix of its
// size, starting after it, in movableRanges.
func freePool4(cfg Config, cl *claims) (netip.Prefix, error) {
	taken, err := hostSubnets(cfg)
	if err != nil {
		return netip.Prefix{}, err
	}
	routes, err := hostRoutes(cfg)
	if err != nil {
		return netip.Prefix{}, err
	}
	taken = append(taken, routes...)
	for _, d := range append(slices.Clone(alwaysDeny), cfg.AlwaysDeny...) {
		taken = append(taken, hostSubnet{subnet: d.Masked(), link: "always denied"})
	}
	free := func(p netip.Prefix) bool {
		if _, held := cl.heldOverlapping(p); held {
			return false
		}
		for _, t := range taken {
			if t.subnet.Overlaps(p) {
				return false
			}
		}
		return true
	}
	if free(cfg.Pool4) {
		return cfg.Pool4, nil
	}
	bits := cfg.Pool4.Bits()
	for _, r := range movableRanges {
		if r.Bits() > bits {
			continue
		}
		n := uint32(1) << (bits - r.Bits())
		base := binary.BigEndian.Uint32(r.Addr().AsSlice())
		start := uint32(0)
		if r.Contains(cfg.Pool4.Addr()) {
			start = (binary.BigEndian.Uint32(cfg.Pool4.Addr().AsSlice()) - base) >> (32 - bits)
		}
		for i := uint32(0); i < n; i++ {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], base+((start+i)%n)<<(32-bits))
			if p := netip.PrefixFrom(netip.AddrFrom4(b), bits); free(p) {
				return p, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: netpolicy: no /%d free of the host's networks and other executors' pools in %v; set network.pool4", errdefs.ErrInvalidArgument, bits, movableRanges)
}

// hostSubnet is a subnet configured on one of the host's interfaces.
type hostSubnet struct {
	subnet netip.Prefix
	link   string
}

// hostLinks maps the index of each of the host's interfaces, other than
// this manager's own veths, to its name; own are the veths' indexes.
func hostLinks(cfg Config) (names map[int]string, own map[int]bool, err error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: list the host's interfaces: %v", ErrUnavailable, err)
	}
	names, own = map[int]string{}, map[int]bool{}
	for _, l := range links {
		if l.Type() == "veth" && strings.HasPrefix(l.Attrs().Alias, cfg.Name+":") {
			own[l.Attrs().Index] = true
			continue
		}
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names, own, nil
}

// hostRoutes lists the destinations of the host's IPv4 routes in every
// routing table, leaving out default routes and routes through this
// manager's own veths. A pool there would take traffic meant for where
// the route leads (a VPN, a container network, a cloud's metadata range).
func hostRoutes(cfg Config) ([]hostSubnet, error) {
	names, own, err := hostLinks(cfg)
	if err != nil {
		return nil, err
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("%w: list the host's routes: %v", ErrUnavailable, err)
	}
	var out []hostSubnet
	for _, r := range routes {
		if r.Dst == nil || own[r.LinkIndex] {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		if !ok || ones == 0 {
			continue
		}
		where := fmt.Sprintf("a route in table %d", r.Table)
		if name, ok := names[r.LinkIndex]; ok {
			where = fmt.Sprintf("a route via %s in table %d", name, r.Table)
		}
		out = append(out, hostSubnet{netip.PrefixFrom(ip.Unmap(), ones).Masked(), where})
	}
	return out, nil
}

// hostSubnets lists the subnets of the addresses on the host's
// interfaces, leaving out this manager's own veths.
func hostSubnets(cfg Config) ([]hostSubnet, error) {
	names, _, err := hostLinks(cfg)
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("%w: list the host's addresses: %v", ErrUnavailable, err)
	}
	var out []hostSubnet
	for _, a := range addrs {
		name, ok := names[a.LinkIndex]
		if !ok || a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, hostSubnet{netip.PrefixFrom(ip.Unmap(), ones).Masked(), name})
	}
	return out, nil
}

// checkPoolsFree refuses pools that overlap a subnet of the host's (the
// jobs' routes would shadow its neighbours, or a job would get an address
// the host has) and a Pool4 that overlaps another manager's, and warns
// about a Pool4 that overlaps a route. This manager's own veths (left by
// a killed executor, for Recover) do not count.
func checkPoolsFree(cfg Config, cl *claims) error {
	if h, held := cl.heldOverlapping(cfg.Pool4); held {
		return fmt.Errorf("%w: netpolicy: network.pool4 %s overlaps pool %s, which another executor on this host holds; set network.pool4 to a prefix of its own",
			errdefs.ErrInvalidArgument, cfg.Pool4, h)
	}
	taken, err := hostSubnets(cfg)
	if err != nil {
		return err
	}
	routes, err := hostRoutes(cfg)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.subnet.Overlaps(cfg.Pool4) {
			cfg.Logger.Warn("netpolicy: network.pool4 overlaps a route of the host's; jobs' addresses shadow part of it", "pool4", cfg.Pool4, "route", r.subnet, "where", r.link)
		}
	}
	for _, t := range taken {
		for _, pool := range []struct {
			field string
			p     netip.Prefix
		}{{"network.pool4", cfg.Pool4}, {"network.pool6", cfg.Pool6}} {
			if pool.p.IsValid() && pool.p.Overlaps(t.subnet) {
				return fmt.Errorf("%w: netpolicy: %s %s overlaps %s on the host's interface %s (another executor's jobs, or the host's own network); set %s to a prefix of its own",
					errdefs.ErrInvalidArgument, pool.field, pool.p, t.subnet, t.link, pool.field)
			}
		}
	}
	return nil
}

// Net is one job's network namespace and the rules in force for it.
type Net struct {
	m     *Manager
	id    string
	path  string
	veth  string // the host end's name, whether or not it exists now
	table string
	fixed bool

	mu     sync.Mutex
	policy Policy
	gen    int64
	addr   jobAddrs // valid while slot >= 0
	// slot is the job's address slot while it has a veth, and after, until
	// no conntrack entry of its addresses is left.
	slot    int
	hasVeth bool
	// hasTable says the job's nftables table may exist: set before a
	// transaction that makes it, cleared once a delete succeeded. A
	// deny-all job that never had a veth never has a table at all.
	hasTable bool
	closed   bool
}

// CreateOption changes how Create makes a namespace.
type CreateOption func(*Net)

// FixedInterfaces is for a sandbox that reads the namespace's interfaces
// once, when it starts: gVisor's runsc copies them into its own network
// stack and never looks again. The namespace then keeps the interfaces it
// was created with. A job created with an allow policy keeps its veth for
// good, and a later deny-all policy drops everything at the host end
// instead of removing it; a job created deny-all has no veth, and Apply of
// an allow policy fails with ErrFixedInterfaces (start such a job with an
// allow policy if it may be widened later). Host-side rule changes (allow
// A to allow B) work either way.
func FixedInterfaces() CreateOption { return func(n *Net) { n.fixed = true } }

// Generation is the generation of the policy Create puts in force: the
// grant's network_policy_generation, at least 1. Without it, 1.
func Generation(gen int64) CreateOption { return func(n *Net) { n.gen = gen } }

func (m *Manager) newNet(id string) *Net {
	sum := sha256.Sum256([]byte(m.cfg.Name + "\x00" + id))
	h := hex.EncodeToString(sum[:])[:12]
	return &Net{
		m:     m,
		id:    id,
		path:  filepath.Join(m.nsDir, id),
		veth:  "alk" + h,
		table: m.cfg.Name + "_" + h,
		slot:  -1,
		gen:   1,
	}
}

// Create makes job id's namespace with p in force as generation 1, or the
// one the Generation option gives.
func (m *Manager) Create(ctx context.Context, id string, p Policy, opts ...CreateOption) (_ *Net, err error) {
	if !idFormat.MatchString(id) {
		return nil, fmt.Errorf("%w: netpolicy: job id %q: want 1 to 64 of [a-zA-Z0-9_-]", errdefs.ErrInvalidArgument, id)
	}
	p, err = p.normalize()
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	n := m.newNet(id)
	for _, o := range opts {
		o(n)
	}
	if n.gen < 1 {
		return nil, fmt.Errorf("%w: netpolicy: job %s: policy generation %d: want at least 1", errdefs.ErrInvalidArgument, id, n.gen)
	}
	m.mu.Lock()
	if _, dup := m.live[id]; dup {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: netpolicy: job %s already has a network namespace", errdefs.ErrAlreadyExists, id)
	}
	m.live[id] = n
	m.mu.Unlock()

	f, err := os.OpenFile(n.path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		m.forget(n)
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: netpolicy: job %s: a previous executor left its namespace %s behind; Recover removes it", errdefs.ErrAlreadyExists, id, n.path)
		}
		return nil, fmt.Errorf("netpolicy: job %s: %w", id, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			n.mu.Lock()
			cerr := n.teardown()
			n.mu.Unlock()
			if cerr != nil {
				// It stays live, with its address slot: Manager.Close
				// reports it, and the next start's Recover removes it.
				m.log.Error("netpolicy: undo a failed create; its leftovers stay until Recover", "job_id", id, "error", cerr)
				return
			}
			m.forget(n)
		}
	}()
	if err := makeNetns(n.path); err != nil {
		return nil, fmt.Errorf("netpolicy: job %s: %w", id, err)
	}
	if !p.DenyAll() {
		if err := n.addVeth(ctx, p); err != nil {
			return nil, err
		}
	}
	n.policy = p
	m.log.Info("netpolicy: namespace created", "job_id", id, "path", n.path, "generation", n.gen, "deny_all", p.DenyAll(), "veth", n.hasVeth)
	return n, nil
}

func (m *Manager) forget(n *Net) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[n.id] == n {
		delete(m.live, n.id)
	}
}

// Path is the namespace's path, for the OCI spec's network namespace.
func (n *Net) Path() string { return n.path }

// ID is the job id the namespace belongs to.
func (n *Net) ID() string { return n.id }

// CanApply reports the error Apply would return for reasons known before
// it touches the kernel: an invalid policy, a generation not higher than
// the current one, a closed namespace, or an interface the namespace
// cannot gain (ErrFixedInterfaces). A caller changing more than the
// network can check first, and change nothing when Apply would fail.
func (n *Net) CanApply(p Policy, gen int64) error {
	p, err := p.normalize()
	if err != nil {
		return fmt.Errorf("job %s: %w", n.id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.check(p, gen)
}

func (n *Net) check(p Policy, gen int64) error {
	switch {
	case n.closed:
		return fmt.Errorf("%w: netpolicy: job %s: namespace is closed", errdefs.ErrFailedPrecondition, n.id)
	case gen <= n.gen:
		return fmt.Errorf("%w: netpolicy: job %s: generation %d is not higher than the current %d", errdefs.ErrFailedPrecondition, n.id, gen, n.gen)
	case !p.DenyAll() && !n.hasVeth && n.fixed:
		return fmt.Errorf("job %s: %w: a deny-all namespace cannot gain an interface", n.id, ErrFixedInterfaces)
	}
	return nil
}

// Apply puts p in force as generation gen (higher than the current one)
// and returns once the rules are in the kernel and the job's connections
// p does not allow are cut (their conntrack entries removed, so no reply
// reaches the job). On error the previous policy stays in force.
func (n *Net) Apply(ctx context.Context, p Policy, gen int64) error {
	p, err := p.normalize()
	if err != nil {
		return fmt.Errorf("job %s: %w", n.id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.check(p, gen); err != nil {
		return err
	}
	switch {
	case !p.DenyAll() && !n.hasVeth:
		if err := n.addVeth(ctx, p); err != nil {
			return err
		}
	case p.DenyAll() && n.hasVeth && !n.fixed:
		if err := n.removeVeth(); err != nil {
			return err
		}
	case n.hasVeth:
		// One transaction: the kernel switches from the old rules to the
		// new ones at once, or keeps the old ones.
		n.hasTable = true
		if err := n.m.installRules(ctx, n, p); err != nil {
			return fmt.Errorf("netpolicy: job %s: replace rules: %w", n.id, err)
		}
		// Only then: until the new rules are in, the job could open
		// again what is removed.
		if err := n.forgetFlows(&p); err != nil {
			// Back to the old rules, which the remaining entries agree
			// with, so that on error the previous policy is in force.
			rerr := n.m.installRules(ctx, n, n.policy)
			if rerr == nil {
				return err
			}
			// The new rules stay, and they are what is recorded: the
			// policy in force must be the one reported. Only replies on
			// connections opened before could still reach the job.
			n.m.log.Error("netpolicy: new rules in force, but the connections they no longer allow could not be cut",
				"job_id", n.id, "generation", gen, "error", err, "restore_error", rerr)
		}
	}
	n.policy, n.gen = p, gen
	n.m.log.Info("netpolicy: policy applied", "job_id", n.id, "generation", gen, "deny_all", p.DenyAll(), "veth", n.hasVeth)
	return nil
}

// addVeth installs p's rules for the veth first, then makes it, so no
// packet ever crosses it unfiltered.
func (n *Net) addVeth(ctx context.Context, p Policy) error {
	if n.slot >= 0 && !n.hasVeth {
		// An earlier veth's entries could not be removed then.
		if err := n.forgetFlows(nil); err != nil {
			return err
		}
	}
	if n.slot < 0 {
		slot, err := n.m.takeSlot()
		if err != nil {
			return fmt.Errorf("job %s: %w", n.id, err)
		}
		n.slot, n.addr = slot, n.m.addrs(slot)
	}
	n.hasTable = true
	if err := n.m.installRules(ctx, n, p); err != nil {
		return fmt.Errorf("netpolicy: job %s: install rules: %w", n.id, err)
	}
	n.hasVeth = true
	if err := n.m.makeVeth(n); err != nil {
		if rerr := n.removeVeth(); rerr != nil {
			n.m.log.Error("netpolicy: undo a failed veth", "job_id", n.id, "error", rerr)
		}
		return fmt.Errorf("netpolicy: job %s: %w", n.id, err)
	}
	return nil
}

// removeVeth deletes the veth (the job's side goes with it), then its
// rules and its addresses' conntrack entries, and only then releases the
// addresses. With the veth gone nothing can reach or leave the namespace,
// so a failure after that is only logged, and the job keeps its addresses
// until Close or Recover clean up.
func (n *Net) removeVeth() error {
	if err := deleteLink(n.veth); err != nil {
		return fmt.Errorf("netpolicy: job %s: %w", n.id, err)
	}
	n.hasVeth = false
	if err := n.m.deleteTables(context.Background(), n.table); err != nil {
		n.m.log.Warn("netpolicy: remove a job's rules after its veth", "job_id", n.id, "table", n.table, "error", err)
	} else {
		n.hasTable = false
	}
	if err := n.forgetFlows(nil); err != nil {
		n.m.log.Warn("netpolicy: keep a job's addresses until their conntrack entries are gone", "job_id", n.id, "error", err)
		return nil
	}
	n.m.freeSlot(n.slot)
	n.slot = -1
	return nil
}

// ProxyAddrs are the addresses of the host end of the job's veth, where a
// proxied job's egress services listen (IPv4, then IPv6 when the manager
// has Pool6), or nil while it has no veth.
func (n *Net) ProxyAddrs() []netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.hasVeth {
		return nil
	}
	out := []netip.Addr{n.addr.host4.Addr()}
	if n.addr.host6.IsValid() {
		out = append(out, n.addr.host6.Addr())
	}
	return out
}

// HostLink is the name of the host end of the job's veth (whether or not it
// exists now): a proxied job's services bind to it.
func (n *Net) HostLink() string { return n.veth }

// Refused are the destinations no job may reach, as the rules refuse
// them: the always-denied prefixes, the pools, and every address now on
// one of the host's interfaces (as a single address: the host's
// neighbours are not refused for being on its subnets). An egress proxy
// dialling for a job refuses them too.
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

// Current returns the policy in force and its generation.
func (n *Net) Current() (Policy, int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.policy.clone(), n.gen
}

// Close removes the namespace, its interfaces and its rules. It may be
// called again, also after a failure.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	if err := n.teardown(); err != nil {
		return err
	}
	n.m.forget(n)
	return nil
}

// teardown removes everything of n that may exist. The rules stay as long
// as the veth does, so a job is never left with a route and no filter; the
// addresses are released only once their conntrack entries are gone.
func (n *Net) teardown() error {
	var errs []error
	if err := deleteLink(n.veth); err != nil {
		errs = append(errs, err)
	} else {
		n.hasVeth = false
		if n.hasTable {
			if err := n.m.deleteTables(context.Background(), n.table); err != nil {
				errs = append(errs, fmt.Errorf("remove rules: %w", err))
			} else {
				n.hasTable = false
			}
		}
		if n.slot >= 0 {
			if err := n.forgetFlows(nil); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := removeNetns(n.path); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("netpolicy: close job %s: %w", n.id, errors.Join(errs...))
	}
	if n.slot >= 0 {
		n.m.freeSlot(n.slot)
		n.slot = -1
	}
	return nil
}

// Recover removes what jobs of an earlier, killed executor left behind and
// returns their ids: namespaces under Dir, veths carrying this manager's
// alias, and this manager's nftables tables. Call it at start, before the
// first Create.
func (m *Manager) Recover(ctx context.Context) ([]string, error) {
	m.mu.Lock()
	busy := len(m.live)
	m.mu.Unlock()
	if busy > 0 {
		return nil, fmt.Errorf("%w: netpolicy: Recover must run before any namespace is created (%d live)", errdefs.ErrFailedPrecondition, busy)
	}
	ids := map[string]bool{}
	var errs []error
	// The tables of veths that could not be deleted stay: a veth with a
	// route and no rules would let its job out unfiltered.
	keep := map[string]bool{}
	ents, err := os.ReadDir(m.nsDir)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: recover: %w", err)
	}
	for _, e := range ents {
		ids[e.Name()] = true
		// Veth and table names follow from the id, even where the alias
		// was never set.
		n := m.newNet(e.Name())
		if err := deleteLink(n.veth); err != nil {
			errs = append(errs, err)
			keep[n.table] = true
		}
		if err := removeNetns(n.path); err != nil {
			errs = append(errs, err)
		}
	}
	left, err := m.ourLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for name, id := range left {
		ids[id] = true
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
			// The table's name follows from the id; a veth whose alias
			// names no valid id keeps every table.
			if idFormat.MatchString(id) {
				keep[m.newNet(id).table] = true
			} else {
				keep["*"] = true
			}
		}
	}
	if err == nil && len(keep) == 0 {
		// No job of ours has an interface left: no entry of the pools
		// belongs to a live connection.
		if err := deleteFlows(prefixFilter{m.cfg.Pool4, m.cfg.Pool6}, m.cfg.Pool6.IsValid()); err != nil {
			errs = append(errs, fmt.Errorf("remove connection tracking entries of pool %s: %w", m.cfg.Pool4, err))
		}
	}
	tables, err := m.ourTables(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	var gone []string
	for _, t := range tables {
		if !keep[t] && !keep["*"] {
			gone = append(gone, t)
		}
	}
	if len(gone) > 0 {
		if err := m.deleteTables(ctx, gone...); err != nil {
			errs = append(errs, fmt.Errorf("remove tables %v: %w", gone, err))
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		if id != "" {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	if len(out) > 0 || len(tables) > 0 {
		m.log.Info("netpolicy: recovered", "job_ids", out, "tables", tables)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("netpolicy: recover: %w", errors.Join(errs...))
	}
	return out, nil
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
