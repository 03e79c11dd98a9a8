package runs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// TestExecStdinStream streams stdin into execs of a real session: 5 MiB
// through sha256sum, the record showing what was given; a stream past
// the limit refused and its exec cancelled; a re-attach that neither runs
// the exec again nor may feed it; an exec whose stdin is never closed
// ended by its own timeout. Under runc and runsc.
func TestExecStdinStream(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) { testExecStdinStream(t, class) })
	}
}

func testExecStdinStream(t *testing.T, class sandbox.Class) {
	h, _ := newHarness(t, false)
	sid := h.startSession(t, h.sessionGrant(class, time.Minute))
	stream := func(x ExecSpec) ExecSpec { x.StdinStream = true; return x }

	t.Run("5MiB through sha256sum", func(t *testing.T) {
		data := make([]byte, 5<<20)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		want := hex.EncodeToString(sum[:])
		// The side effect counts runs: a second run would append a line.
		x := stream(sh("digest", "echo run >> /work/digest-runs; sha256sum"))
		rec, created, stdin, err := h.m.RunExec(context.Background(), sid, x)
		if err != nil || !created || stdin == nil {
			t.Fatalf("RunExec: created %v, stdin %v, %v", created, stdin != nil, err)
		}
		if !rec.Spec.StdinStream || rec.StdinSHA256 != "" {
			t.Fatalf("a streamed exec's first record: stdin_stream %v, stdin_sha256 %q", rec.Spec.StdinStream, rec.StdinSHA256)
		}
		for b := bytes.NewReader(data); b.Len() > 0; {
			chunk := make([]byte, min(b.Len(), 64<<10+7)) // not a multiple of the pipe's size
			b.Read(chunk)
			if err := stdin.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		stdin.Close()
		stdin.Close() // the half-close after close_stdin
		got := h.waitExec(t, sid, x.ID)
		if got.Reason != sandbox.ReasonExited || got.ExitCode != 0 || !strings.HasPrefix(string(got.StdoutTail), want) {
			t.Fatalf("sha256sum of 5 MiB: %s %d stdout %q, want %s", got.Reason, got.ExitCode, got.StdoutTail, want)
		}
		if got.StdinSize != int64(len(data)) || got.StdinSHA256 != want {
			t.Fatalf("the record's stdin: %d bytes, %q; want %d, %s", got.StdinSize, got.StdinSHA256, len(data), want)
		}
		if err := stdin.Write([]byte("late")); err != nil {
			t.Fatalf("stdin after the exec ended is dropped, not refused: %v", err)
		}

		// The same id and spec attaches: no second run, and no stdin.
		again, created, stdin2, err := h.m.RunExec(context.Background(), sid, x)
		if err != nil || created || stdin2 != nil || again.Seq != got.Seq || again.StdinSHA256 != want {
			t.Fatalf("re-attach: created %v, stdin %v, seq %d (want %d), %v", created, stdin2 != nil, again.Seq, got.Seq, err)
		}
		// StartExec attaches too; a spec without the stream is another spec.
		if _, created, err := h.m.StartExec(context.Background(), sid, x); err != nil || created {
			t.Fatalf("StartExec attaching to a streamed exec: created %v, %v", created, err)
		}
		plain := x
		plain.StdinStream = false
		_, _, err = h.m.StartExec(context.Background(), sid, plain)
		wantRefusal(t, "the id without the stream", err, errdefs.ErrAlreadyExists, "spec.stdin_stream")
		runs := h.execWait(t, sid, sh("count", "cat /work/digest-runs"))
		if string(runs.StdoutTail) != "run\n" {
			t.Fatalf("the exec ran %q times, want once", runs.StdoutTail)
		}
	})

	t.Run("StartExec cannot start one", func(t *testing.T) {
		_, _, err := h.m.StartExec(context.Background(), sid, stream(sh("unfed", "cat")))
		wantRefusal(t, "StartExec of a streamed exec", err, errdefs.ErrFailedPrecondition, "spec.stdin_stream")
		x := stream(sh("both", "cat"))
		x.Stdin = []byte("x")
		_, _, _, err = h.m.RunExec(context.Background(), sid, x)
		wantRefusal(t, "bytes and a stream", err, errdefs.ErrInvalidArgument, "spec.stdin")
	})

	t.Run("past the limit", func(t *testing.T) {
		x := stream(sh("big", "cat > /dev/null; echo done"))
		_, _, stdin, err := h.m.RunExec(context.Background(), sid, x)
		if err != nil {
			t.Fatal(err)
		}
		chunk := make([]byte, 1<<20)
		for i := range MaxExecStdinStream / len(chunk) {
			if err := stdin.Write(chunk); err != nil {
				t.Fatalf("chunk %d, inside the limit: %v", i, err)
			}
		}
		err = stdin.Write([]byte{0})
		wantRefusal(t, "one byte past the limit", err, errdefs.ErrResourceExhausted, "stdin: more than 67108864 bytes")
		got := h.waitExec(t, sid, x.ID)
		if got.Reason != sandbox.ReasonCancelled || strings.Contains(string(got.StdoutTail), "done") ||
			!strings.Contains(got.Message, "streamed stdin passed") || got.StdinSize != MaxExecStdinStream {
			t.Fatalf("an exec given too much stdin: %s %q stdout %q stdin %d", got.Reason, got.Message, got.StdoutTail, got.StdinSize)
		}
	})

	t.Run("broken off", func(t *testing.T) {
		x := stream(sh("cut", "cat > /work/cut.txt; echo whole"))
		_, _, stdin, err := h.m.RunExec(context.Background(), sid, x)
		if err != nil {
			t.Fatal(err)
		}
		if err := stdin.Write([]byte("half of it")); err != nil {
			t.Fatal(err)
		}
		stdin.Abort("the call broke off")
		got := h.waitExec(t, sid, x.ID)
		if got.Reason != sandbox.ReasonCancelled || strings.Contains(string(got.StdoutTail), "whole") || !strings.Contains(got.Message, "the call broke off") {
			t.Fatalf("an exec whose call broke off with stdin open: %s %q stdout %q", got.Reason, got.Message, got.StdoutTail)
		}
	})

	t.Run("never closed", func(t *testing.T) {
		x := stream(sh("open", "cat"))
		x.Timeout = 2 * time.Second
		_, _, stdin, err := h.m.RunExec(context.Background(), sid, x)
		if err != nil {
			t.Fatal(err)
		}
		if err := stdin.Write([]byte("some, never closed\n")); err != nil {
			t.Fatal(err)
		}
		got := h.waitExec(t, sid, x.ID)
		if got.Reason != sandbox.ReasonTimeout || string(got.StdoutTail) != "some, never closed\n" || got.StdinSize != 19 {
			t.Fatalf("an exec whose stdin was never closed: %s %q stdout %q stdin %d", got.Reason, got.Message, got.StdoutTail, got.StdinSize)
		}
		if err := stdin.Write([]byte("more")); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatal(err)
		}
	})
}
