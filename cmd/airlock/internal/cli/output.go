package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// A job's or an exec's output as it streams, and a job's outcome: how
// job submit --wait, job watch and the session commands follow a run to
// its end, show it and turn it into the exit status.

// streamHelp says, for the commands that stream a job's output, what
// reaches the terminal.
const streamHelp = `On a terminal the job's output is shown with control characters, invalid
UTF-8 and invisible or bidi runes escaped (\x1b, \x9b, \u202e, each in
reverse video; with TERM=dumb or NO_COLOR set, between the marks ⟦ ⟧), so
it cannot move the cursor, rewrite the screen or set the clipboard; a
backslash is shown as itself. --raw copies its bytes unchanged. To a pipe
or a file the output is always the job's bytes unchanged: they are data
there. The [airlock] status lines and the summary are always escaped.`

// watchJob streams a job's output to stdout/stderr until it ends and
// returns the final job. A dropped stream is resumed from the last offsets.
func watchJob(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient, jobID string, raw bool) (*authorityv1.Job, error) {
	out := newOutputSink(g, raw)
	defer out.flush()
	return followJob(ctx, g, client, func() *authorityv1.WatchJobRequest {
		return &authorityv1.WatchJobRequest{
			JobId:        jobID,
			StdoutOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDOUT),
			StderrOffset: out.offset(typesv1.OutputStream_OUTPUT_STREAM_STDERR),
		}
	}, func(msg *authorityv1.WatchJobResponse) error {
		if o := msg.GetOutput(); o != nil {
			out.write(o)
		}
		return nil
	})
}

// followJob watches a job until it ends and returns the final job, saying
// each state it reaches on stderr and handing every other event to handle.
// A dropped stream is watched again with request's answer then, which
// resumes where handle got to.
func followJob(ctx context.Context, g *globals, client authorityv1.AuthorityServiceClient,
	request func() *authorityv1.WatchJobRequest, handle func(*authorityv1.WatchJobResponse) error) (*authorityv1.Job, error) {
	var last *authorityv1.Job
	var printed authorityv1.JobState
	for attempt := 0; ; attempt++ {
		stream, err := client.WatchJob(ctx, request())
		if err != nil {
			return nil, err
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				if last != nil && terminal(last.GetState()) {
					return last, nil
				}
				break // ended early: reconnect
			}
			if err != nil {
				if status.Code(err) == codes.Unavailable && attempt < 10 {
					break
				}
				return nil, err
			}
			if j := msg.GetJob(); j != nil {
				last = j
				if g.Output == "text" && j.GetState() != printed {
					fmt.Fprintf(g.Stderr, "[airlock] %s\n", jobStateWord(j.GetState()))
					printed = j.GetState()
				}
				continue
			}
			if err := handle(msg); err != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}

// outputSink copies a watched job's or exec's output streams to the
// terminal or pipe, resuming from what it has written after a reconnect.
type outputSink struct {
	g       *globals
	outs    map[typesv1.OutputStream]io.Writer
	offsets map[typesv1.OutputStream]int64
}

func newOutputSink(g *globals, raw bool) *outputSink {
	stdout := g.Stdout
	if g.Output == "json" {
		stdout = g.Stderr // stdout carries the JSON result
	}
	return &outputSink{g: g, offsets: map[typesv1.OutputStream]int64{}, outs: map[typesv1.OutputStream]io.Writer{
		typesv1.OutputStream_OUTPUT_STREAM_STDOUT: jobOutput(stdout, raw),
		typesv1.OutputStream_OUTPUT_STREAM_STDERR: jobOutput(g.Stderr, raw),
	}}
}

// offset is how much of stream has been written: where a watch resumes.
func (s *outputSink) offset(stream typesv1.OutputStream) int64 { return s.offsets[stream] }

// write copies one chunk, unless a reconnect sent it again, and says when
// its stream was cut at its size cap.
func (s *outputSink) write(o *typesv1.OutputChunk) {
	w, ok := s.outs[o.GetStream()]
	if !ok || o.GetOffset() < s.offsets[o.GetStream()] {
		return
	}
	w.Write(o.GetData())
	s.offsets[o.GetStream()] = o.GetOffset() + int64(len(o.GetData()))
	if o.GetTruncated() {
		flushOutput(w)
		fmt.Fprintf(s.g.Stderr, "\n[airlock] %s truncated at its size cap\n", streamWord(o.GetStream()))
	}
}

// flush writes what the escaping writers hold back.
func (s *outputSink) flush() {
	for _, w := range s.outs {
		flushOutput(w)
	}
}

// jobOutput is where a job's output stream headed for w is copied: the
// file under w when it is not a terminal, or raw, else an escaping writer.
func jobOutput(w io.Writer, raw bool) io.Writer {
	if raw || !isTerminal(w) {
		return termtext.Unwrap(w)
	}
	return termtext.NewWriter(w)
}

// flushOutput writes what a jobOutput writer holds back: the end of a
// rune or line the stream never completed.
func flushOutput(w io.Writer) {
	if tw, ok := w.(*termtext.Writer); ok {
		tw.Flush()
	}
}

// isTerminal reports whether w (or what a termtext writer wraps) is a
// terminal.
func isTerminal(w io.Writer) bool {
	f, ok := termtext.Unwrap(w).(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// textWriter is where text for people headed for w goes: on a terminal a
// termtext.Terminal, which shows each escape highlighted; elsewhere, or
// where the terminal cannot highlight (TERM=dumb) or the user asked for
// no styling (NO_COLOR), w itself, where each escape stands between
// termtext's marks.
func textWriter(w io.Writer) io.Writer {
	if !isTerminal(w) || os.Getenv("TERM") == "dumb" || os.Getenv("NO_COLOR") != "" {
		return w
	}
	return termtext.NewTerminal(w)
}

// flushText writes what a textWriter holds back.
func flushText(w io.Writer) {
	if t, ok := w.(*termtext.Terminal); ok {
		t.Flush()
	}
}

func terminal(s authorityv1.JobState) bool {
	return s == authorityv1.JobState_JOB_STATE_FINISHED || s == authorityv1.JobState_JOB_STATE_FAILED || s == authorityv1.JobState_JOB_STATE_CANCELLED
}

// finishWait prints the summary and turns the job's outcome into our exit code.
func finishWait(g *globals, job *authorityv1.Job) error {
	if err := g.PrintProto(job, func(w io.Writer) { writeSummary(g.Stderr, job) }); err != nil {
		return err
	}
	code := exitCodeOf(job)
	if code == 0 {
		return nil
	}
	return &exitError{code: code, err: remoteError{fmt.Errorf("job %s: %s", job.GetJobId(), outcome(job))}}
}

func exitCodeOf(job *authorityv1.Job) int {
	r := job.GetResult()
	switch {
	case job.GetState() == authorityv1.JobState_JOB_STATE_CANCELLED:
		return 130
	case job.GetState() == authorityv1.JobState_JOB_STATE_FAILED || r == nil:
		return 1
	}
	switch r.GetReason() {
	case typesv1.TerminationReason_TERMINATION_REASON_FINISHED:
		return 0 // a session its client finished
	case typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT, typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT:
		return 124
	case typesv1.TerminationReason_TERMINATION_REASON_OOM:
		return 137
	case typesv1.TerminationReason_TERMINATION_REASON_EXITED, typesv1.TerminationReason_TERMINATION_REASON_DISK_FULL:
		if r.GetExitCode() >= 0 && r.GetExitCode() < 256 {
			if r.GetExitCode() == 0 && r.GetReason() == typesv1.TerminationReason_TERMINATION_REASON_DISK_FULL {
				return 1
			}
			return int(r.GetExitCode())
		}
	}
	return 1
}

func outcome(job *authorityv1.Job) string {
	r := job.GetResult()
	s := jobStateWord(job.GetState())
	if reason := reasonWord(r.GetReason()); r != nil && reason != s {
		s += ", " + reason
		if r.GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED {
			s += fmt.Sprintf(" with status %d", r.GetExitCode())
		}
	}
	switch m := job.GetMessage(); {
	case m == "" || strings.Contains(s, m):
	case strings.HasPrefix(m, s+" ") || strings.HasPrefix(m, s+";") || strings.HasPrefix(m, s+":"):
		s = m // "cancelled by client/dev", not "cancelled: cancelled by client/dev"
	default:
		s += ": " + m
	}
	if m := r.GetMessage(); m != "" && m != job.GetMessage() && !strings.Contains(s, m) {
		s += " (" + m + ")"
	}
	return s
}

// writeUser says who a granted job runs as, and on which image.
func writeUser(w io.Writer, job *authorityv1.Job) {
	if ju := job.GetUser(); ju != nil {
		u := runspec.User{UID: ju.GetUid(), GID: ju.GetGid()}
		fmt.Fprintf(w, "user       %s (%s)\n", u.Name(), u)
	}
	if img := job.GetImage(); img != nil {
		fmt.Fprintf(w, "image      %s/%s@%s (asked as %s, %s)\n", termtext.Line(img.GetRegistry()), termtext.Line(img.GetRepository()),
			termtext.Line(img.GetDigest()), termtext.Line(img.GetName()), humanBytes(img.GetSizeBytes()))
	} else if job.GetUser() != nil {
		fmt.Fprintf(w, "image      host template\n")
	}
}

// writeWith says what a job or session asked to run beside it in its
// sandbox (its spec's with), and the brokered credentials its egress proxy
// adds (by name; it never holds them), when any.
func writeWith(w io.Writer, job *authorityv1.Job) {
	if with := job.GetSpec().GetWith(); len(with) > 0 {
		fmt.Fprintf(w, "with       %s\n", termtext.Line(strings.Join(with, ", ")))
	}
	if creds := job.GetSpec().GetCredentials(); len(creds) > 0 {
		fmt.Fprintf(w, "credentials %s (brokered: added by the egress proxy, never held by the job)\n", termtext.Line(strings.Join(creds, ", ")))
	}
}

// runtimeVersionText is a result's runtime version as a line shows it:
// its first part (the runtime's own version line), and "emulated" when a
// VM ran under QEMU's software emulation rather than KVM.
func runtimeVersionText(v string) string {
	first, _, _ := strings.Cut(v, ";")
	first = termtext.Line(first)
	if strings.Contains(v, "accel tcg") {
		first += ", emulated"
	}
	return first
}

// writeUsage prints what a run used: cpu, memory, wall time, disk, time
// asleep and network bytes.
func writeUsage(w io.Writer, r *typesv1.RunResult) {
	u := r.GetUsage()
	fmt.Fprintf(w, "usage      cpu %s, peak memory %s, wall %s, disk %s\n",
		u.GetCpuTime().AsDuration().Round(time.Millisecond), humanBytes(u.GetPeakMemoryBytes()),
		u.GetWallTime().AsDuration().Round(time.Millisecond), humanBytes(u.GetDiskBytes()))
	if asleep := u.GetAsleepTime().AsDuration(); asleep > 0 {
		fmt.Fprintf(w, "awake      %s, asleep or suspended %s\n", u.GetAwakeTime().AsDuration().Round(time.Millisecond), asleep.Round(time.Millisecond))
	}
	if u.GetNetworkSentBytes() > 0 || u.GetNetworkReceivedBytes() > 0 {
		fmt.Fprintf(w, "network    %s sent, %s received\n", humanBytes(u.GetNetworkSentBytes()), humanBytes(u.GetNetworkReceivedBytes()))
	}
}

func writeSummary(w io.Writer, job *authorityv1.Job) {
	r := job.GetResult()
	fmt.Fprintf(w, "\njob        %s\n", termtext.Line(job.GetJobId()))
	fmt.Fprintf(w, "outcome    %s\n", termtext.Line(outcome(job)))
	if r == nil {
		return
	}
	writeUsage(w, r)
	ds := r.GetDiffStat()
	if t := job.GetSpec().GetPublishTarget(); t != nil {
		fmt.Fprintf(w, "publish to %s:%s (after approval)\n", termtext.Line(t.GetRepository()), termtext.Line(t.GetBranch()))
	}
	if id := termtext.Line(job.GetApprovalId()); id != "" {
		fmt.Fprintf(w, "approval   %s (airlock approval show %s --as approver/NAME)\n", id, id)
	}
	fmt.Fprintf(w, "changes    %d files, +%d -%d\n", ds.GetFilesChanged(), ds.GetInsertions(), ds.GetDeletions())
	fmt.Fprintf(w, "runtime    %s (%s), template %s\n", runtimeClassWord(r.GetRuntimeClass()),
		runtimeVersionText(r.GetRuntimeVersion()), termtext.Line(r.GetTemplateVersion()))
	if img := r.GetImage(); img != "" {
		fmt.Fprintf(w, "image      %s\n", termtext.Line(img))
	}
	if r.GetBundleDigest() != "" {
		fmt.Fprintf(w, "bundle     %s (%s)\n", termtext.Line(r.GetBundleDigest()), humanBytes(r.GetBundleSize()))
	}
	writeCacheUses(w, r)
}
