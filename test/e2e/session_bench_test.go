//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// createSession makes a session on repo and waits until it runs.
func createSession(ctx context.Context, b testing.TB, client authorityv1.AuthorityServiceClient, repo, key string) string {
	b.Helper()
	resp, err := client.CreateSession(ctx, &authorityv1.CreateSessionRequest{Tenant: "dev", IdempotencyKey: key,
		Spec: &authorityv1.JobSpec{Repository: repo, Revision: "main"}})
	if err != nil {
		b.Fatal(err)
	}
	id := resp.GetSession().GetJobId()
	for {
		r, err := client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: id})
		if err != nil {
			b.Fatal(err)
		}
		if r.GetSession().GetState() == authorityv1.JobState_JOB_STATE_RUNNING {
			return id
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// benchStack is a stack serving the repository "bench", a client/dev
// client of its authority, and a context for the benchmark's calls.
func benchStack(b *testing.B) (*stack, authorityv1.AuthorityServiceClient, context.Context) {
	s := startStack(b, "--repo", "bench="+benchRepo(b, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	b.Cleanup(cancel)
	return s, authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority")), ctx
}

// execWait runs argv in a session over the authority's API and returns its
// stdout once it has ended with status 0.
func execWait(ctx context.Context, client authorityv1.AuthorityServiceClient, sid, execID string, argv ...string) (string, error) {
	if _, err := client.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: execID, Argv: argv}}); err != nil {
		return "", err
	}
	stream, err := client.WatchExec(ctx, &authorityv1.WatchExecRequest{SessionId: sid, ExecId: execID})
	if err != nil {
		return "", err
	}
	return execStdout(execID, func() (*typesv1.OutputChunk, *typesv1.Exec, error) {
		msg, err := stream.Recv()
		return msg.GetOutput(), msg.GetExec(), err
	})
}

// execStdout reads an exec's events until its record and returns its
// stdout once it has ended with status 0.
func execStdout(execID string, next func() (*typesv1.OutputChunk, *typesv1.Exec, error)) (string, error) {
	var out []byte
	for {
		o, x, err := next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("exec %s: the stream ended without its record", execID)
		}
		if err != nil {
			return "", err
		}
		if o != nil && o.GetStream() == typesv1.OutputStream_OUTPUT_STREAM_STDOUT {
			out = append(out, o.GetData()...)
		}
		if x != nil {
			if x.GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXITED || x.GetExitCode() != 0 {
				return "", fmt.Errorf("exec %s: %v %d %s", execID, x.GetReason(), x.GetExitCode(), x.GetMessage())
			}
			return string(out), nil
		}
	}
}

// runExecWait is execWait in one RunExec call, as the CLI runs an exec.
func runExecWait(ctx context.Context, client authorityv1.AuthorityServiceClient, sid, execID string, argv ...string) (string, error) {
	stream, err := client.RunExec(ctx)
	if err != nil {
		return "", err
	}
	if err := stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{
		SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: execID, Argv: argv},
	}}}); err != nil {
		return "", err
	}
	if err := stream.CloseSend(); err != nil {
		return "", err
	}
	return execStdout(execID, func() (*typesv1.OutputChunk, *typesv1.Exec, error) {
		msg, err := stream.Recv()
		return msg.GetOutput(), msg.GetExec(), err
	})
}

// BenchmarkSessionTrue is `true` four ways, in one run: a fresh job end
// to end (via=job), an exec in a warm session end to end over mTLS
// through the authority to the executor, in one RunExec call (via=exec)
// and as StartExec then WatchExec (via=start+watch), and raw `runc exec`
// into the same session's container (via=raw). benchstat -col /via gives
// the ratios.
func BenchmarkSessionTrue(b *testing.B) {
	s, client, ctx := benchStack(b)
	if err := runTrue(ctx, client, "bench", "warm-up"); err != nil {
		b.Fatal(err)
	}
	sid := createSession(ctx, b, client, "bench", "bench-session")
	roots, _ := filepath.Glob(filepath.Join(s.dir, "*", "*", "sandbox", "runc"))
	if len(roots) == 0 {
		roots, _ = filepath.Glob(filepath.Join(s.dir, "*", "sandbox", "runc"))
	}
	if len(roots) != 1 {
		b.Fatalf("the executor's runc root under %s: found %v", s.dir, roots)
	}
	seq := 0
	b.Run("via=job", func(b *testing.B) {
		for range b.N {
			seq++
			if err := runTrue(ctx, client, "bench", fmt.Sprintf("true-%d", seq)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("via=exec", func(b *testing.B) {
		for range b.N {
			seq++
			if _, err := runExecWait(ctx, client, sid, fmt.Sprintf("true-%d", seq), "true"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("via=start+watch", func(b *testing.B) {
		for range b.N {
			seq++
			if _, err := execWait(ctx, client, sid, fmt.Sprintf("true-%d", seq), "true"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("via=raw", func(b *testing.B) {
		for range b.N {
			if out, err := exec.CommandContext(ctx, bin("runc"), "--root", roots[0], "exec", sid, "true").CombinedOutput(); err != nil {
				b.Fatalf("runc exec: %v: %s", err, out)
			}
		}
	})
}

// BenchmarkAgentLoop20 is a 20-step agent loop (write a file, run the
// test, read the result) in one session (via=session: create, 20 × upload,
// exec as one RunExec call, as the CLI and the MCP server make it,
// download, finish) against the same 20 steps as 20 jobs
// (via=jobs), in one run; via=host is the floor: the same 20 steps as
// this process's own file writes, `sh -c` and reads on the host, no
// sandbox and no RPC.
func BenchmarkAgentLoop20(b *testing.B) {
	_, client, ctx := benchStack(b)
	if err := runTrue(ctx, client, "bench", "warm-up"); err != nil {
		b.Fatal(err)
	}
	seq := 0
	b.Run("via=session", func(b *testing.B) {
		var steps []time.Duration
		for range b.N {
			seq++
			sid := createSession(ctx, b, client, "bench", fmt.Sprintf("loop-%d", seq))
			t0 := time.Now()
			for step := range 20 {
				if err := writeFile(ctx, client, sid, "/work/step.txt", fmt.Sprintf("step %d\n", step)); err != nil {
					b.Fatal(err)
				}
				if _, err := runExecWait(ctx, client, sid, fmt.Sprintf("s%d", step), "sh", "-c", "cat step.txt > /out/result.txt"); err != nil {
					b.Fatal(err)
				}
				if got, err := readFile(ctx, client, sid, "/out/result.txt"); err != nil || got != fmt.Sprintf("step %d\n", step) {
					b.Fatalf("step %d read %q, %v", step, got, err)
				}
			}
			steps = append(steps, time.Since(t0))
			if _, err := client.FinishSession(ctx, &authorityv1.FinishSessionRequest{SessionId: sid}); err != nil {
				b.Fatal(err)
			}
			// Its finish (the patch, the bundle, its upload) is done
			// before the next session's steps are timed, not beside them.
			waitJob(ctx, b, client, sid, jobEnded)
		}
		// The 20 steps alone (upload, exec, download each), without the
		// session's create and finish: the loop an agent waits on.
		b.ReportMetric(float64(median(steps).Microseconds())/1000, "steps-ms")
	})
	b.Run("via=host", func(b *testing.B) {
		dir := b.TempDir()
		var steps []time.Duration
		for range b.N {
			t0 := time.Now()
			for step := range 20 {
				want := fmt.Sprintf("step %d\n", step)
				if err := os.WriteFile(filepath.Join(dir, "step.txt"), []byte(want), 0o644); err != nil {
					b.Fatal(err)
				}
				cmd := exec.CommandContext(ctx, "sh", "-c", "cat step.txt > result.txt")
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("sh: %v: %s", err, out)
				}
				if got, err := os.ReadFile(filepath.Join(dir, "result.txt")); err != nil || string(got) != want {
					b.Fatalf("step %d read %q, %v", step, got, err)
				}
			}
			steps = append(steps, time.Since(t0))
		}
		b.ReportMetric(float64(median(steps).Microseconds())/1000, "steps-ms")
	})
	b.Run("via=jobs", func(b *testing.B) {
		for range b.N {
			for step := range 20 {
				seq++
				if err := runScript(ctx, client, "bench", fmt.Sprintf("loop-job-%d", seq),
					fmt.Sprintf("echo 'step %d' > step.txt && cat step.txt > /out/result.txt && cat /out/result.txt", step)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

func writeFile(ctx context.Context, client authorityv1.AuthorityServiceClient, sid, path, content string) error {
	stream, err := client.WriteFile(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Header{Header: &authorityv1.WriteFileHeader{SessionId: sid, Path: path}}}); err != nil {
		return err
	}
	if err := stream.Send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Chunk{Chunk: []byte(content)}}); err != nil {
		return err
	}
	_, err = stream.CloseAndRecv()
	return err
}

func readFile(ctx context.Context, client authorityv1.AuthorityServiceClient, sid, path string) (string, error) {
	stream, err := client.ReadFile(ctx, &authorityv1.ReadFileRequest{SessionId: sid, Path: path})
	if err != nil {
		return "", err
	}
	var out []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return string(out), nil
		}
		if err != nil {
			return "", err
		}
		out = append(out, msg.GetChunk()...)
	}
}

// runScript is runTrue with a shell script for the command.
func runScript(ctx context.Context, client authorityv1.AuthorityServiceClient, repo, key, script string) error {
	return runJob(ctx, client, repo, key, []string{"sh", "-c", script})
}

// BenchmarkSessionCalls is each call of an agent loop's step alone, in one
// warm session, in one run: GetSession (the floor: one authorized RPC that
// reaches no executor), an upload, a download, and an exec of `true` as
// StartExec then WatchExec and as one RunExec. benchstat -col /call.
func BenchmarkSessionCalls(b *testing.B) {
	_, client, ctx := benchStack(b)
	sid := createSession(ctx, b, client, "bench", "calls-session")
	defer func() {
		if _, err := client.CancelSession(ctx, &authorityv1.CancelSessionRequest{SessionId: sid}); err != nil {
			b.Error(err)
		}
	}()
	if err := writeFile(ctx, client, sid, "/work/read.txt", "read me\n"); err != nil {
		b.Fatal(err)
	}
	seq := 0
	calls := []struct {
		name string
		call func() error
	}{
		{"get", func() error {
			_, err := client.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid})
			return err
		}},
		{"write", func() error { return writeFile(ctx, client, sid, "/work/step.txt", "step\n") }},
		{"read", func() error {
			got, err := readFile(ctx, client, sid, "/work/read.txt")
			if err == nil && got != "read me\n" {
				err = fmt.Errorf("read %q", got)
			}
			return err
		}},
		{"start+watch", func() error {
			seq++
			_, err := execWait(ctx, client, sid, fmt.Sprintf("c%d", seq), "true")
			return err
		}},
		{"runexec", func() error {
			seq++
			_, err := runExecWait(ctx, client, sid, fmt.Sprintf("c%d", seq), "true")
			return err
		}},
	}
	for _, c := range calls {
		b.Run("call="+c.name, func(b *testing.B) {
			for range b.N {
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
