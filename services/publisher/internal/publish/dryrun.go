package publish

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// approvalPending is a spec's state while the approval awaits its votes.
const approvalPending = "pending"

// DryRun checks what Publish checks before it spends anything — the
// approval is this request's, the bundle verifies against its digest and
// provenance, and its patch and /out files pass the tenant's content
// scan — and then stops: nothing is recorded, consumed, leased, fetched
// from the target or pushed. The approval may still be pending (a dry run
// needs nobody's vote and spends none) or approved. The answer is a
// deployment that was never stored (no id): FAILED with the findings when
// the content is refused, else SUCCEEDED with the steps accepted, verified
// and validated and no commit. Without the target branch's tree, the path
// checks that need it (case collisions with and writes beneath paths the
// patch does not name) are left to the real publish.
//
// At most maxDryRuns run at once (each fetches and scans a whole bundle);
// another is ResourceExhausted. Each is logged with its requester, its
// approval and its outcome, and its answer's message begins "dry run".
func (s *Service) DryRun(ctx context.Context, requester string, r Request) (d store.Deployment, err error) {
	select {
	case s.dryRuns <- struct{}{}:
		defer func() { <-s.dryRuns }()
	default:
		return store.Deployment{}, fmt.Errorf("%w: %d dry runs are already in progress on this publisher; retry later", errdefs.ErrResourceExhausted, maxDryRuns)
	}
	defer func() {
		outcome := string(d.State)
		if err != nil {
			outcome = "error: " + err.Error()
		}
		s.cfg.Logger.Info("dry run", "requester", requester, "approval", r.ApprovalID, "job", d.JobID, "outcome", outcome, "findings", len(d.Findings))
	}()
	return s.dryRun(ctx, requester, r)
}

// maxDryRuns bounds the dry runs one publisher runs at once.
const maxDryRuns = 2

// dryRunMessage begins every dry run's message.
const dryRunMessage = "dry run, nothing recorded or pushed"

// removeDryRunLeftovers removes the bundle copies of dry runs a stopped
// publisher did not get to remove (dry-run-*.tar and their provenance).
func removeDryRunLeftovers(dir string, log *slog.Logger) {
	left, _ := filepath.Glob(filepath.Join(dir, "bundles", "dry-run-*.tar*"))
	for _, f := range left {
		if err := os.Remove(f); err != nil {
			log.Warn("remove a dry run's leftover bundle", "path", f, "err", err)
		}
	}
}

func (s *Service) dryRun(ctx context.Context, requester string, r Request) (store.Deployment, error) {
	if err := r.check(); err != nil {
		return store.Deployment{}, err
	}
	spec, err := s.cfg.Authority.Spec(ctx, r.ApprovalID)
	if err != nil {
		return store.Deployment{}, err
	}
	if err := r.matches(spec); err != nil {
		return store.Deployment{}, err
	}
	if spec.State != approvalPending && spec.State != ApprovalApproved {
		return store.Deployment{}, fmt.Errorf("%w: approval %s is %s: a dry run checks a pending or approved one", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.State)
	}
	if spec.Executor.IsZero() {
		return store.Deployment{}, fmt.Errorf("%w: approval %s: the authority names no executor for job %s", errdefs.ErrFailedPrecondition, r.ApprovalID, spec.JobID)
	}
	now := s.now()
	run := &runState{s: s, spec: spec, dry: true, log: s.cfg.Logger.With("dry_run", r.ApprovalID), d: store.Deployment{
		ID: "dry-run-" + ids.New(), IdempotencyKey: r.IdempotencyKey, Requester: requester, Tenant: spec.Tenant,
		JobID: spec.JobID, ApprovalID: r.ApprovalID, BundleDigest: spec.BundleDigest, TargetRepo: spec.Repo, TargetBranch: spec.Branch,
		BaseCommit: spec.Base, State: store.InProgress, Step: store.StepAccepted, Steps: map[store.Step]time.Time{store.StepAccepted: now},
		CreatedAt: now, UpdatedAt: now,
	}}
	defer run.close()
	defer func() {
		// The copy fetched for the dry run is not kept: a real publish
		// fetches and verifies its own.
		if run.bundle != "" {
			_ = os.Remove(run.bundle)
			_ = os.Remove(run.bundle + ".provenance")
		}
	}()
	if err := run.verify(ctx); err != nil {
		return store.Deployment{}, err
	}
	patch, files, err := run.content()
	if err != nil {
		return store.Deployment{}, err
	}
	found, err := s.cfg.Checker.Check(ctx, spec.Policy, contentcheck.Input{Patch: patch, Files: files})
	if err != nil {
		return store.Deployment{}, err
	}
	outs, err := run.outFiles(ctx)
	if err != nil {
		return store.Deployment{}, err
	}
	d := run.d
	d.ID, d.UpdatedAt = "", s.now()
	if findings := append(append(found, outs...), listMismatch(patch, files)...); len(findings) > 0 {
		rf := &refusal{findings: toStore(findings)}
		d.State, d.Findings, d.Message = store.Failed, rf.findings, dryRunMessage+": "+rf.Error()
		return d, nil
	}
	d.State, d.Step, d.Message = store.Succeeded, store.StepValidated, dryRunMessage+": the content passed the checks a publish makes before it fetches the target"
	d.Steps[store.StepValidated] = d.UpdatedAt
	d.FilesDigest, d.PolicyDigest = FilesDigestOf(paths(files)), spec.PolicyDigest
	return d, nil
}
