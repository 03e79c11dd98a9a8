package selftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/config"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Each row's checks. A job's command is bash (sh for the pids probe, which
// must not retry a refused fork as bash does), and every marker a job
// looks for is assembled at run time from two halves, so the command
// line itself never holds what is searched for.

// ending is how a job or exec ended, for a check's detail.
func ending(reason typesv1.TerminationReason, code int32, msg string) string {
	w := strings.ToLower(strings.TrimPrefix(reason.String(), "TERMINATION_REASON_"))
	if reason == typesv1.TerminationReason_TERMINATION_REASON_EXITED {
		w += " " + strconv.Itoa(int(code))
	}
	if msg != "" {
		w += " (" + msg + ")"
	}
	return w
}

func jobEnding(j *authorityv1.Job) string {
	res := j.GetResult()
	if res == nil {
		return strings.ToLower(strings.TrimPrefix(j.GetState().String(), "JOB_STATE_")) + ": " + j.GetMessage()
	}
	return ending(res.GetReason(), res.GetExitCode(), res.GetMessage())
}

func exited(j *authorityv1.Job, code int32) bool {
	return j.GetResult().GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED && j.GetResult().GetExitCode() == code
}

// lines are the lines of out that start with prefix, prefix removed.
func lines(out, prefix string) []string {
	var got []string
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			got = append(got, strings.TrimSpace(rest))
		}
	}
	return got
}

// split is shell text setting variable name to value without value
// appearing whole in the text.
func split(name, value string) string {
	h := len(value) / 2
	return name + "=" + quote(value[:h]) + "; " + name + "=\"$" + name + "\"" + quote(value[h:]) + "; "
}

// quote is s as one shell word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// searchExcludes keep a search of / off the host's /usr, the kernel's
// trees and git's objects.
const searchExcludes = "--exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr --exclude-dir=.git"

func (r *runner) exitStatus(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	res := r.runJobs(ctx, []*authorityv1.JobSpec{r.spec(class, "sh", "-c", "exit 3"), r.spec(class, "sh", "-c", "exit 0")},
		[]string{r.key(row, "failing"), r.key(row, "passing")})
	for i, want := range []int32{3, 0} {
		name := []string{"failing command", "passing command"}[i]
		if res[i].err != nil {
			row.fail(name, "%v", res[i].err)
			continue
		}
		record(row, res[i].job)
		row.check(name, exited(res[i].job, want), "`exit %d` came back as %s", want, jobEnding(res[i].job))
	}
}

// plantSecret writes the run's dummy secret on this machine when asked,
// world-readable so that only the sandbox stands between it and a job,
// and returns what removes it.
func (r *runner) plantSecret() (func(), error) {
	if !r.opts.PlantSecret {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "airlock-selftest-")
	if err != nil {
		return nil, fmt.Errorf("plant the dummy secret: %w", err)
	}
	path := filepath.Join(dir, "secret")
	if err := os.Chmod(dir, 0o755); err == nil {
		err = os.WriteFile(path, []byte(r.secret()+"\n"), 0o644)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("plant the dummy secret: %w", err)
	}
	r.opts.SecretPaths = append(r.opts.SecretPaths, path)
	return func() { os.RemoveAll(dir) }, nil
}

func (r *runner) secret() string { return "selftest-secret-" + r.run }

func (r *runner) isolation(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	marker, cred := "selftest-marker-"+r.run, "selftest-cred-"+r.run
	var paths strings.Builder
	for _, p := range r.opts.SecretPaths {
		paths.WriteString(" " + quote(p))
	}
	planter := split("M", marker) + split("S", r.secret()) +
		`for f in /tmp/$M "$HOME/$M" /work/$M /out/$M; do echo "$M" > "$f" 2>/dev/null && echo "selftest-wrote $f"; done; ` +
		`printf 'https://selftest:%s@selftest.invalid\n' "$SELFTEST_CRED" > "$HOME/.git-credentials" 2>/dev/null; ` +
		`for p in` + paths.String() + ` ; do head -c1 -- "$p" >/dev/null 2>&1 && echo "selftest-secret-visible $p"; done; ` +
		`timeout 20 grep -rslF ` + searchExcludes + ` -e "$S" / 2>/dev/null | sed 's/^/selftest-secret-found /'; ` +
		`echo selftest-done`
	if len(r.opts.SecretPaths) == 0 {
		planter = strings.Replace(planter, "for p in ; do", "for p in /nonexistent; do", 1)
	}
	spec := r.spec(class, sh(planter)...)
	spec.Env["SELFTEST_CRED"] = cred
	first, ok := r.probe(ctx, row, "earlier job", spec, r.key(row, "planter"))
	if !ok {
		return
	}
	wrote := lines(first.stdout, "selftest-wrote ")
	row.check("earlier job", len(wrote) > 0, "wrote its markers to %s and a credential to $HOME/.git-credentials", strings.Join(wrote, ", "))
	seen := append(lines(first.stdout, "selftest-secret-visible "), lines(first.stdout, "selftest-secret-found ")...)
	switch {
	case len(r.opts.SecretPaths) == 0:
		row.skip("dummy secret", "no secret to look for: pass --secret-path, or run the selftest on the executor host without --no-plant-secret")
	default:
		row.verdict("dummy secret", len(seen) == 0, "no job could read "+strings.Join(r.opts.SecretPaths, ", ")+", nor find its content under /",
			fmt.Sprintf("a job read %v of %s", seen, strings.Join(r.opts.SecretPaths, ", ")))
	}

	checker := split("M", marker) + split("C", cred) +
		`for f in /tmp/$M "$HOME/$M" /work/$M /out/$M; do [ -e "$f" ] && echo "selftest-leftover $f"; done; ` +
		`timeout 20 grep -rslF ` + searchExcludes + ` -e "$M" -e "$C" / 2>/dev/null | sed 's/^/selftest-leftover /'; ` +
		`env | grep -qF "$C" && echo "selftest-leftover environment"; ` +
		`echo selftest-done`
	second, ok := r.probe(ctx, row, "new job", r.spec(class, sh(checker)...), r.key(row, "checker"))
	if !ok {
		return
	}
	left := lines(second.stdout, "selftest-leftover ")
	row.verdict("earlier job's files and credentials", len(left) == 0,
		"a new job found none of the earlier job's files (/tmp, $HOME, /work, /out) or credentials",
		fmt.Sprintf("a new job found the earlier job's %v", left))
}

// probe runs a job whose script ends by printing selftest-done, and
// records it; a job that did not get there fails the check name.
func (r *runner) probe(ctx context.Context, row *Row, name string, spec *authorityv1.JobSpec, key string) (ran, bool) {
	res := r.runJob(ctx, spec, key)
	if res.err != nil {
		row.fail(name, "%v", res.err)
		return res, false
	}
	record(row, res.job)
	if !strings.Contains(res.stdout, "selftest-done") {
		row.fail(name, "did not run to its end: %s", jobEnding(res.job))
		return res, false
	}
	return res, true
}

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

func (r *runner) cancelSession(ctx context.Context, id string) {
	r.cl.Client.CancelSession(context.WithoutCancel(ctx), &authorityv1.CancelSessionRequest{SessionId: id, Reason: "airlock selftest " + r.run + ": row done"})
}

func (r *runner) idempotency(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	jobPath, execPath := "/idem-"+r.run+"/job", "/idem-"+r.run+"/exec"
	jobCmd, execCmd := "echo selftest-acted", "echo selftest-acted"
	var policy *typesv1.NetworkPolicy
	if r.counter != nil {
		rule, err := r.counterRule()
		if err != nil {
			row.fail("external side", "%v", err)
			return
		}
		policy = allow([]*typesv1.AllowRule{rule})
		jobCmd, execCmd = r.counter.get(jobPath, 10), r.counter.get(execPath, 10)
	}
	spec := r.spec(class, sh(jobCmd)...)
	spec.NetworkPolicy = policy
	key := r.key(row, "job")
	first, err := r.submit(ctx, spec, key)
	if err != nil {
		row.fail("retried submission", "%v", err)
		return
	}
	again, err := r.submit(ctx, spec, key)
	if err != nil {
		row.fail("retried submission", "%v", err)
		return
	}
	id := first.GetJob().GetJobId()
	row.check("retried submission", again.GetJob().GetJobId() == id && !again.GetCreated(),
		"the same key returned job %s (created %v), the first was %s", again.GetJob().GetJobId(), again.GetCreated(), id)
	done := r.wait(ctx, id)
	if done.err != nil {
		row.fail("retried submission", "%v", done.err)
	} else {
		record(row, done.job)
	}

	sspec := r.spec(class)
	sspec.NetworkPolicy = policy
	s, err := r.session(ctx, sspec, r.key(row, "session"))
	if err != nil {
		row.fail("retried exec id", "create a session: %v", err)
		return
	}
	defer r.cancelSession(ctx, s.GetJobId())
	execID := "selftest-" + r.run + "-once"
	x1, err := r.exec(ctx, s.GetJobId(), execID, sh(execCmd)...)
	if err != nil {
		row.fail("retried exec id", "%v", err)
		return
	}
	x2, err := r.exec(ctx, s.GetJobId(), execID, sh(execCmd)...)
	if err != nil {
		row.fail("retried exec id", "%v", err)
		return
	}
	row.check("retried exec id", x1.created && !x2.created && x1.exec.GetSeq() == x2.exec.GetSeq() && x1.stdout == x2.stdout,
		"the retry returned exec seq %d (created %v), the first seq %d (created %v)", x2.exec.GetSeq(), x2.created, x1.exec.GetSeq(), x1.created)
	if r.counter == nil {
		row.skip("external side", "no --counter-listen: no external side to count")
		return
	}
	jh, eh := r.counter.count(jobPath), r.counter.count(execPath)
	row.check("external side", jh == 1 && eh == 1, "the counter saw %d request(s) from the retried job and %d from the retried exec; want 1 each", jh, eh)
}

func (r *runner) limits(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	mem := r.spec(class, sh(fmt.Sprintf("dd if=/dev/zero of=/dev/null bs=%d count=1 2>/dev/null && echo selftest-memory-unbounded", r.opts.MemoryProbe))...)
	mem.Resources.Deadline = durationpb.New(2 * time.Minute)
	pids := r.spec(class, "sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 30 & i=$((i+1)); done; echo selftest-pids-unbounded; kill $(jobs -p) 2>/dev/null; exit 0`, r.opts.PidsProbe))
	pids.Resources.Deadline = durationpb.New(2 * time.Minute)
	dl := r.spec(class, "sleep", "600")
	dl.Resources.Deadline = durationpb.New(r.opts.Deadline)
	res := r.runJobs(ctx, []*authorityv1.JobSpec{mem, pids, dl}, []string{r.key(row, "memory"), r.key(row, "pids"), r.key(row, "deadline")})

	if m := res[0]; m.err != nil {
		row.fail("memory", "%v", m.err)
	} else {
		record(row, m.job)
		limit := m.job.GetLimits().GetMemoryBytes()
		ok := m.job.GetResult().GetReason() == typesv1.TerminationReason_TERMINATION_REASON_OOM && !strings.Contains(m.stdout, "selftest-memory-unbounded")
		row.check("memory", ok, "a job allocating %s under the tenant's default memory limit (%s) ended %s", config.FormatByteSize(r.opts.MemoryProbe), config.FormatByteSize(limit), jobEnding(m.job))
	}
	if p := res[1]; p.err != nil {
		row.fail("pids", "%v", p.err)
	} else {
		record(row, p.job)
		limit := p.job.GetLimits().GetPids()
		peak := p.job.GetResult().GetUsage().GetPeakPids()
		// The peak is the runtime's count (under runsc, gVisor's host
		// tasks, bounded apart): reported, not judged. The fork refused
		// inside the sandbox is the proof.
		ok := p.job.GetResult().GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED && p.job.GetResult().GetExitCode() != 0 &&
			!strings.Contains(p.stdout, "selftest-pids-unbounded")
		row.verdict("pids", ok,
			fmt.Sprintf("a job starting %d processes under the tenant's default pids limit (%d) had a fork refused: ended %s (peak %d as the runtime counts)", r.opts.PidsProbe, limit, jobEnding(p.job), peak),
			fmt.Sprintf("a job started %d processes under the tenant's default pids limit (%d): ended %s, started them all %v", r.opts.PidsProbe, limit, jobEnding(p.job), strings.Contains(p.stdout, "selftest-pids-unbounded")))
	}
	if d := res[2]; d.err != nil {
		row.fail("deadline", "%v", d.err)
	} else {
		record(row, d.job)
		wall := d.job.GetResult().GetUsage().GetWallTime().AsDuration()
		ok := d.job.GetResult().GetReason() == typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT && wall < r.opts.Deadline+15*time.Second
		row.check("deadline", ok, "`sleep 600` with a %s deadline ended %s after %s", r.opts.Deadline, jobEnding(d.job), wall.Round(10*time.Millisecond))
	}
}

// exportFile is where the export row's job plants its fake key: in the
// patch and in /out.
const exportFile = "selftest-export.ini"

func (r *runner) export(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	if r.opts.PublishTo == "" || r.cl.Publisher == nil {
		row.skip("planted key", "not run: pass --publish-to REPO:BRANCH and --pipeline KIND/NAME (a dry run; nothing is published)")
		return
	}
	repo, branch, _ := strings.Cut(r.opts.PublishTo, ":")
	spec := r.spec(class, sh(`k=AKIA$(tr -dc A-Z2-7 </dev/urandom | head -c 16); printf '[default]\naws_access_key_id = %s\n' "$k" > /work/`+exportFile+
		` && cp /work/`+exportFile+` /out/`+exportFile)...)
	spec.PublishTarget = &typesv1.PublishTarget{Repository: repo, Branch: branch}
	res := r.runJob(ctx, spec, r.key(row, "planted-key"))
	if res.err != nil {
		row.fail("planted key", "%v", res.err)
		return
	}
	record(row, res.job)
	j := res.job
	// The approval opens once the result is recorded.
	for end := time.Now().Add(30 * time.Second); j.GetApprovalId() == "" && time.Now().Before(end) && exited(j, 0); {
		time.Sleep(100 * time.Millisecond)
		got, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: j.GetJobId()})
		if err != nil {
			row.fail("planted key", "%v", err)
			return
		}
		j = got.GetJob()
	}
	if !exited(j, 0) || j.GetApprovalId() == "" {
		row.fail("planted key", "the job planting the key ended %s with approval %q; want exit 0 and an approval", jobEnding(j), j.GetApprovalId())
		return
	}
	// The approval stays pending (nobody approves it), so even a
	// publisher that ignored dry_run could push nothing.
	defer r.deny(ctx, j.GetApprovalId())
	resp, err := r.cl.Publisher.Publish(ctx, &publisherv1.PublishRequest{
		JobId: j.GetJobId(), ApprovalId: j.GetApprovalId(), IdempotencyKey: r.key(row, "dry-run"), DryRun: true,
	})
	if err != nil {
		row.fail("planted key", "the dry-run publish: %v", err)
		return
	}
	d := resp.GetDeployment()
	var rules []string
	planted := map[string]bool{}
	for _, f := range d.GetFindings() {
		rules = append(rules, f.GetRule()+" "+f.GetPath())
		if strings.HasPrefix(f.GetRule(), "secret.") && (f.GetPath() == exportFile || f.GetPath() == "/out/"+exportFile) {
			planted[f.GetPath()] = true
		}
	}
	ok := d.GetState() == publisherv1.DeploymentState_DEPLOYMENT_STATE_FAILED && planted[exportFile] && planted["/out/"+exportFile]
	row.check("planted key", ok, "the publisher's dry run of a result with a fake AWS key in %s and /out/%s: %s, findings %v",
		exportFile, exportFile, strings.ToLower(strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_")), rules)
	list, err := r.cl.Publisher.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{JobId: j.GetJobId()})
	row.check("nothing pushed", err == nil && len(list.GetDeployments()) == 0 && d.GetCommit() == "" && d.GetDeploymentId() == "",
		"the dry run recorded %d deployment(s) for job %s, commit %q (%v)", len(list.GetDeployments()), j.GetJobId(), d.GetCommit(), err)
}

func (r *runner) restart(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	if !r.opts.Disruptive {
		row.skip("executor restart", "not run: restarting the executor needs --disruptive (and --restart-command)")
		return
	}
	if r.opts.RestartCommand == "" {
		row.fail("executor restart", "--disruptive needs --restart-command, the command that restarts the executor")
		return
	}
	result := r.runJob(ctx, r.spec(class, "sh", "-c", "echo selftest-recorded > /out/result.txt"), r.key(row, "recorded"))
	if result.err != nil {
		row.fail("recorded results", "%v", result.err)
		return
	}
	record(row, result.job)
	digest := result.job.GetResult().GetBundleDigest()
	marker := "selftest-scratch-" + r.run
	s, err := r.session(ctx, r.spec(class), r.key(row, "session"))
	if err != nil {
		row.fail("scratch", "create a session: %v", err)
		return
	}
	defer r.cancelSession(ctx, s.GetJobId())
	if _, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-scratch", sh(split("M", marker)+`echo "$M" > /tmp/$M && echo "$M" > /work/$M`)...); err != nil {
		row.fail("scratch", "%v", err)
		return
	}

	r.progress("%s: running --restart-command", row.ID())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	out, err := exec.CommandContext(cctx, "sh", "-c", r.opts.RestartCommand).CombinedOutput()
	cancel()
	if err != nil {
		row.fail("executor restart", "--restart-command: %v: %s", err, strings.TrimSpace(string(out)))
		return
	}
	row.pass("executor restart", "--restart-command ran")

	// The authority may take a moment to reach the restarted executor.
	got, err := r.bundleDigest(ctx, result.job.GetJobId())
	for end := time.Now().Add(time.Minute); err != nil && status.Code(err) == codes.Unavailable && time.Now().Before(end); {
		time.Sleep(time.Second)
		got, err = r.bundleDigest(ctx, result.job.GetJobId())
	}
	row.check("recorded results", err == nil && got == digest && digest != "", "job %s's bundle after the restart: %s (recorded %s) %v", result.job.GetJobId(), got, digest, err)

	check := split("M", marker) + `for f in /tmp/$M /work/$M; do [ -e "$f" ] && echo "selftest-leftover $f"; done; ` +
		`git -C /work status --porcelain | sed 's/^/selftest-dirty /'; echo "selftest-head $(git -C /work rev-parse HEAD)"; echo selftest-done`
	fresh := r.runJob(ctx, r.spec(class, sh(check)...), r.key(row, "after"))
	if fresh.err != nil {
		row.fail("retained source", "%v", fresh.err)
		return
	}
	record(row, fresh.job)
	head := lines(fresh.stdout, "selftest-head ")
	row.check("retained source", strings.Contains(fresh.stdout, "selftest-done") && len(lines(fresh.stdout, "selftest-dirty ")) == 0 && len(head) == 1 && head[0] == fresh.job.GetCommit(),
		"a job after the restart saw /work at %v, clean: %v (want commit %s)", head, len(lines(fresh.stdout, "selftest-dirty ")) == 0, fresh.job.GetCommit())
	left := lines(fresh.stdout, "selftest-leftover ")
	row.check("scratch in a new job", len(left) == 0, "a new job after the restart found %v of the session's scratch", left)
	sess, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: s.GetJobId()})
	if err != nil {
		row.fail("scratch in the session", "%v", err)
		return
	}
	st := sess.GetJob().GetState()
	if terminal(st) {
		row.pass("scratch in the session", "the session that wrote scratch ended with the restart: %s", jobEnding(sess.GetJob()))
		return
	}
	// A session the restart kept is suspended: resumed, it has its /work
	// changes and /out, never its /tmp.
	if got, err := r.cl.Client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: s.GetJobId()}); err == nil && got.GetSuspended() {
		if _, err := r.cl.Client.ResumeSession(ctx, &authorityv1.ResumeSessionRequest{SessionId: s.GetJobId()}); err != nil {
			row.fail("scratch in the session", "resume the session the restart suspended: %v", err)
			return
		}
		if _, err := r.waitRunning(ctx, s.GetJobId()); err != nil {
			row.fail("scratch in the session", "%v", err)
			return
		}
	}
	x, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-after-restart", sh(split("M", marker)+
		`[ -e /tmp/$M ] && echo "selftest-leftover /tmp/$M"; [ -e /work/$M ] && echo "selftest-kept /work/$M"; echo selftest-done`)...)
	if err != nil {
		row.fail("scratch in the session", "the session is %s after the restart, and an exec in it failed: %v", st, err)
		return
	}
	left = lines(x.stdout, "selftest-leftover ")
	row.check("scratch in the session", strings.Contains(x.stdout, "selftest-done") && len(left) == 0,
		"the session kept across the restart has %v of its scratch (and kept %v of /work)", left, lines(x.stdout, "selftest-kept "))
}

// bundleDigest is the digest the authority streams job id's bundle
// under, read from the stream's header and checked at its end.
func (r *runner) bundleDigest(ctx context.Context, id string) (string, error) {
	stream, err := r.cl.Client.DownloadBundle(ctx, &authorityv1.DownloadBundleRequest{JobId: id})
	if err != nil {
		return "", err
	}
	var header string
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return "", errors.New("the stream ended without its verified digest")
		}
		if err != nil {
			return "", err
		}
		if h := msg.GetHeader(); h != nil {
			header = h.GetBundleDigest()
		}
		if v := msg.GetVerifiedDigest(); v != "" {
			if v != header {
				return "", fmt.Errorf("header %s, verified %s", header, v)
			}
			return v, nil
		}
	}
}
