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
