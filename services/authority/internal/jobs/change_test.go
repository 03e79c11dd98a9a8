package jobs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

func allowOf(rules ...AllowRule) Network { return Network{Mode: NetworkAllow, Rules: rules} }

// TestWidensNetwork: a change widens the network exactly when the new
// policy permits a destination or port the old one did not.
func TestWidensNetwork(t *testing.T) {
	deny := Network{Mode: NetworkDenyAll}
	for _, tc := range []struct {
		name     string
		from, to Network
		widens   bool
	}{
		{"deny to deny", deny, deny, false},
		{"allow to deny", allowOf(AllowRule{CIDR: "10.0.0.0/8"}), deny, false},
		{"deny to allow", deny, allowOf(AllowRule{CIDR: "10.1.0.0/16", Ports: []uint32{443}}), true},
		{"sub-prefix, same port", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.1.2.0/24", Ports: []uint32{443}}), false},
		{"sub-prefix under all ports", allowOf(AllowRule{CIDR: "10.0.0.0/8"}), allowOf(AllowRule{CIDR: "10.1.2.3/32", Ports: []uint32{22, 443}}), false},
		{"fewer ports", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80, 443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), false},
		{"another port", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{22}}), true},
		{"all ports where some were", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}), allowOf(AllowRule{CIDR: "10.0.0.0/8"}), true},
		{"wider prefix", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.0.0.0/8"}), true},
		{"sibling prefix", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.2.0.0/16"}), true},
		{"v6 not covered by v4 all", allowOf(AllowRule{CIDR: "0.0.0.0/0"}), allowOf(AllowRule{CIDR: "2001:db8::/32"}), true},
		{"v6 sub-prefix", allowOf(AllowRule{CIDR: "2001:db8::/32"}), allowOf(AllowRule{CIDR: "2001:db8:1::/48"}), false},
		{"ports split over two rules", allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80}}, AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{443}}),
			allowOf(AllowRule{CIDR: "10.0.0.0/8", Ports: []uint32{80, 443}}), true},
		{"host bits in the new rule", allowOf(AllowRule{CIDR: "10.1.0.0/16"}), allowOf(AllowRule{CIDR: "10.1.2.3/16"}), false},
		{"domains always widen", deny, Network{Mode: NetworkDomains, Domains: []string{"example.com"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := len(uncovered(tc.from, tc.to)) > 0
			if got != tc.widens {
				t.Fatalf("widens = %v, want %v (uncovered %v)", got, tc.widens, uncovered(tc.from, tc.to))
			}
		})
	}
}

// TestPlanChange: limits merge over the grant in force, the tenant's
// ceilings hold, disk cannot change, and each raised limit is named.
func TestPlanChange(t *testing.T) {
	tenant := &policy.Tenant{Name: "dev", Max: policy.DefaultMax,
		Egress: policy.Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Domains: []string{"example.com"}}}
	cur := GrantRequest{Generation: 3, Limits: policy.DefaultLimits, Network: Network{Mode: NetworkDenyAll}, RuntimeClass: "runc"}
	ch, err := planChange(tenant, cur, ChangeRequest{Limits: &policy.Limits{MemoryBytes: 1 << 30, Pids: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if ch.BaseGeneration != 3 || ch.ToLimits.MemoryBytes != 1<<30 || ch.ToLimits.Pids != 10 || ch.ToLimits.CPUMillis != cur.Limits.CPUMillis ||
		ch.ToLimits.Deadline != cur.Limits.Deadline {
		t.Fatalf("change = %+v", ch)
	}
	if len(ch.Widens) != 1 || !strings.HasPrefix(ch.Widens[0], "memory_bytes: ") {
		t.Fatalf("widens = %v, want memory only", ch.Widens)
	}
	if d := describe(ch); !strings.Contains(d, "memory_bytes") || !strings.Contains(d, "pids 256 -> 10") {
		t.Fatalf("describe = %q", d)
	}
	for _, tc := range []struct {
		name string
		req  ChangeRequest
		want string
	}{
		{"above the ceiling", ChangeRequest{Limits: &policy.Limits{Deadline: 2 * time.Hour}}, "limits.deadline"},
		{"disk", ChangeRequest{Limits: &policy.Limits{DiskBytes: 1}}, "limits.disk_bytes"},
		{"negative", ChangeRequest{Limits: &policy.Limits{Pids: -1}}, "limits.pids"},
		{"outside egress", ChangeRequest{Network: &Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "192.0.2.0/24"}}}}, "policy.allow.rules[0].cidr: 192.0.2.0/24 is outside"},
		{"domains for a job that started deny_all", ChangeRequest{Network: &Network{Mode: NetworkDomains, Domains: []string{"example.com"}}}, "did not start with a domains policy"},
		{"no change", ChangeRequest{Limits: &policy.Limits{Pids: policy.DefaultLimits.Pids}}, "already runs under exactly"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := planChange(tenant, cur, tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	runsc := cur
	runsc.RuntimeClass = policy.RuntimeRunsc
	if _, err := planChange(tenant, runsc, ChangeRequest{Network: &Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "10.0.0.0/8"}}}}); err == nil || !strings.Contains(err.Error(), "runsc job started deny_all") {
		t.Fatalf("widening a deny-all runsc job's network: %v", err)
	}
	if _, err := planChange(tenant, runsc, ChangeRequest{Limits: &policy.Limits{Pids: 512}}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "limits.pids: cannot change on a running runsc job") {
		t.Fatalf("changing a runsc job's pids: %v", err)
	}
	if _, err := planChange(tenant, runsc, ChangeRequest{Limits: &policy.Limits{MemoryBytes: 1 << 30}}); err != nil {
		t.Fatalf("a runsc job's memory still changes: %v", err)
	}
	// A VM's RAM and pids limit are its guest's, set at boot; its CPU
	// is the host cgroup's and changes. Its interfaces are read at boot.
	vm := cur
	vm.RuntimeClass = policy.RuntimeVM
	for _, tc := range []struct {
		req  ChangeRequest
		want string
	}{
		{ChangeRequest{Limits: &policy.Limits{MemoryBytes: 1 << 30}}, "limits.memory_bytes: cannot change on a running vm job: it is the guest's RAM"},
		{ChangeRequest{Limits: &policy.Limits{Pids: 512}}, "limits.pids: cannot change on a running vm job"},
		{ChangeRequest{Network: &Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "10.0.0.0/8"}}}}, "vm job started deny_all"},
	} {
		if _, err := planChange(tenant, vm, tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("vm change %+v: %v, want %q", tc.req, err, tc.want)
		}
	}
	if _, err := planChange(tenant, vm, ChangeRequest{Limits: &policy.Limits{CPUMillis: 500}}); err != nil {
		t.Fatalf("a vm job's cpu still changes: %v", err)
	}
	// Digest binds the exact change.
	_, d1, _ := ch.Encode()
	ch.ToLimits.Pids++
	if _, d2, _ := ch.Encode(); d1 == d2 {
		t.Fatal("two different changes have one digest")
	}
}

// TestSessionBounds: a session's idle timeout and concurrent execs take
// the tenant's defaults and may not pass its ceilings, at submission or by
// a change; the refusal names the field and the ceiling.
func TestSessionBounds(t *testing.T) {
	bounds := policy.Sessions{DefaultIdleTimeout: 5 * time.Minute, MaxIdleTimeout: time.Hour, DefaultConcurrentExecs: 2, MaxConcurrentExecs: 3}
	got, err := effectiveSession("spec.session", Session{}, Session{}, bounds)
	if err != nil || got != (Session{IdleTimeout: 5 * time.Minute, MaxConcurrentExecs: 2, OnIdle: policy.OnIdleEnd}) {
		t.Fatalf("defaults: %+v, %v", got, err)
	}
	if got, err := effectiveSession("spec.session", Session{}, Session{}, policy.Sessions{}); err != nil ||
		got != (Session{IdleTimeout: policy.DefaultSessions.DefaultIdleTimeout, MaxConcurrentExecs: policy.DefaultSessions.DefaultConcurrentExecs, OnIdle: policy.OnIdleEnd}) {
		t.Fatalf("a policy that says nothing takes the built-in defaults: %+v, %v", got, err)
	}
	if got, err := effectiveSession("session", Session{MaxConcurrentExecs: 1}, Session{IdleTimeout: 2 * time.Hour, MaxConcurrentExecs: 3, OnIdle: policy.OnIdleSleep}, bounds); err != nil ||
		got != (Session{IdleTimeout: 2 * time.Hour, MaxConcurrentExecs: 1, OnIdle: policy.OnIdleSleep}) {
		t.Fatalf("a change keeps what it does not name (even past a ceiling lowered since): %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		req  Session
		want string
	}{
		{"idle above the ceiling", Session{IdleTimeout: 2 * time.Hour}, "spec.session.idle_timeout: 2h0m0s is above the tenant's ceiling of 1h0m0s"},
		{"execs above the ceiling", Session{MaxConcurrentExecs: 4}, "spec.session.max_concurrent_execs: 4 is above the tenant's ceiling of 3"},
		{"idle too short", Session{IdleTimeout: time.Millisecond}, "spec.session.idle_timeout: 1ms: at least 1s"},
		{"negative idle", Session{IdleTimeout: -time.Second}, "spec.session.idle_timeout: -1s: must not be negative"},
		{"negative execs", Session{MaxConcurrentExecs: -1}, "spec.session.max_concurrent_execs: -1: must not be negative"},
		{"unknown on_idle", Session{OnIdle: "nap"}, `spec.session.on_idle: "nap": want end or sleep`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := effectiveSession("spec.session", tc.req, Session{}, bounds)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPlanSessionChange: raising a session's idle timeout or concurrent
// execs widens, as raising memory does; lowering them narrows; a job has
// no session to change.
func TestPlanSessionChange(t *testing.T) {
	tenant := &policy.Tenant{Name: "dev", Max: policy.DefaultMax,
		Sessions: policy.Sessions{DefaultIdleTimeout: 5 * time.Minute, MaxIdleTimeout: time.Hour, DefaultConcurrentExecs: 2, MaxConcurrentExecs: 8}}
	sess := Session{IdleTimeout: 5 * time.Minute, MaxConcurrentExecs: 2, OnIdle: policy.OnIdleEnd}
	cur := GrantRequest{JobID: "s1", Generation: 1, Limits: policy.DefaultLimits, Network: Network{Mode: NetworkDenyAll}, RuntimeClass: "runc", Session: &sess}

	ch, err := planChange(tenant, cur, ChangeRequest{Session: &Session{IdleTimeout: 30 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if *ch.ToSession != (Session{IdleTimeout: 30 * time.Minute, MaxConcurrentExecs: 2, OnIdle: policy.OnIdleEnd}) || *ch.FromSession != sess || ch.ToLimits != ch.FromLimits {
		t.Fatalf("change = %+v", ch)
	}
	if len(ch.Widens) != 1 || ch.Widens[0] != "session.idle_timeout: 5m0s -> 30m0s" {
		t.Fatalf("widens = %q", ch.Widens)
	}
	ch, err = planChange(tenant, cur, ChangeRequest{Session: &Session{MaxConcurrentExecs: 1}})
	if err != nil || len(ch.Widens) != 0 || ch.ToSession.MaxConcurrentExecs != 1 || !strings.Contains(describe(ch), "session.max_concurrent_execs 2 -> 1") {
		t.Fatalf("lowering execs: %+v (%q), %v", ch, describe(ch), err)
	}
	ch, err = planChange(tenant, cur, ChangeRequest{Session: &Session{MaxConcurrentExecs: 4}, Limits: &policy.Limits{Pids: 10}})
	if err != nil || len(ch.Widens) != 1 || ch.Widens[0] != "session.max_concurrent_execs: 2 -> 4" {
		t.Fatalf("raising execs, lowering pids: %+v, %v", ch, err)
	}
	if _, err := planChange(tenant, cur, ChangeRequest{Session: &Session{MaxConcurrentExecs: 9}}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "session.max_concurrent_execs: 9 is above the tenant's ceiling of 8") {
		t.Fatalf("past the ceiling: %v", err)
	}
	if _, err := planChange(tenant, cur, ChangeRequest{Session: &Session{MaxConcurrentExecs: 2}}); err == nil || !strings.Contains(err.Error(), "already runs under exactly") {
		t.Fatalf("no change: %v", err)
	}
	job := cur
	job.Session = nil
	if _, err := planChange(tenant, job, ChangeRequest{Session: &Session{MaxConcurrentExecs: 1}}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not a session") {
		t.Fatalf("a job's session: %v", err)
	}
	// The change's digest binds its session settings too.
	_, d1, _ := ch.Encode()
	ch.ToSession.IdleTimeout++
	if _, d2, _ := ch.Encode(); d1 == d2 {
		t.Fatal("two different session changes have one digest")
	}
}

// TestSessionOnIdle: a session that does not say what it does once idle
// takes the tenant's default; one that asks to sleep where the tenant
// forbids it is refused naming spec.session.on_idle.
func TestSessionOnIdle(t *testing.T) {
	sleepy := policy.Sessions{DefaultOnIdle: policy.OnIdleSleep}
	if got, err := effectiveSession("spec.session", Session{}, Session{}, sleepy); err != nil || got.OnIdle != policy.OnIdleSleep {
		t.Fatalf("the tenant's default sleep: %+v, %v", got, err)
	}
	if got, err := effectiveSession("spec.session", Session{OnIdle: policy.OnIdleEnd}, Session{}, sleepy); err != nil || got.OnIdle != policy.OnIdleEnd {
		t.Fatalf("end asked where sleep is the default: %+v, %v", got, err)
	}
	forbid := policy.Sessions{ForbidSleep: true}
	_, err := effectiveSession("spec.session", Session{OnIdle: policy.OnIdleSleep}, Session{}, forbid)
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "spec.session.on_idle: sleep: the tenant's policy does not allow sessions to sleep") {
		t.Fatalf("sleep where the tenant forbids it: %v", err)
	}
	if got, err := effectiveSession("spec.session", Session{}, Session{}, forbid); err != nil || got.OnIdle != policy.OnIdleEnd {
		t.Fatalf("the default where sleep is forbidden: %+v, %v", got, err)
	}
	// A change that leaves on_idle as a sleeping session had it, after
	// the tenant forbade sleep, does not keep sleep: it is refused, and
	// one that says end goes through.
	sleeping := Session{IdleTimeout: 5 * time.Minute, MaxConcurrentExecs: 2, OnIdle: policy.OnIdleSleep}
	_, err = effectiveSession("session", Session{IdleTimeout: 30 * time.Minute}, sleeping, forbid)
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "session.on_idle: sleep, as the session does: the tenant's policy no longer allows") {
		t.Fatalf("a change keeping sleep the tenant now forbids: %v", err)
	}
	if got, err := effectiveSession("session", Session{IdleTimeout: 30 * time.Minute, OnIdle: policy.OnIdleEnd}, sleeping, forbid); err != nil || got.OnIdle != policy.OnIdleEnd {
		t.Fatalf("the change saying end: %+v, %v", got, err)
	}
}
