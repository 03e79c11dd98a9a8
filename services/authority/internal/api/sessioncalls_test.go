package api_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/fakeexecutor"
)

// TestSessionCallsReachTheExecutor: every session call the authority
// forwards (files both ways, a listing, a streamed exec, a watch, a
// cancel, suspend and resume) reaches the executor through the domain's
// one executor interface and comes back whole, and the executor's own
// refusal reaches the caller with its code and words.
func TestSessionCallsReachTheExecutor(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev := h.client(devID)
	sid := h.runningSession("calls", nil).GetJobId()

	up, err := dev.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("#!/bin/sh\necho hi\n")
	for _, m := range []*authorityv1.WriteFileRequest{
		{Part: &authorityv1.WriteFileRequest_Header{Header: &authorityv1.WriteFileHeader{SessionId: sid, Path: "/work/run.sh", Mode: 0o755}}},
		{Part: &authorityv1.WriteFileRequest_Chunk{Chunk: body[:5]}},
		{Part: &authorityv1.WriteFileRequest_Chunk{Chunk: body[5:]}},
	} {
		if err := up.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := up.CloseAndRecv(); err != nil || resp.GetSize() != int64(len(body)) {
		t.Fatalf("WriteFile: %v, %v", resp, err)
	}

	rd, err := dev.ReadFile(ctx, &authorityv1.ReadFileRequest{SessionId: sid, Path: "/work/run.sh"})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	var size int64 = -1
	for {
		msg, err := rd.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hd := msg.GetHeader(); hd != nil {
			size = hd.GetSize()
		}
		got = append(got, msg.GetChunk()...)
	}
	if !bytes.Equal(got, body) || size != int64(len(body)) {
		t.Fatalf("ReadFile: %q (header size %d), want %q", got, size, body)
	}
	_, err = readAll(dev.ReadFile(ctx, &authorityv1.ReadFileRequest{SessionId: sid, Path: "/work/none"}))
	wantStatus(t, err, codes.NotFound, `path "/work/none": no such file`)

	list, err := dev.ListFiles(ctx, &authorityv1.ListFilesRequest{SessionId: sid, Path: "/work"})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetPath() != "/work/run.sh" || list.GetEntries()[0].GetModifiedAt() == nil {
		t.Fatalf("ListFiles: %v, %v", list, err)
	}

	run, err := dev.RunExec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := &typesv1.ExecSpec{ExecId: "stream", Argv: []string{"sh", "/work/run.sh"}, StdinStream: true}
	for _, m := range []*authorityv1.RunExecRequest{
		{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{SessionId: sid, Spec: spec}}},
		{Msg: &authorityv1.RunExecRequest_Stdin{Stdin: []byte("input")}},
		{Msg: &authorityv1.RunExecRequest_CloseStdin{CloseStdin: true}},
	} {
		if err := run.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	var started, ended bool
	var out []byte
	for {
		msg, err := run.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev := msg.GetEvent().(type) {
		case *authorityv1.RunExecResponse_Started:
			started = ev.Started.GetCreated() && ev.Started.GetExec().GetSpec().GetExecId() == "stream"
		case *authorityv1.RunExecResponse_Output:
			out = append(out, ev.Output.GetData()...)
		case *authorityv1.RunExecResponse_Exec:
			ended = ev.Exec.GetState() == typesv1.ExecState_EXEC_STATE_ENDED && ev.Exec.GetReason() == typesv1.TerminationReason_TERMINATION_REASON_EXITED
		}
	}
	if !started || !ended || !bytes.Equal(out, bytes.Join(fakeexecutor.Stdout, nil)) {
		t.Fatalf("RunExec: started %v, ended %v, output %q", started, ended, out)
	}

	// While the session runs, GetSession lists the uploads as the
	// executor keeps them, each placed among the execs.
	sess, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid})
	if err != nil || sess.GetFileWritesTotal() != 1 || len(sess.GetFileWrites()) != 1 {
		t.Fatalf("GetSession's uploads: %v of %d, %v", sess.GetFileWrites(), sess.GetFileWritesTotal(), err)
	}
	if w := sess.GetFileWrites()[0]; w.GetPath() != "/work/run.sh" || w.GetSize() != int64(len(body)) || w.GetAfterExec() != 0 || len(w.GetSha256()) != 64 {
		t.Fatalf("GetSession's upload: %v", w)
	}

	watch, err := dev.WatchExec(ctx, &authorityv1.WatchExecRequest{SessionId: sid, ExecId: "stream", StdoutOffset: 6})
	if err != nil {
		t.Fatal(err)
	}
	out, ended = nil, false
	for {
		msg, err := watch.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, msg.GetOutput().GetData()...)
		ended = ended || msg.GetExec().GetSpec().GetExecId() == "stream"
	}
	if string(out) != "world\n" || !ended {
		t.Fatalf("WatchExec from offset 6: %q, record %v", out, ended)
	}
	// The authority recorded the streamed exec from what the executor said.
	if x, err := dev.GetExec(ctx, &authorityv1.GetExecRequest{SessionId: sid, ExecId: "stream"}); err != nil || x.GetExec().GetState() != typesv1.ExecState_EXEC_STATE_ENDED {
		t.Fatalf("GetExec: %v, %v", x, err)
	}
	if x, err := dev.CancelExec(ctx, &authorityv1.CancelExecRequest{SessionId: sid, ExecId: "stream"}); err != nil || x.GetExec().GetSeq() != 1 {
		t.Fatalf("CancelExec: %v, %v", x, err)
	}
	_, err = dev.CancelExec(ctx, &authorityv1.CancelExecRequest{SessionId: sid, ExecId: "none"})
	wantStatus(t, err, codes.NotFound, `exec "none"`)

	if _, err := dev.SuspendSession(ctx, &authorityv1.SuspendSessionRequest{SessionId: sid}); err != nil {
		t.Fatal(err)
	}
	if s, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid}); err != nil || !s.GetSuspended() || s.GetExecsTotal() != 1 {
		t.Fatalf("GetSession after suspend: %v, %v", s, err)
	}
	if _, err := dev.ResumeSession(ctx, &authorityv1.ResumeSessionRequest{SessionId: sid}); err != nil {
		t.Fatal(err)
	}
	if s, err := dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sid}); err != nil || s.GetSuspended() {
		t.Fatalf("GetSession after resume: %v, %v", s, err)
	}
}

// readAll drains a ReadFile stream.
func readAll(stream interface {
	Recv() (*authorityv1.ReadFileResponse, error)
}, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	var b []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		b = append(b, msg.GetChunk()...)
	}
}

// TestSessionIOCallsRefuseAnotherTenant: another tenant's client is
// refused each call that moves a session's files and execs (an upload, a
// download, a listing, StartExec, RunExec), before and after the owner's
// own calls, exactly as an unknown id is; a job that is not a session is
// refused as one; and the owner's calls still work.
func TestSessionIOCallsRefuseAnotherTenant(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dev, other := h.client(devID), h.client(otherID)
	sid := h.runningSession("io", nil).GetJobId()
	job := h.submit(dev, "a-job", spec()).GetJob().GetJobId()

	write := func(c authorityv1.AuthorityServiceClient, id string) error {
		up, err := c.WriteFile(ctx)
		if err != nil {
			return err
		}
		if err := up.Send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Header{Header: &authorityv1.WriteFileHeader{SessionId: id, Path: "/work/f"}}}); err != nil {
			return err
		}
		if err := up.Send(&authorityv1.WriteFileRequest{Part: &authorityv1.WriteFileRequest_Chunk{Chunk: []byte("x")}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = up.CloseAndRecv()
		return err
	}
	runExec := func(c authorityv1.AuthorityServiceClient, id, execID string) error {
		run, err := c.RunExec(ctx)
		if err != nil {
			return err
		}
		if err := run.Send(&authorityv1.RunExecRequest{Msg: &authorityv1.RunExecRequest_Start{Start: &authorityv1.RunExecStart{
			SessionId: id, Spec: &typesv1.ExecSpec{ExecId: execID, Argv: []string{"true"}}}}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_ = run.CloseSend()
		var started, ended bool
		for {
			msg, err := run.Recv()
			if errors.Is(err, io.EOF) {
				if !started || !ended {
					return fmt.Errorf("RunExec ended with started %v, end record %v", started, ended)
				}
				return nil
			}
			if err != nil {
				return err
			}
			started = started || msg.GetStarted() != nil
			ended = ended || msg.GetExec().GetState() == typesv1.ExecState_EXEC_STATE_ENDED
		}
	}
	calls := []struct {
		name string
		call func(c authorityv1.AuthorityServiceClient, id string) error
	}{
		{"WriteFile", write},
		{"ReadFile", func(c authorityv1.AuthorityServiceClient, id string) error {
			_, err := readAll(c.ReadFile(ctx, &authorityv1.ReadFileRequest{SessionId: id, Path: "/work/f"}))
			return err
		}},
		{"ListFiles", func(c authorityv1.AuthorityServiceClient, id string) error {
			_, err := c.ListFiles(ctx, &authorityv1.ListFilesRequest{SessionId: id, Path: "/work"})
			return err
		}},
		{"StartExec", func(c authorityv1.AuthorityServiceClient, id string) error {
			_, err := c.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: id, Spec: &typesv1.ExecSpec{ExecId: "start", Argv: []string{"true"}}})
			return err
		}},
		{"RunExec", func(c authorityv1.AuthorityServiceClient, id string) error { return runExec(c, id, "run") }},
	}
	for round := range 2 {
		for _, c := range calls {
			if err := c.call(dev, sid); err != nil {
				t.Fatalf("round %d: the owner's %s: %v", round, c.name, err)
			}
			err := c.call(other, sid)
			wantStatus(t, err, codes.NotFound, sid)
			errUnknown := c.call(other, "zzzz")
			if status.Code(errUnknown) != status.Code(err) || strings.ReplaceAll(status.Convert(errUnknown).Message(), "zzzz", sid) != status.Convert(err).Message() {
				t.Errorf("round %d: %s: a foreign and an unknown session answer differently: %v / %v", round, c.name, err, errUnknown)
			}
			wantStatus(t, c.call(dev, job), codes.FailedPrecondition, "is a job, not a session")
		}
	}
}
