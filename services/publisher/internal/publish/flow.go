package publish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitcmd"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// runState is one run's working state.
type runState struct {
	s    *Service
	d    store.Deployment
	log  *slog.Logger
	spec Spec
	// bundle is the verified bundle file; repo the scratch repository.
	bundle string
	repo   *Repo
	unlock func()
	// caFile is the remote's CA bundle for git, when it has one.
	caFile string
	prep   Prepared
	lease  Lease
	// dry is a dry run's (DryRun): its record stays in memory.
	dry bool
}

func (r *runState) close() {
	clear(r.lease.Secret)
	if r.unlock != nil {
		r.unlock()
	}
}

// record marks step done, applying change to the deployment in the same
// write.
func (r *runState) record(ctx context.Context, step store.Step, change func(d *store.Deployment)) error {
	if r.dry {
		if change != nil {
			change(&r.d)
		}
		r.d.Step, r.d.Steps[step] = step, r.s.now()
		return nil
	}
	d, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		if d.State.Terminal() {
			return fmt.Errorf("deployment %s ended meanwhile (%s)", d.ID, d.State)
		}
		if d.Owner != r.s.cfg.Owner {
			return fmt.Errorf("deployment %s is claimed by %s now", d.ID, d.Owner)
		}
		if change != nil {
			change(d)
		}
		d.Step = step
		d.Steps[step] = r.s.now()
		d.UpdatedAt = d.Steps[step]
		if strings.HasPrefix(d.Message, waitingPrefix) {
			d.Message = ""
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.d = d
	return nil
}

// fail ends the deployment as failed with err's message and the findings
// it carries, revoking any lease held.
func (r *runState) fail(ctx context.Context, err error) {
	if rerr := r.revokeAll(ctx, "the publish failed"); rerr != nil {
		r.log.Warn("revoke after a refusal", "error", rerr)
	}
	var rf *refusal
	findings := []store.Finding(nil)
	if errors.As(err, &rf) {
		findings = rf.findings
	}
	msg := errdefs.Detail(err)
	switch {
	case !r.d.Reached(store.StepConsumed):
		msg += "; the approval was not spent"
	case !r.d.Reached(store.StepPushed):
		msg += "; the approval was spent: whether a commit landed shows on the branch as the trailer Airlock-Approval: " + r.d.ApprovalID
	}
	d, uerr := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		if d.State.Terminal() {
			return nil
		}
		d.State, d.Message, d.Findings, d.LeaseID = store.Failed, msg, findings, ""
		d.UpdatedAt = r.s.now()
		return nil
	})
	if uerr != nil {
		r.log.Warn("record the failure", "error", uerr)
		return
	}
	r.d = d
}

// refusal is a validation refusal: its findings go on the deployment.
type refusal struct {
	findings []store.Finding
}

func (e *refusal) Error() string {
	n := len(e.findings)
	s := ""
	if n != 1 {
		s = "s"
	}
	return fmt.Sprintf("validation refused the result: %d finding%s (see findings)", n, s)
}

func (e *refusal) Unwrap() error { return errdefs.ErrFailedPrecondition }

// drive runs every step not yet recorded.
func (r *runState) drive(ctx context.Context) error {
	if r.d.Reached(store.StepPushed) {
		// The commit is on the branch: only the lease and the record are
		// left, whatever became of the bundle or the approval since.
		return r.succeed(ctx)
	}
	if err := r.readSpec(ctx); err != nil {
		return err
	}
	if err := r.verify(ctx); err != nil {
		return err
	}
	if err := r.openRepo(ctx); err != nil {
		return err
	}
	if !r.d.Reached(store.StepValidated) {
		if err := r.validate(ctx); err != nil {
			return err
		}
	}
	landed, err := r.prepare(ctx)
	if err != nil {
		return err
	}
	if landed != "" {
		return r.landed(ctx, landed)
	}
	if !r.d.Reached(store.StepConsumed) {
		if err := r.consume(ctx); err != nil {
			return err
		}
	}
	if err := r.leaseDeploy(ctx); err != nil {
		return err
	}
	if err := r.push(ctx); err != nil {
		return err
	}
	return r.succeed(ctx)
}

// readSpec reads the approval's spec and checks it is this request's.
func (r *runState) readSpec(ctx context.Context) error {
	spec, err := r.s.cfg.Authority.Spec(ctx, r.d.ApprovalID)
	if err != nil {
		return err
	}
	d := r.d
	switch {
	case spec.JobID != d.JobID:
		return fmt.Errorf("%w: job_id: approval %s is for job %s, not %s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.JobID, d.JobID)
	case spec.BundleDigest != d.BundleDigest:
		return fmt.Errorf("%w: bundle_digest: approval %s is for %s, not %s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.BundleDigest, d.BundleDigest)
	case spec.Repo != d.TargetRepo || spec.Branch != d.TargetBranch:
		return fmt.Errorf("%w: target: approval %s is for %s:%s, not %s:%s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.Repo, spec.Branch, d.TargetRepo, d.TargetBranch)
	case spec.State == ApprovalConsumed && !d.Reached(store.StepPrepared):
		// This deployment consumes only once prepared: spent before then,
		// it was spent by another.
		return fmt.Errorf("%w: approval %s was consumed, and not by this deployment", errdefs.ErrFailedPrecondition, d.ApprovalID)
	case spec.State == ApprovalConsumed:
		// Only the publisher consumes, and one deployment exists per
		// approval: a crash came between the consume and its record.
	case spec.State != ApprovalApproved:
		return fmt.Errorf("%w: approval %s is %s, not approved", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.State)
	case d.Reached(store.StepConsumed):
		return fmt.Errorf("%w: approval %s reads approved although this deployment consumed it", errdefs.ErrFailedPrecondition, d.ApprovalID)
	}
	switch {
	case spec.Base == "" || (spec.ApprovedAt.IsZero() && spec.State == ApprovalApproved):
		return fmt.Errorf("%w: approval %s: the authority gave no base commit or approval time", errdefs.ErrFailedPrecondition, d.ApprovalID)
	case !spec.DeployCredential:
		// Found before anything is spent, not after the consume.
		return fmt.Errorf("%w: target: tenant %s has no deploy credential for %s", errdefs.ErrFailedPrecondition, spec.Tenant, spec.Repo)
	case spec.Executor.IsZero():
		return fmt.Errorf("%w: approval %s: the authority names no executor for job %s", errdefs.ErrFailedPrecondition, d.ApprovalID, spec.JobID)
	case spec.OnMoved != "" && spec.OnMoved != OnMovedReapply && spec.OnMoved != OnMovedRefuse:
		return fmt.Errorf("%w: the tenant's on_moved %q is neither %s nor %s", errdefs.ErrFailedPrecondition, spec.OnMoved, OnMovedReapply, OnMovedRefuse)
	}
	r.spec = spec
	if d.Tenant == "" {
		upd, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
			d.Tenant, d.BaseCommit, d.Approvers = spec.Tenant, spec.Base, spec.Approvers
			d.UpdatedAt = r.s.now()
			return nil
		})
		if err != nil {
			return err
		}
		r.d = upd
	}
	return nil
}

// maxBundleFetches bounds how often one run fetches the bundle: a copy
// kept from an earlier run that no longer verifies is fetched once more.
const maxBundleFetches = 2

// verify fetches the bundle (unless a copy is here) and checks it against
// the approval, then records StepVerified.
func (r *runState) verify(ctx context.Context) error {
	r.bundle = filepath.Join(r.s.cfg.Dir, "bundles", r.d.ID+".tar")
	envPath := r.bundle + ".provenance"
	for fetches := 0; ; {
		envelope, err := os.ReadFile(envPath)
		if _, serr := os.Stat(r.bundle); err != nil || serr != nil {
			if envelope, err = r.fetchBundle(ctx, envPath); err != nil {
				return err
			}
			fetches++
		}
		// Every run checks again what it is about to use.
		_, err = VerifyBundle(r.bundle, envelope, Want{Digest: r.d.BundleDigest, JobID: r.d.JobID, Tenant: r.spec.Tenant, Executor: r.spec.Executor}, r.s.cfg.Trust)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrBundle) || fetches >= maxBundleFetches {
			return err
		}
		// A copy that no longer verifies is never trusted: fetch again.
		r.log.Warn("the bundle kept here does not verify; fetching it again", "error", err)
		_ = os.Remove(envPath)
		_ = os.Remove(r.bundle)
		if fetches == 0 {
			fetches = 1 // the kept copy counts as one
		}
	}
	if r.d.Reached(store.StepVerified) {
		return nil
	}
	return r.record(ctx, store.StepVerified, nil)
}

// maxBundleBytes bounds a bundle the publisher fetches.
const maxBundleBytes = 8 << 30

// fetchBundle writes the bundle and its provenance beside each other.
func (r *runState) fetchBundle(ctx context.Context, envPath string) ([]byte, error) {
	f, err := atomicfile.Create(r.bundle, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Abort()
	envelope, err := r.s.cfg.Executor.Artifact(ctx, r.spec.Executor, r.spec.ExecutorAddress, r.d.JobID, r.d.BundleDigest, &capWriter{w: f.File, left: maxBundleBytes})
	if err != nil {
		return nil, err
	}
	if err := f.Commit(atomicfile.Durable); err != nil {
		return nil, err
	}
	return envelope, atomicfile.Write(envPath, envelope, 0o600, atomicfile.Durable)
}

// capWriter refuses writes past left bytes.
type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, fmt.Errorf("%w: %w: the bundle is larger than %d bytes", errdefs.ErrFailedPrecondition, ErrBundle, int64(maxBundleBytes))
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

// openRepo locks the target's scratch repository, writes the CA file git
// needs, and fetches the branch (with a read lease when the repository
// needs a credential).
func (r *runState) openRepo(ctx context.Context) error {
	sum := sha256.Sum256([]byte(r.spec.Tenant + "\x00" + r.spec.Repo + "\x00" + r.spec.URL))
	dir := filepath.Join(r.s.cfg.Dir, "repos", hex.EncodeToString(sum[:8]))
	r.s.mu.Lock()
	mu := r.s.repoMu[dir]
	if mu == nil {
		mu = &sync.Mutex{}
		r.s.repoMu[dir] = mu
	}
	r.s.mu.Unlock()
	mu.Lock()
	r.unlock = mu.Unlock
	repo, err := OpenRepo(ctx, dir)
	if err != nil {
		return err
	}
	r.repo = repo
	if len(r.spec.CA) > 0 {
		caSum := sha256.Sum256(r.spec.CA)
		r.caFile = filepath.Join(r.s.cfg.Dir, "ca", hex.EncodeToString(caSum[:8])+".pem")
		if _, err := os.Stat(r.caFile); err != nil {
			if err := atomicfile.Write(r.caFile, r.spec.CA, 0o600, atomicfile.Durable); err != nil {
				return err
			}
		}
	}
	if !r.spec.ReadCredential {
		return r.fetch(ctx, nil)
	}
	// A read lease is allowed while the approval is approved and after
	// the publisher consumed it; it ends as soon as the fetch does.
	l, err := r.s.cfg.Authority.Lease(ctx, LeaseRead, r.d.JobID, r.d.TargetRepo)
	if err != nil {
		return err
	}
	defer clear(l.Secret)
	if err := r.s.cfg.Authority.Use(ctx, l.ID, r.d.JobID, r.d.TargetRepo); err != nil {
		return errors.Join(err, r.s.cfg.Authority.Revoke(context.WithoutCancel(ctx), l.ID, "not used"))
	}
	err = r.fetch(ctx, l.Secret)
	if rerr := r.s.cfg.Authority.Revoke(context.WithoutCancel(ctx), l.ID, "the branch was fetched"); rerr != nil {
		// Not a refusal: the run pauses and the sweep before the next
		// lease ends it.
		return errors.Join(err, fmt.Errorf("revoke the read lease %s: %v", l.ID, rerr))
	}
	return err
}

// remoteEnv is git's environment for the remote, with secret's header
// when one is given.
func (r *runState) remoteEnv(secret []byte) ([]string, error) {
	kv := gitcmd.RemoteConfig(r.caFile)
	if len(secret) > 0 {
		h, err := gitcmd.AuthHeader(secret)
		if err != nil {
			return nil, fmt.Errorf("%w: the leased credential: %v", errdefs.ErrFailedPrecondition, err)
		}
		kv = append(kv, [2]string{"http.extraHeader", h})
	}
	return gitcmd.ConfigEnv(kv), nil
}

// fetch brings the branch's tip into the scratch repository.
func (r *runState) fetch(ctx context.Context, secret []byte) error {
	env, err := r.remoteEnv(secret)
	if err != nil {
		return err
	}
	tip, err := r.repo.Fetch(ctx, r.spec.URL, r.d.TargetBranch, env)
	if err != nil {
		return err
	}
	r.prep.Tip = tip
	return nil
}

// content reads what the content checks read from the bundle.
func (r *runState) content() (patch []byte, files []bundle.FileChange, err error) {
	if patch, err = bundle.ReadEntry(r.bundle, bundle.PatchFile); err != nil {
		return nil, nil, fmt.Errorf("%w: %w: patch: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	raw, err := bundle.ReadEntry(r.bundle, bundle.FilesFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w: file list: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	if files, err = bundle.ParseFiles(raw); err != nil {
		return nil, nil, fmt.Errorf("%w: %w: file list: %v", errdefs.ErrFailedPrecondition, ErrBundle, err)
	}
	return patch, files, nil
}

// validate checks the bundle's content against the tenant's policy, the
// base tree and the bundle's own file list; any finding refuses it.
func (r *runState) validate(ctx context.Context) error {
	patch, files, err := r.content()
	if err != nil {
		return err
	}
	found, err := r.checkOn(ctx, r.spec.Base, patch, files)
	if err != nil {
		return err
	}
	outs, err := r.outFiles(ctx)
	if err != nil {
		return err
	}
	findings := append(append(found, outs...), listMismatch(patch, files)...)
	if len(findings) > 0 {
		return &refusal{findings: toStore(findings)}
	}
	return r.record(ctx, store.StepValidated, func(d *store.Deployment) {
		d.FilesDigest, d.PolicyDigest = FilesDigestOf(paths(files)), r.spec.PolicyDigest
	})
}

// checkOn runs the content checks of the patch on the tree of commit.
func (r *runState) checkOn(ctx context.Context, commit string, patch []byte, files []bundle.FileChange) ([]contentcheck.Finding, error) {
	tree, err := r.repo.Tree(ctx, commit)
	if err != nil {
		return nil, err
	}
	return r.s.cfg.Checker.Check(ctx, r.spec.Policy, contentcheck.Input{Patch: patch, Base: tree, Files: files})
}

// outFiles scans the bundle's /out files, streaming them; the findings of
// all of them together are bounded as one check's are.
func (r *runState) outFiles(ctx context.Context) ([]contentcheck.Finding, error) {
	f, err := os.Open(r.bundle)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var findings []contentcheck.Finding
	err = bundle.Stream(f, r.d.BundleDigest, func(name string) bool { return strings.HasPrefix(name, bundle.OutDir) },
		func(name string, size int64, entry io.Reader) error {
			if len(findings) >= contentcheck.MaxFindings {
				return nil
			}
			got, err := r.s.cfg.Checker.CheckOut(ctx, r.spec.Policy, contentcheck.OutFile{Name: strings.TrimPrefix(name, bundle.OutDir), Content: entry, Size: size})
			findings = append(findings, got...)
			return err
		})
	if len(findings) > contentcheck.MaxFindings {
		findings = append(findings[:contentcheck.MaxFindings-1], contentcheck.Finding{Rule: contentcheck.RuleFindingsTruncated,
			Message: fmt.Sprintf("more than %d findings in /out; the rest are not listed", contentcheck.MaxFindings)})
	}
	return findings, err
}

// RuleListMismatch is a bundle whose file list (files.json, what the
// approver was shown) is not the list of files its patch changes.
const RuleListMismatch = "bundle.file-list"

// listMismatch compares the paths the patch touches with the bundle's
// file list.
func listMismatch(patch []byte, files []bundle.FileChange) []contentcheck.Finding {
	p, err := contentcheck.ParsePatch(patch)
	if err != nil {
		return nil // reported by Check as patch.malformed
	}
	var touched []string
	for _, fp := range p.Files {
		for _, path := range []string{fp.OldPath, fp.NewPath} {
			if path != "" {
				touched = append(touched, path)
			}
		}
	}
	slices.Sort(touched)
	touched = slices.Compact(touched)
	listed := paths(files)
	if slices.Equal(touched, listed) {
		return nil
	}
	return []contentcheck.Finding{{Rule: RuleListMismatch, Message: fmt.Sprintf(
		"the patch changes %d paths and the file list shown for review names %d; they must be the same", len(touched), len(listed))}}
}

// paths returns the sorted paths of files.
func paths(files []bundle.FileChange) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func toStore(fs []contentcheck.Finding) []store.Finding {
	out := make([]store.Finding, 0, len(fs))
	for _, f := range fs {
		out = append(out, store.Finding{Rule: f.Rule, Path: f.Path, Line: f.Line, Message: f.Message, Redacted: f.Redacted})
	}
	return out
}

// change is what the commit carries.
func (r *runState) change() (Change, error) {
	patch, err := bundle.ReadEntry(r.bundle, bundle.PatchFile)
	if err != nil {
		return Change{}, err
	}
	at := r.spec.ApprovedAt
	if at.IsZero() {
		at = r.d.Steps[store.StepAccepted]
	}
	return Change{
		Remote: r.spec.URL, Branch: r.d.TargetBranch, Base: r.spec.Base, Patch: patch,
		JobID: r.d.JobID, BundleDigest: r.d.BundleDigest, ApprovalID: r.d.ApprovalID, Approvers: r.d.Approvers,
		At: at, OnMoved: r.spec.OnMoved,
	}, nil
}

// prepare looks for the commit an earlier attempt landed (returned) and
// otherwise makes the commit on the fetched tip, checks it changes
// exactly the approved file list (and, re-applied on a moved tip, passes
// the content checks on that tip's tree), and records StepPrepared.
func (r *runState) prepare(ctx context.Context) (string, error) {
	c, err := r.change()
	if err != nil {
		return "", err
	}
	if found, ok, err := r.repo.Find(ctx, r.d.TargetBranch, r.d.ApprovalID); err != nil {
		return "", err
	} else if ok {
		return found, r.isOurs(ctx, c, found)
	}
	p, err := r.repo.Prepare(ctx, c, r.prep.Tip)
	if err != nil {
		return "", err
	}
	changed, err := r.repo.Changed(ctx, p.Parent, p.Commit)
	if err != nil {
		return "", err
	}
	if got := FilesDigestOf(changed); r.d.FilesDigest != "" && got != r.d.FilesDigest {
		return "", fmt.Errorf("%w: the commit changes other files than the approved list (%d paths)", errdefs.ErrFailedPrecondition, len(changed))
	}
	if p.Parent != r.spec.Base {
		patch, files, err := r.content()
		if err != nil {
			return "", err
		}
		found, err := r.checkOn(ctx, p.Parent, patch, files)
		if err != nil {
			return "", err
		}
		if len(found) > 0 {
			return "", &refusal{findings: toStore(found)}
		}
	}
	r.prep = p
	if r.d.Reached(store.StepPrepared) && r.d.Commit == p.Commit {
		return "", nil
	}
	return "", r.record(ctx, maxStep(r.d.Step, store.StepPrepared), func(d *store.Deployment) {
		d.Commit, d.ParentCommit = p.Commit, p.Parent
	})
}

// isOurs checks that commit, found on the branch with the approval's
// trailer, is the one the publisher makes: the same commit id made again
// on its parent, and the approval spent. Anyone who may push to the
// branch can write a trailer; nobody else makes that commit id.
func (r *runState) isOurs(ctx context.Context, c Change, commit string) error {
	parent, err := r.repo.Parent(ctx, commit)
	if err != nil {
		return err
	}
	c.OnMoved = OnMovedReapply
	again, err := r.repo.Prepare(ctx, c, parent)
	if err != nil || again.Commit != commit {
		return fmt.Errorf("%w: commit %s on %s carries the trailer of approval %s but is not the commit its approval makes: someone else wrote it",
			errdefs.ErrFailedPrecondition, commit, r.d.TargetBranch, r.d.ApprovalID)
	}
	if r.spec.State != ApprovalConsumed {
		return fmt.Errorf("%w: commit %s on %s is approval %s's, which is not spent: the publisher did not push it",
			errdefs.ErrFailedPrecondition, commit, r.d.TargetBranch, r.d.ApprovalID)
	}
	return nil
}

// maxStep is the later of two steps: re-preparing after a lost push race
// keeps the later step recorded.
func maxStep(a, b store.Step) store.Step {
	if slices.Index(store.Steps, a) > slices.Index(store.Steps, b) {
		return a
	}
	return b
}

// consume spends the approval.
func (r *runState) consume(ctx context.Context) error {
	if r.spec.State != ApprovalConsumed {
		err := r.s.cfg.Authority.Consume(ctx, r.d.ApprovalID, r.d.JobID, r.d.BundleDigest, r.d.TargetRepo, r.d.TargetBranch)
		if err != nil {
			// A consume that landed but whose answer was lost reads
			// consumed now.
			spec, serr := r.s.cfg.Authority.Spec(ctx, r.d.ApprovalID)
			if serr != nil || spec.State != ApprovalConsumed {
				return err
			}
		}
	}
	r.log.Info("approval consumed", "approval", r.d.ApprovalID)
	return r.record(ctx, store.StepConsumed, nil)
}

// leaseDeploy ends any lease a crash left and leases the deploy
// credential.
func (r *runState) leaseDeploy(ctx context.Context) error {
	if err := r.revokeAll(ctx, "left by an interrupted publish"); err != nil {
		return err
	}
	l, err := r.s.cfg.Authority.Lease(ctx, LeaseDeploy, r.d.JobID, r.d.TargetRepo)
	if err != nil {
		return err
	}
	r.lease = l
	return r.record(ctx, store.StepLeased, func(d *store.Deployment) { d.LeaseID = l.ID })
}

// maxPushAttempts bounds the re-applies after lost push races in one run;
// the next run tries again.
const maxPushAttempts = 3

// push sends the commit, re-preparing on the new tip when the branch
// moved (if the policy allows), and records StepPushed.
func (r *runState) push(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		if err := r.s.cfg.Authority.Use(ctx, r.lease.ID, r.d.JobID, r.d.TargetRepo); err != nil {
			return err
		}
		env, err := r.remoteEnv(r.lease.Secret)
		if err != nil {
			return err
		}
		err = r.repo.Push(ctx, r.spec.URL, r.d.TargetBranch, r.prep, env)
		if err == nil {
			r.log.Info("commit pushed", "commit", r.prep.Commit, "branch", r.d.TargetBranch)
			return r.record(ctx, store.StepPushed, func(d *store.Deployment) { d.Commit, d.ParentCommit = r.prep.Commit, r.prep.Parent })
		}
		if !errors.Is(err, ErrMoved) || attempt >= maxPushAttempts {
			return err
		}
		r.log.Info("the branch moved during the push; preparing again", "attempt", attempt)
		if err := r.fetch(ctx, r.lease.Secret); err != nil {
			return err
		}
		landed, err := r.prepare(ctx)
		if err != nil {
			return err
		}
		if landed != "" {
			r.prep.Commit = landed
			return r.record(ctx, store.StepPushed, func(d *store.Deployment) { d.Commit = landed })
		}
	}
}

// landed records a commit an earlier attempt pushed (checked by isOurs).
func (r *runState) landed(ctx context.Context, commit string) error {
	r.log.Info("the approval's commit is already on the branch", "commit", commit)
	if err := r.record(ctx, store.StepPushed, func(d *store.Deployment) { d.Commit = commit }); err != nil {
		return err
	}
	return r.succeed(ctx)
}

// succeed ends the leases and the deployment; a revoke that fails keeps
// it in progress, at pushed, for a retry.
func (r *runState) succeed(ctx context.Context) error {
	if err := r.revokeAll(ctx, "the commit was pushed"); err != nil {
		return err
	}
	if r.d.Step != store.StepRevoked {
		if err := r.record(ctx, store.StepRevoked, func(d *store.Deployment) { d.LeaseID = "" }); err != nil {
			return err
		}
	}
	d, err := r.s.cfg.Store.Update(ctx, r.d.ID, func(d *store.Deployment) error {
		d.State, d.Message = store.Succeeded, ""
		d.UpdatedAt = r.s.now()
		return nil
	})
	if err != nil {
		return err
	}
	r.d = d
	r.log.Info("deployment succeeded", "commit", d.Commit, "branch", d.TargetBranch)
	return nil
}

// revokeAll ends every active lease the publisher holds for the job (one
// deployment per job's approval, run by one process at a time: they are
// this deployment's, some perhaps left by a crash before they were
// recorded).
func (r *runState) revokeAll(ctx context.Context, reason string) error {
	ctx = context.WithoutCancel(ctx)
	ids, err := r.s.cfg.Authority.ActiveLeases(ctx, r.d.JobID)
	// A failure here is never a refusal (%v, not %w): it pauses the run.
	if err != nil {
		return fmt.Errorf("list the leases to revoke: %v", err)
	}
	var errs []error
	for _, id := range ids {
		if err := r.s.cfg.Authority.Revoke(ctx, id, reason); err != nil {
			errs = append(errs, fmt.Errorf("revoke lease %s: %v", id, err))
		}
	}
	return errors.Join(errs...)
}
