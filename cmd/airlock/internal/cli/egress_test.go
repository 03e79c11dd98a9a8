package cli

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// job egress --follow asks the watch for the egress record and no output,
// prints each decision once as it comes, with how its TLS went and which
// end closed first, every name escaped, and ends when the job does.
func TestJobEgressFollow(t *testing.T) {
	running := &authorityv1.Job{JobId: "j-1", State: authorityv1.JobState_JOB_STATE_RUNNING}
	done := &authorityv1.Job{JobId: "j-1", State: authorityv1.JobState_JOB_STATE_FINISHED}
	at := timestamppb.New(time.Now())
	failed := &typesv1.EgressEvent{Index: 0, Record: &typesv1.EgressRecord{
		Time: at, Via: "connect", Name: "registry\x1b[2J.test", Port: 443, Allowed: true, Reason: "allowed by registry.test",
		BytesIn: 2150, BytesOut: 517, End: "closed", ClosedFirst: typesv1.EgressSide_EGRESS_SIDE_JOB,
		Tls: &typesv1.EgressTLS{Handshake: typesv1.EgressHandshake_EGRESS_HANDSHAKE_FAILED, By: typesv1.EgressSide_EGRESS_SIDE_JOB, After: 2150},
	}}
	completed := &typesv1.EgressEvent{Index: 1, Record: &typesv1.EgressRecord{
		Time: at, Via: "transparent", Name: "ok.test", Port: 443, Allowed: true, Reason: "allowed by ok.test",
		End: "closed", ClosedFirst: typesv1.EgressSide_EGRESS_SIDE_SERVER,
		Tls: &typesv1.EgressTLS{Handshake: typesv1.EgressHandshake_EGRESS_HANDSHAKE_COMPLETED},
	}}
	egressEv := func(e *typesv1.EgressEvent) *authorityv1.WatchJobResponse {
		return &authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Egress{Egress: e}}
	}
	f := &fakeAuthority{job: done, watch: []*authorityv1.WatchJobResponse{
		{Event: &authorityv1.WatchJobResponse_Job{Job: running}},
		egressEv(failed), egressEv(failed), // sent again, as after a resumed stream
		egressEv(completed),
		{Event: &authorityv1.WatchJobResponse_Job{Job: done}},
	}}
	cfg := serveFake(t, f)
	code, stdout, stderr := runCLI(t, cfg, nil, "job", "egress", "j-1", "--follow")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"tls handshake failed: the job sent an alert after 2.1KiB from the server; the job closed first",
		"tls handshake completed; the server closed first",
		`registry⟦\x1b⟧[2J.test`,
	} {
		if strings.Count(stdout, want) != 1 {
			t.Errorf("want %q once in:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\x1b") {
		t.Errorf("a raw escape reached the output:\n%q", stdout)
	}
	if !strings.Contains(stderr, "finished") {
		t.Errorf("the job's end is not said:\n%s", stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.watches) != 1 {
		t.Fatalf("%d watches", len(f.watches))
	}
	if w := f.watches[0]; !w.GetEgress() || w.GetEgressOffset() != 0 || w.GetStdoutOffset() != math.MaxInt64 || w.GetStderrOffset() != math.MaxInt64 {
		t.Errorf("watch request %v: want the egress record from 0 and no output", w)
	}
}
