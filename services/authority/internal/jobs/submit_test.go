package jobs

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

func TestCredentialLookingEnv(t *testing.T) {
	secrets, err := contentcheck.New(contentcheck.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, value string
		refused     bool
	}{
		// Names.
		{"GITHUB_TOKEN", "x", true},
		{"MY_SECRET_THING", "x", true},
		{"DB_PASSWORD", "x", true},
		{"MYSQL_PWD_PASSWD", "x", true},
		{"AWS_SECRET_ACCESS_KEY", "x", true},
		{"OPENAI_API_KEY", "x", true},
		{"STRIPE_APIKEY", "x", true},
		{"GOOGLE_APPLICATION_CREDENTIALS", "x", true},
		{"SSH_PRIVATE_KEY", "x", true},
		{"NPM_CONFIG__AUTH", "x", true},
		{"HTTP_AUTHORIZATION", "x", true},
		{"db_pass", "x", true},
		{"GH_PAT", "x", true},
		{"SENTRY_DSN", "x", true},
		{"GIT_AUTHOR_NAME", "Agent", false},
		{"GIT_AUTHOR_EMAIL", "agent@example.com", false},
		{"BYPASS_CACHE", "1", false},
		{"PATH", "/usr/local/bin:/usr/bin", false},
		{"PASSES", "3", false},
		{"KEYBOARD_LAYOUT", "us", false},
		// Values.
		{"V", "ghp_0123456789abcdefABCDEF0123456789abcd", true},
		{"V", "gho_0123456789abcdefABCDEF0123456789abcd", true},
		{"V", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", true},
		{"V", "glpat-abcdefghij0123456789", true},
		{"V", "AKIAIOSFODNN7EXAMPLE", true},
		{"V", "xoxb-1234567890-abcdefghijkl", true},
		{"V", "xoxp-1234567890-abcdefghijkl", true},
		{"V", "sk-abcdefghijklmnopqrstuvwx", true},
		{"V", "-----BEGIN RSA PRIVATE KEY-----\nMIIE", true},
		{"V", "prefix -----BEGIN CERTIFICATE-----", true},
		{"V", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", true},
		{"V", "https://user:hunter2@example.com/repo.git", true},
		{"V", "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWpr", true},
		{"V", "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9f", true},
		{"V", strings.Repeat("0123456789abcdef", 4), false},      // a sha256 digest
		{"V", "0d9853d7934a565cf84fedd6f3397b81465597c3", false}, // a commit
		{"V", "123e4567-e89b-12d3-a456-426614174000", false},
		{"V", "https://proxy.golang.org,direct", false},
		{"V", "https://example.com/path/to/something/quite/long/indeed", false},
		{"V", "the quick brown fox jumps over the lazy dog", false},
		{"V", "-mod=mod -trimpath", false},
		{"V", "sk-short", false},
		{"V", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1a", false}, // long but not random
		{"V", "", false},
		// Only the gitleaks rules (pkg/contentcheck) know these.
		{"V", "dapi0123456789abcdef0123456789abcdef", true},         // a Databricks token
		{"V", "shpat_0123456789abcdef0123456789abcdef", true},       // a Shopify token
		{"V", "pul-0123456789abcdef0123456789abcdef01234567", true}, // a Pulumi token
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			err := checkEnv(t.Context(), secrets, map[string]string{tc.name: tc.value})
			if tc.refused {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "spec.env."+tc.name+":") {
					t.Fatalf("checkEnv = %v, want a refusal naming spec.env.%s", err, tc.name)
				}
				if tc.value != "x" && strings.Contains(err.Error(), tc.value) {
					t.Errorf("the refusal repeats the value: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("checkEnv refused a plain variable: %v", err)
			}
		})
	}
}

func TestEffectiveLimits(t *testing.T) {
	def := policy.Limits{CPUMillis: 1000, MemoryBytes: 512 << 20, Pids: 256, DiskBytes: 1 << 30, Deadline: 10 * time.Minute}
	ceil := policy.Limits{CPUMillis: 2000, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 4 << 30, Deadline: time.Hour}
	for _, tc := range []struct {
		name string
		req  policy.Limits
		want policy.Limits
		err  string
	}{
		{"all defaults", policy.Limits{}, def, ""},
		{"some set", policy.Limits{MemoryBytes: 1 << 30, Deadline: time.Hour}, policy.Limits{CPUMillis: 1000, MemoryBytes: 1 << 30, Pids: 256, DiskBytes: 1 << 30, Deadline: time.Hour}, ""},
		{"at the ceiling", ceil, ceil, ""},
		{"cpu over", policy.Limits{CPUMillis: 2001}, policy.Limits{}, "spec.resources.cpu_millis: 2001 is above the tenant's ceiling of 2000"},
		{"memory over", policy.Limits{MemoryBytes: 4 << 30}, policy.Limits{}, "spec.resources.memory_bytes: 4294967296 (4GiB) is above the tenant's ceiling of 2147483648 (2GiB)"},
		{"pids over", policy.Limits{Pids: 5000}, policy.Limits{}, "spec.resources.pids:"},
		{"disk over", policy.Limits{DiskBytes: 5 << 30}, policy.Limits{}, "spec.resources.disk_bytes:"},
		{"deadline over", policy.Limits{Deadline: 61 * time.Minute}, policy.Limits{}, "spec.resources.deadline: 1h1m0s is above"},
		{"negative", policy.Limits{DiskBytes: -1}, policy.Limits{}, "spec.resources.disk_bytes: must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := effectiveLimits("spec.resources", tc.req, def, ceil)
			if tc.err != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("effectiveLimits = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestCheckNetwork(t *testing.T) {
	tenant := &policy.Tenant{Name: "dev", Egress: policy.Egress{
		CIDRs:   []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
		Domains: []string{"proxy.golang.org", "*.example.com"},
	}}
	allow := func(cidrs ...string) Network {
		n := Network{Mode: NetworkAllow}
		for _, c := range cidrs {
			n.Rules = append(n.Rules, AllowRule{CIDR: c})
		}
		return n
	}
	domains := func(d ...string) Network { return Network{Mode: NetworkDomains, Domains: d} }
	for _, tc := range []struct {
		name string
		in   Network
		err  error
		want string
	}{
		{"unset is deny-all", Network{}, nil, ""},
		{"deny-all", Network{Mode: NetworkDenyAll}, nil, ""},
		{"inside", allow("10.1.0.0/16", "10.0.0.0/8", "10.2.3.4/32"), nil, ""},
		{"inside v6", allow("2001:db8:1::/48"), nil, ""},
		{"outside", allow("10.0.0.0/8", "11.0.0.0/8"), errdefs.ErrPermissionDenied, "spec.network_policy.allow.rules[1].cidr"},
		{"wider", allow("0.0.0.0/0"), errdefs.ErrPermissionDenied, "rules[0].cidr"},
		{"v4-mapped v6 is not v4", allow("::ffff:10.0.0.0/104"), errdefs.ErrInvalidArgument, "rules[0].cidr: ::ffff:10.0.0.0/104 is an IPv4-mapped"},
		{"host bits set", allow("10.0.0.1/8"), errdefs.ErrInvalidArgument, "rules[0].cidr: 10.0.0.1/8 has host bits set; write 10.0.0.0/8"},
		{"mapped metadata", allow("::ffff:169.254.169.254/128"), errdefs.ErrInvalidArgument, "IPv4-mapped"},
		{"not a cidr", allow("10.0.0.0"), errdefs.ErrInvalidArgument, "rules[0].cidr"},
		{"no rules", allow(), errdefs.ErrInvalidArgument, "spec.network_policy.allow.rules"},
		{"bad port", Network{Mode: NetworkAllow, Rules: []AllowRule{{CIDR: "10.0.0.0/8", Ports: []uint32{443, 70000}}}}, errdefs.ErrInvalidArgument, "rules[0].ports[1]"},
		{"listed domain", domains("proxy.golang.org"), nil, ""},
		{"under a wildcard", domains("api.example.com"), nil, ""},
		{"the wildcard itself", domains("*.example.com"), nil, ""},
		{"two labels under a wildcard", domains("a.b.example.com"), errdefs.ErrPermissionDenied, "domains.domains[0]"},
		{"the wildcard's apex", domains("example.com"), errdefs.ErrPermissionDenied, "domains.domains[0]"},
		{"unlisted", domains("proxy.golang.org", "evil.org"), errdefs.ErrPermissionDenied, "spec.network_policy.domains.domains[1]"},
		{"not a name", domains("http://x"), errdefs.ErrInvalidArgument, "domains.domains[0]"},
		{"no domains", domains(), errdefs.ErrInvalidArgument, "spec.network_policy.domains.domains"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkNetwork(tenant, "spec.network_policy", tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("checkNetwork = %v, want %v naming %q", err, tc.err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.in.Mode == NetworkUnset && got.Mode != NetworkDenyAll {
				t.Errorf("unset became %v, want an explicit deny_all", got.Mode)
			}
		})
	}
}

func TestAdvancesOnlyForward(t *testing.T) {
	for _, tc := range []struct {
		from, to store.State
		want     bool
	}{
		{store.StateQueued, store.StateStaging, true},
		{store.StateQueued, store.StateRunning, true},
		{store.StateStaging, store.StateRunning, true},
		{store.StateRunning, store.StateStaging, false},
		{store.StateRunning, store.StateRunning, false},
		{store.StateFinished, store.StateRunning, false},
		{store.StateCancelled, store.StateStaging, false},
	} {
		if got := advances(tc.from, tc.to); got != tc.want {
			t.Errorf("advances(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestHubNeverBlocks(t *testing.T) {
	h := newHub()
	ch, stop := h.subscribe("j")
	defer stop()
	for i := range 100 {
		h.publish(store.Job{ID: "j", Version: int64(i + 1)})
	}
	var last int64
	for len(ch) > 0 {
		last = (<-ch).Version
	}
	if last != 100 {
		t.Fatalf("a slow watcher's last version is %d, want the newest (100)", last)
	}
	h.publish(store.Job{ID: "other", Version: 1}) // nobody listening: fine
}

func TestWatchOffsetsTrimOverlap(t *testing.T) {
	w := &outputWatch{next: Offsets{Stdout: 8}}
	if _, ok := w.advanceOutput(Output{Stream: Stdout, Offset: 0, Data: []byte("hello ")}); ok {
		t.Error("output before the offset was forwarded")
	}
	o, ok := w.advanceOutput(Output{Stream: Stdout, Offset: 6, Data: []byte("world\n")})
	if !ok || string(o.Data) != "rld\n" || o.Offset != 8 {
		t.Errorf("overlap = %q at %d, want \"rld\\n\" at 8", o.Data, o.Offset)
	}
	if o, ok := w.advanceOutput(Output{Stream: Stderr, Offset: 0, Data: []byte("e")}); !ok || string(o.Data) != "e" || w.next.Stderr != 1 {
		t.Errorf("stderr = %q %v, next %d", o.Data, ok, w.next.Stderr)
	}
}

// A watch resumed after a broken executor stream forwards each egress
// decision once, and none to a watcher that did not ask for them.
func TestWatchEgressOnce(t *testing.T) {
	ev := func(i int64) RunEvent {
		return RunEvent{Egress: &EgressEntry{Index: i, Record: egress.Record{Name: fmt.Sprint(i)}}}
	}
	if _, ok := (&outputWatch{}).advance(ev(0)); ok {
		t.Error("an egress decision went to a watcher that did not ask for the record")
	}
	w := &outputWatch{next: Offsets{Egress: true, EgressIndex: 2}}
	var got []string
	for _, i := range []int64{0, 1, 2, 3, 3, 2, 4} {
		if out, ok := w.advance(ev(i)); ok {
			got = append(got, out.Egress.Record.Name)
		}
	}
	if strings.Join(got, ",") != "2,3,4" || w.next.EgressIndex != 5 {
		t.Errorf("forwarded %v, next %d; want 2,3,4 and 5", got, w.next.EgressIndex)
	}
	if out, ok := w.advance(RunEvent{Output: &Output{Stream: Stdout, Offset: 0, Data: []byte("x")}}); !ok || out.Output == nil {
		t.Errorf("output beside the record: %+v %v", out, ok)
	}
}
