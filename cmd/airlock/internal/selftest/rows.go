package selftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/config"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
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

// searchTools are what a probe's search needs; a missing one fails the
// check, never reads as "nothing found".
const searchTools = `for t in grep head timeout sed env; do command -v "$t" >/dev/null 2>&1 || echo "selftest-missing-tool $t"; done; `

// search is shell text that greps / for the patterns (shell words)
// within a minute, printing "PREFIX PATH" per file found, then
// "selftest-search-exit N" with grep's (or timeout's) status.
func search(prefix, patterns string) string {
	return `timeout 60 grep -rslF ` + searchExcludes + ` ` + patterns + ` / 2>/dev/null | sed 's/^/` + prefix + ` /'; ` +
		`echo "selftest-search-exit ${PIPESTATUS[0]}"; `
}

// searchWorked says whether a search ran over all of / and found its own
// control file: grep's status 0 (found) or 2 (some file unreadable), not
// 124 (timed out) or 126/127 (missing), and no missing tool.
func searchWorked(out string, found []string, control string) (bool, string) {
	if miss := lines(out, "selftest-missing-tool "); len(miss) > 0 {
		return false, "the job lacks " + strings.Join(miss, ", ") + ": nothing was searched"
	}
	exit := lines(out, "selftest-search-exit ")
	if len(exit) != 1 || (exit[0] != "0" && exit[0] != "2") {
		return false, fmt.Sprintf("the search of / did not complete (status %v; 124 is a timeout)", exit)
	}
	if !contains(found, control) {
		return false, "the search of / did not find the control file " + control + " the job planted itself"
	}
	return true, ""
}

// without is list without s.
func without(list []string, s string) []string {
	var out []string
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

// markerDirs are where the earlier job writes its marker, as shell words.
var markerDirs = []string{"/tmp", `"$HOME"`, "/work", "/out"}

func (r *runner) isolation(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	marker, cred, ctl := "selftest-marker-"+r.run, "selftest-cred-"+r.run, "selftest-control-"+r.run
	var paths strings.Builder
	for _, p := range r.opts.SecretPaths {
		paths.WriteString(" " + quote(p))
	}
	// The control file holds the dummy secret's content inside the job
	// itself: the job's own search must find it, or the search proved
	// nothing.
	control := "/tmp/" + ctl + "-planter"
	planter := split("M", marker) + split("S", r.secret()) + searchTools +
		`for f in /tmp/$M "$HOME/$M" /work/$M /out/$M; do if echo "$M" > "$f"; then echo "selftest-wrote $f"; else echo "selftest-unwritten $f"; fi; done 2>/dev/null; ` +
		`if printf 'https://selftest:%s@selftest.invalid\n' "$SELFTEST_CRED" > "$HOME/.git-credentials"; then echo "selftest-wrote $HOME/.git-credentials"; else echo "selftest-unwritten $HOME/.git-credentials"; fi 2>/dev/null; ` +
		`for p in` + paths.String() + ` /nonexistent-selftest; do head -c1 -- "$p" >/dev/null 2>&1 && echo "selftest-secret-visible $p"; done; ` +
		`echo "$S" > ` + control + `; ` +
		search("selftest-secret-found", `-e "$S"`) +
		`echo selftest-done`
	spec := r.spec(class, sh(planter)...)
	spec.Env["SELFTEST_CRED"] = cred
	first, ok := r.probe(ctx, row, "earlier job", spec, r.key(row, "planter"))
	if !ok {
		return
	}
	wrote, unwritten := lines(first.stdout, "selftest-wrote "), lines(first.stdout, "selftest-unwritten ")
	row.verdict("earlier job", len(wrote) == len(markerDirs)+1 && len(unwritten) == 0,
		"wrote its markers and a credential to "+strings.Join(wrote, ", "),
		fmt.Sprintf("could not write %v (wrote %v): a leftover there would go unseen", unwritten, wrote))
	found := lines(first.stdout, "selftest-secret-found ")
	searched, why := searchWorked(first.stdout, found, control)
	seen := append(lines(first.stdout, "selftest-secret-visible "), without(found, control)...)
	switch {
	case len(r.opts.SecretPaths) == 0:
		row.skip("dummy secret", "no secret to look for: pass --secret-path FILE (a file on the executor host), or --on-executor-host when this machine is the executor host")
	case len(seen) > 0:
		row.fail("dummy secret", "a job read %v of %s", seen, strings.Join(r.opts.SecretPaths, ", "))
	case !searched:
		row.fail("dummy secret", "%s", why)
	default:
		row.pass("dummy secret", "no job could read %s, nor find its content under / (its own control file found)", strings.Join(r.opts.SecretPaths, ", "))
	}

	// The new job plants a control of its own, and looks in each place
	// directly beside the search.
	control = "/tmp/" + ctl + "-checker"
	checker := split("M", marker) + split("C", cred) + split("N", ctl) + searchTools +
		`for f in /tmp/$M "$HOME/$M" /work/$M /out/$M; do [ -e "$f" ] && echo "selftest-leftover $f"; done; ` +
		`grep -qF "$C" "$HOME/.git-credentials" 2>/dev/null && echo "selftest-leftover $HOME/.git-credentials"; ` +
		`echo "$N" > ` + control + `; ` +
		search("selftest-found", `-e "$M" -e "$C" -e "$N"`) +
		`env | grep -qF "$C" && echo "selftest-leftover environment"; ` +
		`echo selftest-done`
	second, ok := r.probe(ctx, row, "new job", r.spec(class, sh(checker)...), r.key(row, "checker"))
	if !ok {
		return
	}
	if e1, e2 := first.job.GetExecutor(), second.job.GetExecutor(); e1 != e2 {
		// On a fleet the new job may land elsewhere, where the earlier
		// one's leftovers could never be: once more, then skip.
		second, ok = r.probe(ctx, row, "new job", r.spec(class, sh(checker)...), r.key(row, "checker-again"))
		if !ok {
			return
		}
		if e3 := second.job.GetExecutor(); e3 != e1 {
			row.skip("earlier job's files and credentials", "the new job ran on executor %s, the earlier one on %s (twice): nothing to compare on one host", e3, e1)
			return
		}
	}
	found = lines(second.stdout, "selftest-found ")
	searched, why = searchWorked(second.stdout, found, control)
	left := append(lines(second.stdout, "selftest-leftover "), without(found, control)...)
	switch {
	case len(left) > 0:
		row.fail("earlier job's files and credentials", "a new job found the earlier job's %v", left)
	case !searched:
		row.fail("earlier job's files and credentials", "%s", why)
	default:
		row.pass("earlier job's files and credentials", "a new job on the same executor found none of the earlier job's files (/tmp, $HOME, /work, /out) or credentials, looking in each place and searching / (its own control file found)")
	}
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

func (r *runner) cancelSession(ctx context.Context, id string) {
	r.cl.Client.CancelSession(context.WithoutCancel(ctx), &authorityv1.CancelSessionRequest{SessionId: id, Reason: "airlock selftest " + r.run + ": row done"})
}

func (r *runner) idempotency(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	jobCmd, execCmd := "echo selftest-acted", "echo selftest-acted"
	var policy *typesv1.NetworkPolicy
	var jobPath, execPath string
	if r.counter != nil {
		jobPath, execPath = r.counter.path("idempotency-job"), r.counter.path("idempotency-exec")
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
	record(row, s)
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
	// Each fork that worked says so; the refused one's message (stderr,
	// joined to stdout) must name the fork: any other failure proves no
	// bound.
	pids := r.spec(class, "sh", "-c", fmt.Sprintf(`exec 2>&1; i=0; while [ $i -lt %d ]; do sleep 30 & i=$((i+1)); echo "selftest-forked $i"; done; echo selftest-pids-unbounded; kill $(jobs -p) 2>/dev/null; exit 0`, r.opts.PidsProbe))
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
		forked := len(lines(p.stdout, "selftest-forked "))
		refused := forkRefused(p.stdout)
		ok := p.job.GetResult().GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED && p.job.GetResult().GetExitCode() != 0 &&
			forked > 0 && refused && !strings.Contains(p.stdout, "selftest-pids-unbounded")
		row.verdict("pids", ok,
			fmt.Sprintf("a job starting %d processes under the tenant's default pids limit (%d) started %d, then had a fork refused: ended %s (peak %d as the runtime counts)", r.opts.PidsProbe, limit, forked, jobEnding(p.job), peak),
			fmt.Sprintf("a job starting %d processes under the tenant's default pids limit (%d) started %d, a fork refused %v: ended %s, started them all %v", r.opts.PidsProbe, limit, forked, refused, jobEnding(p.job), strings.Contains(p.stdout, "selftest-pids-unbounded")))
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

// forkRefused says whether a shell's output reports a refused fork
// (EAGAIN): dash's "Cannot fork", busybox's "can't fork", bash's "fork:
// retry" or the error's own text.
func forkRefused(out string) bool {
	o := strings.ToLower(out)
	return strings.Contains(o, "cannot fork") || strings.Contains(o, "can't fork") || strings.Contains(o, "fork: retry") ||
		strings.Contains(o, "resource temporarily unavailable")
}
