package selftest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

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

// dial is the host a job dials for t: the name, or the CIDR's address.
func (t target) dial() string {
	if t.name != "" {
		return t.name
	}
	return t.prefix.Addr().String()
}

// parseTarget reads NAME|CIDR|ADDR with an optional :PORT (443 without).
func parseTarget(s string) (target, error) {
	t := target{text: s, port: 443}
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
	if p, err := netip.ParsePrefix(host); err == nil {
		t.prefix = p
		return t, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		t.prefix = netip.PrefixFrom(a, a.BitLen())
		return t, nil
	}
	if host == "" || strings.ContainsAny(host, " /'\"$`\\") {
		return t, fmt.Errorf("--expect-reach %q: want NAME, CIDR or ADDRESS, with an optional :PORT", s)
	}
	t.name = host
	return t, nil
}

// reach is shell text that tries host:port within 3 seconds and prints
// "selftest-reach ok|fail LABEL".
func reach(label, host string, port uint32) string {
	return fmt.Sprintf(`if timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%d' 2>/dev/null; then echo "selftest-reach ok %s"; else echo "selftest-reach fail %s"; fi; `, host, port, label, label)
}

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
	var names []target
	var cidrRules []*typesv1.AllowRule
	var cidrs []target
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

	// A job under the tenant's default policy (no policy asked for) reaches
	// neither the counter nor a public address, nor resolves a name.
	// The probes run at once: a refused destination may be a silent one.
	probe := "(" + reach("public 1.1.1.1:443", "1.1.1.1", 443) + ") & " +
		`(if timeout 3 getent hosts example.com >/dev/null 2>&1; then echo "selftest-reach ok dns example.com"; else echo "selftest-reach fail dns example.com"; fi) & `
	if r.counter != nil {
		probe += "(if " + r.counter.get("/egress-"+r.run+"/default", 3) + " >/dev/null; then echo 'selftest-reach ok counter'; else echo 'selftest-reach fail counter'; fi) & "
	}
	def := r.runJob(ctx, r.spec(class, sh(probe+"wait; echo selftest-done")...), r.key(row, "default-policy"))
	if def.err != nil {
		row.fail("unapproved destination", "%v", def.err)
	} else {
		record(row, def.job)
		ok := lines(def.stdout, "selftest-reach ok ")
		done := strings.Contains(def.stdout, "selftest-done")
		hits := 0
		if r.counter != nil {
			hits = r.counter.count("/egress-" + r.run + "/default")
		}
		row.verdict("unapproved destination", done && len(ok) == 0 && hits == 0,
			"a job under the default policy ("+policyWord(def.job)+") reached no public address, no name and not the counter",
			fmt.Sprintf("a job under the default policy (%s) reached %v, the counter saw %d requests (ran to its end: %v)", policyWord(def.job), ok, hits, done))
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
		spec := r.spec(class, sh(reachAll(names))...)
		spec.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Domains{Domains: &typesv1.DomainList{Domains: domains, Ports: ports}}}
		res := r.runJob(ctx, spec, r.key(row, "names"))
		r.reachChecks(row, res, names)
	}

	if r.counter == nil {
		if len(cidrs) > 0 {
			spec := r.spec(class, sh(reachAll(cidrs))...)
			spec.NetworkPolicy = allow(cidrRules)
			r.reachChecks(row, r.runJob(ctx, spec, r.key(row, "cidrs")), cidrs)
		}
		row.skip("policy change", "no --counter-listen: no live destination to take away")
		return
	}
	rule, err := r.counterRule()
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	spec := r.spec(class)
	spec.NetworkPolicy = allow(append([]*typesv1.AllowRule{rule}, cidrRules...))
	s, err := r.session(ctx, spec, r.key(row, "session"))
	if err != nil {
		row.fail("policy change", "create a session allowed the counter: %v", err)
		return
	}
	defer r.cancelSession(ctx, s.GetJobId())
	before := "/egress-" + r.run + "/before"
	x, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-before", sh(r.counter.get(before, 10)+"; "+reachAll(cidrs))...)
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	if len(cidrs) > 0 {
		r.reachChecks(row, ran{job: &authorityv1.Job{Result: &typesv1.RunResult{}}, stdout: x.stdout}, cidrs)
	}
	if r.counter.count(before) != 1 {
		row.fail("policy change", "the session could not reach the counter its policy allows (%d requests seen; exec %s): is --counter-addr reachable from the sandboxes?",
			r.counter.count(before), ending(x.exec.GetReason(), x.exec.GetExitCode(), x.exec.GetMessage()))
		return
	}
	job, _ := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: s.GetJobId()})
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
	after := "/egress-" + r.run + "/after"
	y, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-after", sh("if "+r.counter.get(after, 3)+"; then echo selftest-reach ok counter; fi; echo selftest-done")...)
	if err != nil {
		row.fail("policy change", "%v", err)
		return
	}
	enforced := time.Since(asked)
	hits := r.counter.count(after)
	ok := hits == 0 && strings.Contains(y.stdout, "selftest-done") && len(lines(y.stdout, "selftest-reach ok ")) == 0
	row.verdict("policy change", ok,
		fmt.Sprintf("narrowed policy applied %s after the request (generation %d); the next connection failed (checked %s after the request)",
			applied.Round(time.Millisecond), st.GetGeneration(), enforced.Round(time.Millisecond)),
		fmt.Sprintf("after the narrowing said applied (generation %d, %s after the request), the session's next connection to the counter went through (%d requests seen)",
			st.GetGeneration(), applied.Round(time.Millisecond), hits))
	if row.Detail == "" && ok {
		row.Detail = "policy change applied in " + applied.Round(time.Millisecond).String()
	}
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

// reachChecks adds one check per target from a probe's output.
func (r *runner) reachChecks(row *Row, res ran, ts []target) {
	if res.err != nil {
		row.fail("expected connection", "%v", res.err)
		return
	}
	record(row, res.job)
	okSet := lines(res.stdout, "selftest-reach ok ")
	for _, t := range ts {
		row.check("expected connection "+t.text, contains(okSet, t.text), "%s:%d reached: %v", t.dial(), t.port, contains(okSet, t.text))
	}
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
