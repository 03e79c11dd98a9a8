package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// domainProbe checks, every round, whether the job reaches each name over
// HTTPS (through the proxy its HTTPS_PROXY names) and prints one line per
// name and "tick" after each round, as probeScript does.
func domainProbe(names ...string) string {
	var b strings.Builder
	b.WriteString("while true; do\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  if curl -sSk --max-time 3 -o /dev/null https://%s/; then echo '%s open'; else echo '%s closed'; fi\n", n, n, n)
	}
	// The first name again, as a tool that ignores proxy variables reaches
	// it (the job's DNS server, then TCP 443 redirected), and a lookup that
	// would carry data out.
	fmt.Fprintf(&b, "  if curl -sSk --noproxy '*' --max-time 3 -o /dev/null https://%s/; then echo 'direct open'; else echo 'direct closed'; fi\n", names[0])
	b.WriteString("  if getent hosts c2VjcmV0.notlisted.test >/dev/null; then echo 'leak open'; else echo 'leak closed'; fi\n")
	b.WriteString("  echo tick\n  sleep 0.2\ndone\n")
	return b.String()
}

// TestDomainsJobEndToEnd runs a job with a domains policy through the whole
// stack (dev up with --resolver and --egress-domain): it reaches exactly
// its names; adding a name waits for an approval; removing one applies at
// once; and airlock job egress lists what the proxy decided, while the
// test's upstream resolver never hears a name the policy did not allow.
func TestDomainsJobEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	n := int(time.Now().UnixNano() & 0xff)
	web := nettest.StartWeb(t, nettest.Config{
		Name:    fmt.Sprintf("ew%04x%02x", os.Getpid()&0xffff, n),
		Prefix:  nettest.Subnet(netip.MustParsePrefix("203.0.113.128/25"), 30, (os.Getpid()+n)%32),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("2001:db8:7b00::/40"), 64, (os.Getpid()&0xffff)<<8|n),
	})
	public := []netip.Addr{web.IP, web.IP6}
	dns := nettest.StartDNS(t, map[string][]netip.Addr{"allowed.test": public, "a.wild.test": public, "notlisted.test": public})
	s := startStack(t, "--repo", "sample="+repo, "--resolver", dns.Addr.String(), "--egress-domain", "allowed.test", "--egress-domain", "*.wild.test")

	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--memory", "256MiB", "--allow-domain", "allowed.test",
		"--", "bash", "-c", domainProbe("allowed.test", "a.wild.test", "notlisted.test"))
	if res.code != 0 {
		t.Fatalf("job submit: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)
	watch := s.startAirlock(t, "job", "watch", id)
	defer s.airlock(t, "job", "cancel", id)

	r := waitRound(t, watch, "allowed.test reached", func(r map[string]bool) bool { return r["allowed.test"] && r["direct"] })
	if r["a.wild.test"] || r["notlisted.test"] || r["leak"] {
		t.Fatalf("with allowed.test alone the job reached %v", r)
	}

	// Widening: an approval, and nothing changes until it is decided.
	res = s.airlock(t, "job", "update", id, "--allow-domain", "allowed.test", "--allow-domain", "*.wild.test")
	m := approvalIDLine.FindStringSubmatch(res.stdout)
	if res.code != 0 || m == nil {
		t.Fatalf("job update --allow-domain: exit %d, want an approval\n%s%s", res.code, res.stdout, res.stderr)
	}
	if r := nextRound(t, watch); r["a.wild.test"] {
		t.Fatal("the added name was reachable before anyone approved it")
	}
	if res := s.airlock(t, "approval", "approve", m[1], "--as", "approver/alice"); res.code != 0 {
		t.Fatalf("alice approves: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	r = waitRound(t, watch, "the approved name", func(r map[string]bool) bool { return r["a.wild.test"] })
	if r["notlisted.test"] {
		t.Fatalf("after the widening the job reached %v", r)
	}
	if st := s.job(t, id).GetNetworkPolicyStatus(); st.GetGeneration() != 2 || st.GetState().String() != "NETWORK_POLICY_STATE_APPLIED" {
		t.Fatalf("network policy status after the approved change: %v", st)
	}

	// Narrowing applies at once.
	if res := s.airlock(t, "job", "update", id, "--allow-domain", "*.wild.test"); res.code != 0 || !strings.Contains(res.stdout, "network_policy: applied") {
		t.Fatalf("job update (narrowing): exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if r := nextRound(t, watch); r["allowed.test"] || !r["a.wild.test"] {
		t.Fatalf("after the narrowing the job reached %v; want a.wild.test only", r)
	}

	if res := s.airlock(t, "job", "cancel", id); res.code != 0 {
		t.Fatalf("job cancel: exit %d\n%s", res.code, res.stderr)
	}
	if watch.exitCode(30*time.Second) == -1 {
		t.Fatal("job watch did not end after the cancel")
	}

	// The record, as a person and a program read it.
	var text result
	deadline := time.Now().Add(30 * time.Second)
	for {
		text = s.airlock(t, "job", "egress", id)
		if text.code == 0 && !strings.Contains(text.stdout, "no egress record yet") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job egress: exit %d\n%s%s", text.code, text.stdout, text.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{`connect\s+allowed\.test\s+443\s+allowed\s`, `connect\s+a\.wild\.test\s+443\s+allowed\s`,
		`connect\s+notlisted\.test\s+443\s+refused\s.*notlisted\.test is not in the policy`,
		`transparent\s+allowed\.test\s+443\s+allowed\s`, `dns\s+allowed\.test\s+A\s+allowed\s`,
		`dns\s+c2vjcmv0\.notlisted\.test\s+A+\s+refused\s`} {
		if !regexp.MustCompile(want).MatchString(text.stdout) {
			t.Errorf("job egress has no line matching %q:\n%s", want, text.stdout)
		}
	}
	js := s.airlock(t, "job", "egress", id, "--refused", "-o", "json")
	var got struct {
		Egress struct {
			Records []struct {
				Via, Name, Reason string
				Allowed           bool
			}
			Total string
		}
	}
	if js.code != 0 || json.Unmarshal([]byte(js.stdout), &got) != nil || len(got.Egress.Records) == 0 {
		t.Fatalf("job egress --refused -o json: exit %d\n%s%s", js.code, js.stdout, js.stderr)
	}
	for _, r := range got.Egress.Records {
		if r.Allowed {
			t.Errorf("--refused listed an allowed decision: %+v", r)
		}
	}
	asked := dns.Asked()
	if !slices.Contains(asked, "allowed.test") {
		t.Errorf("the upstream resolver was never asked for allowed.test: %v", asked)
	}
	for _, name := range asked {
		if name != "allowed.test" && name != "a.wild.test" {
			t.Errorf("the upstream resolver was asked for %q, which the policy never allowed", name)
		}
	}
	if web.DNSHits() != 0 {
		t.Errorf("%d packets reached the web host's port 53 straight from the job", web.DNSHits())
	}
}
