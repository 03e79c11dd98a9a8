//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestSessionExecStdin streams stdin through the CLI's RunExec: a pipe
// into `wc -l`, retried by id (the same output, no second run), and
// --stdin FILE through sha256sum; the records carry what each was given.
// Stdin from a call that attached, or from another tenant, reaches nothing.
func TestSessionExecStdin(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.restartService(t, "authority")
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--idle-timeout", "5m")
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)

	var seq strings.Builder
	for i := 1; i <= 100000; i++ {
		fmt.Fprintf(&seq, "%d\n", i)
	}
	piped := fmt.Sprintf("seq 1 100000 | %s session exec %s --exec-id x -- wc -l", bin("airlock"), id)
	for i := range 2 {
		r := runCommand(t, s.env(), "sh", "-c", piped)
		if r.code != 0 || strings.TrimSpace(r.stdout) != "100000" {
			t.Fatalf("attempt %d: seq 1 100000 | session exec -- wc -l: exit %d, stdout %q\n%s", i, r.code, r.stdout, r.stderr)
		}
		if again := strings.Contains(r.stderr, "started before"); again != (i == 1) {
			t.Fatalf("attempt %d: says started before: %v\n%s", i, again, r.stderr)
		}
	}

	data := []byte(strings.Repeat("a streamed file\n", 200000)) // 3.2 MB, past the 1 MiB of bytes stdin
	local := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(local, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := map[string][2]string{
		"x":      {fmt.Sprint(seq.Len()), sha256Hex(seq.String())},
		"digest": {fmt.Sprint(len(data)), hex.EncodeToString(sum[:])},
	}
	r := s.airlock(t, "session", "exec", id, "--exec-id", "digest", "--stdin", local, "--", "sha256sum")
	if r.code != 0 || !strings.HasPrefix(r.stdout, hex.EncodeToString(sum[:])) {
		t.Fatalf("--stdin FILE through sha256sum: exit %d %q, want %x\n%s", r.code, r.stdout, sum, r.stderr)
	}

	// Over the API: stdin to a running exec from a call that did not start
	// it is refused, naming it, and never reaches the command.
	client := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := &typesv1.ExecSpec{ExecId: "fed", Argv: []string{"sh", "-c", "cat; echo end"}, StdinStream: true}
	call := func() authorityv1.AuthorityService_RunExecClient {
		t.Helper()
		stream, err := client.RunExec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{SessionId: id, Spec: spec}}}); err != nil {
			t.Fatal(err)
		}
		return stream
	}
	stdin := func(b string) *authorityv1.RunExecRequest {
		return &authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Stdin{Stdin: []byte(b)}}
	}
	owner := call()
	if first, err := owner.Recv(); err != nil || !first.GetStarted().GetCreated() {
		t.Fatalf("RunExec starting fed: %v, %v", first, err)
	}
	if err := owner.Send(stdin("from the owner\n")); err != nil {
		t.Fatal(err)
	}
	other := call()
	if first, err := other.Recv(); err != nil || first.GetStarted() == nil || first.GetStarted().GetCreated() {
		t.Fatalf("RunExec attaching to fed: %v, %v", first, err)
	}
	_ = other.Send(stdin("from another call\n")) // its refusal comes with Recv
	for {
		msg, err := other.Recv()
		if err == nil && msg.GetExec() == nil {
			continue
		}
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), `exec "fed" takes no stdin from this call`) {
			t.Fatalf("stdin from a call that attached: %v %v, want FAILED_PRECONDITION naming the exec", msg, err)
		}
		break
	}
	if err := owner.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_CloseStdin{CloseStdin: true}}); err != nil {
		t.Fatal(err)
	}
	var out string
	for {
		msg, err := owner.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out += string(msg.GetOutput().GetData())
		if x := msg.GetExec(); x != nil {
			if out != "from the owner\nend\n" || x.GetExitCode() != 0 {
				t.Fatalf("the fed exec: exit %d, stdout %q", x.GetExitCode(), out)
			}
			break
		}
	}
	want["fed"] = [2]string{"15", sha256Hex("from the owner\n")}

	// Another tenant's client cannot start, attach to or feed an exec in
	// this session.
	intruder := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/other", "authority"))
	for _, execID := range []string{"fed", "intruder"} {
		stream, err := intruder.RunExec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{
			SessionId: id, Spec: &typesv1.ExecSpec{ExecId: execID, Argv: []string{"sh", "-c", "cat > /work/planted"}, StdinStream: true},
		}}})
		_ = stream.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Stdin{Stdin: []byte("planted")}})
		msg, err := stream.Recv()
		if code := status.Code(err); code != codes.NotFound && code != codes.PermissionDenied {
			t.Fatalf("tenant other's RunExec %s into dev's session: %v, %v; want NOT_FOUND or PERMISSION_DENIED", execID, msg, err)
		}
	}

	res = s.airlock(t, "session", "get", id, "-o", "json")
	got := &authorityv1.GetSessionResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), got); res.code != 0 || err != nil {
		t.Fatalf("session get: exit %d, %v\n%s", res.code, err, res.stderr)
	}
	if len(got.GetExecs()) != len(want) {
		t.Fatalf("the session ran %d execs, want %d: %v", len(got.GetExecs()), len(want), got.GetExecs())
	}
	for _, x := range got.GetExecs() {
		w := want[x.GetSpec().GetExecId()]
		if !x.GetSpec().GetStdinStream() || fmt.Sprint(x.GetStdinSize()) != w[0] || x.GetStdinSha256() != w[1] {
			t.Errorf("exec %s: stdin_stream %v, %d bytes, sha256 %s; want streamed, %s bytes, %s",
				x.GetSpec().GetExecId(), x.GetSpec().GetStdinStream(), x.GetStdinSize(), x.GetStdinSha256(), w[0], w[1])
		}
	}

	// A call refused mid-stream (a second start) takes its exec with it:
	// a command left reading a stdin nobody may feed, with no timeout of
	// its own, would hold a slot of the session for ever.
	spec = &typesv1.ExecSpec{ExecId: "refused", Argv: []string{"cat"}, StdinStream: true}
	refused := call()
	if first, err := refused.Recv(); err != nil || !first.GetStarted().GetCreated() {
		t.Fatalf("RunExec starting refused: %v, %v", first, err)
	}
	_ = refused.Send(stdin("some input\n"))
	_ = refused.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{SessionId: id, Spec: spec}}})
	for {
		msg, err := refused.Recv()
		if err == nil && msg.GetExec() == nil {
			continue
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a second start on one call: %v %v, want INVALID_ARGUMENT", msg, err)
		}
		break
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		x, err := client.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: id, ExecId: "refused"})
		if err == nil && x.GetExec().GetState() == typesv1.ExecState_EXEC_STATE_ENDED {
			if x.GetExec().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_CANCELLED {
				t.Fatalf("the refused call's exec ended %v, want CANCELLED", x.GetExec().GetReason())
			}
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the refused call's exec still runs 30s later: %v, %v", x, err)
		}
	}
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
