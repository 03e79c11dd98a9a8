// Package api is the executor's thin gRPC adapter: it validates requests
// (a grant's signature among them, with package convert), calls the run
// manager and maps its errors with pkg/errdefs. It is imported only by the
// executor's composition root.
package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress/egresspb"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
)

// Config holds the executor's domain services.
type Config struct {
	Runs *runs.Manager
	// Caches keeps the tenants' named caches; nil answers FailedPrecondition.
	Caches *cache.Store
	// Images keeps the images jobs run on; nil answers FailedPrecondition.
	Images *images.Store
	// Verifier checks the authority's signature on every grant.
	Verifier *grant.Verifier
	// Self is this executor's SPIFFE ID: a grant naming another executor,
	// or none, is refused.
	Self   identity.ID
	Logger *slog.Logger
	Now    func() time.Time
}

// Service implements airlock.executor.v1.ExecutorService; the Unsafe
// embedding makes an unhandled new RPC a compile error.
type Service struct {
	executorv1.UnsafeExecutorServiceServer
	cfg Config
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg}
}

// Register registers the service on s.
func (s *Service) Register(r grpc.ServiceRegistrar) { executorv1.RegisterExecutorServiceServer(r, s) }

// fail maps a domain error for the caller and logs what the caller does
// not get to see.
func (s *Service) fail(ctx context.Context, method string, err error) error {
	st := errgrpc.ToGRPC(err)
	if st != nil && st.Error() != err.Error() {
		s.cfg.Logger.ErrorContext(ctx, "request failed", "method", method, "error", err)
	}
	return st
}

func required(field, value string) error {
	if value == "" {
		return fmt.Errorf("%w: %s is required", errdefs.ErrInvalidArgument, field)
	}
	return nil
}

func (s *Service) StartJob(ctx context.Context, req *executorv1.StartJobRequest) (*executorv1.StartJobResponse, error) {
	if req.GetGrant() == nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("%w: grant is required", errdefs.ErrInvalidArgument))
	}
	g, err := convert.Grant(s.cfg.Verifier, s.cfg.Self, req.GetGrant(), s.cfg.Now())
	if err != nil {
		return nil, s.fail(ctx, "StartJob", err)
	}
	run, created, err := s.cfg.Runs.StartContext(ctx, g)
	if err != nil {
		return nil, s.fail(ctx, "StartJob", err)
	}
	return &executorv1.StartJobResponse{Run: convert.Run(run), Created: created}, nil
}

func (s *Service) GetRun(ctx context.Context, req *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	run, err := s.cfg.Runs.Get(req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "GetRun", err)
	}
	out := convert.Run(run)
	if u := out.GetUsage(); u != nil {
		// A running job's network bytes so far (one netlink request).
		if sent, received, err := s.cfg.Runs.NetworkBytes(run.JobID); err == nil {
			u.NetworkSentBytes, u.NetworkReceivedBytes = sent, received
		}
	}
	return &executorv1.GetRunResponse{Run: out}, nil
}

func (s *Service) WatchRun(req *executorv1.WatchRunRequest, stream grpc.ServerStreamingServer[executorv1.WatchRunResponse]) error {
	if err := required("job_id", req.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	from := runs.WatchFrom{Stdout: req.GetStdoutOffset(), Stderr: req.GetStderrOffset(), Egress: req.GetEgress(), EgressIndex: req.GetEgressOffset()}
	err := s.cfg.Runs.Watch(stream.Context(), req.GetJobId(), from, func(ev runs.Event) error {
		switch {
		case ev.Run != nil:
			return stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Run{Run: convert.Run(*ev.Run)}})
		case ev.Egress != nil:
			return stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Egress{Egress: egresspb.Event(ev.EgressIndex, *ev.Egress)}})
		}
		return stream.Send(&executorv1.WatchRunResponse{Event: &executorv1.WatchRunResponse_Output{Output: outputChunk(ev.Stream, ev.Offset, ev.Data, ev.Cut)}})
	})
	if err != nil {
		return s.fail(stream.Context(), "WatchRun", err)
	}
	return nil
}

func (s *Service) CancelRun(ctx context.Context, req *executorv1.CancelRunRequest) (*executorv1.CancelRunResponse, error) {
	if err := required("job_id", req.GetJobId()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	run, err := s.cfg.Runs.Cancel(req.GetJobId())
	if err != nil {
		return nil, s.fail(ctx, "CancelRun", err)
	}
	return &executorv1.CancelRunResponse{Run: convert.Run(run)}, nil
}

func (s *Service) UpdateRun(ctx context.Context, req *executorv1.UpdateRunRequest) (*executorv1.UpdateRunResponse, error) {
	if req.GetGrant() == nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("%w: grant is required", errdefs.ErrInvalidArgument))
	}
	g, err := convert.Grant(s.cfg.Verifier, s.cfg.Self, req.GetGrant(), s.cfg.Now())
	if err != nil {
		return nil, s.fail(ctx, "UpdateRun", err)
	}
	run, err := s.cfg.Runs.Update(ctx, g)
	if err != nil {
		return nil, s.fail(ctx, "UpdateRun", err)
	}
	out := convert.Run(run)
	return &executorv1.UpdateRunResponse{Run: out, NetworkPolicyStatus: out.GetNetworkPolicyStatus()}, nil
}

const artifactChunk = 256 << 10

func (s *Service) GetArtifact(req *executorv1.GetArtifactRequest, stream grpc.ServerStreamingServer[executorv1.GetArtifactResponse]) error {
	if err := required("job_id", req.GetJobId()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	if err := required("bundle_digest", req.GetBundleDigest()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	art, err := s.cfg.Runs.Artifact(req.GetJobId(), req.GetBundleDigest())
	if err != nil {
		return s.fail(stream.Context(), "GetArtifact", err)
	}
	f, err := os.Open(art.Path)
	if err != nil {
		return s.fail(stream.Context(), "GetArtifact", err)
	}
	defer f.Close()
	if err := stream.Send(&executorv1.GetArtifactResponse{Part: &executorv1.GetArtifactResponse_Header{Header: &executorv1.ArtifactHeader{
		BundleDigest: art.Digest, Size: art.Size, MediaType: bundle.MediaType, Provenance: art.Provenance,
	}}}); err != nil {
		return err
	}
	buf := make([]byte, artifactChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&executorv1.GetArtifactResponse{Part: &executorv1.GetArtifactResponse_Chunk{Chunk: buf[:n]}}); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return s.fail(stream.Context(), "GetArtifact", err)
		}
	}
}
