// Package api is the authority's thin gRPC adapter: it reads the caller's
// identity, converts requests to the jobs domain's types, calls the domain
// and maps its errors with pkg/errdefs, logging what is internal instead of
// returning it. It is imported only by the authority's composition root.
package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/chunkio"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/flow"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/portforward"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Config holds the authority's domain services.
type Config struct {
	// Jobs is the job domain; required.
	Jobs *jobs.Service
	// Approvals is the approval domain; required.
	Approvals *approvals.Service
	// Leases is the credential lease domain; required.
	Leases *leases.Service
	// Flow is the workflow across jobs and approvals; required.
	Flow *flow.Service
	// Checkpoints serves the audit log's signed checkpoints; nil answers
	// Unimplemented.
	Checkpoints *checkpoints.Service
	// Fleet is the executor fleet; required.
	Fleet *fleet.Fleet
	// Usage meters usage and its cost; nil answers GetUsage Unimplemented.
	Usage *metering.Service
	// Forwards is the port forward domain; nil answers Unimplemented.
	Forwards *portforward.Service
	// Logger receives internal errors; default slog.Default().
	Logger *slog.Logger
}

// Service implements airlock.authority.v1.AuthorityService. Embedding the
// Unsafe interface (not the Unimplemented struct) makes a new RPC in the
// proto a compile error here until it is handled.
type Service struct {
	authorityv1.UnsafeAuthorityServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg}
}

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { authorityv1.RegisterAuthorityServiceServer(r, s) }

// maxChunk bounds one FetchSource chunk.
const maxChunk = 256 << 10

// caller returns the identity the authorization interceptor stored.
func caller(ctx context.Context) (identity.ID, error) {
	id, ok := identity.FromContext(ctx)
	if !ok {
		return identity.ID{}, status.Error(codes.Unauthenticated, "no caller identity")
	}
	return id, nil
}

// fail maps a domain error to a status. Anything that is not one of the
// sentinels is logged here and reaches the caller only as "internal error".
func (s *Service) fail(ctx context.Context, err error) error {
	st := errgrpc.ToGRPC(err)
	if c := status.Code(st); c == codes.Internal || c == codes.Unknown {
		s.cfg.Logger.ErrorContext(ctx, "internal error", "error", err)
	}
	return st
}

func (s *Service) SubmitJob(ctx context.Context, req *authorityv1.SubmitJobRequest) (*authorityv1.SubmitJobResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec: required")
	}
	spec, err := specFromProto(req.GetSpec())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(req.GetSpec())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	sub, err := s.cfg.Jobs.Submit(ctx, id, jobs.SubmitRequest{
		Tenant: req.GetTenant(), IdempotencyKey: req.GetIdempotencyKey(), Spec: spec, SpecWire: wire,
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(sub.Job)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.SubmitJobResponse{Job: pj, Created: sub.Created, BudgetWarning: sub.BudgetWarning}, nil
}

func (s *Service) GetJob(ctx context.Context, req *authorityv1.GetJobRequest) (*authorityv1.GetJobResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	j, err := s.cfg.Jobs.Get(ctx, id, req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := s.jobView(ctx, j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.GetJobResponse{Job: pj}, nil
}

func (s *Service) GetJobEgress(ctx context.Context, req *authorityv1.GetJobEgressRequest) (*authorityv1.GetJobEgressResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	j, err := s.cfg.Jobs.Get(ctx, id, req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	d, err := storedReview(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.GetJobEgressResponse{State: pj.GetState(), Egress: d.GetEgress()}, nil
}

// storedReview is the review detail recorded with j's result, or nil
// when it has none.
func storedReview(j store.Job) (*authorityv1.ReviewDetail, error) {
	if len(j.Review) == 0 {
		return nil, nil
	}
	var d authorityv1.ReviewDetail
	if err := proto.Unmarshal(j.Review, &d); err != nil {
		return nil, fmt.Errorf("stored review detail of job %s: %w", j.ID, err)
	}
	return &d, nil
}

func (s *Service) ListJobs(ctx context.Context, req *authorityv1.ListJobsRequest) (*authorityv1.ListJobsResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	states, err := statesFromProto(req.GetStates())
	if err != nil {
		return nil, err
	}
	list, next, err := s.cfg.Jobs.List(ctx, id, jobs.ListRequest{
		Tenant: req.GetTenant(), States: states, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken(),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	resp := &authorityv1.ListJobsResponse{NextPageToken: next}
	for _, j := range list {
		pj, err := s.jobView(ctx, j)
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		resp.Jobs = append(resp.Jobs, pj)
	}
	return resp, nil
}

func (s *Service) WatchJob(req *authorityv1.WatchJobRequest, stream grpc.ServerStreamingServer[authorityv1.WatchJobResponse]) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	from := jobs.Offsets{Stdout: req.GetStdoutOffset(), Stderr: req.GetStderrOffset(), Egress: req.GetEgress(), EgressIndex: req.GetEgressOffset()}
	err = s.cfg.Jobs.Watch(ctx, id, req.GetJobId(), from, func(ev jobs.WatchEvent) error {
		switch {
		case ev.Job != nil:
			pj, err := jobToProto(*ev.Job)
			if err != nil {
				return err
			}
			return stream.Send(&authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Job{Job: pj}})
		case ev.Egress != nil:
			return stream.Send(&authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Egress{Egress: egresspb.Event(ev.Egress.Index, ev.Egress.Record)}})
		}
		return stream.Send(&authorityv1.WatchJobResponse{Event: &authorityv1.WatchJobResponse_Output{Output: outputToProto(*ev.Output)}})
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

func (s *Service) CancelJob(ctx context.Context, req *authorityv1.CancelJobRequest) (*authorityv1.CancelJobResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	j, err := s.cfg.Jobs.Cancel(ctx, id, req.GetJobId(), req.GetReason())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.CancelJobResponse{Job: pj}, nil
}

func (s *Service) FetchSource(req *authorityv1.FetchSourceRequest, stream grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	w := newSourceStream(stream)
	if err := s.cfg.Jobs.FetchSource(ctx, id, req.GetJobId(), w); err != nil {
		return s.fail(ctx, err)
	}
	if err := w.Flush(); err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

func (s *Service) FetchImageBlob(req *authorityv1.FetchImageBlobRequest, stream grpc.ServerStreamingServer[authorityv1.FetchImageBlobResponse]) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	w := newBlobStream(stream)
	if err := s.cfg.Jobs.FetchImageBlob(ctx, id, req.GetJobId(), req.GetDigest(), req.GetCheckOnly(), w); err != nil {
		return s.fail(ctx, err)
	}
	if err := w.Flush(); err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// blobStream sends the header, then the blob in chunks of maxChunk.
type blobStream struct {
	stream grpc.ServerStreamingServer[authorityv1.FetchImageBlobResponse]
	*chunkio.Writer
}

func newBlobStream(stream grpc.ServerStreamingServer[authorityv1.FetchImageBlobResponse]) *blobStream {
	return &blobStream{stream: stream, Writer: chunkio.NewWriter(maxChunk, func(b []byte) error {
		return stream.Send(&authorityv1.FetchImageBlobResponse{Part: &authorityv1.FetchImageBlobResponse_Chunk{Chunk: b}})
	})}
}

func (w *blobStream) Header(digest, mediaType string, size int64) error {
	return w.stream.Send(&authorityv1.FetchImageBlobResponse{Part: &authorityv1.FetchImageBlobResponse_Header{
		Header: &authorityv1.ImageBlobHeader{Digest: digest, MediaType: mediaType, Size: size},
	}})
}

// sourceStream sends the header, then the archive in chunks of maxChunk
// (the last one shorter), then the history part and its chunks.
type sourceStream struct {
	stream  grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]
	history bool
	*chunkio.Writer
}

func newSourceStream(stream grpc.ServerStreamingServer[authorityv1.FetchSourceResponse]) *sourceStream {
	w := &sourceStream{stream: stream}
	w.Writer = chunkio.NewWriter(maxChunk, func(b []byte) error {
		msg := &authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_Chunk{Chunk: b}}
		if w.history {
			msg.Part = &authorityv1.FetchSourceResponse_HistoryChunk{HistoryChunk: b}
		}
		return stream.Send(msg)
	})
	return w
}

func (w *sourceStream) Header(commit, tree string, commitObject []byte, historyDepth int) error {
	return w.stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_Header{
		Header: &authorityv1.SourceHeader{Commit: commit, TreeHash: tree, Format: "tar", CommitObject: commitObject, HistoryDepth: uint32(historyDepth)},
	}})
}

func (w *sourceStream) History(depth, commits int) (io.Writer, error) {
	if err := w.Flush(); err != nil {
		return nil, err
	}
	w.history = true
	return w, w.stream.Send(&authorityv1.FetchSourceResponse{Part: &authorityv1.FetchSourceResponse_History{
		History: &authorityv1.SourceHistory{Depth: uint32(depth), Commits: uint32(commits)},
	}})
}

func (s *Service) ReportResult(ctx context.Context, req *authorityv1.ReportResultRequest) (*authorityv1.ReportResultResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	r := req.GetResult()
	if r == nil {
		return nil, status.Error(codes.InvalidArgument, "result: required")
	}
	if err := checkReviewDetail(req); err != nil {
		return nil, s.fail(ctx, err)
	}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	var review []byte // nil: no detail was sent
	if d := req.GetDetail(); d != nil {
		if review, err = (proto.MarshalOptions{Deterministic: true}).Marshal(d); err != nil {
			return nil, s.fail(ctx, err)
		}
		review = append([]byte{}, review...) // an empty detail is still one
	}
	j, approvalID, err := s.cfg.Flow.ReportResult(ctx, id, req.GetJobId(), jobs.Report{
		Reason: reasonFromProto(r.GetReason()), ExitCode: r.GetExitCode(), BundleDigest: r.GetBundleDigest(), Message: r.GetMessage(),
		Result: wire, Patch: req.GetPatch(), Review: review, Provenance: req.GetProvenance(),
		Execs: execsFromProto(req.GetDetail().GetExecs()),
	})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(j)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj.ApprovalId = approvalID
	return &authorityv1.ReportResultResponse{Job: pj}, nil
}

// execsFromProto are a report's execs in the domain's terms.
func execsFromProto(xs []*typesv1.Exec) []jobs.ExecSeen {
	var out []jobs.ExecSeen
	for _, x := range xs {
		if x != nil {
			out = append(out, executorclient.ExecFromProto(x))
		}
	}
	return out
}

func reasonFromProto(r typesv1.TerminationReason) jobs.Reason {
	switch r {
	case typesv1.TerminationReason_TERMINATION_REASON_EXITED:
		return jobs.ReasonExited
	case typesv1.TerminationReason_TERMINATION_REASON_TIMEOUT:
		return jobs.ReasonTimeout
	case typesv1.TerminationReason_TERMINATION_REASON_OOM:
		return jobs.ReasonOOM
	case typesv1.TerminationReason_TERMINATION_REASON_DISK_FULL:
		return jobs.ReasonDiskFull
	case typesv1.TerminationReason_TERMINATION_REASON_CANCELLED:
		return jobs.ReasonCancelled
	case typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_RESTARTED:
		return jobs.ReasonExecutorRestarted
	case typesv1.TerminationReason_TERMINATION_REASON_SANDBOX_ERROR:
		return jobs.ReasonSandboxError
	case typesv1.TerminationReason_TERMINATION_REASON_FINISHED:
		return jobs.ReasonFinished
	case typesv1.TerminationReason_TERMINATION_REASON_IDLE_TIMEOUT:
		return jobs.ReasonIdleTimeout
	}
	return jobs.ReasonUnspecified
}

func (s *Service) UpdateNetworkPolicy(ctx context.Context, req *authorityv1.UpdateNetworkPolicyRequest) (*authorityv1.UpdateNetworkPolicyResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetPolicy() == nil {
		return nil, s.fail(ctx, invalid("policy", "required: the whole new policy"))
	}
	n, err := executorclient.NetworkFromProto("policy", req.GetPolicy())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := s.cfg.Jobs.RequestChange(ctx, id, jobs.ChangeRequest{JobID: req.GetJobId(), Network: &n})
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(res.Job)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.UpdateNetworkPolicyResponse{Status: pj.GetNetworkPolicyStatus(), ApprovalId: res.ApprovalID}, nil
}

func (s *Service) UpdateJobLimits(ctx context.Context, req *authorityv1.UpdateJobLimitsRequest) (*authorityv1.UpdateJobLimitsResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetLimits() == nil && req.GetSession() == nil {
		return nil, s.fail(ctx, invalid("limits", "required: the limits (or a session's settings) to change"))
	}
	change := jobs.ChangeRequest{JobID: req.GetJobId()}
	if req.GetLimits() != nil {
		l, err := executorclient.LimitsFromProto("limits", req.GetLimits())
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		change.Limits = &l
	}
	if req.GetSession() != nil {
		sess, err := sessionFromProto("session", req.GetSession())
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		change.Session = sess
	}
	res, err := s.cfg.Jobs.RequestChange(ctx, id, change)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	pj, err := jobToProto(res.Job)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.UpdateJobLimitsResponse{Job: pj, ApprovalId: res.ApprovalID}, nil
}

func (s *Service) ListAuditEvents(ctx context.Context, req *authorityv1.ListAuditEventsRequest) (*authorityv1.ListAuditEventsResponse, error) {
	q := jobs.AuditQuery{
		JobID: req.GetJobId(), Tenant: req.GetTenant(), Caller: req.GetCaller(), Kind: req.GetKind(),
		PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken(),
	}
	if req.GetStartTime() != nil {
		q.Since = req.GetStartTime().AsTime()
	}
	if req.GetEndTime() != nil {
		q.Until = req.GetEndTime().AsTime()
	}
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	events, next, err := s.cfg.Jobs.AuditEvents(ctx, id, q)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListAuditEventsResponse{NextPageToken: next}
	for _, e := range events {
		out.Events = append(out.Events, &authorityv1.AuditEvent{
			Sequence: e.Sequence, Time: timestamppb.New(e.Time), Kind: e.Kind, Caller: e.Caller, Subject: e.Subject,
			Tenant: e.Tenant, JobId: e.JobID, Outcome: auditOutcomes[e.Outcome], Reason: e.Reason,
			Hash: e.Hash, PreviousHash: e.PrevHash,
		})
	}
	return out, nil
}

func (s *Service) ListAuditCheckpoints(ctx context.Context, req *authorityv1.ListAuditCheckpointsRequest) (*authorityv1.ListAuditCheckpointsResponse, error) {
	if s.cfg.Checkpoints == nil {
		return nil, status.Error(codes.Unimplemented, "this authority signs no audit checkpoints")
	}
	p, err := s.cfg.Checkpoints.List(req.GetAfterSequence(), int(req.GetPageSize()))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListAuditCheckpointsResponse{More: p.More, PublicKey: p.PublicKey, KeyId: p.KeyID, Halted: p.Halted}
	for _, c := range p.Checkpoints {
		out.Checkpoints = append(out.Checkpoints, &authorityv1.AuditCheckpoint{
			Sequence: c.Sequence, Hash: c.Hash, Time: timestamppb.New(c.Time), KeyId: c.KeyID, PublicKey: c.PublicKey, Signature: c.Signature,
		})
	}
	return out, nil
}

// auditOutcomes maps the log's outcome words to the API's.
var auditOutcomes = map[string]authorityv1.AuditOutcome{
	"allowed": authorityv1.AuditOutcome_AUDIT_OUTCOME_ALLOWED,
	"denied":  authorityv1.AuditOutcome_AUDIT_OUTCOME_DENIED,
	"failed":  authorityv1.AuditOutcome_AUDIT_OUTCOME_FAILED,
}

// statesFromProto reads a list request's states.
func statesFromProto(in []authorityv1.JobState) ([]store.State, error) {
	states := make([]store.State, 0, len(in))
	for _, st := range in {
		ds, ok := stateFromProto[st]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "states: %v is not a job state", st)
		}
		states = append(states, ds)
	}
	return states, nil
}

// jobView is a job (or session) as the API shows it: its record and the
// approval opened for its result, if any.
func (s *Service) jobView(ctx context.Context, j store.Job) (*authorityv1.Job, error) {
	pj, err := jobToProto(j)
	if err != nil {
		return nil, err
	}
	if pj.ApprovalId, err = s.cfg.Approvals.IDForJob(ctx, j.ID); err != nil {
		return nil, err
	}
	return pj, nil
}
