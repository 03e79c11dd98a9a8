package approvals

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Artifacts opens result bundles where they are kept (the executor).
type Artifacts interface {
	// OpenArtifact streams the bundle of jobID that has digest.
	OpenArtifact(ctx context.Context, jobID, digest string) (io.ReadCloser, error)
}

// Review parts ReadReview streams, in the order a bundle holds them.
const (
	PartFiles  = "files"
	PartPatch  = "patch"
	PartStdout = "stdout"
	PartStderr = "stderr"
)

var reviewParts = []struct{ part, entry string }{
	{PartFiles, bundle.FilesFile}, {PartPatch, bundle.PatchFile}, {PartStdout, bundle.StdoutFile}, {PartStderr, bundle.StderrFile},
}

// ReviewSink receives what ReadReview reads, as it reads it. For each part:
// Start, then Files (for PartFiles) or Chunk calls.
type ReviewSink interface {
	Start(part string, size int64) error
	Files(files []bundle.FileChange) error
	Chunk(data []byte) error
}

const (
	reviewChunk = 256 << 10
	// reviewBatchBytes bounds one Files call, counting each file at four
	// times its path (a path that is not UTF-8 travels twice, its invalid
	// bytes as three-byte replacements once) and 64 bytes of the rest, so
	// no message nears gRPC's 4 MiB limit whatever names a job chose.
	reviewBatchBytes = 1 << 20
)

// ReadReview streams parts (all when empty) of a publish request's result
// bundle to sink, to whoever may read the request (Get). Every byte of the
// bundle is checked against the request's digest; the digest is returned
// only when all of it matched. An error after the sink was called means
// what it got is not known to be the approved bundle.
func (s *Service) ReadReview(ctx context.Context, caller identity.ID, id string, parts []string, sink ReviewSink) (string, error) {
	want := map[string]bool{}
	for _, p := range parts {
		if !slices.ContainsFunc(reviewParts, func(r struct{ part, entry string }) bool { return r.part == p }) {
			return "", invalid("parts", "%q is not files, patch, stdout or stderr", p)
		}
		if want[p] {
			return "", invalid("parts", "%q is named twice", p)
		}
		want[p] = true
	}
	entries := map[string]string{}
	for _, r := range reviewParts {
		if len(want) == 0 || want[r.part] {
			entries[r.entry] = r.part
		}
	}
	a, j, err := s.Get(ctx, caller, id)
	if err != nil {
		return "", err
	}
	if a.Kind != store.KindPublish {
		return "", fmt.Errorf("%w: approval %q is a change request: it has no result bundle", errdefs.ErrFailedPrecondition, id)
	}
	if s.cfg.Artifacts == nil {
		return "", fmt.Errorf("%w: this authority reads no bundles", errdefs.ErrFailedPrecondition)
	}
	rc, err := s.cfg.Artifacts.OpenArtifact(ctx, j.ID, a.BundleDigest)
	if err != nil {
		return "", fmt.Errorf("open the bundle of job %s: %w", j.ID, err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	err = bundle.Stream(rc, a.BundleDigest, func(name string) bool { return entries[name] != "" }, func(name string, size int64, r io.Reader) error {
		part := entries[name]
		seen[part] = true
		if part == PartFiles {
			return sendFiles(r, sink)
		}
		if err := sink.Start(part, size); err != nil {
			return err
		}
		buf := make([]byte, reviewChunk)
		for {
			n, err := io.ReadFull(r, buf)
			if n > 0 {
				if err := sink.Chunk(buf[:n]); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	})
	if errors.Is(err, bundle.ErrDigestMismatch) {
		s.cfg.Logger.Error("a bundle read for review does not match its approval", "approval_id", id, "job_id", j.ID, "error", err)
		// On the record, for whoever decides next: the bundle the
		// executor holds is not the one this request names.
		ev := audit.Event{Time: s.now(), Kind: audit.KindReviewBundleMismatch, Caller: caller.String(), Subject: id, JobID: j.ID,
			Outcome: audit.OutcomeDenied, Reason: err.Error()}
		if _, aerr := s.cfg.Store.AppendAudit(ctx, ev); aerr != nil {
			s.cfg.Logger.ErrorContext(ctx, "audit a bundle mismatch", "error", aerr)
		}
		return "", fmt.Errorf("%w: the bundle the executor holds for job %s is not the one approval %s names (%s)", errdefs.ErrDataLoss, j.ID, id, a.BundleDigest)
	}
	if err != nil {
		return "", err
	}
	for _, part := range entries {
		if !seen[part] {
			return "", fmt.Errorf("%w: the bundle of job %s has no %s (it was written before bundles held one)", errdefs.ErrFailedPrecondition, j.ID, part)
		}
	}
	return a.BundleDigest, nil
}

func sendFiles(r io.Reader, sink ReviewSink) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	files, err := bundle.ParseFiles(data)
	if err != nil {
		return err
	}
	if err := sink.Start(PartFiles, int64(len(files))); err != nil {
		return err
	}
	for len(files) > 0 {
		n, size := 0, 0
		for n < len(files) && (n == 0 || size+4*len(files[n].Path)+64 <= reviewBatchBytes) {
			size += 4*len(files[n].Path) + 64
			n++
		}
		if err := sink.Files(files[:n]); err != nil {
			return err
		}
		files = files[n:]
	}
	return nil
}
