package config

import (
	"crypto/ed25519"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grant"
)

// fieldErrors maps each field ValidatePeers complains about to its reason.
func fieldErrors(err error) map[string]string {
	out := map[string]string{}
	var walk func(error)
	walk = func(err error) {
		var fe *config.FieldError
		if errors.As(err, &fe) && err == error(fe) {
			out[fe.Field] = fe.Reason
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Without network.pool4, each data directory gets a /22 of 10.200.0.0/13
// of its own, the same at every start.
func TestDefaultPool4(t *testing.T) {
	seen := map[netip.Prefix]string{}
	for _, dir := range []string{"/var/lib/airlock/executor", "/var/lib/airlock/executor2", "/srv/a", "/srv/b", "/srv/c"} {
		c := &Config{}
		c.DataDir = dir
		_ = c.ValidatePeers()
		p := c.Network.Pool4Prefix
		if p.Bits() != 22 || !netip.MustParsePrefix("10.200.0.0/13").Contains(p.Addr()) || p != p.Masked() {
			t.Errorf("data_dir %s: default pool4 %s, want a /22 of 10.200.0.0/13", dir, p)
		}
		if other, dup := seen[p]; dup {
			t.Errorf("data_dirs %s and %s both get pool4 %s", other, dir, p)
		}
		seen[p] = dir
		again := &Config{}
		again.DataDir = dir
		_ = again.ValidatePeers()
		if again.Network.Pool4Prefix != p {
			t.Errorf("data_dir %s: pool4 %s, then %s", dir, p, again.Network.Pool4Prefix)
		}
	}
	c := &Config{Network: Network{Pool4: "10.1.0.0/16"}}
	_ = c.ValidatePeers()
	if c.Network.Pool4Prefix != netip.MustParsePrefix("10.1.0.0/16") {
		t.Errorf("a configured pool4 became %s", c.Network.Pool4Prefix)
	}
}

// network.always_deny takes CIDRs, masked; each bad one is named by its
// index.
func TestAlwaysDeny(t *testing.T) {
	c := &Config{Network: Network{AlwaysDeny: []string{"203.0.113.7/24", "nonsense", "2001:db8::/32", "::ffff:1.2.3.4/128"}}}
	errs := fieldErrors(c.ValidatePeers())
	for _, f := range []string{"network.always_deny[1]", "network.always_deny[3]"} {
		if _, ok := errs[f]; !ok {
			t.Errorf("no error for %s; errors %v", f, errs)
		}
	}
	for f := range errs {
		if f == "network.always_deny[0]" || f == "network.always_deny[2]" {
			t.Errorf("%s: %s", f, errs[f])
		}
	}
	want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if !slices.Equal(c.Network.AlwaysDenyPrefixes, want) {
		t.Errorf("parsed %v, want %v", c.Network.AlwaysDenyPrefixes, want)
	}
	if reason := errs["network.always_deny[1]"]; !strings.Contains(reason, "nonsense") {
		t.Errorf("reason %q does not quote the value", reason)
	}
}

// network.resolvers takes "IP" (port 53) or "IP:PORT", at most three; each
// bad one is named by its index.
func TestResolvers(t *testing.T) {
	c := &Config{Network: Network{Resolvers: []string{"192.0.2.53", "[2001:db8::53]:5353", "dns.example:53"}}}
	errs := fieldErrors(c.ValidatePeers())
	for f := range errs {
		if strings.HasPrefix(f, "network.resolvers") && f != "network.resolvers[2]" {
			t.Errorf("%s: %s", f, errs[f])
		}
	}
	if _, ok := errs["network.resolvers[2]"]; !ok {
		t.Errorf("errors %v, want one for network.resolvers[2]", errs)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[2001:db8::53]:5353")}
	if !slices.Equal(c.Network.ResolverAddrs, want) {
		t.Errorf("parsed %v, want %v", c.Network.ResolverAddrs, want)
	}
	for _, bad := range []string{"0.0.0.0", "192.0.2.1:0", "[fe80::1%eth0]:53", ""} {
		c := &Config{Network: Network{Resolvers: []string{bad}}}
		if _, ok := fieldErrors(c.ValidatePeers())["network.resolvers[0]"]; !ok {
			t.Errorf("%q accepted", bad)
		}
	}
	c = &Config{Network: Network{Resolvers: []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"}}}
	if _, ok := fieldErrors(c.ValidatePeers())["network.resolvers"]; !ok {
		t.Error("four resolvers accepted")
	}
}

// network.max_connections defaults to 1024; a value below 1 or above
// 1<<20 is refused, naming the field.
func TestMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		in, want int
		ok       bool
	}{{0, 1024, true}, {8, 8, true}, {1 << 20, 1 << 20, true}, {-1, 0, false}, {1<<20 + 1, 0, false}} {
		c := &Config{Network: Network{MaxConnections: tc.in}}
		reason, bad := fieldErrors(c.ValidatePeers())["network.max_connections"]
		switch {
		case tc.ok && bad:
			t.Errorf("max_connections %d: %s", tc.in, reason)
		case tc.ok && c.Network.MaxConnections != tc.want:
			t.Errorf("max_connections %d became %d, want %d", tc.in, c.Network.MaxConnections, tc.want)
		case !tc.ok && !bad:
			t.Errorf("max_connections %d: no error for network.max_connections", tc.in)
		}
	}
}

// warm_pool: each bound out of range is refused naming its field;
// max_idle defaults to an hour.
func TestWarmPoolBounds(t *testing.T) {
	for _, tc := range []struct {
		in    WarmPool
		field string
	}{
		{WarmPool{MaxSandboxes: -1}, "warm_pool.max_sandboxes"},
		{WarmPool{MaxSandboxes: MaxWarmPool + 1}, "warm_pool.max_sandboxes"},
		{WarmPool{MaxSandboxes: 2, PerTenant: 3}, "warm_pool.per_tenant"},
		{WarmPool{MaxSandboxes: 2, PerTenant: -1}, "warm_pool.per_tenant"},
		{WarmPool{MaxSandboxes: 2, MaxIdle: time.Second}, "warm_pool.max_idle"},
	} {
		c := &Config{WarmPool: tc.in}
		if _, bad := fieldErrors(c.ValidatePeers())[tc.field]; !bad {
			t.Errorf("warm_pool %+v: no error for %s", tc.in, tc.field)
		}
	}
	c := &Config{WarmPool: WarmPool{MaxSandboxes: 4, PerTenant: 2}}
	errs := fieldErrors(c.ValidatePeers())
	for f, why := range errs {
		if strings.HasPrefix(f, "warm_pool") {
			t.Errorf("a good warm_pool: %s: %s", f, why)
		}
	}
	if c.WarmPool.MaxIdle != time.Hour {
		t.Errorf("max_idle defaulted to %v, want 1h", c.WarmPool.MaxIdle)
	}
}

// Without a capacity section the capacity is this host's, less the
// reserves: memory less a tenth (at least 1 GiB), four times every CPU
// (CPU is shared in time), the free
// space of data_dir's filesystem less a tenth (at least 2 GiB), and 64
// jobs, or fewer when network.pool4 has fewer /30s.
func TestCapacityDefaults(t *testing.T) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	mem := int64(si.Totalram) * int64(si.Unit)
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "not", "yet")
	c := &Config{}
	c.DataDir = dir
	if reason, bad := fieldErrors(c.ValidatePeers())["capacity"]; bad {
		t.Fatal(reason)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(filepath.Dir(dir)), &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	got := c.Capacity
	if want := (mem - max(1<<30, mem/10)) &^ (1<<20 - 1); got.MemoryBytes != want {
		t.Errorf("memory %d, want %d (host %d)", got.MemoryBytes, want, mem)
	}
	if want := int64(cpus.Count()) * 4000; got.CPUMillis != want {
		t.Errorf("cpu_millis %d, want %d", got.CPUMillis, want)
	}
	// Other tests write to the same filesystem meanwhile.
	if want := free - max(2<<30, free/10); got.DiskBytes < want-256<<20 || got.DiskBytes > want+256<<20 {
		t.Errorf("disk %d, want about %d (free %d)", got.DiskBytes, want, free)
	}
	if got.Jobs != 64 {
		t.Errorf("jobs %d, want 64", got.Jobs)
	}
	small := &Config{Network: Network{Pool4: "10.1.0.0/28"}}
	small.DataDir = dir
	_ = small.ValidatePeers()
	if small.Capacity.Jobs != 4 {
		t.Errorf("jobs %d with a /28 pool4, want its 4 /30s", small.Capacity.Jobs)
	}
}

// Configured capacities are taken as written, in the config's size
// syntax; bad ones name the field and say why.
func TestCapacityValues(t *testing.T) {
	h := host{memory: 25125203968, cpuMillis: 2000, diskFree: 75 << 30, diskSize: 252 << 30}
	var c Capacity
	if err := yaml.Unmarshal([]byte("memory: 8GiB\ncpu_millis: 1500\ndisk: 100GB\njobs: 3\n"), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(h, 22); err != nil {
		t.Fatal(err)
	}
	if c.MemoryBytes != 8<<30 || c.CPUMillis != 1500 || c.DiskBytes != 100e9 || c.Jobs != 3 {
		t.Errorf("capacity %+v", c)
	}
	for _, tc := range []struct {
		yaml, field, reason string
		h                   host
	}{
		{"memory: 64GiB", "capacity.memory", "64GiB is more than this host's 23.4GiB", h},
		{"memory: -1", "capacity.memory", `"-1" is not a size`, h},
		{"memory: 0", "capacity.memory", "0: must be positive", h},
		{"cpu_millis: 8001", "capacity.cpu_millis", "8001 is more than 4 times this host's 2 CPUs (8000)", h},
		{"cpu_millis: -1", "capacity.cpu_millis", "-1: must be positive", h},
		{"disk: 1TiB", "capacity.disk", "1TiB is more than data_dir's whole filesystem (252.0GiB)", h},
		{"disk: 0", "capacity.disk", "0: must be positive", h},
		{"jobs: -2", "capacity.jobs", "-2: must be positive", h},
		{"{}", "capacity.disk", "data_dir's filesystem has 1.5GiB free, no more than the 2.0GiB kept", host{memory: 8 << 30, cpuMillis: 1000, diskFree: 3 << 29, diskSize: 10 << 30}},
		{"{}", "capacity.memory", "this host has 1.0GiB of memory, no more than the 1.0GiB kept", host{memory: 1 << 30, cpuMillis: 1000, diskFree: 10 << 30, diskSize: 10 << 30}},
	} {
		var c Capacity
		if err := yaml.Unmarshal([]byte(tc.yaml), &c); err != nil {
			t.Fatal(err)
		}
		errs := fieldErrors(c.validate(tc.h, 22))
		if reason, ok := errs[tc.field]; !ok || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: errors %v; want %s: %s", tc.yaml, errs, tc.field, tc.reason)
		}
		if len(errs) != 1 {
			t.Errorf("%s: errors %v; want only %s", tc.yaml, errs, tc.field)
		}
	}
}

// authority.grant_public_key names a file of one or more keys or a
// directory of *.pub files; anything else is refused at start, naming the
// field, never left to refuse every grant later.
func TestGrantPublicKey(t *testing.T) {
	dir := t.TempDir()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := grant.MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"one.pub": p, "two.pub": append(append([]byte{}, p...), p...), "bad.pub": []byte("not a key\n"), "keys/a.pub": p}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for path, want := range map[string]string{
		"one.pub": "", "two.pub": "", "keys": "",
		"bad.pub": "not a PEM PUBLIC KEY", "empty": "holds no PEM PUBLIC KEY", "missing.pub": "no such file", "": "required",
	} {
		c := &Config{}
		c.DataDir = dir
		if path != "" {
			c.Authority.GrantPublicKey = filepath.Join(dir, path)
		}
		got := fieldErrors(c.ValidatePeers())["authority.grant_public_key"]
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("%q: authority.grant_public_key error %q, want %q", path, got, want)
		}
	}
}

// The disk bandwidth bounds take sizes per second; a bad or non-positive
// one names its field.
func TestDiskBandwidth(t *testing.T) {
	for _, tc := range []struct {
		yaml, field, reason string
		read, write         int64
	}{
		{yaml: "{}"},
		{yaml: "disk_read_bps: 50MiB\ndisk_write_bps: 1048576", read: 50 << 20, write: 1 << 20},
		{yaml: "disk_read_bps: fast", field: "sandbox.disk_read_bps", reason: "fast"},
		{yaml: "disk_write_bps: 0", field: "sandbox.disk_write_bps", reason: "must be positive"},
		{yaml: "disk_write_bps: [1]", field: "sandbox.disk_write_bps", reason: "not a list"},
	} {
		c := &Config{}
		if err := yaml.Unmarshal([]byte(tc.yaml), &c.Sandbox); err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		errs := fieldErrors(c.ValidatePeers())
		if tc.field == "" {
			for _, f := range []string{"sandbox.disk_read_bps", "sandbox.disk_write_bps"} {
				if r, bad := errs[f]; bad {
					t.Errorf("%q: %s: %s", tc.yaml, f, r)
				}
			}
			if c.Sandbox.DiskReadBPS.Bytes() != tc.read || c.Sandbox.DiskWriteBPS.Bytes() != tc.write {
				t.Errorf("%q: read %d write %d, want %d %d", tc.yaml, c.Sandbox.DiskReadBPS.Bytes(), c.Sandbox.DiskWriteBPS.Bytes(), tc.read, tc.write)
			}
			continue
		}
		if r, bad := errs[tc.field]; !bad || !strings.Contains(r, tc.reason) {
			t.Errorf("%q: %s error %q, want one saying %q", tc.yaml, tc.field, r, tc.reason)
		}
	}
}

// sandbox.execd defaults to airlock-execd beside runc, or beside the file
// a runc link names (as the e2e tests and dev up link runc); none there
// leaves it empty (execs through runc exec); a set one must exist.
func TestExecdDefault(t *testing.T) {
	bin, links := t.TempDir(), t.TempDir()
	for _, name := range []string{"runc", "airlock-execd"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(bin, "runc"), filepath.Join(links, "runc")); err != nil {
		t.Fatal(err)
	}
	lone := filepath.Join(t.TempDir(), "runc")
	if err := os.WriteFile(lone, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ runc, execd, want, field string }{
		{runc: filepath.Join(bin, "runc"), want: filepath.Join(bin, "airlock-execd")},
		{runc: filepath.Join(links, "runc"), want: filepath.Join(bin, "airlock-execd")},
		{runc: lone, want: ""},
		{runc: lone, execd: "/nonexistent/airlock-execd", field: "sandbox.execd"},
	} {
		c := &Config{}
		c.Sandbox.Runc, c.Sandbox.Execd = tc.runc, tc.execd
		errs := fieldErrors(c.ValidatePeers())
		if tc.field != "" {
			if _, bad := errs[tc.field]; !bad {
				t.Errorf("runc %s, execd %s: no %s error", tc.runc, tc.execd, tc.field)
			}
			continue
		}
		if r, bad := errs["sandbox.execd"]; bad {
			t.Errorf("runc %s: sandbox.execd: %s", tc.runc, r)
		}
		if c.Sandbox.Execd != tc.want {
			t.Errorf("runc %s: execd %q, want %q", tc.runc, c.Sandbox.Execd, tc.want)
		}
	}
}
