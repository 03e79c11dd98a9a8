// Package config owns the executor's config file: the common server part
// from pkg/config, the authority it serves, its sandbox and network
// settings, and the capacity its jobs may hold, measured on the host by
// default. Only the executor's main and composition root import it.
package config

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// Config is the executor's whole config file, validated.
type Config struct {
	config.Server `yaml:",inline"`
	// Authority is where the executor fetches source and reports results.
	Authority Authority `yaml:"authority"`
	// Sandbox configures the OCI runtimes.
	Sandbox Sandbox `yaml:"sandbox"`
	// OutputLimit caps each of a job's stdout and stderr, a size such as
	// 4MiB or a number of bytes; default (unset or 0) 4 MiB.
	OutputLimit config.ByteSize `yaml:"output_limit"`
	// Network configures per-job egress enforcement.
	Network Network `yaml:"network"`
	// Capacity bounds what the jobs running at once may hold together.
	Capacity Capacity `yaml:"capacity"`
	// Images configures the cache of the OCI images jobs run on.
	Images Images `yaml:"images"`
	// Advertise is host:port where the authority reaches this executor,
	// sent with every heartbeat. Default listen, when listen names a host;
	// required when listen's host is unspecified (0.0.0.0, ::), which is
	// no address another host can dial. --advertise overrides it.
	Advertise string `yaml:"advertise"`
	// Fleet configures the executor's membership of the authority's fleet.
	Fleet Fleet `yaml:"fleet"`
	// WarmPool bounds the sandboxes this executor keeps started and ready
	// for sessions, which the tenants' policies ask for
	// (sessions.warm_pool).
	WarmPool WarmPool `yaml:"warm_pool"`
}

// WarmPool bounds the pooled sandboxes: each is a runc session's sandbox
// made for one tenant's session shape ahead of the session, claimed by one
// session and never reused. It needs the exec helper (Linux 6.15 or
// newer).
type WarmPool struct {
	// MaxSandboxes bounds the pooled sandboxes on this executor, every
	// tenant's together: 0 to 64, default 0 (none, whatever tenants ask).
	// They count against capacity (each its disk limit and 16MiB of
	// memory), and give their room back to runs.
	MaxSandboxes int `yaml:"max_sandboxes"`
	// PerTenant bounds what one tenant's policy may ask for one shape:
	// 0 (the default) is max_sandboxes.
	PerTenant int `yaml:"per_tenant"`
	// MaxIdle is how long a pooled sandbox waits for a claim before it is
	// made again: at least 1m, default 1h.
	MaxIdle time.Duration `yaml:"max_idle"`
}

// MaxWarmPool bounds WarmPool.MaxSandboxes.
const MaxWarmPool = 64

// Fleet configures the heartbeat and the fence.
type Fleet struct {
	// FenceAfter is how long after its last answered heartbeat the
	// executor stops starting sandboxes of new runs, default 20s. It must
	// be shorter than the authority's fleet.lost_after (default 30s): by
	// the time the authority declares this executor lost and places its
	// queued jobs elsewhere, this executor has stopped starting them.
	FenceAfter time.Duration `yaml:"fence_after"`
}

// DefaultFenceAfter is Fleet.FenceAfter's default.
const DefaultFenceAfter = 20 * time.Second

// Images configures the image cache (under data_dir/images).
type Images struct {
	// MaxSize bounds the cache's disk: past it the least recently used
	// layers no running job holds are evicted. Default 20GiB.
	MaxSize config.ByteSize `yaml:"max_size"`
}

// Network configures the per-job network namespaces and their rules.
type Network struct {
	// Pool4 is the IPv4 prefix each allow-policy job's veth pair takes a
	// /30 from. Executors sharing a host need pools of their own, so the
	// default is a /22 of 10.200.0.0/13 (256 such jobs at once) chosen by
	// a hash of data_dir, like Name, and each executor claims its pool
	// host-wide while it runs (a lock under /run/airlock/netpolicy). At
	// start a default pool that another executor holds or that overlaps
	// the host's networks (an interface's subnet, a route other than a
	// default one, an always-denied prefix) moves to a free one; a
	// configured pool that another executor holds or that overlaps an
	// interface's subnet is refused, one that overlaps a route is logged.
	Pool4 string `yaml:"pool4"`
	// Pool6, if set, gives jobs IPv6 too (a /64 each). Off by default:
	// IPv6 forwarding makes Linux ignore router advertisements.
	Pool6 string `yaml:"pool6"`
	// Name prefixes the executor's nftables tables and veth aliases; it
	// must be this executor's alone, since at start the executor removes
	// every table and veth of that name as a leftover. Default
	// airlock_<hash of data_dir>.
	Name string `yaml:"name"`
	// AlwaysDeny are more CIDRs no job may reach, whatever its policy, on
	// top of link-local, loopback, the well-known cloud metadata
	// addresses, the pools and the host's own addresses.
	AlwaysDeny []string `yaml:"always_deny"`
	// MaxConnections caps the connections each job may have open at once
	// through its interface; beyond it a new one is rejected, so no job
	// fills the host's connection tracking table. Default 1024.
	MaxConnections int `yaml:"max_connections"`
	// Resolvers are the upstream DNS servers, "IP" or "IP:PORT" (port 53
	// by default), that resolve names for jobs with a domains policy: the
	// egress proxy and each job's DNS server ask them, and nothing a job
	// sends reaches them. At most 3, tried in order; none means the host's
	// resolver (/etc/resolv.conf).
	Resolvers []string `yaml:"resolvers"`

	// Parsed forms, set by validation.
	Pool4Prefix, Pool6Prefix netip.Prefix `yaml:"-"`
	// Pool4Default says Pool4 was not configured: the executor may move it
	// off the host's own networks.
	Pool4Default       bool             `yaml:"-"`
	AlwaysDenyPrefixes []netip.Prefix   `yaml:"-"`
	ResolverAddrs      []netip.AddrPort `yaml:"-"`
}

// defaultPools is where the default Pool4 comes from: one /22 of it per
// data directory.
var defaultPools = netip.MustParsePrefix("10.200.0.0/13")

const defaultPoolBits = 22

// defaultPool4 is the /22 of defaultPools the hash of dataDir picks.
func defaultPool4(dataDir string) netip.Prefix {
	sum := sha256.Sum256([]byte(dataDir))
	// Other bytes than Name's, so the two do not vary together.
	i := binary.BigEndian.Uint32(sum[8:12]) % (1 << (defaultPoolBits - defaultPools.Bits()))
	b := defaultPools.Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) + i<<(32-defaultPoolBits)
	binary.BigEndian.PutUint32(b[:], v)
	return netip.PrefixFrom(netip.AddrFrom4(b), defaultPoolBits)
}

// Authority is the executor's authority peer.
type Authority struct {
	config.Peer `yaml:",inline"`
	// GrantPublicKey is the set of PEM Ed25519 keys a grant may be signed
	// with: a file holding one or more PUBLIC KEY blocks (the authority's
	// grant.key.pub), or a directory of *.pub files. It is re-read when it
	// changes, with no restart; an unreadable or invalid change keeps the
	// last good set.
	GrantPublicKey string `yaml:"grant_public_key"`
}

// Sandbox configures the runtimes.
type Sandbox struct {
	// Runc is the runc binary (built from the pinned module by tools/sandbox/build.sh).
	Runc string `yaml:"runc"`
	// Runsc is the gVisor runsc binary; empty disables the runsc class.
	Runsc string `yaml:"runsc"`
	// Execd is the static airlock-execd binary, the exec helper that
	// starts a runc session's execs inside its sandbox (docs/exec.md);
	// default airlock-execd beside Runc (or the file Runc links to) if it is there, else each exec is
	// one `runc exec`.
	Execd string `yaml:"execd"`
	// RunscPlatform is gVisor's platform for runsc jobs: ptrace (default)
	// or systrap, which must pass the self-check (docs/operations.md: on
	// issue 20's host it corrupts vector registers and is refused).
	RunscPlatform string `yaml:"runsc_platform"`
	// RunscSelfCheckCache is the directory where a passed runsc
	// self-check is recorded, so a start with the same runsc, executor,
	// kernel and CPU skips it; default data_dir/sandbox/probe. Executors
	// that share one check once between them.
	RunscSelfCheckCache string `yaml:"runsc_self_check_cache"`
	// UIDBase is the host uid and gid that root inside a sandbox maps to; default 1000000.
	UIDBase uint32 `yaml:"uid_base"`
	// CgroupParent is the cgroup under which job cgroups are made. It must
	// be this executor's alone: at start the executor removes every job
	// cgroup under it as a leftover. Default /airlock/<hash of data_dir>.
	CgroupParent string `yaml:"cgroup_parent"`
	// DiskReadBPS and DiskWriteBPS bound, per second, what each job reads
	// from and writes to its scratch disk (a size such as 50MiB); unset is
	// no bound. cgroup v2 io.max; on v1, blkio throttling, which binds
	// direct I/O only.
	DiskReadBPS  config.ByteSize `yaml:"disk_read_bps"`
	DiskWriteBPS config.ByteSize `yaml:"disk_write_bps"`
	// Path is the PATH every job and exec starts with unless its own
	// environment sets one: absolute, clean directories separated by ':',
	// no empty entry, at most 4096 bytes. Default
	// /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; add a
	// toolchain the host keeps outside those, e.g. /usr/local/go/bin.
	Path string `yaml:"path"`
	// CABundle is the PEM file of CA certificates every job trusts,
	// default the host's public bundle, /etc/ssl/certs/ca-certificates.crt
	// (a start without it and without this setting is refused). ExtraCAs
	// are more PEM files appended to it, such as the CA of an egress that
	// inspects TLS. Each must hold CA certificates and no other PEM block,
	// at most 1 MiB; at most 16 extra files. They are read once, at start,
	// into the jobs' root filesystem template: a later change on the host
	// reaches no job until the executor restarts.
	CABundle string   `yaml:"ca_bundle"`
	ExtraCAs []string `yaml:"extra_cas"`
	// VM configures the vm runtime class: a QEMU machine per job.
	VM VM `yaml:"vm"`

	// CAs is the trust store read from CABundle and ExtraCAs, set by
	// validation.
	CAs []byte `yaml:"-"`
}

// VM configures the vm runtime class (README: "The vm runtime class").
type VM struct {
	// Runtime is the airlock-vm binary (make build puts it in bin/ beside
	// airlock-guest, the guest agent it boots); empty disables the class.
	Runtime string `yaml:"runtime"`
	// Kernel is the guest kernel's directory as `airlock-vm kernel fetch`
	// caches it (Debian's linux-image package, pinned by its version);
	// empty takes the newest one cached.
	Kernel string `yaml:"kernel"`
	// QEMU is qemu-system-x86_64; empty finds it in PATH.
	QEMU string `yaml:"qemu"`
	// Emulation lets the class run under QEMU's software emulation where
	// KVM is not usable. For development and CI only: code runs 5 to 10
	// times slower, and `airlock status` shows "vm: emulated".
	Emulation bool `yaml:"emulation"`
}

// maxExtraCAs bounds Sandbox.ExtraCAs.
const maxExtraCAs = 16

// defaultCABundle is Sandbox.CABundle's default (a variable for tests).
var defaultCABundle = sandbox.DefaultCABundle

// validateCAs reads the jobs' trust store into s.CAs.
func (c *Config) validateCAs() error {
	s := &c.Sandbox
	s.CAs = nil
	var errs []error
	read := func(field, path string) {
		b, err := sandbox.ReadCAFile(path)
		if err != nil {
			errs = append(errs, config.Field(field, "%v", err))
			return
		}
		s.CAs = append(s.CAs, b...)
	}
	if s.CABundle == "" {
		if _, err := os.Stat(defaultCABundle); err != nil {
			errs = append(errs, config.Field("sandbox.ca_bundle", "not set, and this host has no %s (Debian's ca-certificates package): install it, or name a PEM file of CA certificates", defaultCABundle))
		} else {
			read("sandbox.ca_bundle", defaultCABundle)
		}
	} else if err := c.Server.CheckFile("sandbox.ca_bundle", &s.CABundle, true); err != nil {
		errs = append(errs, err)
	} else {
		read("sandbox.ca_bundle", s.CABundle)
	}
	if len(s.ExtraCAs) > maxExtraCAs {
		errs = append(errs, config.Field("sandbox.extra_cas", "%d files: at most %d", len(s.ExtraCAs), maxExtraCAs))
		s.CAs = nil
		return errors.Join(errs...)
	}
	for i := range s.ExtraCAs {
		field := fmt.Sprintf("sandbox.extra_cas[%d]", i)
		if err := c.Server.CheckFile(field, &s.ExtraCAs[i], true); err != nil {
			errs = append(errs, err)
			continue
		}
		read(field, s.ExtraCAs[i])
	}
	if len(errs) > 0 {
		s.CAs = nil
	}
	return errors.Join(errs...)
}

var networkName = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// Common implements config.Service.
func (c *Config) Common() *config.Server { return &c.Server }

// ValidatePeers implements config.Service.
func (c *Config) ValidatePeers() error {
	var errs []error
	errs = append(errs, config.ValidatePeer("authority", c.Authority.Peer))
	if err := c.Server.CheckFile("authority.grant_public_key", &c.Authority.GrantPublicKey, true); err != nil {
		errs = append(errs, err)
	} else if _, err := grant.LoadPublicKeys(c.Authority.GrantPublicKey); err != nil {
		errs = append(errs, config.Field("authority.grant_public_key", "%v", err))
	}
	errs = append(errs, c.Server.CheckFile("sandbox.runc", &c.Sandbox.Runc, true))
	errs = append(errs, c.Server.CheckFile("sandbox.runsc", &c.Sandbox.Runsc, false))
	if c.Sandbox.Execd == "" && c.Sandbox.Runc != "" {
		// Beside runc as built (tools/sandbox/build.sh builds both), also
		// when runc is a link to it.
		if runc, err := filepath.EvalSymlinks(c.Sandbox.Runc); err == nil {
			if p := filepath.Join(filepath.Dir(runc), "airlock-execd"); fileExists(p) {
				c.Sandbox.Execd = p
			}
		}
	}
	errs = append(errs, c.Server.CheckFile("sandbox.execd", &c.Sandbox.Execd, false))
	errs = append(errs, c.Server.CheckFile("sandbox.vm.runtime", &c.Sandbox.VM.Runtime, false))
	errs = append(errs, c.Server.CheckFile("sandbox.vm.kernel", &c.Sandbox.VM.Kernel, false))
	errs = append(errs, c.Server.CheckFile("sandbox.vm.qemu", &c.Sandbox.VM.QEMU, false))
	if c.Sandbox.UIDBase == 0 {
		c.Sandbox.UIDBase = 1000000
	} else if c.Sandbox.UIDBase < 65536 {
		errs = append(errs, config.Field("sandbox.uid_base", "%d: must be at least 65536 so no sandbox uid is a real host user", c.Sandbox.UIDBase))
	}
	if c.Sandbox.Path != "" {
		if err := runspec.ValidPath(c.Sandbox.Path); err != nil {
			errs = append(errs, config.Field("sandbox.path", "%q: %v", c.Sandbox.Path, err))
		}
	}
	errs = append(errs, c.validateCAs())
	if c.Sandbox.CgroupParent == "" {
		sum := sha256.Sum256([]byte(c.DataDir))
		c.Sandbox.CgroupParent = "/airlock/" + hex.EncodeToString(sum[:6])
	} else if !filepath.IsAbs(c.Sandbox.CgroupParent) {
		errs = append(errs, config.Field("sandbox.cgroup_parent", "%q: must be an absolute cgroup path", c.Sandbox.CgroupParent))
	}
	for _, b := range []struct {
		field string
		v     config.ByteSize
	}{{"sandbox.disk_read_bps", c.Sandbox.DiskReadBPS}, {"sandbox.disk_write_bps", c.Sandbox.DiskWriteBPS}} {
		if err := b.v.Check(b.field); err != nil {
			errs = append(errs, err)
		} else if b.v.IsSet() && b.v.Bytes() <= 0 {
			errs = append(errs, config.Field(b.field, "%s: must be positive (leave it out for no bound)", config.FormatByteSize(b.v.Bytes())))
		}
	}
	if c.Network.Name == "" {
		sum := sha256.Sum256([]byte(c.DataDir))
		c.Network.Name = "airlock_" + hex.EncodeToString(sum[:4])
	} else if !networkName.MatchString(c.Network.Name) {
		errs = append(errs, config.Field("network.name", "%q: want 1 to 32 of [a-z0-9_]", c.Network.Name))
	}
	if c.Network.Pool4 == "" {
		c.Network.Pool4 = defaultPool4(c.DataDir).String()
		c.Network.Pool4Default = true
	}
	for _, p := range []struct {
		field, text string
		out         *netip.Prefix
		v4          bool
	}{{"network.pool4", c.Network.Pool4, &c.Network.Pool4Prefix, true}, {"network.pool6", c.Network.Pool6, &c.Network.Pool6Prefix, false}} {
		if p.text == "" {
			continue
		}
		pre, err := netip.ParsePrefix(p.text)
		switch {
		case err != nil:
			errs = append(errs, config.Field(p.field, "%q is not a CIDR", p.text))
		case p.v4 && (!pre.Addr().Is4() || pre.Bits() > 30):
			errs = append(errs, config.Field(p.field, "%s: want an IPv4 prefix of at most /30", pre))
		case !p.v4 && (!pre.Addr().Is6() || pre.Addr().Is4In6() || pre.Bits() > 64):
			errs = append(errs, config.Field(p.field, "%s: want an IPv6 prefix of at most /64", pre))
		default:
			*p.out = pre
		}
	}
	c.Network.ResolverAddrs = nil
	if len(c.Network.Resolvers) > 3 {
		errs = append(errs, config.Field("network.resolvers", "%d given: at most 3", len(c.Network.Resolvers)))
	}
	for i, text := range c.Network.Resolvers {
		ap, err := config.ParseResolver(text)
		if err != nil {
			errs = append(errs, config.Field(fmt.Sprintf("network.resolvers[%d]", i), "%q: %v", text, err))
			continue
		}
		c.Network.ResolverAddrs = append(c.Network.ResolverAddrs, ap)
	}
	c.Network.AlwaysDenyPrefixes = nil
	for i, text := range c.Network.AlwaysDeny {
		pre, err := netip.ParsePrefix(text)
		switch {
		case err != nil:
			errs = append(errs, config.Field(fmt.Sprintf("network.always_deny[%d]", i), "%q is not a CIDR", text))
		case pre.Addr().Zone() != "" || pre.Addr().Is4In6():
			errs = append(errs, config.Field(fmt.Sprintf("network.always_deny[%d]", i), "%s: want an IPv4 or IPv6 prefix without zone or IPv4-mapped form", pre))
		default:
			c.Network.AlwaysDenyPrefixes = append(c.Network.AlwaysDenyPrefixes, pre.Masked())
		}
	}
	switch {
	case c.Network.MaxConnections == 0:
		c.Network.MaxConnections = 1024
	case c.Network.MaxConnections < 1 || c.Network.MaxConnections > 1<<20:
		errs = append(errs, config.Field("network.max_connections", "%d: want 1 to %d", c.Network.MaxConnections, 1<<20))
	}
	if err := c.OutputLimit.Check("output_limit"); err != nil {
		errs = append(errs, err)
	} else if c.OutputLimit.Bytes() < 0 {
		errs = append(errs, config.Field("output_limit", "must not be negative"))
	}
	if err := c.Images.MaxSize.Check("images.max_size"); err != nil {
		errs = append(errs, err)
	} else if n := c.Images.MaxSize.Bytes(); n != 0 && n < 64<<20 {
		errs = append(errs, config.Field("images.max_size", "%d bytes: at least 64MiB (0 or unset is 20GiB)", n))
	}
	errs = append(errs, c.validateFleet())
	switch w := c.WarmPool; {
	case w.MaxSandboxes < 0 || w.MaxSandboxes > MaxWarmPool:
		errs = append(errs, config.Field("warm_pool.max_sandboxes", "%d: want 0 to %d", w.MaxSandboxes, MaxWarmPool))
	case w.PerTenant < 0 || w.PerTenant > max(w.MaxSandboxes, 0):
		errs = append(errs, config.Field("warm_pool.per_tenant", "%d: want 0 to max_sandboxes (%d)", w.PerTenant, w.MaxSandboxes))
	case w.MaxIdle == 0:
		c.WarmPool.MaxIdle = time.Hour
	case w.MaxIdle < time.Minute:
		errs = append(errs, config.Field("warm_pool.max_idle", "%v: at least 1m", w.MaxIdle))
	}
	if h, err := measureHost(c.DataDir); err != nil {
		errs = append(errs, config.Field("capacity", "measure this host: %v", err))
	} else {
		errs = append(errs, c.Capacity.validate(h, c.Network.Pool4Prefix.Bits()))
	}
	return errors.Join(errs...)
}

// validateFleet checks advertise (listen by default, when it names a
// host) and fleet.
func (c *Config) validateFleet() error {
	var errs []error
	if c.Advertise == "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if ip, perr := netip.ParseAddr(host); err == nil && (host == "" || perr == nil && ip.IsUnspecified()) {
			errs = append(errs, config.Field("advertise", "required when listen (%s) has no specific host: the authority must be told an address it can dial (give the host's address and listen's port, or --advertise)", c.Listen))
		} else {
			c.Advertise = c.Listen
		}
	}
	if c.Advertise != "" {
		if err := config.CheckAddress(c.Advertise); err != nil {
			errs = append(errs, config.Field("advertise", "%v", err))
		} else if host, port, _ := net.SplitHostPort(c.Advertise); port == "0" {
			errs = append(errs, config.Field("advertise", "%q: port 0 is no port the authority can dial", c.Advertise))
		} else if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
			errs = append(errs, config.Field("advertise", "%q: an unspecified address is no address the authority can dial", c.Advertise))
		}
	}
	switch {
	case c.Fleet.FenceAfter == 0:
		c.Fleet.FenceAfter = DefaultFenceAfter
	case c.Fleet.FenceAfter < time.Second:
		errs = append(errs, config.Field("fleet.fence_after", "%v: at least 1s (and shorter than the authority's fleet.lost_after)", c.Fleet.FenceAfter))
	}
	return errors.Join(errs...)
}

// Flags are the executor's own command-line flags, beyond those every
// service takes (daemon.Flags).
type Flags struct {
	// Advertise, unless empty, overrides advertise (--advertise).
	Advertise string
}

// Load reads and validates the file at path; override applies the flags
// every service takes, then own the executor's.
func Load(path string, override func(*config.Server), own Flags) (*Config, error) {
	var c Config
	if err := config.LoadService(path, &c, c.withFlags(override, own)); err != nil {
		return nil, err
	}
	return &c, nil
}

// Check is --check-config: the file at path loaded as Load does, and every
// file it names read as a start would (config.Check), creating nothing and
// running no runtime.
func Check(path string, override func(*config.Server)) (string, []error) {
	return (&Flags{}).Check(path, override)
}

// Check is Check with the executor's own flags f.
func (f *Flags) Check(path string, override func(*config.Server)) (string, []error) {
	c := &Config{}
	return config.Check("executor", path, c, c.withFlags(override, *f))
}

// withFlags is override, then own: the flags win over the file, which is
// decoded into c before either applies.
func (c *Config) withFlags(override func(*config.Server), own Flags) func(*config.Server) {
	return func(s *config.Server) {
		if override != nil {
			override(s)
		}
		if own.Advertise != "" {
			c.Advertise = own.Advertise
		}
	}
}

// CheckFiles implements config.Checker: the grant public key parses and
// the runtimes are executable.
func (c *Config) CheckFiles() ([]string, error) {
	return nil, errors.Join(
		config.CheckPublicKey("authority.grant_public_key", c.Authority.GrantPublicKey),
		config.CheckExecutable("sandbox.runc", c.Sandbox.Runc),
		config.CheckExecutable("sandbox.runsc", c.Sandbox.Runsc),
		config.CheckExecutable("sandbox.execd", c.Sandbox.Execd),
		config.CheckExecutable("sandbox.vm.runtime", c.Sandbox.VM.Runtime),
		config.CheckExecutable("sandbox.vm.qemu", c.Sandbox.VM.QEMU),
	)
}

// Summary implements config.Checker.
func (c *Config) Summary() string {
	classes := "runc"
	if c.Sandbox.Runsc != "" {
		classes += ", runsc"
	}
	if c.Sandbox.VM.Runtime != "" {
		classes += ", vm"
		if c.Sandbox.VM.Emulation {
			classes += " (emulation allowed)"
		}
	}
	return fmt.Sprintf("authority %s, %s, cgroup parent %s, network %s pool %s, capacity %d jobs",
		c.Authority.Address, classes, c.Sandbox.CgroupParent, c.Network.Name, c.Network.Pool4Prefix, c.Capacity.Jobs)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
