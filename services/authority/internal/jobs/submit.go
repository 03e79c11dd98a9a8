package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// decision is what the policy check makes of a spec.
type decision struct {
	repo    policy.Repository
	limits  policy.Limits
	network Network
	runtime string
	with    []string // what runs beside the job (runspec.CheckWith)
	session *Session // set, defaults filled in, for a session
	caches  []CacheGrant
	user    runspec.User
	// image is the image reference to resolve, "" for the host template.
	image string
	// userAsked says the spec named its user (an image's config then
	// does not choose it).
	userAsked bool
	// start is the brokered credentials the job asks for; when one needs
	// it, the job waits for a start approval before it is placed.
	start StartRequest
}

// Submitted is what Submit did.
type Submitted struct {
	Job store.Job
	// Created is false for the job an earlier submission with the same
	// key recorded.
	Created bool
	// BudgetWarning says the tenant has used 80% or more of its monthly
	// budget; empty otherwise.
	BudgetWarning string
}

// Submit checks a job against its tenant's policy and budget, resolves
// its revision, records it, and (unless policy keeps it from running)
// grants it and dispatches the grant in the background. The same (tenant,
// idempotency key) returns the job recorded first, with created=false.
func (s *Service) Submit(ctx context.Context, caller identity.ID, req SubmitRequest) (Submitted, error) {
	var warning string
	j, created, err := s.submit(ctx, caller, req, &warning)
	s.metrics.submission(req, created, err)
	if err != nil && refusal(err) {
		// The refusal is a decision too; the caller still learns of it if
		// it cannot be recorded.
		if aerr := s.auditRefusal(ctx, audit.Event{Kind: audit.KindJobRefused, Caller: caller.String(), Subject: req.Spec.Repository,
			Tenant: req.Tenant, Outcome: audit.OutcomeDenied, Reason: err.Error()}); aerr != nil {
			s.cfg.Logger.Error("audit a refused job", "error", aerr)
		}
	}
	return Submitted{Job: j, Created: created, BudgetWarning: warning}, err
}

// refusal reports whether err is a policy decision rather than a failure.
func refusal(err error) bool {
	return errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrPermissionDenied) || errors.Is(err, errdefs.ErrAlreadyExists)
}

func (s *Service) submit(ctx context.Context, caller identity.ID, req SubmitRequest, warning *string) (store.Job, bool, error) {
	t, err := s.tenantFor(caller, req.Tenant)
	if err != nil {
		return store.Job{}, false, err
	}
	if err := checkIdempotencyKey(req.IdempotencyKey); err != nil {
		return store.Job{}, false, err
	}
	digest, err := specDigest(req.Spec)
	if err != nil {
		return store.Job{}, false, err
	}
	existing, err := s.cfg.Store.JobByIdempotencyKey(ctx, req.Tenant, req.IdempotencyKey)
	switch {
	case err == nil:
		if existing.State == store.StateQueued && existing.ClaimedBy == s.cfg.Replica {
			// The first submission may have been stored while its caller's
			// context ended, before it was driven: it is driven now.
			s.kick(existing.ID)
		}
		return sameSpec(existing, digest)
	case !errors.Is(err, errdefs.ErrNotFound):
		return store.Job{}, false, err
	}
	if s.cfg.Metering != nil {
		// New work only: a retry of a recorded submission is answered above.
		// A soft limit: submissions arriving together may read the same
		// month-to-date cost and all pass, and what is admitted here (a
		// job waiting for its start approval too) runs whatever it costs.
		w, err := s.cfg.Metering.Admit(ctx, req.Tenant)
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			if aerr := s.auditRefusal(ctx, audit.Event{Kind: audit.KindJobRefused, Caller: caller.String(), Subject: req.Spec.Repository,
				Tenant: req.Tenant, Outcome: audit.OutcomeDenied, Reason: err.Error()}); aerr != nil {
				s.cfg.Logger.Error("audit a refused job", "error", aerr)
			}
		}
		if err != nil {
			return store.Job{}, false, err
		}
		*warning = w
	}

	d, err := s.check(ctx, t, req.Spec)
	if err != nil {
		return store.Job{}, false, err
	}
	if err := s.queueRoom(ctx, t); err != nil {
		return store.Job{}, false, err
	}
	rev, err := s.cfg.Source.Resolve(ctx, d.repo, req.Spec.Revision)
	switch {
	case errors.Is(err, source.ErrBadRevision), errors.Is(err, source.ErrUnknownRevision):
		return store.Job{}, false, fmt.Errorf("%w: spec.revision: %q does not name a commit in repository %q", errdefs.ErrInvalidArgument, req.Spec.Revision, d.repo.Name)
	case err != nil:
		return store.Job{}, false, err
	}
	img, err := s.resolveImage(ctx, t, &d)
	if err != nil {
		return store.Job{}, false, err
	}

	now := s.now()
	j := store.Job{
		ID: newID(), Tenant: req.Tenant, Requester: caller.String(), IdempotencyKey: req.IdempotencyKey,
		Repository: d.repo.Name, Spec: req.SpecWire, SpecDigest: digest, Commit: rev.Commit, TreeHash: rev.Tree,
		CreatedAt: now, UpdatedAt: now,
		// This replica drives it.
		ClaimedBy: s.cfg.Replica, ClaimExpiresAt: now.Add(s.cfg.ClaimTTL),
	}
	greq := GrantRequest{
		JobID: j.ID, Tenant: j.Tenant, Requester: j.Requester, Repository: d.repo.Name, Commit: rev.Commit,
		Command: req.Spec.Command, Env: req.Spec.Env, Limits: d.limits, Network: d.network, NetworkGeneration: 1, Generation: 1,
		RuntimeClass: d.runtime, PublishTarget: req.Spec.PublishTarget, Session: d.session,
		HistoryDepth: s.historyDepth(j.Tenant), Caches: d.caches, User: d.user, Image: img, With: d.with, Credentials: req.Spec.Credentials,
		IssuedAt: now, ExpiresAt: now.Add(s.cfg.GrantTTL),
	}
	greq.WarmPool = t.WarmPool
	// Placed now when an executor has room (the grant names it), else when
	// its turn comes; a job waiting for its start approval holds no place.
	where := "; placed on no executor yet"
	if d.start.needsApproval() {
		where += " (it waits for its start approval: brokered credential(s) " + strings.Join(d.start.approvalNames(), ", ") + ")"
	} else if m, why, err := s.place(ctx, j, greq); err != nil {
		s.cfg.Logger.Warn("place a submitted job", "job", j.ID, "error", err)
	} else if m.ID != "" {
		greq.Executor, j.Executor, where = m.ID, m.ID, "; placed on executor "+m.Name
	} else {
		where += " (" + why + ")"
	}
	{
		g, err := s.cfg.Signer.Sign(greq)
		if err != nil {
			s.cfg.Fleet.Release(j.ID)
			return store.Job{}, false, fmt.Errorf("jobs: sign grant: %w", err)
		}
		j.State, j.NetworkState = store.StateQueued, "pending"
		j.Grant, j.GrantExpiresAt = g.Wire, now.Add(s.cfg.GrantTTL)
	}
	ev := audit.Event{Kind: audit.KindJobGranted, Caller: caller.String(), Subject: j.ID, Outcome: audit.OutcomeAllowed,
		Reason: fmt.Sprintf("repository %s at %s, command %q%s%s; grant expires %s", j.Repository, j.Commit, req.Spec.Command, imageNote(img), where, j.GrantExpiresAt.Format(time.RFC3339))}
	if d.session != nil {
		ev.Reason = fmt.Sprintf("session on repository %s at %s%s, idle timeout %s, at most %d execs at once%s; grant expires %s",
			j.Repository, j.Commit, imageNote(img), d.session.IdleTimeout, d.session.MaxConcurrentExecs, where, j.GrantExpiresAt.Format(time.RFC3339))
	}
	if j.State == store.StateFailed {
		ev.Kind, ev.Outcome, ev.Reason = audit.KindJobRefused, audit.OutcomeDenied, j.Message
	}
	stored, created, err := s.cfg.Store.CreateJobAudited(ctx, j, ev)
	if err != nil || !created {
		s.cfg.Fleet.Release(j.ID)
	}
	if err != nil {
		return store.Job{}, false, err
	}
	if !created {
		// Another submission with the same key won the race.
		return sameSpec(stored, digest)
	}
	s.cfg.Logger.Info("job submitted", "job", stored.ID, "tenant", stored.Tenant, "requester", stored.Requester,
		"repository", stored.Repository, "commit", stored.Commit, "state", string(stored.State), "message", stored.Message)
	if d.start.needsApproval() {
		// Opened before the job is first driven; should this fail, its
		// dispatch opens it.
		if _, err := s.openStart(ctx, caller.String(), stored, t, d.start); err != nil {
			s.cfg.Logger.Warn("open a start approval", "job", stored.ID, "error", err)
		}
	}
	s.hub.publish(stored)
	if stored.State == store.StateQueued {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			s.mu.Lock()
			s.traces[stored.ID] = sc
			s.mu.Unlock()
		}
		s.kick(stored.ID)
	}
	return stored, true, nil
}

func sameSpec(j store.Job, digest string) (store.Job, bool, error) {
	if j.SpecDigest != digest {
		return store.Job{}, false, fmt.Errorf("%w: idempotency_key: already used for job %q with a different spec", errdefs.ErrAlreadyExists, j.ID)
	}
	return j, false, nil
}

// specDigest identifies a spec's content: the sha256 of its canonical
// JSON (maps sorted by key).
func specDigest(spec Spec) (string, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("jobs: spec digest: %w", err)
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

func checkIdempotencyKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: idempotency_key: required", errdefs.ErrInvalidArgument)
	case len(k) > 256:
		return fmt.Errorf("%w: idempotency_key: at most 256 bytes", errdefs.ErrInvalidArgument)
	case !printable(k):
		return fmt.Errorf("%w: idempotency_key: printable characters only", errdefs.ErrInvalidArgument)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

func denied(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errdefs.ErrPermissionDenied, field, fmt.Sprintf(format, args...))
}

// check applies the tenant's policy to spec.
func (s *Service) check(ctx context.Context, t *policy.Tenant, spec Spec) (decision, error) {
	var d decision
	if spec.Repository == "" {
		return d, invalid("spec.repository", "required")
	}
	names := []struct{ name, v string }{{"spec.repository", spec.Repository}, {"spec.revision", spec.Revision}}
	if p := spec.PublishTarget; p != nil {
		names = append(names, struct{ name, v string }{"spec.publish_target.repository", p.Repository}, struct{ name, v string }{"spec.publish_target.branch", p.Branch})
	}
	for _, f := range names {
		if len(f.v) > maxNameBytes {
			return d, invalid(f.name, "at most %d bytes (got %d)", maxNameBytes, len(f.v))
		}
	}
	repo, ok := t.Repositories[spec.Repository]
	if !ok {
		return d, denied("spec.repository", "%q is not a repository of tenant %q", spec.Repository, t.Name)
	}
	d.repo = repo
	if spec.Revision == "" {
		return d, invalid("spec.revision", "required")
	}
	if err := source.CheckRevision(spec.Revision); err != nil {
		return d, invalid("spec.revision", "%q: give a branch, tag or commit SHA (and nothing starting with '-')", spec.Revision)
	}
	if spec.Session != nil {
		if len(spec.Command) > 0 {
			return d, invalid("spec.command", "must be empty for a session: its execs are the work")
		}
		sess, err := effectiveSession("spec.session", *spec.Session, Session{}, t.Sessions)
		if err != nil {
			return d, err
		}
		d.session = &sess
	} else if err := checkCommand(spec.Command); err != nil {
		return d, err
	}
	if err := checkEnv(ctx, s.cfg.Secrets, spec.Env); err != nil {
		return d, err
	}
	user, err := checkUser(t, spec.User)
	if err != nil {
		return d, err
	}
	d.user, d.userAsked = user, spec.User != nil
	switch d.image = cmp.Or(spec.Image, t.Images.Default, policy.HostImage); {
	case d.image == policy.HostImage:
		d.image = ""
	}
	caches, err := checkCaches(t, spec.Caches)
	if err != nil {
		return d, err
	}
	for i, c := range caches {
		if err := runspec.CheckCacheUser(c.Path, d.user); err != nil {
			return d, invalid(fmt.Sprintf("spec.caches[%d]", i), "%q: the cache's path %v", c.Name, err)
		}
	}
	d.caches = caches
	limits, err := effectiveLimits("spec.resources", spec.Resources, t.Default, t.Max)
	if err != nil {
		return d, err
	}
	if err := withinQuota("spec.resources", t, limits); err != nil {
		return d, err
	}
	d.limits = limits
	switch {
	case spec.RuntimeClass == "":
		d.runtime = t.RuntimeClasses[0]
	case !slices.Contains(t.RuntimeClasses, spec.RuntimeClass):
		return d, denied("spec.runtime_class", "%s is not allowed for tenant %q (allowed: %s)", spec.RuntimeClass, t.Name, strings.Join(t.RuntimeClasses, ", "))
	default:
		d.runtime = spec.RuntimeClass
	}
	if err := runnable("spec.resources", d.runtime, spec.With, d.limits); err != nil {
		return d, err
	}
	d.with = spec.With
	if d.network, err = checkNetwork(t, "spec.network_policy", spec.Network); err != nil {
		return d, err
	}
	if d.start, err = checkCredentials(t, spec.Credentials, d.runtime, d.network); err != nil {
		return d, err
	}
	if p := spec.PublishTarget; p != nil {
		if _, ok := t.Repositories[p.Repository]; !ok {
			return d, denied("spec.publish_target.repository", "%q is not a repository of tenant %q", p.Repository, t.Name)
		}
		if err := source.CheckRevision(p.Branch); err != nil || p.Branch == "HEAD" {
			return d, invalid("spec.publish_target.branch", "%q is not a branch name", p.Branch)
		}
	}
	return d, nil
}

// resolveImage resolves the decision's image, if any, to a digest under
// the tenant's policy. A job that asked for no user runs as the image's,
// where the image names one by number and the tenant's policy allows it.
func (s *Service) resolveImage(ctx context.Context, t *policy.Tenant, d *decision) (*ImageGrant, error) {
	if d.image == "" {
		return nil, nil
	}
	if s.cfg.Images == nil {
		return nil, fmt.Errorf("%w: spec.image: this authority runs no images (the host template only)", errdefs.ErrFailedPrecondition)
	}
	r, err := s.cfg.Images.Resolve(ctx, t.Images, d.image)
	if err != nil {
		return nil, err
	}
	if !d.userAsked && r.Config.User != "" {
		if u, err := runspec.ParseUser(r.Config.User); err == nil && r.Config.User != "agent" && runspec.CheckUser(u) == nil && t.UserAllowed(u) == "" {
			d.user = u
		}
	}
	for i, c := range d.caches {
		if err := runspec.CheckCacheUser(c.Path, d.user); err != nil {
			return nil, invalid(fmt.Sprintf("spec.caches[%d]", i), "%q: the cache's path %v (the job runs as the image's user %s)", c.Name, err, d.user)
		}
	}
	return &ImageGrant{Name: d.image, Registry: r.Registry, Repository: r.Repository, Digest: r.Digest, MediaType: r.MediaType, Size: r.Size}, nil
}

// imageNote says which image a grant runs on, for the audit log.
func imageNote(g *ImageGrant) string {
	if g == nil {
		return ""
	}
	return ", image " + g.Reference()
}

// effectiveSession checks the session fields req names against the
// tenant's ceilings; a zero field takes base's value, or where that is
// zero too (a submission) the tenant's default. Errors name fields under
// prefix.
func effectiveSession(prefix string, req, base Session, bounds policy.Sessions) (Session, error) {
	b := bounds.Filled()
	out := req
	switch {
	case req.IdleTimeout < 0:
		return out, invalid(prefix+".idle_timeout", "%s: must not be negative", req.IdleTimeout)
	case req.IdleTimeout == 0:
		out.IdleTimeout = cmp.Or(base.IdleTimeout, b.DefaultIdleTimeout)
	case req.IdleTimeout < policy.MinIdleTimeout:
		return out, invalid(prefix+".idle_timeout", "%s: at least %s", req.IdleTimeout, policy.MinIdleTimeout)
	case req.IdleTimeout > b.MaxIdleTimeout:
		return out, invalid(prefix+".idle_timeout", "%s is above the tenant's ceiling of %s", req.IdleTimeout, b.MaxIdleTimeout)
	}
	switch {
	case req.MaxConcurrentExecs < 0:
		return out, invalid(prefix+".max_concurrent_execs", "%d: must not be negative", req.MaxConcurrentExecs)
	case req.MaxConcurrentExecs == 0:
		out.MaxConcurrentExecs = cmp.Or(base.MaxConcurrentExecs, b.DefaultConcurrentExecs)
	case req.MaxConcurrentExecs > b.MaxConcurrentExecs:
		return out, invalid(prefix+".max_concurrent_execs", "%d is above the tenant's ceiling of %d", req.MaxConcurrentExecs, b.MaxConcurrentExecs)
	}
	switch req.OnIdle {
	case "":
		out.OnIdle = cmp.Or(base.OnIdle, b.DefaultOnIdle)
		if out.OnIdle == policy.OnIdleSleep && b.ForbidSleep {
			// Kept from the running session, which the tenant's policy
			// no longer allows: the change says what it does instead.
			return out, denied(prefix+".on_idle", "sleep, as the session does: the tenant's policy no longer allows sessions to sleep (sessions.allow_sleep is false); say on_idle end with this change")
		}
	case policy.OnIdleEnd:
	case policy.OnIdleSleep:
		if b.ForbidSleep {
			return out, denied(prefix+".on_idle", "sleep: the tenant's policy does not allow sessions to sleep (sessions.allow_sleep is false)")
		}
	default:
		return out, invalid(prefix+".on_idle", "%q: want %s or %s", req.OnIdle, policy.OnIdleEnd, policy.OnIdleSleep)
	}
	return out, nil
}

// checkUser is who a job runs as: the one it asks for, ids every sandbox
// maps and root only where the tenant's policy allows it, or the tenant's
// default.
func checkUser(t *policy.Tenant, u *runspec.User) (runspec.User, error) {
	if u == nil {
		return t.User, nil
	}
	if err := runspec.CheckUser(*u); err != nil {
		return runspec.User{}, invalid("spec.user", "%v", err)
	}
	if why := t.UserAllowed(*u); why != "" {
		return runspec.User{}, denied("spec.user", "root: %s", why)
	}
	return *u, nil
}

// checkCaches takes the named caches a spec asks for from the tenant's
// policy; a name the policy lacks is refused, naming it.
func checkCaches(t *policy.Tenant, names []string) ([]CacheGrant, error) {
	if len(names) > runspec.MaxCaches {
		return nil, invalid("spec.caches", "%d given, at most %d", len(names), runspec.MaxCaches)
	}
	var out []CacheGrant
	for i, n := range names {
		c, err := named(t, t.Caches, names, i, "spec.caches", "cache", denied)
		if err != nil {
			return nil, err
		}
		out = append(out, CacheGrant{Name: n, Path: c.Path, MaxSize: c.MaxSize})
	}
	return out, nil
}

// named takes names[i], which a spec's field lists, from m, the tenant's
// policy's entries of one kind (what): a name the policy lacks is refused
// by unknown naming it and those there are, one listed twice as invalid.
func named[V any](t *policy.Tenant, m map[string]V, names []string, i int, field, what string, unknown func(field, format string, args ...any) error) (V, error) {
	var zero V
	n, field := names[i], fmt.Sprintf("%s[%d]", field, i)
	if len(n) > maxNameBytes {
		return zero, invalid(field, "at most %d bytes (got %d)", maxNameBytes, len(n))
	}
	v, ok := m[n]
	if !ok {
		have := slices.Sorted(maps.Keys(m))
		if len(have) == 0 {
			return zero, unknown(field, "%q: tenant %q has no %ss in its policy", n, t.Name, what)
		}
		return zero, unknown(field, "%q is not a %s of tenant %q (it has: %s)", n, what, t.Name, strings.Join(have, ", "))
	}
	if slices.Contains(names[:i], n) {
		return zero, invalid(field, "%q is listed twice", n)
	}
	return v, nil
}

func checkCommand(argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return invalid("spec.command", "at least one element, the program, is required")
	}
	if len(argv) > 4096 {
		return invalid("spec.command", "at most 4096 elements")
	}
	total := 0
	for i, a := range argv {
		total += len(a)
		if strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
			return invalid(fmt.Sprintf("spec.command[%d]", i), "must be valid UTF-8 without NUL")
		}
	}
	if total > 128<<10 {
		return invalid("spec.command", "at most 128KiB in all")
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func checkEnv(ctx context.Context, secrets *contentcheck.Checker, env map[string]string) error {
	if len(env) > 256 {
		return invalid("spec.env", "at most 256 variables")
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	total := 0
	for _, k := range keys {
		total += len(k) + len(env[k])
	}
	if total > 256<<10 {
		return invalid("spec.env", "at most 256KiB in all (got %d bytes)", total)
	}
	for _, k := range keys {
		v := env[k]
		if len(k) > 256 || !envName.MatchString(k) {
			return invalid("spec.env", "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		field := "spec.env." + k
		if len(v) > 32<<10 {
			return invalid(field, "value longer than 32KiB")
		}
		if strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			return invalid(field, "value must be valid UTF-8 without NUL")
		}
		if credentialName(k) {
			return invalid(field, "the name looks like a credential; jobs never get credentials (the authority keeps them)")
		}
		// The value is never echoed: if it is a secret, the error must not
		// spread it further.
		what, err := secrets.CredentialValue(ctx, v)
		if err != nil {
			return err
		}
		if what != "" {
			return invalid(field, "the value looks like a credential (%s); jobs never get credentials (the authority keeps them)", what)
		}
	}
	return nil
}

// Name fragments that mark a variable as a credential wherever they occur.
var secretNameFragments = []string{
	"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "APIKEY", "API_KEY",
	"PRIVATE_KEY", "PRIVATEKEY", "ACCESS_KEY", "ACCESSKEY", "AUTHORIZATION", "AUTHTOKEN", "COOKIE",
}

// Name segments (between underscores) that mark a credential only as a
// whole word, so GIT_AUTHOR_NAME and BYPASS_CACHE stay plain.
var secretNameWords = []string{"AUTH", "PASS", "PAT", "DSN"}

func credentialName(name string) bool {
	upper := strings.ToUpper(name)
	for _, f := range secretNameFragments {
		if strings.Contains(upper, f) {
			return true
		}
	}
	for _, seg := range strings.Split(upper, "_") {
		if slices.Contains(secretNameWords, seg) {
			return true
		}
	}
	return false
}

// effectiveLimits fills zero fields from def and refuses any above ceil;
// errors name the field under prefix.
func effectiveLimits(prefix string, req, def, ceil policy.Limits) (policy.Limits, error) {
	out := req
	for _, f := range []struct {
		name      string
		v         *int64
		def, ceil int64
		format    func(int64) string
	}{
		{"cpu_millis", &out.CPUMillis, def.CPUMillis, ceil.CPUMillis, plain},
		{"memory_bytes", &out.MemoryBytes, def.MemoryBytes, ceil.MemoryBytes, bytesText},
		{"pids", &out.Pids, def.Pids, ceil.Pids, plain},
		{"disk_bytes", &out.DiskBytes, def.DiskBytes, ceil.DiskBytes, bytesText},
		{"deadline", (*int64)(&out.Deadline), int64(def.Deadline), int64(ceil.Deadline), durationText},
	} {
		field := prefix + "." + f.name
		switch {
		case *f.v < 0:
			return policy.Limits{}, invalid(field, "must not be negative")
		case *f.v == 0:
			*f.v = f.def
		case *f.v > f.ceil:
			return policy.Limits{}, invalid(field, "%s is above the tenant's ceiling of %s", f.format(*f.v), f.format(f.ceil))
		}
	}
	return out, nil
}

// queueRoom refuses a submission while tenant t has as many jobs queued as
// its quota.queued_jobs allows: waiting jobs cost the authority work, and
// no tenant may pile them up without bound.
func (s *Service) queueRoom(ctx context.Context, t *policy.Tenant) error {
	limit := t.Quota.QueuedJobs
	if limit <= 0 {
		limit = policy.DefaultQueuedJobs
	}
	queued, _, err := s.cfg.Store.ListJobs(ctx, store.ListOptions{Tenant: t.Name, States: []store.State{store.StateQueued}, Limit: int(limit)})
	if err != nil {
		return err
	}
	if int64(len(queued)) >= limit {
		return fmt.Errorf("%w: tenant %s has %d jobs queued, its quota.queued_jobs: wait for some to start, or cancel some", errdefs.ErrResourceExhausted, t.Name, len(queued))
	}
	return nil
}

// withinQuota refuses limits no job of tenant t could ever run under: more
// memory or CPU than its quota allows all its jobs together.
func withinQuota(prefix string, t *policy.Tenant, l policy.Limits) error {
	switch q := t.Quota; {
	case q.MemoryBytes > 0 && l.MemoryBytes > q.MemoryBytes:
		return invalid(prefix+".memory_bytes", "%s is more than tenant %s's quota.memory of %s for all its running jobs", bytesText(l.MemoryBytes), t.Name, bytesText(q.MemoryBytes))
	case q.CPUMillis > 0 && l.CPUMillis > q.CPUMillis:
		return invalid(prefix+".cpu_millis", "%d is more than tenant %s's quota.cpu_millis of %d for all its running jobs", l.CPUMillis, t.Name, q.CPUMillis)
	}
	return nil
}

// runnable checks limits against what the runtime class needs to start
// at all, and with what runs beside the job (pkg/runspec, which the
// executor applies too); errors name a limit under prefix, and with as
// the spec's field.
func runnable(prefix, class string, with []string, l policy.Limits) error {
	rl := runspec.Limits{CPUMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids, DiskBytes: l.DiskBytes, Deadline: l.Deadline}
	err := runspec.CheckLimits(class, rl)
	if err == nil {
		err = runspec.CheckWith(class, with, rl)
	}
	var fe *runspec.FieldError
	switch {
	case errors.As(err, &fe) && strings.HasPrefix(fe.Field, "with"):
		return invalid("spec."+fe.Field, "%s", fe.Reason)
	case errors.As(err, &fe):
		return invalid(prefix+"."+fe.Field, "%s", fe.Reason)
	}
	return err
}

func plain(n int64) string        { return fmt.Sprint(n) }
func bytesText(n int64) string    { return fmt.Sprintf("%d (%s)", n, config.FormatByteSize(n)) }
func durationText(n int64) string { return time.Duration(n).String() }

// checkNetwork validates a policy and checks it against the tenant's
// egress; errors name fields under base. An unset policy is deny-all,
// made explicit.
func checkNetwork(t *policy.Tenant, base string, n Network) (Network, error) {
	switch n.Mode {
	case NetworkUnset, NetworkDenyAll:
		return Network{Mode: NetworkDenyAll}, nil
	case NetworkAllow:
		if len(n.Rules) == 0 {
			return n, invalid(base+".allow.rules", "at least one rule is required")
		}
		for i, r := range n.Rules {
			field := fmt.Sprintf("%s.allow.rules[%d]", base, i)
			// In the form the executor takes (pkg/egress), so nothing is
			// granted that cannot run.
			p, err := egress.ParsePrefix(r.CIDR)
			if err != nil {
				return n, invalid(field+".cidr", "%v", err)
			}
			if err := checkPorts(field+".ports", r.Ports); err != nil {
				return n, err
			}
			if !t.Egress.AllowsPrefix(p) {
				return n, denied(field+".cidr", "%s is outside tenant %q's permitted egress", r.CIDR, t.Name)
			}
		}
	case NetworkDomains:
		if len(n.Domains) == 0 {
			return n, invalid(base+".domains.domains", "at least one domain is required")
		}
		for i, d := range n.Domains {
			field := fmt.Sprintf("%s.domains.domains[%d]", base, i)
			name, err := egress.NormalizeName(d)
			if err != nil {
				return n, invalid(field, "%v", err)
			}
			if name != d {
				return n, invalid(field, "%q: write it as %q", d, name)
			}
			if !t.Egress.AllowsDomain(d) {
				return n, denied(field, "%s is outside tenant %q's permitted egress", d, t.Name)
			}
		}
		if err := checkPorts(base+".domains.ports", n.DomainPorts); err != nil {
			return n, err
		}
	default:
		return n, invalid(base, "unknown mode")
	}
	return n, nil
}

func checkPorts(field string, ports []uint32) error {
	var pe *egress.PortError
	if _, err := egress.Ports(ports); errors.As(err, &pe) {
		return invalid(fmt.Sprintf("%s[%d]", field, pe.Index), "%v", err)
	}
	return nil
}
