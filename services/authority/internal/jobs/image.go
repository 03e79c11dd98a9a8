package jobs

import (
	"context"
	"fmt"
	"io"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/images"
)

// Serving a job's image to the executor it was dispatched to.

// BlobWriter receives one blob: its header, then its bytes.
type BlobWriter interface {
	Header(digest, mediaType string, size int64) error
	io.Writer
}

// FetchImageBlob streams one blob of the image job id's grant names (its
// manifest, config or a layer), read from the registry with the tenant's
// credential, to the executor the job was dispatched to, while it may
// run. checkOnly asks only whether the tenant's credential reaches the
// blob: the header alone follows. The registry's bytes are checked
// against the digest on the way (package images); the executor checks
// them again on arrival.
func (s *Service) FetchImageBlob(ctx context.Context, caller identity.ID, id, digest string, checkOnly bool, w BlobWriter) error {
	j, err := s.servedJob(ctx, caller, id, "image")
	if err != nil {
		return err
	}
	if err := images.CheckDigest(digest); err != nil {
		return fmt.Errorf("%w: digest: %v", errdefs.ErrInvalidArgument, err)
	}
	g, err := s.grantOf(j)
	if err != nil {
		return err
	}
	if g.Image == nil {
		return fmt.Errorf("%w: job %q runs on the host template, not an image", errdefs.ErrFailedPrecondition, id)
	}
	if s.cfg.Images == nil {
		return fmt.Errorf("%w: this authority runs no images", errdefs.ErrFailedPrecondition)
	}
	t := s.cfg.Tenants[j.Tenant]
	if t == nil {
		return fmt.Errorf("%w: tenant %q is no longer in the policy", errdefs.ErrFailedPrecondition, j.Tenant)
	}
	img := *g.Image
	m, err := s.cfg.Images.Manifest(ctx, t.Images, img.Registry, img.Repository, img.Digest)
	if err != nil {
		return err
	}
	b, ok := m.Blob(digest)
	if !ok {
		return fmt.Errorf("%w: digest: %s is not a blob of job %q's image %s", errdefs.ErrPermissionDenied, digest, id, img.Reference())
	}
	what := "layer"
	switch digest {
	case m.Digest:
		what = "manifest"
	case m.ConfigBlob.Digest:
		what = "config"
	}
	if err := w.Header(b.Digest, b.MediaType, b.Size); err != nil {
		return err
	}
	switch {
	case digest == m.Digest:
		if _, err := w.Write(m.Manifest); err != nil {
			return err
		}
	case checkOnly:
		if err := s.cfg.Images.CheckBlob(ctx, t.Images, img.Registry, img.Repository, digest, b.Size); err != nil {
			return err
		}
		what += " (checked)"
	default:
		rc, err := s.cfg.Images.Blob(ctx, t.Images, img.Registry, img.Repository, digest)
		if err != nil {
			return err
		}
		defer rc.Close()
		n, err := io.Copy(w, io.LimitReader(rc, b.Size+1))
		switch {
		case err != nil:
			return err
		case n != b.Size:
			return fmt.Errorf("%w: registry %s: blob %s is %d bytes, its manifest says %d", errdefs.ErrUnavailable, img.Registry, digest, n, b.Size)
		}
	}
	return s.audit(ctx, audit.Event{Kind: audit.KindImageFetched, Caller: caller.String(), Subject: j.ID, Tenant: j.Tenant, JobID: j.ID,
		Outcome: audit.OutcomeAllowed, Reason: fmt.Sprintf("image %s %s %s (%d bytes)", img.Reference(), what, digest, b.Size)})
}
