package approvals

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
)

// Bundle is what DownloadBundle hands its sink before the bundle's bytes:
// the job, the digest the authority recorded for its result, and the
// provenance envelope the executor reported with it.
type Bundle struct {
	JobID      string
	Digest     string
	Provenance []byte
}

// BundleSink receives what DownloadBundle reads: Header once, then Chunk
// calls with the bundle's bytes in order.
type BundleSink interface {
	Header(b Bundle) error
	Chunk(data []byte) error
}

// sinkWriter is a BundleSink as an io.Writer of chunks.
type sinkWriter struct{ sink BundleSink }

func (w sinkWriter) Write(p []byte) (int, error) {
	if err := w.sink.Chunk(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// DownloadBundle streams the whole result bundle of a finished job or
// session to sink, for whoever audits the tenant's work: a client of the
// job's tenant, or an approver its approval policy lists (anyone else, and
// a job that does not exist, is NotFound). Every byte is checked against
// the digest the authority recorded for the job's result; the digest is
// returned only when all of it matched. An error after the sink was
// called means what it got is not known to be that bundle.
func (s *Service) DownloadBundle(ctx context.Context, caller identity.ID, jobID string, sink BundleSink) (string, error) {
	if jobID == "" {
		return "", invalid("job_id", "required")
	}
	if len(jobID) > MaxIDBytes {
		return "", invalid("job_id", "at most %d bytes", MaxIDBytes)
	}
	j, err := s.cfg.Store.GetJob(ctx, jobID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("%w: job %q", errdefs.ErrNotFound, jobID)
	}
	if err != nil {
		return "", err
	}
	if !s.readsTenant(caller, j.Tenant) {
		return "", fmt.Errorf("%w: job %q", errdefs.ErrNotFound, jobID)
	}
	if j.BundleDigest == "" {
		return "", precondition("job %s has no result bundle (it is %s; a bundle comes with its result)", j.ID, j.State)
	}
	if s.cfg.Artifacts == nil {
		return "", precondition("this authority reads no bundles")
	}
	rc, err := s.cfg.Artifacts.OpenArtifact(ctx, j.ID, j.BundleDigest)
	if err != nil {
		return "", fmt.Errorf("open the bundle of job %s: %w", j.ID, err)
	}
	defer rc.Close()
	if err := sink.Header(Bundle{JobID: j.ID, Digest: j.BundleDigest, Provenance: j.Provenance}); err != nil {
		return "", err
	}
	_, err = bundle.Copy(sinkWriter{sink}, rc, j.BundleDigest)
	if errors.Is(err, bundle.ErrDigestMismatch) {
		s.cfg.Logger.Error("a bundle read for download does not match its job's result", "job_id", j.ID, "error", err)
		ev := audit.Event{Time: s.now(), Kind: audit.KindReviewBundleMismatch, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant,
			JobID: j.ID, Outcome: audit.OutcomeDenied, Reason: err.Error()}
		if _, aerr := s.cfg.Store.AppendAudit(ctx, ev); aerr != nil {
			s.cfg.Logger.ErrorContext(ctx, "audit a bundle mismatch", "error", aerr)
		}
		return "", fmt.Errorf("%w: the bundle the executor holds for job %s is not the one its result names (%s)", errdefs.ErrDataLoss, j.ID, j.BundleDigest)
	}
	if err != nil {
		return "", err
	}
	return j.BundleDigest, nil
}
