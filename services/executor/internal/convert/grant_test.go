package convert

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// self is the executor under test; testGrant is for it.
var self = identity.MustParse("spiffe://test.example/service/executor/exec-b")

func testGrant() *typesv1.Grant {
	issued, expires := grant.Timestamps(time.Now(), time.Hour)
	return &typesv1.Grant{
		Executor: self.String(),
		JobId:    "job-1", Tenant: "acme", Requester: "spiffe://test.example/client/alice", Repository: "widgets",
		Commit: strings.Repeat("a", 40), Env: map[string]string{"GREETING": "hi", "LANG": "C"},
		Limits: &typesv1.ResourceLimits{CpuMillis: 1000, MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 32 << 20, Deadline: durationpb.New(time.Minute)},
		NetworkPolicy: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{
			Rules: []*typesv1.AllowRule{{Cidr: "192.0.2.0/24", Ports: []uint32{443}}}}}},
		NetworkPolicyGeneration: 2, Generation: 3,
		RuntimeClass:  typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC,
		PublishTarget: &typesv1.PublishTarget{Repository: "widgets", Branch: "main"},
		Session:       &typesv1.SessionSpec{IdleTimeout: durationpb.New(time.Minute), MaxConcurrentExecs: 4, OnIdle: typesv1.IdleAction_IDLE_ACTION_SLEEP},
		Caches:        []*typesv1.CacheGrant{{Name: "go-build", Path: "/home/agent/.cache/go-build", MaxSizeBytes: 1 << 30}},
		User:          &typesv1.JobUser{Uid: 1000, Gid: 1000},
		Credentials:   []string{"gh-token", "npm.basic"},
		IssuedAt:      issued, ExpiresAt: expires,
	}
}

// A verified grant carries to the run manager everything runs uses, the
// whole signed grant and its digest; the same record read back (a run
// record from before records kept the Grant) is the same Grant.
func TestGrant(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	sg, err := grant.NewSigner(key).Sign(testGrant())
	if err != nil {
		t.Fatal(err)
	}
	g, err := Grant(grant.NewVerifier(pub), self, sg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := runs.Grant{
		JobID: "job-1", Tenant: "acme", Requester: "spiffe://test.example/client/alice", Repository: "widgets",
		Commit: strings.Repeat("a", 40), Env: map[string]string{"GREETING": "hi", "LANG": "C"},
		Class:  sandbox.ClassRunsc,
		Limits: sandbox.Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 32 << 20, Deadline: time.Minute},
		Network: runs.NetworkPolicy{Net: netpolicy.Policy{Allow: []netpolicy.Rule{
			{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Ports: []uint16{443}}}}},
		NetworkGeneration: 2, Generation: 3,
		Session:     &runs.SessionSpec{IdleTimeout: time.Minute, MaxConcurrentExecs: 4, SleepOnIdle: true},
		Caches:      []runs.CacheGrant{{Name: "go-build", Path: "/home/agent/.cache/go-build", MaxSize: 1 << 30}},
		User:        runspec.Agent,
		Credentials: []string{"gh-token", "npm.basic"},
		Digest:      grant.Digest(sg),
	}
	got := g
	got.Fixed, got.Signed = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Grant:\n got %+v\nwant %+v", got, want)
	}
	back := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(g.Signed, back); err != nil || !proto.Equal(back, sg) {
		t.Fatalf("Signed is not the signed grant: %v", err)
	}
	decoded, err := DecodeGrant(g.Signed)
	if err != nil || !reflect.DeepEqual(decoded, g) {
		t.Fatalf("DecodeGrant = %+v, %v; want %+v", decoded, err, g)
	}
	if _, err := DecodeGrant([]byte("not a grant")); err == nil {
		t.Error("DecodeGrant of garbage: no error")
	}
}

// A grant of class vm with docker becomes a run of sandbox.ClassVM with
// Docker set, a session's as a job's; unspecified (a grant from before
// classes) is runc; and a vm result names the vm class.
func TestGrantVM(t *testing.T) {
	for _, tc := range []struct {
		class  typesv1.RuntimeClass
		with   []string
		want   sandbox.Class
		docker bool
	}{
		{typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker"}, sandbox.ClassVM, true},
		{typesv1.RuntimeClass_RUNTIME_CLASS_VM, nil, sandbox.ClassVM, false},
		{typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED, nil, sandbox.ClassRunc, false},
	} {
		for _, session := range []bool{false, true} {
			g := testGrant()
			g.RuntimeClass, g.With = tc.class, tc.with
			g.Limits.MemoryBytes = 1 << 30
			if !session {
				g.Session, g.Command = nil, []string{"docker", "build", "."}
			}
			pub, key, _ := ed25519.GenerateKey(rand.Reader)
			sg, err := grant.NewSigner(key).Sign(g)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Grant(grant.NewVerifier(pub), self, sg, time.Now())
			if err != nil {
				t.Fatalf("%v %q (session %v): %v", tc.class, tc.with, session, err)
			}
			if got.Class != tc.want || got.Docker != tc.docker || (got.Session != nil) != session {
				t.Errorf("%v %q (session %v): class %q docker %v session %v", tc.class, tc.with, session, got.Class, got.Docker, got.Session)
			}
		}
	}
	if rc := RunResult(&runs.Result{Class: sandbox.ClassVM, RuntimeVersion: "airlock-vm dev; accel tcg (emulated)"}); rc.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM ||
		rc.GetRuntimeVersion() != "airlock-vm dev; accel tcg (emulated)" {
		t.Errorf("a vm run's result: %v", rc)
	}
}

// Grants the executor must not take are refused with the right code and a
// message naming what is wrong.
func TestGrantRefusals(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	v, signer := grant.NewVerifier(pub), grant.NewSigner(key)
	sign := func(f func(g *typesv1.Grant)) *typesv1.SignedGrant {
		g := testGrant()
		f(g)
		sg, err := signer.Sign(g)
		if err != nil {
			t.Fatal(err)
		}
		return sg
	}
	tampered := sign(func(*typesv1.Grant) {})
	tampered.Body[len(tampered.Body)-1] ^= 1
	unknownKey, err := grant.NewSigner(otherKey).Sign(testGrant())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sg   *typesv1.SignedGrant
		want error
		text string
	}{
		{"bad signature", tampered, errdefs.ErrPermissionDenied, "bad signature"},
		{"unknown key", unknownKey, errdefs.ErrPermissionDenied, "unknown key"},
		{"no signature", &typesv1.SignedGrant{Body: tampered.Body}, errdefs.ErrPermissionDenied, "body and signature are required"},
		{"expired", sign(func(g *typesv1.Grant) {
			g.IssuedAt, g.ExpiresAt = grant.Timestamps(time.Now().Add(-2*time.Hour), time.Hour)
		}), errdefs.ErrFailedPrecondition, "expired"},
		// Signed and unexpired, but for another executor of the fleet, or
		// for none: what a replayed or misrouted grant looks like.
		{"another executor's", sign(func(g *typesv1.Grant) { g.Executor = "spiffe://test.example/service/executor/exec-a" }), errdefs.ErrPermissionDenied,
			"grant is for executor spiffe://test.example/service/executor/exec-a; this is spiffe://test.example/service/executor/exec-b"},
		{"no executor", sign(func(g *typesv1.Grant) { g.Executor = "" }), errdefs.ErrPermissionDenied, "the grant names no executor"},
		{"job id", sign(func(g *typesv1.Grant) { g.JobId = "../etc" }), errdefs.ErrInvalidArgument, `grant job_id "../etc": want 1-64 of [A-Za-z0-9_-]`},
		{"network policy", sign(func(g *typesv1.Grant) {
			g.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{
				Rules: []*typesv1.AllowRule{{Cidr: "192.0.2.1/24"}}}}}
		}), errdefs.ErrInvalidArgument, "network_policy.allow.rules[0].cidr"},
		// A grant is signed, but the executor checks a cache's shape
		// itself: it is what decides where a host directory is mounted.
		{"cache path outside", sign(func(g *typesv1.Grant) { g.Caches[0].Path = "/etc" }), errdefs.ErrInvalidArgument, `grant caches[0].path "/etc": must lie below /home or /root or /tmp`},
		{"cache path climbs", sign(func(g *typesv1.Grant) { g.Caches[0].Path = "/root/../proc" }), errdefs.ErrInvalidArgument, `grant caches[0].path "/root/../proc": must be a clean absolute path`},
		{"cache name", sign(func(g *typesv1.Grant) { g.Caches[0].Name = "../x" }), errdefs.ErrInvalidArgument, `grant caches[0].name "../x"`},
		{"cache size", sign(func(g *typesv1.Grant) { g.Caches[0].MaxSizeBytes = 0 }), errdefs.ErrInvalidArgument, "grant caches[0].max_size_bytes 0: must be between"},
		{"cache twice", sign(func(g *typesv1.Grant) {
			g.Caches = append(g.Caches, &typesv1.CacheGrant{Name: "other", Path: "/home/agent/.cache", MaxSizeBytes: 4096})
		}), errdefs.ErrInvalidArgument, "grant caches[1]: same name as, or a path overlapping, grant caches[0]"},
		// Who the job runs as decides host ids: a signed grant still
		// names only ids every sandbox maps.
		{"uid outside the mapping", sign(func(g *typesv1.Grant) { g.User.Uid = 65534 }), errdefs.ErrInvalidArgument, "grant user uid 65534: must be 0 to 65533"},
		{"gid outside the mapping", sign(func(g *typesv1.Grant) { g.User.Gid = 1 << 20 }), errdefs.ErrInvalidArgument, "grant user gid 1048576: must be 0 to 65533"},
		{"cache in root's home for agent", sign(func(g *typesv1.Grant) { g.Caches[0].Path = "/root/.cache/go-build" }), errdefs.ErrInvalidArgument,
			`grant caches[0].path "/root/.cache/go-build": lies outside the home of the job's user agent`},
		// A class this build does not know is not run as another.
		{"unknown runtime class", sign(func(g *typesv1.Grant) { g.RuntimeClass = 99 }), errdefs.ErrInvalidArgument, "grant runtime_class 99: not a class this executor knows"},
		// What runs beside the job is checked as the authority checked it.
		{"docker under runsc", sign(func(g *typesv1.Grant) { g.With = []string{"docker"} }), errdefs.ErrInvalidArgument,
			"grant with: docker runs only in the vm runtime class"},
		{"docker in a small vm", sign(func(g *typesv1.Grant) {
			g.RuntimeClass, g.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"docker"}
		}), errdefs.ErrInvalidArgument, "grant limits.memory_bytes: 268435456: must be at least 1073741824 with docker"},
		// A credential's name becomes part of a variable and a placeholder.
		{"credential name", sign(func(g *typesv1.Grant) { g.Credentials = []string{"gh:token"} }), errdefs.ErrInvalidArgument, `grant credentials[0] "gh:token"`},
		{"credential twice", sign(func(g *typesv1.Grant) { g.Credentials = []string{"gh", "gh"} }), errdefs.ErrInvalidArgument, `grant credentials[1] "gh": named twice`},
		{"too many credentials", sign(func(g *typesv1.Grant) {
			g.Credentials = nil
			for i := range 17 {
				g.Credentials = append(g.Credentials, fmt.Sprint("c", i))
			}
		}), errdefs.ErrInvalidArgument, "grant credentials: 17 named, at most 16"},
		// What an idle session does: an action this build does not know
		// is not taken as another.
		{"unknown on_idle", sign(func(g *typesv1.Grant) { g.Session.OnIdle = 9 }), errdefs.ErrInvalidArgument, "grant session.on_idle 9: not an action this build knows"},
		{"unknown with", sign(func(g *typesv1.Grant) {
			g.RuntimeClass, g.With = typesv1.RuntimeClass_RUNTIME_CLASS_VM, []string{"k8s"}
		}), errdefs.ErrInvalidArgument, `grant with[0]: "k8s" is not "docker"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Grant(v, self, tc.sg, time.Now())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Grant: %v; want %v naming %q", err, tc.want, tc.text)
			}
		})
	}
}

// Every field of the grant format but limits, network policy, their
// generations and times is fixed: changing it, adding one this build
// does not know, or removing a message changes that field of Fixed alone,
// so runs.Manager.Update refuses the grant naming it.
func TestGrantFixed(t *testing.T) {
	fixedOf := func(g *typesv1.Grant) []runs.Field {
		t.Helper()
		f, err := fixedFields(g)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	base := fixedOf(testGrant())
	for _, tc := range []struct {
		field string
		edit  func(g *typesv1.Grant)
	}{
		{"job_id", func(g *typesv1.Grant) { g.JobId = "job-2" }},
		{"tenant", func(g *typesv1.Grant) { g.Tenant = "other" }},
		{"requester", func(g *typesv1.Grant) { g.Requester = "spiffe://test.example/client/mallory" }},
		{"repository", func(g *typesv1.Grant) { g.Repository = "gadgets" }},
		{"commit", func(g *typesv1.Grant) { g.Commit = strings.Repeat("b", 40) }},
		{"command", func(g *typesv1.Grant) { g.Command = []string{"curl", "evil"} }},
		{"env", func(g *typesv1.Grant) { g.Env["EXTRA"] = "1" }},
		{"runtime_class", func(g *typesv1.Grant) { g.RuntimeClass = typesv1.RuntimeClass_RUNTIME_CLASS_RUNC }},
		{"publish_target", func(g *typesv1.Grant) { g.PublishTarget.Branch = "release" }},
		{"publish_target", func(g *typesv1.Grant) { g.PublishTarget = nil }},
		{"publish_target", func(g *typesv1.Grant) { g.PublishTarget = &typesv1.PublishTarget{} }},
		{"git_history_depth", func(g *typesv1.Grant) { g.GitHistoryDepth = 5 }},
		{"version", func(g *typesv1.Grant) { g.Version = 9 }},
		{"executor", func(g *typesv1.Grant) { g.Executor = "spiffe://test.example/service/executor/exec-a" }},
		{"with", func(g *typesv1.Grant) { g.With = []string{"docker"} }},
		{"(unknown fields)", func(g *typesv1.Grant) {
			g.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
		}},
		{"", func(g *typesv1.Grant) {
			g.Limits.Pids = 100
			g.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}
			g.NetworkPolicyGeneration, g.Generation = 5, 6
			g.IssuedAt, g.ExpiresAt = grant.Timestamps(time.Now().Add(time.Minute), time.Hour)
			// A session's settings change as limits do; a job becoming a
			// session, or back, is refused by runs.
			g.Session.MaxConcurrentExecs = 16
		}},
	} {
		g := testGrant()
		tc.edit(g)
		got := fixedOf(g)
		var changed []string
		for i := range got {
			if got[i].Name != base[i].Name {
				t.Fatalf("field %d is %s, was %s", i, got[i].Name, base[i].Name)
			}
			if string(got[i].Value) != string(base[i].Value) {
				changed = append(changed, got[i].Name)
			}
		}
		if fmt.Sprint(changed) != fmt.Sprint(strings.Fields(tc.field)) {
			t.Errorf("changing %q changed fixed fields %v", tc.field, changed)
		}
	}
}

func TestPolicyFromProto(t *testing.T) {
	allowList := func(rules ...*typesv1.AllowRule) *typesv1.NetworkPolicy {
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: rules}}}
	}
	domainList := func(ports []uint32, names ...string) *typesv1.NetworkPolicy {
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: names, Ports: ports}}}
	}
	for _, tc := range []struct {
		name string
		in   *typesv1.NetworkPolicy
		want runs.NetworkPolicy
		err  string
	}{
		{name: "deny all", in: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}},
		{name: "allow", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{443, 80}}, &typesv1.AllowRule{Cidr: "2001:db8::/32"}),
			want: runs.NetworkPolicy{Net: netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Ports: []uint16{80, 443}}, {Prefix: netip.MustParsePrefix("2001:db8::/32")}}}}},
		{name: "domains", in: domainList([]uint32{8443}, "Proxy.Golang.org.", "*.npmjs.org", "bücher.example"),
			want: runs.NetworkPolicy{Net: netpolicy.Policy{Proxied: true}, Names: egress.Policy{Names: []egress.Name{
				{Name: "proxy.golang.org", Ports: []uint16{8443}}, {Name: "*.npmjs.org", Ports: []uint16{8443}}, {Name: "xn--bcher-kva.example", Ports: []uint16{8443}}}}}},
		{name: "no domains", in: domainList(nil), err: "network_policy.domains.domains: need at least one name"},
		{name: "bad domain", in: domainList(nil, "exa mple.com"), err: "network_policy.domains"},
		{name: "bad domain port", in: domainList([]uint32{70000}, "example.com"), err: "network_policy.domains.ports[0]"},
		{name: "no mode", in: &typesv1.NetworkPolicy{}, err: "exactly one mode"},
		{name: "nil", in: nil, err: "exactly one mode"},
		{name: "empty allow", in: allowList(), err: "at least one rule"},
		{name: "bad cidr", in: allowList(&typesv1.AllowRule{Cidr: "example.com"}), err: "rules[0].cidr"},
		{name: "host bits", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.1/24"}), err: "host bits"},
		{name: "port 0", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{0}}), err: "ports[0]"},
		{name: "port too big", in: allowList(&typesv1.AllowRule{Cidr: "192.0.2.0/24", Ports: []uint32{65536}}), err: "ports[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policyFromProto(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
