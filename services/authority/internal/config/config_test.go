package config_test

import (
	"encoding/pem"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pkgconfig "github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/config"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// write puts body in dir/authority.yaml beside empty TLS files, a
// credential file and a real CA bundle git-ca.crt, and returns its path.
func write(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"ca.crt", "authority.crt", "authority.key", "demo.token"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := pki.NewCA("airlock.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "git-ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "authority.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const common = `version: 1
trust_domain: airlock.test
listen: 127.0.0.1:7401
data_dir: data
tls: {ca: ca.crt, cert: authority.crt, key: authority.key}
fleet: {heartbeat_interval: 5s, lost_after: 30s}
`

const good = common + `grant_ttl: 5m
tenants:
  dev:
    clients: [client/dev, client/ci]
    repositories:
      demo:
        url: https://git.example.com/demo.git
        credential: demo.token
        ca: git-ca.crt
      local:
        url: /srv/git/local.git
      rel:
        url: repos/rel
      mirror:
        url: file:///srv/git/mirror.git
    limits:
      default: {cpu_millis: 500, memory: 256MiB, pids: 128, disk: 1GB, deadline: 5m}
      max:     {cpu_millis: 4000, memory: 4GiB,  pids: 2048, disk: 8589934592, deadline: 2h}
    runtime_classes: [runsc, runc]
    egress: {cidrs: ["10.0.0.0/8", "2001:db8::/32"], domains: [proxy.golang.org, "*.example.com"]}
    approvals: {approvers: [approver/alice, approver/bob], required: 2, ttl: 2h}
    deploy_credentials: {demo: demo.token}
  bare:
    clients: [client/bare]
`

func TestLoadGood(t *testing.T) {
	path := write(t, good)
	dir := filepath.Dir(path)
	c, err := config.Load(path, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.GrantKey != filepath.Join(dir, "data", "grant.key") {
		t.Errorf("grant_key default = %q", c.GrantKey)
	}
	if a := c.Audit; a.CheckpointKey != filepath.Join(dir, "data", "audit-checkpoint.key") || a.CheckpointFile != filepath.Join(dir, "data", "audit-checkpoints.jsonl") ||
		a.CheckpointEvery != 100 || a.CheckpointInterval != time.Minute || len(a.Auditors) != 0 {
		t.Errorf("audit defaults = %+v", a)
	}
	if c.GrantTTL != 5*time.Minute {
		t.Errorf("grant_ttl = %v", c.GrantTTL)
	}
	dev := c.Policy["dev"]
	if dev == nil {
		t.Fatalf("no dev tenant in %v", c.Policy)
	}
	if !dev.HasClient("client/dev") || !dev.HasClient("client/ci") || dev.HasClient("client/bare") {
		t.Errorf("clients = %v", dev.Clients)
	}
	wantRepos := map[string]policy.Repository{
		"demo":   {Tenant: "dev", Name: "demo", URL: "https://git.example.com/demo.git", Credential: filepath.Join(dir, "demo.token"), CA: filepath.Join(dir, "git-ca.crt")},
		"local":  {Tenant: "dev", Name: "local", URL: "/srv/git/local.git"},
		"rel":    {Tenant: "dev", Name: "rel", URL: filepath.Join(dir, "repos/rel")},
		"mirror": {Tenant: "dev", Name: "mirror", URL: "file:///srv/git/mirror.git"},
	}
	for name, want := range wantRepos {
		if got := dev.Repositories[name]; got != want {
			t.Errorf("repository %s = %+v, want %+v", name, got, want)
		}
	}
	wantDefault := policy.Limits{CPUMillis: 500, MemoryBytes: 256 << 20, Pids: 128, DiskBytes: 1e9, Deadline: 5 * time.Minute}
	wantMax := policy.Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, Pids: 2048, DiskBytes: 8 << 30, Deadline: 2 * time.Hour}
	if dev.Default != wantDefault || dev.Max != wantMax {
		t.Errorf("limits = %+v / %+v, want %+v / %+v", dev.Default, dev.Max, wantDefault, wantMax)
	}
	if !slices.Equal(dev.RuntimeClasses, []string{"runsc", "runc"}) {
		t.Errorf("runtime classes = %v", dev.RuntimeClasses)
	}
	if !slices.Equal(dev.Egress.CIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}) ||
		!slices.Equal(dev.Egress.Domains, []string{"proxy.golang.org", "*.example.com"}) {
		t.Errorf("egress = %+v", dev.Egress)
	}

	if !slices.Equal(dev.Approvals.Approvers, []string{"approver/alice", "approver/bob"}) || dev.Approvals.Required != 2 || dev.Approvals.TTL != 2*time.Hour {
		t.Errorf("approvals = %+v", dev.Approvals)
	}
	if !dev.Approvals.AllowsApprover("approver/alice") || dev.Approvals.AllowsApprover("approver/carol") {
		t.Errorf("approver list not applied: %+v", dev.Approvals)
	}
	if got := dev.DeployCredentials["demo"]; got != filepath.Join(dir, "demo.token") || len(dev.DeployCredentials) != 1 {
		t.Errorf("deploy_credentials = %v", dev.DeployCredentials)
	}

	bare := c.Policy["bare"]
	if bare.Approvals.Required != 1 || bare.Approvals.TTL != 24*time.Hour || len(bare.Approvals.Approvers) != 0 || !bare.Approvals.AllowsApprover("approver/anyone") {
		t.Errorf("approval defaults = %+v", bare.Approvals)
	}
	if bare.Default != policy.DefaultLimits || bare.Max != policy.DefaultMax {
		t.Errorf("omitted limits = %+v / %+v, want the built-in ones", bare.Default, bare.Max)
	}
	if !slices.Equal(bare.RuntimeClasses, []string{"runc"}) || len(bare.Repositories) != 0 {
		t.Errorf("bare tenant = %+v", bare)
	}
}

func TestLoadWithoutTenants(t *testing.T) {
	c, err := config.Load(write(t, common+"grant_key: keys/grant.key\n"), nil)
	if err != nil {
		t.Fatalf("a file without tenants must load (it serves nothing but health): %v", err)
	}
	if len(c.Policy) != 0 || c.GrantTTL != config.DefaultGrantTTL || !strings.HasSuffix(c.GrantKey, "/keys/grant.key") || !filepath.IsAbs(c.GrantKey) {
		t.Errorf("policy=%v ttl=%v key=%q", c.Policy, c.GrantTTL, c.GrantKey)
	}
}

// TestRunscWithAHighCeiling: a pids ceiling above what runsc takes still
// serves runc jobs; runsc jobs asking past runsc's own maximum are
// refused at submission.
func TestRunscWithAHighCeiling(t *testing.T) {
	c, err := config.Load(write(t, common+`tenants:
  dev:
    clients: [client/dev]
    runtime_classes: [runc, runsc]
    limits:
      max: {pids: 8000}
`), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := c.Policy["dev"].Max.Pids; got != 8000 {
		t.Errorf("max pids %d, want 8000", got)
	}
}

func TestPartialLimitsKeepDefaultBelowCeiling(t *testing.T) {
	c, err := config.Load(write(t, common+`tenants:
  dev:
    clients: [client/dev]
    limits:
      max: {memory: 256MiB, deadline: 2m}
      default: {pids: 2000}
`), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	dev := c.Policy["dev"]
	if dev.Default.MemoryBytes != 256<<20 || dev.Default.Deadline != 2*time.Minute {
		t.Errorf("an omitted default above a written ceiling must be lowered to it: %+v", dev.Default)
	}
	if dev.Max.Pids != 2000 {
		t.Errorf("an omitted ceiling below a written default must be raised to it: %+v", dev.Max)
	}
}

func TestSessionsSection(t *testing.T) {
	c, err := config.Load(write(t, common+`tenants:
  dev:
    clients: [client/dev]
    sessions: {max_idle_timeout: 5m, max_concurrent_execs: 32, default_concurrent_execs: 8}
    warm_pool: 2
  other:
    clients: [client/other]
  sleepy:
    clients: [client/sleepy]
    sessions: {default_on_idle: sleep}
  awake:
    clients: [client/awake]
    sessions: {allow_sleep: false}
`), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := c.Policy["dev"].Sessions, (policy.Sessions{DefaultIdleTimeout: 5 * time.Minute, MaxIdleTimeout: 5 * time.Minute, DefaultConcurrentExecs: 8, MaxConcurrentExecs: 32, DefaultOnIdle: policy.OnIdleEnd}); got != want {
		t.Errorf("dev's sessions = %+v, want %+v (an omitted default lowered to its ceiling)", got, want)
	}
	if got := c.Policy["other"].Sessions; got != policy.DefaultSessions {
		t.Errorf("other's sessions = %+v, want the built-in %+v", got, policy.DefaultSessions)
	}
	if got := c.Policy["sleepy"].Sessions; got.DefaultOnIdle != policy.OnIdleSleep || got.ForbidSleep {
		t.Errorf("sleepy's sessions = %+v, want sleep by default", got)
	}
	if got := c.Policy["awake"].Sessions; got.DefaultOnIdle != policy.OnIdleEnd || !got.ForbidSleep {
		t.Errorf("awake's sessions = %+v, want end by default and sleep forbidden", got)
	}
}

func TestLoadErrorsNameTheField(t *testing.T) {
	tenant := func(body string) string { return common + "tenants:\n  dev:\n    clients: [client/dev]\n" + body }
	for _, tc := range []struct {
		name string
		body string
		want []string
	}{
		{"unknown tenant field", tenant("    limitz: {}\n"), []string{"tenants.dev.limitz (line 10): unknown field"}},
		{"unknown limit field", tenant("    limits: {max: {gpus: 1}}\n"), []string{"tenants.dev.limits.max.gpus", "unknown field"}},
		{"unknown sessions field", tenant("    sessions: {idle_timeout: 1m}\n"), []string{"tenants.dev.sessions.idle_timeout", "unknown field"}},
		{"idle ceiling below its default", tenant("    sessions: {default_idle_timeout: 2h, max_idle_timeout: 1h}\n"), []string{"tenants.dev.sessions.max_idle_timeout: ceiling 1h0m0s is below the default 2h0m0s"}},
		{"idle too long", tenant("    sessions: {max_idle_timeout: 200h}\n"), []string{"tenants.dev.sessions.max_idle_timeout: 200h0m0s: must be between 1s and 168h0m0s"}},
		{"too many execs", tenant("    sessions: {max_concurrent_execs: 65}\n"), []string{"tenants.dev.sessions.max_concurrent_execs: 65: must be between 1 and 64"}},
		{"warm pool too big", tenant("    warm_pool: 17\n"), []string{"tenants.dev.warm_pool: 17: must be between 0 and 16"}},
		{"negative warm pool", tenant("    warm_pool: -1\n"), []string{"tenants.dev.warm_pool: -1: must be between 0 and 16"}},
		{"negative execs", tenant("    sessions: {default_concurrent_execs: -1}\n"), []string{"tenants.dev.sessions.default_concurrent_execs: -1: must be between 1 and 64"}},
		{"bad on_idle", tenant("    sessions: {default_on_idle: nap}\n"), []string{`tenants.dev.sessions.default_on_idle: "nap": want end or sleep`}},
		{"sleep by default where it is forbidden", tenant("    sessions: {default_on_idle: sleep, allow_sleep: false}\n"), []string{"tenants.dev.sessions.default_on_idle: sleep, but allow_sleep is false"}},
		{"execs ceiling below its default", tenant("    sessions: {default_concurrent_execs: 8, max_concurrent_execs: 2}\n"), []string{"tenants.dev.sessions.max_concurrent_execs: ceiling 2 is below the default 8"}},
		{"bad size", tenant("    limits: {max: {memory: lots}}\n"), []string{`tenants.dev.limits.max.memory: "lots" is not a size`}},
		{"negative size", tenant("    limits: {default: {disk: -1GiB}}\n"), []string{"tenants.dev.limits.default.disk:", "is not a size"}},
		{"size as a list", tenant("    limits: {default: {disk: [1]}}\n"), []string{"tenants.dev.limits.default.disk:", "not a list"}},
		{"zero memory", tenant("    limits: {default: {memory: 0}}\n"), []string{"tenants.dev.limits.default.memory: must be more than 0"}},
		{"default memory no runtime starts in", tenant("    limits: {default: {memory: 1MiB}}\n"), []string{"tenants.dev.limits.default.memory: 1048576: must be at least 16777216 under runc"}},
		{"runsc needs more pids", tenant("    runtime_classes: [runc, runsc]\n    limits: {default: {pids: 32}}\n"), []string{"tenants.dev.limits.default.pids: 32: must be at least 64 under runsc"}},
		{"runsc default above what runsc takes", tenant("    runtime_classes: [runc, runsc]\n    limits: {default: {pids: 4000}, max: {pids: 8000}}\n"),
			[]string{"tenants.dev.limits.default.pids: 4000: must be at most 3584 under runsc"}},
		{"negative pids", tenant("    limits: {max: {pids: -3}}\n"), []string{"tenants.dev.limits.max.pids: must not be negative"}},
		{"ceiling below default", tenant("    limits: {default: {memory: 2GiB}, max: {memory: 1GiB}}\n"),
			[]string{"tenants.dev.limits.max.memory: ceiling 1GiB is below the default 2GiB"}},
		{"deadline ceiling below default", tenant("    limits: {default: {deadline: 2h}, max: {deadline: 1h}}\n"),
			[]string{"tenants.dev.limits.max.deadline: ceiling 1h0m0s is below the default 2h0m0s"}},
		{"bad client principal", common + "tenants:\n  dev:\n    clients: [approver/alice]\n", []string{`tenants.dev.clients[0]: "approver/alice": want a client principal`}},
		{"bad client name", common + "tenants:\n  dev:\n    clients: [client/Bad Name]\n", []string{"tenants.dev.clients[0]:", "name has character"}},
		{"no clients", common + "tenants:\n  dev: {}\n", []string{"tenants.dev.clients: at least one"}},
		{"the old executor address", common + "executor: {address: 127.0.0.1:7402}\n", []string{"executor: no longer used: executors join the fleet by their own heartbeat"}},
		{"heartbeat too often", strings.Replace(common, "heartbeat_interval: 5s", "heartbeat_interval: 100ms", 1), []string{"fleet.heartbeat_interval: 100ms: must be between 1s and 1m"}},
		{"lost too soon", strings.Replace(common, "lost_after: 30s", "lost_after: 10s", 1), []string{"fleet.lost_after: 10s: must be at least three heartbeat intervals (15s)"}},
		{"replica too long", common + "replica: " + strings.Repeat("r", 129) + "\n", []string{"replica: 129 bytes: at most 128"}},
		{"duplicate client", common + "tenants:\n  dev:\n    clients: [client/dev, client/dev]\n", []string{"tenants.dev.clients[1]:", "listed twice"}},
		{"missing repo url", tenant("    repositories: {demo: {credential: demo.token}}\n"), []string{"tenants.dev.repositories.demo.url: required"}},
		{"http url", tenant("    repositories: {demo: {url: 'http://git.example.com/x.git'}}\n"), []string{"tenants.dev.repositories.demo.url:", "only absolute paths"}},
		{"ssh url", tenant("    repositories: {demo: {url: 'ssh://git.example.com/x.git'}}\n"), []string{"tenants.dev.repositories.demo.url:"}},
		{"url with password", tenant("    repositories: {demo: {url: 'https://me:hunter2@git.example.com/x.git'}}\n"),
			[]string{"tenants.dev.repositories.demo.url: must not carry a user or password"}},
		{"missing credential file", tenant("    repositories: {demo: {url: /x, credential: nope.token}}\n"), []string{"tenants.dev.repositories.demo.credential:", "nope.token"}},
		{"ca for a local path", tenant("    repositories: {demo: {url: /x, ca: git-ca.crt}}\n"), []string{"tenants.dev.repositories.demo.ca: only an https:// URL"}},
		{"ca not a bundle", tenant("    repositories: {demo: {url: 'https://git.example.com/x.git', ca: demo.token}}\n"), []string{"tenants.dev.repositories.demo.ca:", "no certificates"}},
		{"missing ca file", tenant("    repositories: {demo: {url: 'https://git.example.com/x.git', ca: gone.crt}}\n"), []string{"tenants.dev.repositories.demo.ca:", "gone.crt"}},
		{"bad repo name", tenant("    repositories: {Demo: {url: /x}}\n"), []string{"tenants.dev.repositories.Demo: repository name"}},
		{"bad tenant name", common + "tenants:\n  Dev:\n    clients: [client/dev]\n", []string{"tenants.Dev: tenant name"}},
		{"unknown runtime class", tenant("    runtime_classes: [runc, kata]\n"), []string{`tenants.dev.runtime_classes[1]: "kata"`}},
		{"bad cidr", tenant("    egress: {cidrs: [10.0.0.0/33]}\n"), []string{`tenants.dev.egress.cidrs[0]: "10.0.0.0/33" is not a CIDR`}},
		{"cidr host bits", tenant("    egress: {cidrs: [10.1.2.3/8]}\n"), []string{"tenants.dev.egress.cidrs[0]:", "write 10.0.0.0/8"}},
		{"bad domain", tenant("    egress: {domains: [localhost]}\n"), []string{"tenants.dev.egress.domains[0]:", "not a fully qualified name"}},
		{"approver not an approver", tenant("    approvals: {approvers: [client/dev]}\n"), []string{`tenants.dev.approvals.approvers[0]: "client/dev": want an approver principal`}},
		{"duplicate approver", tenant("    approvals: {approvers: [approver/a, approver/a]}\n"), []string{"tenants.dev.approvals.approvers[1]:", "listed twice"}},
		{"required above approvers", tenant("    approvals: {approvers: [approver/a], required: 2}\n"), []string{"tenants.dev.approvals.required: 2: more than the 1 approvers"}},
		{"negative required", tenant("    approvals: {required: -1}\n"), []string{"tenants.dev.approvals.required: -1: must be at least 1"}},
		{"approval ttl too short", tenant("    approvals: {ttl: 1s}\n"), []string{"tenants.dev.approvals.ttl: 1s: must be between"}},
		{"start deadline too long", tenant("    start_deadline: 200h\n"), []string{"tenants.dev.start_deadline: 200h0m0s: must be between 1m and 168h"}},
		{"cache name", tenant("    caches: {Go_Build: {path: /root/.cache/go-build, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.Go_Build: cache name "Go_Build": want 1 to 63 of lower-case letters`}},
		{"cache path relative", tenant("    caches: {go: {path: root/go, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "root/go": must be a clean absolute path`}},
		{"cache path unclean", tenant("    caches: {go: {path: /root/../etc, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/root/../etc": must be a clean absolute path`}},
		{"cache path in work", tenant("    caches: {go: {path: /work/.cache, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/work/.cache": must lie below /home or /root or /tmp`}},
		{"cache path in out", tenant("    caches: {go: {path: /out/c, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/out/c": must lie below /home or /root or /tmp`}},
		{"cache path in proc", tenant("    caches: {go: {path: /proc/self, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/proc/self": must lie below`}},
		{"cache path is etc", tenant("    caches: {go: {path: /etc, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/etc": must lie below`}},
		{"cache path in usr", tenant("    caches: {go: {path: /usr/lib/go, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/usr/lib/go": must lie below`}},
		{"cache path is home", tenant("    caches: {go: {path: /root, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/root": must lie below`}},
		{"cache path with comma", tenant("    caches: {go: {path: '/root/a,b', max_size: 1GiB}}\n"), []string{`tenants.dev.caches.go.path: "/root/a,b": must not contain ','`}},
		{"cache paths overlap", tenant("    caches: {a: {path: /root/.cache, max_size: 1GiB}, b: {path: /root/.cache/go, max_size: 1GiB}}\n"), []string{`tenants.dev.caches.b.path: "/root/.cache/go" overlaps cache a's path "/root/.cache"`}},
		{"cache size missing", tenant("    caches: {go: {path: /root/go}}\n"), []string{"tenants.dev.caches.go.max_size: required"}},
		{"cache size too small", tenant("    caches: {go: {path: /root/go, max_size: 1KiB}}\n"), []string{"tenants.dev.caches.go.max_size: 1024: must be between 4096 (4KiB) and"}},
		{"cache size too large", tenant("    caches: {go: {path: /root/go, max_size: 2TiB}}\n"), []string{"tenants.dev.caches.go.max_size: 2199023255552: must be between"}},
		{"cache unknown field", tenant("    caches: {go: {path: /root/go, max_size: 1GiB, shared: true}}\n"), []string{"shared"}},
		{"user unknown", tenant("    user: nobody\n"), []string{`tenants.dev.user: "nobody": want root, agent, UID or UID:GID`}},
		{"user outside the mapping", tenant("    user: 65534\n"), []string{"tenants.dev.user: uid 65534: must be 0 to 65533"}},
		{"group outside the mapping", tenant("    user: '1000:70000'\n"), []string{"tenants.dev.user: gid 70000: must be 0 to 65533"}},
		{"allow_root for root", tenant("    allow_root: true\n"), []string{"tenants.dev.allow_root: the tenant's jobs run as root already"}},
		{"git history too deep", tenant("    git_history_depth: 1001\n"), []string{"tenants.dev.git_history_depth: 1001: must be between 1 and 1000"}},
		{"negative git history", tenant("    git_history_depth: -1\n"), []string{"tenants.dev.git_history_depth: -1: must be between 1 and 1000"}},
		{"git history not a number", tenant("    git_history_depth: deep\n"), []string{"tenants.dev.git_history_depth"}},
		{"approval widening unknown", tenant("    approvals: {widening: maybe}\n"), []string{`tenants.dev.approvals.widening: "maybe": want approve, allow or deny`}},
		{"deploy credential for unknown repo", tenant("    deploy_credentials: {nope: demo.token}\n"), []string{`tenants.dev.deploy_credentials.nope: "nope" is not a repository`}},
		{"missing deploy credential file", tenant("    repositories: {demo: {url: /x}}\n    deploy_credentials: {demo: gone.token}\n"), []string{"tenants.dev.deploy_credentials.demo:", "gone.token"}},
		{"negative quota", tenant("    quota: {running_jobs: -1}\n"), []string{"tenants.dev.quota.running_jobs: -1: must not be negative"}},
		{"quota below a default job", tenant("    quota: {memory: 1MiB}\n"), []string{"tenants.dev.quota.memory: 1048576: less than one job at the tenant's default limits needs"}},
		{"quota memory not a size", tenant("    quota: {memory: lots}\n"), []string{"tenants.dev.quota.memory:"}},
		{"bad grant ttl", common + "grant_ttl: 1s\n", []string{"grant_ttl: 1s: must be between"}},
		{"auditor not an approver", common + "audit: {auditors: [client/dev]}\n", []string{`audit.auditors[0]: "client/dev": want an approver principal`}},
		{"duplicate auditor", common + "audit: {auditors: [approver/a, approver/a]}\n", []string{"audit.auditors[1]:", "listed twice"}},
		{"checkpoint key is the grant key", common + "grant_key: k.key\naudit: {checkpoint_key: k.key}\n", []string{"audit.checkpoint_key:", "is the grant key"}},
		{"checkpoint every zero entries", common + "audit: {checkpoint_every: -1}\n", []string{"audit.checkpoint_every: -1: must be between 1 and 100000"}},
		{"checkpoint interval too short", common + "audit: {checkpoint_interval: 10ms}\n", []string{"audit.checkpoint_interval: 10ms: must be between 1s and 24h"}},
		{"several at once", tenant("    limits: {max: {memory: lots}}\n    runtime_classes: [kata]\n"),
			[]string{"tenants.dev.limits.max.memory:", "tenants.dev.runtime_classes[0]:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, tc.body), nil)
			if err == nil {
				t.Fatal("accepted a bad config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the password in a URL: %v", err)
			}
		})
	}
}

// A tenant's caches load with their paths and sizes.
func TestCachesSection(t *testing.T) {
	c, err := config.Load(write(t, common+"tenants:\n  dev:\n    clients: [client/dev]\n"+
		"    caches:\n      go-build: {path: /root/.cache/go-build, max_size: 2GiB}\n      npm: {path: /tmp/npm, max_size: 4KiB}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := c.Policy["dev"].Caches
	if len(got) != 2 || got["go-build"].Path != "/root/.cache/go-build" || got["go-build"].MaxSize != 2<<30 || got["npm"].MaxSize != 4096 {
		t.Errorf("caches %+v", got)
	}
}

// TestGitHistoryDepth: a tenant's .git history is the base commit alone
// unless its policy says more; both ends of the range load.
func TestGitHistoryDepth(t *testing.T) {
	for _, tc := range []struct {
		line string
		want int
	}{{"", 1}, {"    git_history_depth: 1\n", 1}, {"    git_history_depth: 3\n", 3}, {"    git_history_depth: 1000\n", 1000}} {
		c, err := config.Load(write(t, common+"tenants:\n  dev:\n    clients: [client/dev]\n"+tc.line), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if got := c.Policy["dev"].GitHistoryDepth; got != tc.want {
			t.Errorf("%q: depth %d, want %d", tc.line, got, tc.want)
		}
	}
}

// TestTenantUser: a tenant without user runs its jobs as root, as every
// tenant did before the field (a policy written for root, caches below
// /root, keeps working); user names the default, allow_root lets a job of
// a non-root tenant ask for root.
func TestTenantUser(t *testing.T) {
	for _, tc := range []struct {
		lines     string
		want      runspec.User
		allowRoot bool
	}{
		{"", runspec.Root, false},
		{"    user: agent\n", runspec.Agent, false},
		{"    user: agent\n    allow_root: true\n", runspec.Agent, true},
		{"    user: root\n", runspec.Root, false},
		{"    user: '2000:3000'\n", runspec.User{UID: 2000, GID: 3000}, false},
		{"    user: 1500\n", runspec.User{UID: 1500, GID: 1500}, false},
	} {
		c, err := config.Load(write(t, common+"tenants:\n  dev:\n    clients: [client/dev]\n"+tc.lines), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.lines, err)
		}
		if got := c.Policy["dev"]; got.User != tc.want || got.AllowRoot != tc.allowRoot {
			t.Errorf("%q: user %v allow_root %v; want %v %v", tc.lines, got.User, got.AllowRoot, tc.want, tc.allowRoot)
		}
	}
}

func TestPublishDefaults(t *testing.T) {
	c, err := config.Load(write(t, good), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for _, name := range []string{"dev", "bare"} {
		p := c.Policy[name].Publish
		if p.OnMoved != policy.OnMovedReapply || p.Content.Protected != nil || p.Content.AllowProtected != nil ||
			p.Content.MaxFileBytes != 0 || p.Content.AllowBinary {
			t.Errorf("tenant %s: publish defaults = %+v, want on_moved reapply and nothing else", name, p)
		}
		// Omitting on_moved and writing its default are the same policy.
		if got, want := p.Digest(), (policy.Publish{OnMoved: policy.OnMovedReapply}).Digest(); got != want {
			t.Errorf("tenant %s: default policy digest %s, want %s", name, got, want)
		}
	}
}

func TestPublishSection(t *testing.T) {
	c, err := config.Load(write(t, common+`tenants:
  dev:
    clients: [client/dev]
    publish:
      protected: ["deploy/**", "*.pem"]
      allow_protected: [CODEOWNERS]
      max_file_size: 1Gi
      allow_binary: true
      on_moved: refuse
`), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	p := c.Policy["dev"].Publish
	if !slices.Equal(p.Content.Protected, []string{"deploy/**", "*.pem"}) || !slices.Equal(p.Content.AllowProtected, []string{"CODEOWNERS"}) ||
		p.Content.MaxFileBytes != 1<<30 || !p.Content.AllowBinary || p.OnMoved != policy.OnMovedRefuse {
		t.Errorf("publish = %+v", p)
	}
	if p.Digest() == (policy.Publish{OnMoved: policy.OnMovedReapply}).Digest() {
		t.Error("a written policy has the default policy's digest")
	}
}

func TestPublishErrorsNameTheField(t *testing.T) {
	tenant := func(body string) string {
		return common + "tenants:\n  dev:\n    clients: [client/dev]\n    publish:\n" + body
	}
	for _, tc := range []struct {
		name string
		body string
		want []string
	}{
		{"bad on_moved", tenant("      on_moved: rebase\n"), []string{`tenants.dev.publish.on_moved: "rebase": want reapply or refuse`}},
		{"on_moved in capitals", tenant("      on_moved: Refuse\n"), []string{"tenants.dev.publish.on_moved:"}},
		{"bad glob in protected", tenant("      protected: [docs/**, \"a/[b\"]\n"), []string{"tenants.dev.publish.protected[1]:", `"a/[b"`}},
		{"absolute glob in protected", tenant("      protected: [/etc/passwd]\n"), []string{"tenants.dev.publish.protected[0]:", "leading /"}},
		{"dot-dot glob in allow_protected", tenant("      allow_protected: [\"../x\"]\n"), []string{"tenants.dev.publish.allow_protected[0]:"}},
		{"empty glob in allow_protected", tenant("      allow_protected: [\"\"]\n"), []string{"tenants.dev.publish.allow_protected[0]:", "empty glob"}},
		{"size not a size", tenant("      max_file_size: lots\n"), []string{`tenants.dev.publish.max_file_size: "lots" is not a size`}},
		{"negative size", tenant("      max_file_size: -1MiB\n"), []string{"tenants.dev.publish.max_file_size:", "is not a size"}},
		{"size as a list", tenant("      max_file_size: [1]\n"), []string{"tenants.dev.publish.max_file_size:", "not a list"}},
		{"size beyond the ceiling", tenant("      max_file_size: 2Ti\n"), []string{"tenants.dev.publish.max_file_size: must be between"}},
		{"unknown field", tenant("      on_move: refuse\n"), []string{"tenants.dev.publish.on_move", "unknown field"}},
		{"binary not a bool", tenant("      allow_binary: sometimes\n"), []string{"tenants.dev.publish.allow_binary"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, tc.body), nil)
			if err == nil {
				t.Fatal("accepted a bad publish section")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			// The content checker's own names must not leak into the file's.
			for _, leak := range []string{"policy.", "max_file_bytes", "invalid argument"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("error %q says %q, a name the file does not use", err, leak)
				}
			}
		})
	}
}

// A glob is quoted as written, even when it holds the words the error's
// field names are rewritten from.
func TestPublishErrorQuotesTheGlob(t *testing.T) {
	body := common + "tenants:\n  dev:\n    clients: [client/dev]\n    publish:\n      protected: [\"docs/policy.[md\"]\n"
	_, err := config.Load(write(t, body), nil)
	var fe *pkgconfig.FieldError
	if !errors.As(err, &fe) || fe.Field != "tenants.dev.publish.protected[0]" || !strings.Contains(fe.Reason, `"docs/policy.[md"`) {
		t.Fatalf("error %v (%T): want a field error on tenants.dev.publish.protected[0] quoting the glob", err, err)
	}
}
