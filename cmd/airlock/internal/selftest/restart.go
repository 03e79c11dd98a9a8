package selftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// restartPrep is what one class's restart row set up before the restart:
// a finished job and a session with scratch and a /work write.
type restartPrep struct {
	row     *Row
	class   typesv1.RuntimeClass
	result  ran
	digest  string
	session string
	marker  string
}

// restartRows runs the restart row for every class with one executor
// restart: each class sets up its job and session, --restart-command
// runs once, then each class checks what survived.
func (r *runner) restartRows(ctx context.Context, classes []typesv1.RuntimeClass) []*Row {
	var rows []*Row
	var preps []*restartPrep
	for _, class := range classes {
		row := &Row{Name: "restart", Runtime: classWord(class)}
		rows = append(rows, row)
		if p := r.restartPrepare(ctx, row, class); p != nil {
			preps = append(preps, p)
		}
	}
	if len(preps) == 0 {
		return rows
	}
	for _, p := range preps {
		defer r.cancelSession(ctx, p.session)
	}
	r.progress("restart: running --restart-command (once for %d runtime class(es))", len(preps))
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	out, err := exec.CommandContext(cctx, "sh", "-c", r.opts.RestartCommand).CombinedOutput()
	cancel()
	for _, p := range preps {
		if err != nil {
			p.row.fail("executor restart", "--restart-command: %v: %s", err, strings.TrimSpace(string(out)))
			continue
		}
		p.row.pass("executor restart", "--restart-command ran (once this run)")
		r.restartCheck(ctx, p)
	}
	return rows
}

func (r *runner) restartPrepare(ctx context.Context, row *Row, class typesv1.RuntimeClass) *restartPrep {
	if !r.opts.Disruptive {
		row.skip("executor restart", "not run: restarting the executor needs --disruptive (and --restart-command)")
		return nil
	}
	if r.opts.RestartCommand == "" {
		row.fail("executor restart", "--disruptive needs --restart-command, the command that restarts the executor")
		return nil
	}
	result := r.runJob(ctx, r.spec(class, "sh", "-c", "echo selftest-recorded > /out/result.txt"), r.key(row, "recorded"))
	if result.err != nil {
		row.fail("recorded results", "%v", result.err)
		return nil
	}
	record(row, result.job)
	p := &restartPrep{row: row, class: class, result: result, digest: result.job.GetResult().GetBundleDigest(), marker: "selftest-scratch-" + r.run}
	s, err := r.session(ctx, r.spec(class), r.key(row, "session"))
	if err != nil {
		row.fail("scratch", "create a session: %v", err)
		return nil
	}
	p.session = s.GetJobId()
	record(row, s)
	x, err := r.exec(ctx, s.GetJobId(), "selftest-"+r.run+"-"+row.Runtime+"-scratch", sh(split("M", p.marker)+`echo "$M" > /tmp/$M && echo "$M" > /work/$M && echo selftest-done`)...)
	if err == nil && !strings.Contains(x.stdout, "selftest-done") {
		err = fmt.Errorf("the session could not write its scratch and /work: %s", ending(x.exec.GetReason(), x.exec.GetExitCode(), x.exec.GetMessage()))
	}
	if err != nil {
		r.cancelSession(ctx, s.GetJobId())
		row.fail("scratch", "%v", err)
		return nil
	}
	return p
}

func (r *runner) restartCheck(ctx context.Context, p *restartPrep) {
	row, class, marker, result, digest := p.row, p.class, p.marker, p.result, p.digest
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
	sess, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: p.session})
	if err != nil {
		row.fail("scratch in the session", "%v", err)
		return
	}
	st := sess.GetJob().GetState()
	if terminal(st) {
		row.pass("scratch in the session", "the session that wrote scratch ended with the restart: %s", jobEnding(sess.GetJob()))
		row.skip("retained source in the session", "the session ended with the restart: no kept /work to check")
		return
	}
	// A session the restart kept is suspended: resumed, it has its /work
	// changes and /out, never its /tmp.
	if got, err := r.cl.Client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: p.session}); err == nil && got.GetSuspended() {
		if _, err := r.cl.Client.ResumeSession(ctx, &authorityv1.ResumeSessionRequest{SessionId: p.session}); err != nil {
			row.fail("scratch in the session", "resume the session the restart suspended: %v", err)
			return
		}
		if _, err := r.waitRunning(ctx, p.session); err != nil {
			row.fail("scratch in the session", "%v", err)
			return
		}
	}
	x, err := r.exec(ctx, p.session, "selftest-"+r.run+"-"+row.Runtime+"-after-restart", sh(split("M", marker)+
		`[ -e /tmp/$M ] && echo "selftest-leftover /tmp/$M"; grep -qxF "$M" /work/$M 2>/dev/null && echo "selftest-kept /work/$M"; echo selftest-done`)...)
	if err != nil {
		row.fail("scratch in the session", "the session is %s after the restart, and an exec in it failed: %v", st, err)
		return
	}
	left = lines(x.stdout, "selftest-leftover ")
	done := strings.Contains(x.stdout, "selftest-done")
	row.check("scratch in the session", done && len(left) == 0, "the session kept across the restart has %v of its /tmp scratch", left)
	kept := lines(x.stdout, "selftest-kept ")
	row.check("retained source in the session", done && len(kept) == 1, "the session kept across the restart has its /work write: %v", kept)
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
