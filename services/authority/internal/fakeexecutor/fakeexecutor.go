// Package fakeexecutor is a hand-written fake of the executor's gRPC API
// for the authority's tests: it verifies every grant with pkg/grant, records
// what it was asked, and plays a scripted run (staging, running, some
// output, then the end when the test says so). It stands exactly at the
// executor boundary; nothing but the authority's tests imports it.
package fakeexecutor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/grant"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Output is what every run writes, each stream in two chunks so offsets
// inside a stream are exercised.
var (
	Stdout = [][]byte{[]byte("hello "), []byte("world\n")}
	Stderr = [][]byte{[]byte("warn\n")}
)

// Executor is the fake. The zero value is not usable; use New.
type Executor struct {
	executorv1.UnsafeExecutorServiceServer
	verifier *grant.Verifier

	mu         sync.Mutex
	startErr   error
	attempts   map[string]int
	grants     map[string][]*typesv1.Grant
	runs       map[string]*run
	cancels    []string
	watches    map[string][]*executorv1.WatchRunRequest
	rejections []error
	updateErr  error
	updates    map[string][]*typesv1.Grant
	artifacts  map[string][]byte
	// capacity, when positive, is how many unended runs the fake holds at
	// once; beyond it StartJob is ResourceExhausted, as the real
	// executor's capacity admission answers.
	capacity int
	// execs are each session's execs in order; execAsks counts the
	// StartExec calls that reached the fake, per session.
	execs    map[string][]*typesv1.Exec
	execAsks map[string]int
	// self, when set, is the executor's SPIFFE ID: a grant naming another
	// is refused, as the real executor refuses it. classes are the
	// runtime classes it runs beside runc (Runs).
	self    string
	classes []typesv1.RuntimeClass
	// cleared are the caches ClearCaches wiped (tenant, repository and
	// name joined by NUL); the fake forgets them.
	cleared map[string]bool
}

type run struct {
	grant *typesv1.SignedGrant
	state executorv1.RunState
	ended chan struct{}
	// A session's: suspended by SuspendRun until ResumeRun, and the files
	// WriteFile wrote, by path.
	suspended   bool
	suspendedAt time.Time
	files       map[string][]byte
	uploads     []*typesv1.FileWrite // WriteFile's records, unfolded
}

// New returns a fake that trusts grants verified by v.
func New(v *grant.Verifier) *Executor {
	return &Executor{
		verifier: v, attempts: map[string]int{}, grants: map[string][]*typesv1.Grant{}, runs: map[string]*run{},
		watches: map[string][]*executorv1.WatchRunRequest{}, updates: map[string][]*typesv1.Grant{},
		execs: map[string][]*typesv1.Exec{}, execAsks: map[string]int{},
	}
}

// Is makes the fake executor id: it refuses every grant that names
// another executor (or none), as the real one does.
func (e *Executor) Is(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.self = id
}

// Runs makes the fake accept grants of classes too; it always runs runc
// (and a grant that names no class, which is runc's).
func (e *Executor) Runs(classes ...typesv1.RuntimeClass) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.classes = append(e.classes, classes...)
}

// Register registers the fake on r.
func (e *Executor) Register(r grpc.ServiceRegistrar) { executorv1.RegisterExecutorServiceServer(r, e) }

// FailStarts makes every StartJob return err (a status error) until called
// again with nil.
func (e *Executor) FailStarts(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.startErr = err
}

// SetCapacity makes the fake admit at most n unended runs at once (0: no
// bound).
func (e *Executor) SetCapacity(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.capacity = n
}

// Unended is how many runs have not ended.
func (e *Executor) Unended() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unendedLocked()
}

func (e *Executor) unendedLocked() int {
	n := 0
	for _, r := range e.runs {
		select {
		case <-r.ended:
		default:
			n++
		}
	}
	return n
}

// Attempts is how many StartJob calls arrived for job, accepted or not.
func (e *Executor) Attempts(job string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts[job]
}

// Grants returns the verified grants StartJob received for job.
func (e *Executor) Grants(job string) []*typesv1.Grant {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*typesv1.Grant(nil), e.grants[job]...)
}

// HasRun reports whether a run exists for job.
func (e *Executor) HasRun(job string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[job] != nil
}

// Cancels returns the job ids CancelRun was called with.
func (e *Executor) Cancels() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.cancels...)
}

// Watches returns the WatchRun requests received for job.
func (e *Executor) Watches(job string) []*executorv1.WatchRunRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*executorv1.WatchRunRequest(nil), e.watches[job]...)
}

// Rejections returns the verification errors of refused grants.
func (e *Executor) Rejections() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.rejections...)
}

// End ends job's run: every WatchRun on it sends the final state and
// closes.
func (e *Executor) End(job string, state executorv1.RunState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.runs[job]; r != nil {
		select {
		case <-r.ended:
		default:
			r.state = state
			close(r.ended)
		}
	}
}

func (e *Executor) runView(id string, r *run) *executorv1.Run {
	g := &typesv1.Grant{}
	_ = proto.Unmarshal(r.grant.GetBody(), g)
	out := &executorv1.Run{JobId: id, State: r.state, Grant: r.grant, Suspended: r.suspended, NetworkPolicyStatus: &typesv1.NetworkPolicyStatus{
		Policy: g.GetNetworkPolicy(), Generation: max(g.GetNetworkPolicyGeneration(), 1), State: typesv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED,
	}}
	if r.suspended {
		out.SuspendedAt = timestamppb.New(r.suspendedAt)
	}
	return out
}

// FailUpdates makes every UpdateRun return err (a status error) until
// called again with nil.
func (e *Executor) FailUpdates(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.updateErr = err
}

// Updates returns the verified grants UpdateRun put in force for job.
func (e *Executor) Updates(job string) []*typesv1.Grant {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*typesv1.Grant(nil), e.updates[job]...)
}

// UpdateRun verifies a newer grant of a running job, as the real executor
// does (same job, higher generation, nothing but limits, network policy
// and a session's settings changed), and puts it in force.
func (e *Executor) UpdateRun(_ context.Context, req *executorv1.UpdateRunRequest) (*executorv1.UpdateRunResponse, error) {
	g, verr := e.verifier.Verify(req.GetGrant(), time.Now())
	e.mu.Lock()
	defer e.mu.Unlock()
	if verr != nil {
		e.rejections = append(e.rejections, verr)
		return nil, status.Errorf(codes.PermissionDenied, "grant: %v", verr)
	}
	if e.updateErr != nil {
		return nil, e.updateErr
	}
	r := e.runs[g.GetJobId()]
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "no run for job %q", g.GetJobId())
	}
	select {
	case <-r.ended:
		return nil, status.Errorf(codes.FailedPrecondition, "job %s has ended", g.GetJobId())
	default:
	}
	cur := &typesv1.Grant{}
	if err := proto.Unmarshal(r.grant.GetBody(), cur); err != nil {
		return nil, status.Errorf(codes.Internal, "stored grant: %v", err)
	}
	if g.GetGeneration() <= max(cur.GetGeneration(), 1) {
		return nil, status.Errorf(codes.FailedPrecondition, "grant generation %d is not newer than %d", g.GetGeneration(), cur.GetGeneration())
	}
	if (cur.GetSession() == nil) != (g.GetSession() == nil) {
		return nil, status.Error(codes.PermissionDenied, "grant field session: a job cannot become a session, nor a session a job")
	}
	a, b := proto.Clone(cur).(*typesv1.Grant), proto.Clone(g).(*typesv1.Grant)
	for _, x := range []*typesv1.Grant{a, b} {
		x.Limits, x.NetworkPolicy, x.NetworkPolicyGeneration, x.Generation, x.IssuedAt, x.ExpiresAt, x.Session = nil, nil, 0, 0, nil, nil, nil
	}
	if !proto.Equal(a, b) {
		return nil, status.Error(codes.PermissionDenied, "the grant changes more than limits, network policy and session settings")
	}
	r.grant = proto.Clone(req.GetGrant()).(*typesv1.SignedGrant)
	e.updates[g.GetJobId()] = append(e.updates[g.GetJobId()], g)
	v := e.runView(g.GetJobId(), r)
	return &executorv1.UpdateRunResponse{Run: v, NetworkPolicyStatus: v.GetNetworkPolicyStatus()}, nil
}

// StartJob verifies the grant and starts (or returns) the run.
func (e *Executor) StartJob(_ context.Context, req *executorv1.StartJobRequest) (*executorv1.StartJobResponse, error) {
	if req.GetGrant() == nil {
		return nil, status.Error(codes.InvalidArgument, "grant is required")
	}
	g, verr := e.verifier.Verify(req.GetGrant(), time.Now())
	e.mu.Lock()
	defer e.mu.Unlock()
	if verr != nil {
		e.rejections = append(e.rejections, verr)
		// As the real executor answers (runs.Manager.verify).
		if errors.Is(verr, grant.ErrExpired) {
			return nil, status.Errorf(codes.FailedPrecondition, "%v", verr)
		}
		return nil, status.Errorf(codes.PermissionDenied, "%v", verr)
	}
	if e.self != "" && g.GetExecutor() != e.self {
		err := fmt.Errorf("grant is for executor %q; this is %s", g.GetExecutor(), e.self)
		e.rejections = append(e.rejections, err)
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	e.attempts[g.GetJobId()]++
	if e.startErr != nil {
		return nil, e.startErr
	}
	if e.runs[g.GetJobId()] == nil && slices.Contains(e.cancels, g.GetJobId()) {
		// As the real executor answers a job cancelled before its run.
		return nil, status.Errorf(codes.FailedPrecondition, "job %s was cancelled before it started", g.GetJobId())
	}
	if c := g.GetRuntimeClass(); c > typesv1.RuntimeClass_RUNTIME_CLASS_RUNC && !slices.Contains(e.classes, c) {
		return nil, status.Errorf(codes.FailedPrecondition, "runtime class %s is not installed on this executor",
			strings.ToLower(strings.TrimPrefix(c.String(), "RUNTIME_CLASS_")))
	}
	if n := e.unendedLocked(); e.runs[g.GetJobId()] == nil && e.capacity > 0 && n >= e.capacity {
		return nil, status.Errorf(codes.ResourceExhausted, "capacity: jobs: %d of %d in use (fake)", n, e.capacity)
	}
	e.grants[g.GetJobId()] = append(e.grants[g.GetJobId()], g)
	if r := e.runs[g.GetJobId()]; r != nil {
		return &executorv1.StartJobResponse{Run: e.runView(g.GetJobId(), r)}, nil
	}
	r := &run{grant: proto.Clone(req.GetGrant()).(*typesv1.SignedGrant), state: executorv1.RunState_RUN_STATE_STAGING, ended: make(chan struct{})}
	e.runs[g.GetJobId()] = r
	return &executorv1.StartJobResponse{Run: e.runView(g.GetJobId(), r), Created: true}, nil
}

// GetRun returns the run, NotFound for a job it never started.
func (e *Executor) GetRun(_ context.Context, req *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[req.GetJobId()]
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "run %q", req.GetJobId())
	}
	return &executorv1.GetRunResponse{Run: e.runView(req.GetJobId(), r)}, nil
}

// WatchRun sends the run as running, its output from the requested
// offsets, then waits for End and sends the final run.
func (e *Executor) WatchRun(req *executorv1.WatchRunRequest, stream grpc.ServerStreamingServer[executorv1.WatchRunResponse]) error {
	e.mu.Lock()
	e.watches[req.GetJobId()] = append(e.watches[req.GetJobId()], proto.Clone(req).(*executorv1.WatchRunRequest))
	r := e.runs[req.GetJobId()]
	if r != nil && r.state == executorv1.RunState_RUN_STATE_STAGING {
		r.state = executorv1.RunState_RUN_STATE_RUNNING
	}
	var first *executorv1.Run
	if r != nil {
		first = e.runView(req.GetJobId(), r)
	}
	e.mu.Unlock()
	if r == nil {
		return status.Errorf(codes.NotFound, "no run for job %q", req.GetJobId())
	}
	if err := stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Run{Run: first}}); err != nil {
		return err
	}
	for _, s := range []struct {
		name   typesv1.OutputStream
		chunks [][]byte
		from   int64
	}{
		{typesv1.OutputStream_OUTPUT_STREAM_STDOUT, Stdout, req.GetStdoutOffset()},
		{typesv1.OutputStream_OUTPUT_STREAM_STDERR, Stderr, req.GetStderrOffset()},
	} {
		var off int64
		for _, c := range s.chunks {
			start, data := off, c
			off += int64(len(c))
			if off <= s.from {
				continue
			}
			if start < s.from {
				data, start = c[s.from-start:], s.from
			}
			if err := stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Output{
				Output: &typesv1.OutputChunk{Stream: s.name, Offset: start, Data: data},
			}}); err != nil {
				return err
			}
		}
	}
	select {
	case <-r.ended:
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
	e.mu.Lock()
	last := e.runView(req.GetJobId(), r)
	e.mu.Unlock()
	return stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Run{Run: last}})
}

// CancelRun records the call and ends the run as cancelled.
func (e *Executor) CancelRun(_ context.Context, req *executorv1.CancelRunRequest) (*executorv1.CancelRunResponse, error) {
	e.mu.Lock()
	e.cancels = append(e.cancels, req.GetJobId())
	r := e.runs[req.GetJobId()]
	e.mu.Unlock()
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "no run for job %q", req.GetJobId())
	}
	e.End(req.GetJobId(), executorv1.RunState_RUN_STATE_CANCELLED)
	e.mu.Lock()
	defer e.mu.Unlock()
	return &executorv1.CancelRunResponse{Run: e.runView(req.GetJobId(), r)}, nil
}

// SetArtifact makes GetArtifact serve data as job's bundle under any
// digest: the fake does not check what the real executor checks, so a test
// can hand the authority bytes that are not the bundle it asked for.
func (e *Executor) SetArtifact(job string, data []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.artifacts == nil {
		e.artifacts = map[string][]byte{}
	}
	e.artifacts[job] = data
}

// GetArtifact serves what SetArtifact set, in small chunks; NotFound for a
// job without one.
func (e *Executor) GetArtifact(req *executorv1.GetArtifactRequest, stream grpc.ServerStreamingServer[executorv1.GetArtifactResponse]) error {
	e.mu.Lock()
	data, ok := e.artifacts[req.GetJobId()]
	e.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "run %q has no bundle", req.GetJobId())
	}
	if err := stream.Send(&executorv1.GetArtifactResponse{Part: &executorv1.GetArtifactResponse_Header{Header: &executorv1.ArtifactHeader{
		BundleDigest: req.GetBundleDigest(), Size: int64(len(data)),
	}}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), 4096)
		if err := stream.Send(&executorv1.GetArtifactResponse{Part: &executorv1.GetArtifactResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// Forget drops job's run and execs, as an executor that lost its disk
// would: every call about it is NotFound from then on.
func (e *Executor) Forget(job string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.runs, job)
	delete(e.execs, job)
}

// ExecAsks returns how many StartExec calls for session job reached the
// fake.
func (e *Executor) ExecAsks(job string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.execAsks[job]
}

// ForwardPort is not faked: port forwards are tested against the real executor.
func (e *Executor) ForwardPort(grpc.BidiStreamingServer[executorv1.ForwardPortRequest, executorv1.ForwardPortResponse]) error {
	return status.Error(codes.Unimplemented, "the fake executor forwards no port")
}
