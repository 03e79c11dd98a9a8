package selftest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// target is one --expect-reach destination.
type target struct {
	text   string
	name   string       // a DNS name, or
	prefix netip.Prefix // a CIDR
	port   uint32
}

// dial is the host a job dials for t: the name; an address's self; a
// network's first host address (network address + 1, but for IPv4 /31
// and /32 and IPv6 /127 and /128, whose addresses are all hosts).
func (t target) dial() string {
	if t.name != "" {
		return t.name
	}
	a := t.prefix.Addr()
	if t.prefix.Bits() < a.BitLen()-1 {
		a = a.Next()
	}
	return a.String()
}

// parseTarget reads NAME|CIDR|ADDR with an optional :PORT (443 without):
// a name must be a fully qualified DNS name (no wildcard: a job dials
// it), a CIDR a network without host bits; anything else is refused,
// naming the flag.
func parseTarget(s string) (target, error) {
	t := target{text: s, port: 443}
	bad := func(why string) (target, error) {
		return t, fmt.Errorf("--expect-reach %q: %s; want NAME, CIDR or ADDRESS, with an optional :PORT", s, why)
	}
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return t, fmt.Errorf("--expect-reach %q: port %q: want 1 to 65535", s, p)
		}
		host, t.port = h, uint32(n)
	} else if i := strings.LastIndexByte(s, ':'); i > 0 && strings.Contains(s[:i], "/") {
		// 192.0.2.0/24:443: SplitHostPort takes no CIDR.
		n, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err == nil && n > 0 {
			host, t.port = s[:i], uint32(n)
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		t.prefix = netip.PrefixFrom(a, a.BitLen())
		return t, nil
	}
	if strings.Contains(host, "/") {
		p, err := egress.ParsePrefix(host)
		if err != nil {
			return bad(err.Error())
		}
		t.prefix = p
		return t, nil
	}
	if strings.HasPrefix(host, "*") {
		return bad("a wildcard cannot be dialled")
	}
	name, err := egress.NormalizeName(host)
	if err != nil {
		return bad(err.Error())
	}
	t.name = name
	return t, nil
}

// probeSecs is how long every connection probe waits, before a policy
// change and after it alike.
const probeSecs = 10

// reach is shell text that tries host:port within probeSecs seconds and
// prints "selftest-reach ok|fail LABEL".
func reach(label, host string, port uint32) string {
	return fmt.Sprintf(`if timeout %d bash -c 'exec 3<>/dev/tcp/%s/%d' 2>/dev/null; then echo "selftest-reach ok %s"; else echo "selftest-reach fail %s"; fi; `, probeSecs, host, port, label, label)
}

// reachTools are what the probes need; a missing one prints
// "selftest-missing-tool NAME", which fails the check (a probe that could
// not run must not read as a refused connection).
const reachTools = `for t in timeout getent bash; do command -v "$t" >/dev/null 2>&1 || echo "selftest-missing-tool $t"; done; `

// outside are destinations no selftest policy lists: a public address and
// a public name. A probe allowed a list must fail to reach them.
var outside = []target{{text: "unlisted 1.1.1.1:443", prefix: netip.MustParsePrefix("1.1.1.1/32"), port: 443}, {text: "unlisted example.com:443", name: "example.com", port: 443}}

// counterRule is the allow rule for the counter.
func (r *runner) counterRule() (*typesv1.AllowRule, error) {
	a, err := netip.ParseAddr(r.counter.host())
	if err != nil {
		return nil, fmt.Errorf("--counter-addr %s: want an IP address and port: %w", r.counter.addr, err)
	}
	p, _ := strconv.ParseUint(r.counter.port(), 10, 16)
	return &typesv1.AllowRule{Cidr: netip.PrefixFrom(a, a.BitLen()).String(), Ports: []uint32{uint32(p)}}, nil
}

func allow(rules []*typesv1.AllowRule) *typesv1.NetworkPolicy {
	if len(rules) == 0 {
		return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}}
	}
	return &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{Rules: rules}}}
}

func (r *runner) egress(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	var names, cidrs []target
	var cidrRules []*typesv1.AllowRule
	for _, s := range r.opts.ExpectReach {
		t, err := parseTarget(s)
		if err != nil {
			row.fail("expect-reach", "%v", err)
			return
		}
		if t.name != "" {
			names = append(names, t)
		} else {
			cidrs = append(cidrs, t)
			cidrRules = append(cidrRules, &typesv1.AllowRule{Cidr: t.prefix.String(), Ports: []uint32{t.port}})
		}
	}
	var counterRule *typesv1.AllowRule
	refused := outside
	if r.counter != nil {
		rule, err := r.counterRule()
		if err != nil {
			row.fail("unapproved destination", "%v", err)
			return
		}
		counterRule = rule
		p, _ := netip.ParsePrefix(rule.GetCidr())
		refused = append(append([]target(nil), outside...), target{text: "unlisted counter", prefix: p, port: rule.GetPorts()[0]})
	}

	// A job under the tenant's default policy (no policy asked for) reaches
	// neither the counter nor a public address, nor resolves a name.
	// The probes run at once: a refused destination may be a silent one.
	probe := reachTools + "(" + reach("public 1.1.1.1:443", "1.1.1.1", 443) + ") & " +
		fmt.Sprintf(`(if timeout %d getent hosts example.com >/dev/null 2>&1; then echo "selftest-reach ok dns example.com"; else echo "selftest-reach fail dns example.com"; fi) & `, probeSecs)
	var path string
	conns := 0
	if r.counter != nil {
		path, conns = r.counter.path("egress-default"), r.counter.accepted()
		probe += "(if " + r.counter.get(path, probeSecs) + " >/dev/null; then echo 'selftest-reach ok counter'; else echo 'selftest-reach fail counter'; fi) & "
	}
	def := r.runJob(ctx, r.spec(class, sh(probe+"wait; echo selftest-done")...), r.key(row, "default-policy"))
	if def.err != nil {
		row.fail("unapproved destination", "%v", def.err)
	} else {
		record(row, def.job)
		ok := lines(def.stdout, "selftest-reach ok ")
		missing := lines(def.stdout, "selftest-missing-tool ")
		done := strings.Contains(def.stdout, "selftest-done")
		hits := 0
		if r.counter != nil {
			hits, conns = r.counter.count(path), r.counter.accepted()-conns
		}
		row.verdict("unapproved destination", done && len(ok) == 0 && len(missing) == 0 && hits == 0 && conns == 0,
			"a job under the default policy ("+policyWord(def.job)+") reached no public address, no name and not the counter",
			fmt.Sprintf("a job under the default policy (%s) reached %v, the counter saw %d requests and %d connections (ran to its end: %v; missing tools %v)",
				policyWord(def.job), ok, hits, conns, done, missing))
	}

	if len(names) > 0 {
		var domains []string
		var ports []uint32
		for _, t := range names {
			domains = append(domains, t.name)
			if !containsPort(ports, t.port) {
				ports = append(ports, t.port)
			}
		}
		spec := r.spec(class, sh(reachTools+reachAll(append(append([]target(nil), names...), refused...)))...)
		spec.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: domains, Ports: ports}}}
		res := r.runJob(ctx, spec, r.key(row, "names"))
		if res.err == nil {
			record(row, res.job)
		}
		r.reachChecks(row, "the domains job", res.stdout, res.err, names, refused)
	}

	if r.counter == nil {
		if len(cidrs) > 0 {
			spec := r.spec(class, sh(reachTools+reachAll(append(append([]target(nil), cidrs...), refused...)))...)
			spec.NetworkPolicy = allow(cidrRules)
			res := r.runJob(ctx, spec, r.key(row, "cidrs"))
			if res.err == nil {
				record(row, res.job)
			}
			r.reachChecks(row, "the allow job", res.stdout, res.err, cidrs, refused)
		}
		row.skip("policy change", "no --counter-listen: no live destination to take away")
		return
	}
	spec := r.spec(class)
	spec.NetworkPolicy = allow(append([]*typesv1.AllowRule{counterRule}, cidrRules...))
	s, err := r.session(ctx, spec, r.key(row, "session"))
	if err != nil {
		row.fail("policy change", "create a session allowed the counter: %v", err)
		return
	}
	defer r.cancelSession(ctx, s.GetJobId())
	before := r.counter.path("egress-before")
	x, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-before", sh(reachTools+r.counter.get(before, probeSecs)+"; "+reachAll(append(append([]target(nil), cidrs...), outside...)))...)
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	r.reachChecks(row, "the allow session", x.stdout, nil, cidrs, outside)
	if r.counter.count(before) != 1 {
		row.fail("policy change", "the session could not reach the counter its policy allows (%d requests seen; exec %s): is --counter-addr reachable from the sandboxes?",
			r.counter.count(before), ending(x.exec.GetReason(), x.exec.GetExitCode(), x.exec.GetMessage()))
		return
	}
	job, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: s.GetJobId()})
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	record(row, job.GetJob())
	gen := job.GetJob().GetNetworkPolicyStatus().GetGeneration()

	asked := time.Now()
	resp, err := r.cl.Client.UpdateNetworkPolicy(ctx, &authorityv1.UpdateNetworkPolicyRequest{JobId: s.GetJobId(), Policy: allow(cidrRules)})
	if err != nil {
		row.fail("policy change", "narrowing the policy: %v", err)
		return
	}
	if resp.GetApprovalId() != "" {
		row.fail("policy change", "narrowing waits for approval %s; a narrowing should apply at once", resp.GetApprovalId())
		return
	}
	st := resp.GetStatus()
	for st.GetState() != typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED || st.GetGeneration() <= gen {
		if st.GetState() == typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED || time.Since(asked) > 30*time.Second {
			row.fail("policy change", "the narrowed policy did not apply within 30s: %s generation %d %s", st.GetState(), st.GetGeneration(), st.GetMessage())
			return
		}
		time.Sleep(50 * time.Millisecond)
		got, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: s.GetJobId()})
		if err != nil {
			row.fail("policy change", "%v", err)
			return
		}
		st = got.GetJob().GetNetworkPolicyStatus()
	}
	applied := time.Since(asked)
	// The same probe as before the change, with the same wait, and the
	// destinations the narrowed policy still allows as a control: the
	// session must still reach those.
	after := r.counter.path("egress-after")
	conns = r.counter.accepted()
	y, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-after",
		sh(reachTools+"if "+r.counter.get(after, probeSecs)+"; then echo selftest-reach ok counter; fi; "+reachAll(cidrs)+"echo selftest-done")...)
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	enforced := time.Since(asked)
	hits, conns := r.counter.count(after), r.counter.accepted()-conns
	okSet := lines(y.stdout, "selftest-reach ok ")
	var lost []string
	for _, t := range cidrs {
		if !contains(okSet, t.text) {
			lost = append(lost, t.text)
		}
	}
	missing := lines(y.stdout, "selftest-missing-tool ")
	control := fmt.Sprintf("; the still-allowed %v stayed reachable", targetTexts(cidrs))
	if len(cidrs) == 0 {
		control = "; no CIDR --expect-reach: no still-allowed destination to control"
	}
	ok := hits == 0 && conns == 0 && len(lost) == 0 && len(missing) == 0 && strings.Contains(y.stdout, "selftest-done") && !contains(okSet, "counter")
	row.verdict("policy change", ok,
		fmt.Sprintf("narrowed policy applied %s after the request (generation %d); the next connection to the counter failed within %ds (checked %s after the request)%s",
			applied.Round(time.Millisecond), st.GetGeneration(), probeSecs, enforced.Round(time.Millisecond), control),
		fmt.Sprintf("after the narrowing said applied (generation %d, %s after the request): the counter saw %d requests and %d connections, still-allowed destinations lost %v, missing tools %v",
			st.GetGeneration(), applied.Round(time.Millisecond), hits, conns, lost, missing))
	if ok {
		row.Detail = "policy change applied in " + applied.Round(time.Millisecond).String()
	}
}

func targetTexts(ts []target) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.text)
	}
	return out
}

func containsPort(ps []uint32, p uint32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

func reachAll(ts []target) string {
	s := ""
	for _, t := range ts {
		s += "(" + reach(t.text, t.dial(), t.port) + ") & "
	}
	if s == "" {
		return ""
	}
	return s + "wait; "
}

// reachChecks adds one check per target a probe (who) must reach, and one
// that it reached none of those it must not, from the probe's output; a
// missing tool fails them all.
func (r *runner) reachChecks(row *Row, who, stdout string, err error, want, refuse []target) {
	if err != nil {
		row.fail("expected connection", "%s: %v", who, err)
		return
	}
	if missing := lines(stdout, "selftest-missing-tool "); len(missing) > 0 {
		row.fail("expected connection", "%s lacks %s: nothing was probed", who, strings.Join(missing, ", "))
		return
	}
	okSet := lines(stdout, "selftest-reach ok ")
	for _, t := range want {
		row.check("expected connection "+t.text, contains(okSet, t.text), "%s reached %s:%d: %v", who, t.dial(), t.port, contains(okSet, t.text))
	}
	var through []string
	for _, t := range refuse {
		if contains(okSet, t.text) {
			through = append(through, t.text)
		}
	}
	row.verdict("unlisted destination ("+who+")", len(through) == 0,
		fmt.Sprintf("%s reached none of %v, which its policy does not list", who, targetTexts(refuse)),
		fmt.Sprintf("%s reached %v, which its policy does not list: the allow-list lets more through", who, through))
}

// policyWord names a job's network policy mode.
func policyWord(j *authorityv1.Job) string {
	switch j.GetNetworkPolicyStatus().GetPolicy().GetMode().(type) {
	case *typesv1.NetworkPolicy_Allow:
		return "allow"
	case *typesv1.NetworkPolicy_Domains:
		return "domains"
	}
	return "deny-all"
}
