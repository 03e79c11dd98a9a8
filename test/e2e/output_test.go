//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// watched is everything one WatchJob stream delivered.
type watched struct {
	stdout, stderr []byte
	// truncated records the streams a chunk marked as cut at their cap.
	truncated map[typesv1.OutputStream]bool
	// final is the last job the stream sent.
	final *authorityv1.Job
}

// watchFrom follows job id from the given output offsets until the stream
// ends, checking that every chunk starts exactly where the stream's data so
// far ends. It returns an error instead of failing the test, so it may run
// in a goroutine.
func watchFrom(ctx context.Context, client authorityv1.AuthorityServiceClient, id string, stdoutFrom, stderrFrom int64) (watched, error) {
	w := watched{truncated: map[typesv1.OutputStream]bool{}}
	stream, err := client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: id, StdoutOffset: stdoutFrom, StderrOffset: stderrFrom})
	if err != nil {
		return w, err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if !terminalState(w.final.GetState()) {
				return w, fmt.Errorf("the watch of %s ended with the job %v", id, w.final.GetState())
			}
			return w, nil
		}
		if err != nil {
			return w, err
		}
		if j := msg.GetJob(); j != nil {
			w.final = j
			continue
		}
		o := msg.GetOutput()
		buf, from := &w.stdout, stdoutFrom
		if o.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDERR {
			buf, from = &w.stderr, stderrFrom
		}
		if want := from + int64(len(*buf)); o.GetOffset() != want {
			return w, fmt.Errorf("%v chunk at offset %d, want %d (a gap or an overlap)", o.GetStream(), o.GetOffset(), want)
		}
		*buf = append(*buf, o.GetData()...)
		if o.GetTruncated() {
			w.truncated[o.GetStream()] = true
		}
	}
}

func terminalState(s authorityv1.JobState) bool {
	return s == authorityv1.JobState_JOB_STATE_FINISHED || s == authorityv1.JobState_JOB_STATE_FAILED || s == authorityv1.JobState_JOB_STATE_CANCELLED
}

// outputCap is the executor's default cap on each of stdout and stderr.
const outputCap = 4 << 20

// TestOutputIsCappedAndMarked: a job that writes 6 MiB to stdout delivers
// exactly the cap, the CLI says the stream was cut, the bundle records it,
// and the job itself still finished with its own status. The second case
// fills the cap exactly, pauses so the watcher catches up, and only then
// writes past it: the cut happens with no byte left to carry the mark.
func TestOutputIsCappedAndMarked(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))

	for _, tc := range []struct {
		name, script string
	}{
		{"one burst", `head -c 6291456 /dev/zero | tr '\0' a; echo on-stderr >&2`},
		{"cap, pause, more", `head -c 4194304 /dev/zero | tr '\0' a; sleep 0.5; head -c 2097152 /dev/zero | tr '\0' b; echo on-stderr >&2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "--", "sh", "-c", tc.script)
			if res.code != 0 {
				t.Fatalf("exit %d, want 0 (the job's own status)\nstderr:\n%s", res.code, res.stderr)
			}
			if len(res.stdout) != outputCap || strings.Trim(res.stdout, "a") != "" {
				t.Errorf("the CLI's stdout has %d bytes (only 'a': %v), want exactly the cap of %d", len(res.stdout), strings.Trim(res.stdout, "a") == "", outputCap)
			}
			if !strings.Contains(res.stderr, "stdout truncated at its size cap") {
				t.Errorf("stderr does not say stdout was truncated:\n%s", res.stderr)
			}
			if strings.Contains(res.stderr, "stderr truncated") || !strings.Contains(res.stderr, "on-stderr") {
				t.Errorf("stderr, under its cap, should be whole and unmarked:\n%s", res.stderr)
			}

			m := regexp.MustCompile(`job (\S+) submitted`).FindStringSubmatch(res.stderr)
			if m == nil {
				t.Fatalf("no job id in stderr:\n%s", res.stderr)
			}
			job := s.job(t, m[1])
			r := job.GetResult()
			if job.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || r.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXITED || r.GetExitCode() != 0 {
				t.Fatalf("job %s: %v %v exit %d, want FINISHED EXITED 0", job.GetJobId(), job.GetState(), r.GetReason(), r.GetExitCode())
			}
			bundle, _ := fetchArtifact(t, s, job.GetJobId(), r.GetBundleDigest())
			if n := len(tarEntry(t, bundle, "stdout.log")); n != outputCap {
				t.Errorf("the bundle's stdout.log has %d bytes, want %d", n, outputCap)
			}
			var meta struct {
				StdoutTruncated bool `json:"stdout_truncated"`
				StderrTruncated bool `json:"stderr_truncated"`
			}
			if err := json.Unmarshal(tarEntry(t, bundle, "result.json"), &meta); err != nil {
				t.Fatal(err)
			}
			if !meta.StdoutTruncated || meta.StderrTruncated {
				t.Errorf("bundle result.json: stdout_truncated %v, stderr_truncated %v; want true, false", meta.StdoutTruncated, meta.StderrTruncated)
			}

			// A watcher that comes after the end is told of the cut as well.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w, err := watchFrom(ctx, client, job.GetJobId(), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(w.stdout) != outputCap || !w.truncated[typesv1.OutputStream_OUTPUT_STREAM_STDOUT] {
				t.Errorf("a later watch: %d stdout bytes, truncated %v; want %d and true", len(w.stdout), w.truncated[typesv1.OutputStream_OUTPUT_STREAM_STDOUT], outputCap)
			}
		})
	}
}

// TestWatchResumesFromOffsets: WatchJob from offset 0 delivers a job's
// output whole and in order; from a later offset, during the run or after
// it, exactly the rest.
func TestWatchResumesFromOffsets(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const lines = 50
	var wantOut, wantErr bytes.Buffer
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&wantOut, "line %03d of the numbered output\n", i)
		fmt.Fprintf(&wantErr, "err %03d\n", i)
	}
	const outFrom, errFrom = 100, 30
	resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "watch-offsets",
		Spec: &authorityv1.JobSpec{Repository: "sample", Revision: "main", Command: []string{"sh", "-c",
			`i=1; while [ $i -le 50 ]; do printf 'line %03d of the numbered output\n' $i; printf 'err %03d\n' $i >&2; i=$((i+1)); sleep 0.02; done`}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetJobId()

	// Both watches start while the job runs.
	type got struct {
		w   watched
		err error
	}
	full, mid := make(chan got, 1), make(chan got, 1)
	go func() { w, err := watchFrom(ctx, client, id, 0, 0); full <- got{w, err} }()
	go func() { w, err := watchFrom(ctx, client, id, outFrom, errFrom); mid <- got{w, err} }()

	check := func(what string, g got, wantOut, wantErr []byte) {
		t.Helper()
		if g.err != nil {
			t.Errorf("%s: %v", what, g.err)
			return
		}
		if !bytes.Equal(g.w.stdout, wantOut) {
			t.Errorf("%s: stdout is\n%q\nwant\n%q", what, g.w.stdout, wantOut)
		}
		if !bytes.Equal(g.w.stderr, wantErr) {
			t.Errorf("%s: stderr is\n%q\nwant\n%q", what, g.w.stderr, wantErr)
		}
		if f := g.w.final; f.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || f.GetResult().GetExitCode() != 0 {
			t.Errorf("%s: final job %v exit %d, want FINISHED 0", what, f.GetState(), f.GetResult().GetExitCode())
		}
	}
	g := <-full
	check("watch from 0 during the run", g, wantOut.Bytes(), wantErr.Bytes())
	if g.err == nil {
		if d := g.w.final.GetResult().GetUsage().GetWallTime().AsDuration(); d < 500*time.Millisecond {
			t.Errorf("the job ran %v; the watch may not have overlapped the run", d)
		}
	}
	check(fmt.Sprintf("watch from %d/%d during the run", outFrom, errFrom), <-mid, wantOut.Bytes()[outFrom:], wantErr.Bytes()[errFrom:])

	// The same after the end, and at the very end: nothing.
	w, err := watchFrom(ctx, client, id, outFrom, errFrom)
	check(fmt.Sprintf("watch from %d/%d after the end", outFrom, errFrom), got{w, err}, wantOut.Bytes()[outFrom:], wantErr.Bytes()[errFrom:])
	w, err = watchFrom(ctx, client, id, int64(wantOut.Len()), int64(wantErr.Len()))
	check("watch from the end", got{w, err}, nil, nil)
}
