package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Approvals and leases. Every change is one transaction with its audit
// event. Consuming is a single conditional UPDATE whose WHERE clause holds
// every condition (state, job, digest, target, expiry): the database's row
// lock makes concurrent consumers of one approval take turns, and only the
// first still finds the row approved.

const approvalColumns = `id, job_id, tenant, requester, bundle_digest, target_repo, target_branch, state, required,
	created_at, expires_at, consumed_at, consumed_by, version, kind, job_change`

func scanApproval(row scanner) (store.Approval, error) {
	var (
		a                          store.Approval
		state, kind                string
		created, expires, consumed int64
	)
	err := row.Scan(&a.ID, &a.JobID, &a.Tenant, &a.Requester, &a.BundleDigest, &a.TargetRepo, &a.TargetBranch, &state, &a.Required,
		&created, &expires, &consumed, &a.ConsumedBy, &a.Version, &kind, &a.Change)
	a.State, a.Kind = store.ApprovalState(state), store.ApprovalKind(kind)
	a.CreatedAt, a.ExpiresAt, a.ConsumedAt = fromMicros(created), fromMicros(expires), fromMicros(consumed)
	return a, err
}

func scanVote(row scanner) (store.Vote, error) {
	var (
		v  store.Vote
		at int64
	)
	err := row.Scan(&v.Approver, &v.Decision, &v.Comment, &at)
	v.DecidedAt = fromMicros(at)
	return v, err
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// byID and byJob select one approval: by its id, or a job's publish request.
const (
	byID  = "id = ?"
	byJob = "job_id = ? AND kind = 'publish'"
)

// loadApproval reads one approval by cond (byID or byJob), with its votes.
func (s *DB) loadApproval(ctx context.Context, q querier, cond, value, suffix string) (store.Approval, error) {
	a, err := scanApproval(q.QueryRowContext(ctx, s.Q(`SELECT `+approvalColumns+` FROM approvals WHERE `+cond+suffix), value))
	if errors.Is(err, sql.ErrNoRows) {
		what := "approval %q"
		if cond == byJob {
			what = "publish approval for job %q"
		}
		return store.Approval{}, fmt.Errorf("%w: "+what, errdefs.ErrNotFound, value)
	}
	if err != nil {
		return store.Approval{}, err
	}
	rows, err := q.QueryContext(ctx, s.Q(`SELECT approver, decision, comment, decided_at FROM approval_votes WHERE approval_id = ? ORDER BY decided_at, approver`), a.ID)
	if err != nil {
		return store.Approval{}, err
	}
	a.Votes, err = collect(rows, scanVote)
	return a, err
}

func defaultEvent(e *audit.Event, jobID, tenant string) error {
	if e.JobID == "" {
		e.JobID = jobID
	}
	if e.Tenant == "" {
		e.Tenant = tenant
	}
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	return nil
}

// CreateApprovalAudited implements store.Store.
func (s *DB) CreateApprovalAudited(ctx context.Context, a store.Approval, e audit.Event) (store.Approval, bool, error) {
	if a.Kind == "" {
		a.Kind = store.KindPublish
	}
	if a.ID == "" || a.JobID == "" || a.Tenant == "" || a.State != store.ApprovalPending || a.Required < 1 || a.ExpiresAt.IsZero() {
		return store.Approval{}, false, fmt.Errorf("%w: store: create approval: id, job, tenant, pending state, required >= 1 and expiry are required", errdefs.ErrInvalidArgument)
	}
	carries := a.Kind == store.KindChange || a.Kind == store.KindStart || a.Kind == store.KindPortForward
	if carries != (len(a.Change) > 0) || (!carries && a.Kind != store.KindPublish) {
		return store.Approval{}, false, fmt.Errorf("%w: store: create approval: kind %q: a change or start request, and only one, carries what it is about", errdefs.ErrInvalidArgument, a.Kind)
	}
	if err := defaultEvent(&e, a.JobID, a.Tenant); err != nil {
		return store.Approval{}, false, fmt.Errorf("store: create approval: %w", err)
	}
	var (
		out     store.Approval
		created bool
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// Only publish requests are one per job (a partial unique index).
		conflict, cond, key := ` ON CONFLICT (job_id) WHERE kind = 'publish' DO NOTHING`, byJob, a.JobID
		if a.Kind != store.KindPublish {
			conflict, cond, key = "", byID, a.ID
		}
		res, err := tx.ExecContext(ctx, s.Q(`INSERT INTO approvals (`+approvalColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`+conflict),
			a.ID, a.JobID, a.Tenant, a.Requester, a.BundleDigest, a.TargetRepo, a.TargetBranch, string(a.State), a.Required,
			micros(a.CreatedAt), micros(a.ExpiresAt), int64(0), "", int64(1), string(a.Kind), a.Change)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 1 {
			created = true
			if _, err := s.appendAudit(ctx, tx, e); err != nil {
				return err
			}
		}
		out, err = s.loadApproval(ctx, tx, cond, key, "")
		return err
	})
	if err != nil {
		return store.Approval{}, false, fmt.Errorf("store: create approval: %w", err)
	}
	return out, created, nil
}

// GetApproval implements store.Store.
func (s *DB) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	a, err := s.loadApproval(ctx, s.SQL, byID, id, "")
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, fmt.Errorf("store: get approval: %w", err)
	}
	return a, err
}

// ApprovalForJob implements store.Store.
func (s *DB) ApprovalForJob(ctx context.Context, jobID string) (store.Approval, error) {
	a, err := s.loadApproval(ctx, s.SQL, byJob, jobID, "")
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return store.Approval{}, fmt.Errorf("store: approval for job: %w", err)
	}
	return a, err
}

// ListApprovals implements store.Store.
func (s *DB) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]store.Approval, string, error) {
	if f.Limit <= 0 {
		return nil, "", fmt.Errorf("%w: store: list approvals: limit must be positive", errdefs.ErrInvalidArgument)
	}
	where := []string{"1 = 1"}
	var args []any
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if f.Kind != "" {
		where = append(where, "kind = ?")
		args = append(args, string(f.Kind))
	}
	if f.JobID != "" {
		where = append(where, "job_id = ?")
		args = append(args, f.JobID)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	tail, args, err := newestFirst(where, args, f.PageToken, f.Limit)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+approvalColumns+` FROM approvals WHERE `+tail), args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list approvals: %w", err)
	}
	list, err := collect(rows, scanApproval)
	if err != nil {
		return nil, "", fmt.Errorf("store: list approvals: %w", err)
	}
	// Votes come after the cut; each comment is bounded where it is made.
	size := func(a store.Approval) int { return len(a.Change) + len(a.Requester) + len(a.TargetRepo) + 1024 }
	list, next := trimPage(list, f.Limit, size, func(a store.Approval) (time.Time, string) { return a.CreatedAt, a.ID })
	if len(list) == 0 {
		return list, next, nil
	}
	// The page's votes in one query.
	ids := make([]any, len(list))
	at := make(map[string]int, len(list))
	for i, a := range list {
		ids[i], at[a.ID] = a.ID, i
	}
	vrows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT approval_id, approver, decision, comment, decided_at FROM approval_votes
		WHERE approval_id IN (`+placeholders(len(ids))+`) ORDER BY decided_at, approver`), ids...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list approvals: votes: %w", err)
	}
	type idVote struct {
		id string
		v  store.Vote
	}
	votes, err := collect(vrows, func(r scanner) (idVote, error) {
		var (
			iv idVote
			at int64
		)
		err := r.Scan(&iv.id, &iv.v.Approver, &iv.v.Decision, &iv.v.Comment, &at)
		iv.v.DecidedAt = fromMicros(at)
		return iv, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("store: list approvals: votes: %w", err)
	}
	for _, iv := range votes {
		if i, ok := at[iv.id]; ok {
			list[i].Votes = append(list[i].Votes, iv.v)
		}
	}
	return list, next, nil
}

// DecideApprovalAudited implements store.Store.
func (s *DB) DecideApprovalAudited(ctx context.Context, id string, decide func(*store.Approval) (store.Vote, audit.Event, error)) (store.Approval, error) {
	var (
		out     store.Approval
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		a, err := s.loadApproval(ctx, tx, byID, id, s.D.ForUpdate)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				userErr = err
			}
			return err
		}
		version := a.Version
		v, e, err := decide(&a)
		if err != nil {
			userErr = err
			return err
		}
		if err := defaultEvent(&e, a.JobID, a.Tenant); err != nil {
			return err
		}
		if v.Approver == "" || (v.Decision != store.DecisionApprove && v.Decision != store.DecisionDeny) {
			return fmt.Errorf("%w: a vote needs an approver and a decision", errdefs.ErrInvalidArgument)
		}
		res, err := tx.ExecContext(ctx, s.Q(`INSERT INTO approval_votes (approval_id, approver, decision, comment, decided_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (approval_id, approver) DO NOTHING`), a.ID, v.Approver, v.Decision, v.Comment, micros(v.DecidedAt))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			userErr = fmt.Errorf("%w: %s has already decided approval %q", errdefs.ErrAlreadyExists, v.Approver, a.ID)
			return userErr
		}
		res, err = tx.ExecContext(ctx, s.Q(`UPDATE approvals SET state = ?, version = ? WHERE id = ? AND version = ?`),
			string(a.State), version+1, a.ID, version)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("approval %q changed underneath the decision (rows=%d, err=%v)", a.ID, n, err)
		}
		if _, err := s.appendAudit(ctx, tx, e); err != nil {
			return err
		}
		out, err = s.loadApproval(ctx, tx, byID, id, "")
		return err
	})
	if userErr != nil {
		return store.Approval{}, userErr
	}
	if err != nil {
		return store.Approval{}, fmt.Errorf("store: decide approval %q: %w", id, err)
	}
	return out, nil
}

// ConsumeApprovalAudited implements store.Store.
func (s *DB) ConsumeApprovalAudited(ctx context.Context, r store.ConsumeRequest, e audit.Event) (store.Approval, error) {
	if r.Kind == "" {
		r.Kind = store.KindPublish
	}
	if err := checkConsume(r, &e); err != nil {
		return store.Approval{}, err
	}
	var (
		out    store.Approval
		refuse error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		out, refuse, err = s.consumeTx(ctx, tx, r, e)
		return err
	})
	if refuse != nil {
		return store.Approval{}, refuse
	}
	if err != nil {
		return store.Approval{}, fmt.Errorf("store: consume approval %q: %w", r.ID, err)
	}
	return out, nil
}

// ApplyChangeAudited implements store.Store.
func (s *DB) ApplyChangeAudited(ctx context.Context, r store.ConsumeRequest, consumed audit.Event, update func(*store.Job) (audit.Event, error)) (store.Approval, store.Job, error) {
	r.Kind = store.KindChange
	if err := checkConsume(r, &consumed); err != nil {
		return store.Approval{}, store.Job{}, err
	}
	var (
		a       store.Approval
		j       store.Job
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		if a, userErr, err = s.consumeTx(ctx, tx, r, consumed); err != nil {
			return err
		}
		j, userErr, err = s.updateJobTx(ctx, tx, r.JobID, func(j *store.Job) (*audit.Event, error) {
			e, err := update(j)
			return &e, err
		})
		return err
	})
	if userErr != nil {
		return store.Approval{}, store.Job{}, userErr
	}
	if err != nil {
		return store.Approval{}, store.Job{}, fmt.Errorf("store: apply change %q: %w", r.ID, err)
	}
	return a, j, nil
}

func checkConsume(r store.ConsumeRequest, e *audit.Event) error {
	if r.ID == "" || r.By == "" || r.At.IsZero() {
		return fmt.Errorf("%w: store: consume approval: id, consumer and time are required", errdefs.ErrInvalidArgument)
	}
	if err := defaultEvent(e, r.JobID, ""); err != nil {
		return fmt.Errorf("store: consume approval: %w", err)
	}
	return nil
}

// consumeTx is the one conditional update that spends an approval, with
// its event, inside tx. refuse is set (and returned as err too) when the
// approval is not an unexpired approved request matching r.
func (s *DB) consumeTx(ctx context.Context, tx *sql.Tx, r store.ConsumeRequest, e audit.Event) (out store.Approval, refuse, err error) {
	res, err := tx.ExecContext(ctx, s.Q(`UPDATE approvals SET state = ?, consumed_at = ?, consumed_by = ?, version = version + 1
		WHERE id = ? AND kind = ? AND state = ? AND job_id = ? AND bundle_digest = ? AND target_repo = ? AND target_branch = ? AND expires_at > ?`),
		string(store.ApprovalConsumed), micros(r.At), r.By,
		r.ID, string(r.Kind), string(store.ApprovalApproved), r.JobID, r.BundleDigest, r.TargetRepo, r.TargetBranch, micros(r.At))
	if err != nil {
		return out, nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return out, nil, err
	}
	if n != 1 {
		err = fmt.Errorf("%w: approval %q is not an unexpired approved %s request for that job, digest and target", errdefs.ErrFailedPrecondition, r.ID, r.Kind)
		return out, err, err
	}
	if out, err = s.loadApproval(ctx, tx, byID, r.ID, ""); err != nil {
		return out, nil, err
	}
	if e.Tenant == "" {
		e.Tenant = out.Tenant
	}
	_, err = s.appendAudit(ctx, tx, e)
	return out, nil, err
}

const leaseColumns = `id, purpose, job_id, resource, holder, issued_at, expires_at, revoked_at, revoke_reason`

func scanLease(row scanner) (store.Lease, error) {
	var (
		l                        store.Lease
		issued, expires, revoked int64
	)
	err := row.Scan(&l.ID, &l.Purpose, &l.JobID, &l.Resource, &l.Holder, &issued, &expires, &revoked, &l.RevokeReason)
	l.IssuedAt, l.ExpiresAt, l.RevokedAt = fromMicros(issued), fromMicros(expires), fromMicros(revoked)
	return l, err
}

func (s *DB) loadLease(ctx context.Context, q querier, id string) (store.Lease, error) {
	l, err := scanLease(q.QueryRowContext(ctx, s.Q(`SELECT `+leaseColumns+` FROM leases WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Lease{}, fmt.Errorf("%w: lease %q", errdefs.ErrNotFound, id)
	}
	return l, err
}

// CreateLeaseAudited implements store.Store.
func (s *DB) CreateLeaseAudited(ctx context.Context, l store.Lease, e audit.Event) (store.Lease, error) {
	if l.ID == "" || l.Purpose == "" || l.JobID == "" || l.Resource == "" || l.Holder == "" || l.IssuedAt.IsZero() || !l.ExpiresAt.After(l.IssuedAt) {
		return store.Lease{}, fmt.Errorf("%w: store: create lease: id, purpose, job, resource, holder and a time span are required", errdefs.ErrInvalidArgument)
	}
	if err := defaultEvent(&e, l.JobID, ""); err != nil {
		return store.Lease{}, fmt.Errorf("store: create lease: %w", err)
	}
	var out store.Lease
	create := func(tx *sql.Tx) error {
		// One active lease per job, purpose and resource (a job's
		// brokered credentials are several resources): a lease asked for
		// again (a retry after a crash, a renewal) replaces the one
		// before, revoked on the log in this transaction. Concurrent
		// leases for one job take turns on the job's key.
		if s.D.KeyLock != "" {
			if _, err := tx.ExecContext(ctx, s.Q(s.D.KeyLock), "lease:"+l.JobID+":"+l.Purpose+":"+l.Resource); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, s.Q(`SELECT id FROM leases WHERE job_id = ? AND purpose = ? AND resource = ? AND revoked_at = 0 ORDER BY id`+s.D.ForUpdate),
			l.JobID, l.Purpose, l.Resource)
		if err != nil {
			return err
		}
		old, err := collect(rows, func(r scanner) (string, error) {
			var id string
			return id, r.Scan(&id)
		})
		if err != nil {
			return err
		}
		for _, id := range old {
			reason := "replaced by lease " + l.ID
			// Never before the replaced lease was issued.
			if _, err := tx.ExecContext(ctx, s.Q(`UPDATE leases SET revoked_at = CASE WHEN issued_at > ? THEN issued_at ELSE ? END, revoke_reason = ?
				WHERE id = ? AND revoked_at = 0`), micros(l.IssuedAt), micros(l.IssuedAt), reason, id); err != nil {
				return err
			}
			rev := audit.Event{Time: l.IssuedAt, Kind: audit.KindLeaseRevoked, Caller: e.Caller, Subject: id, Tenant: e.Tenant, JobID: l.JobID,
				Outcome: e.Outcome, Reason: reason}
			if err := defaultEvent(&rev, l.JobID, ""); err != nil {
				return err
			}
			if _, err := s.appendAudit(ctx, tx, rev); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, s.Q(`INSERT INTO leases (`+leaseColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			l.ID, l.Purpose, l.JobID, l.Resource, l.Holder, micros(l.IssuedAt), micros(l.ExpiresAt), int64(0), ""); err != nil {
			return err
		}
		if _, err := s.appendAudit(ctx, tx, e); err != nil {
			return err
		}
		out, err = s.loadLease(ctx, tx, l.ID)
		return err
	}
	err := s.Tx(ctx, create)
	for try := 0; err != nil && s.D.Conflict != nil && s.D.Conflict(err) && try < 5; try++ {
		// A concurrent lease for the job committed first: this one
		// replaces it.
		err = s.Tx(ctx, create)
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("store: create lease: %w", err)
	}
	return out, nil
}

// GetLease implements store.Store.
func (s *DB) GetLease(ctx context.Context, id string) (store.Lease, error) {
	l, err := s.loadLease(ctx, s.SQL, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return store.Lease{}, fmt.Errorf("store: get lease: %w", err)
	}
	return l, err
}

// RevokeLeaseAudited implements store.Store.
func (s *DB) RevokeLeaseAudited(ctx context.Context, id string, at time.Time, reason string, e audit.Event) (store.Lease, error) {
	if at.IsZero() {
		return store.Lease{}, fmt.Errorf("%w: store: revoke lease: a time is required", errdefs.ErrInvalidArgument)
	}
	var (
		out     store.Lease
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.Q(`UPDATE leases SET revoked_at = ?, revoke_reason = ? WHERE id = ? AND revoked_at = 0`), micros(at), reason, id)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		l, err := s.loadLease(ctx, tx, id)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				userErr = err
			}
			return err
		}
		if n != 1 {
			userErr = fmt.Errorf("%w: lease %q is already revoked", errdefs.ErrFailedPrecondition, id)
			return userErr
		}
		if err := defaultEvent(&e, l.JobID, ""); err != nil {
			return err
		}
		if _, err := s.appendAudit(ctx, tx, e); err != nil {
			return err
		}
		out = l
		return nil
	})
	if userErr != nil {
		return store.Lease{}, userErr
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("store: revoke lease %q: %w", id, err)
	}
	return out, nil
}

// ListLeases implements store.Store.
func (s *DB) ListLeases(ctx context.Context, f store.LeaseFilter) ([]store.Lease, string, error) {
	if f.Limit <= 0 {
		return nil, "", fmt.Errorf("%w: store: list leases: limit must be positive", errdefs.ErrInvalidArgument)
	}
	where := []string{"1 = 1"}
	var args []any
	if f.JobID != "" {
		where = append(where, "job_id = ?")
		args = append(args, f.JobID)
	}
	if !f.ActiveAt.IsZero() {
		where = append(where, "revoked_at = 0 AND expires_at > ?")
		args = append(args, micros(f.ActiveAt))
	}
	if f.PageToken != "" {
		at, id, err := decodeToken(f.PageToken)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(issued_at < ? OR (issued_at = ? AND id < ?))")
		args = append(args, at, at, id)
	}
	args = append(args, f.Limit+1)
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+leaseColumns+` FROM leases WHERE `+strings.Join(where, " AND ")+
		` ORDER BY issued_at DESC, id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list leases: %w", err)
	}
	list, err := collect(rows, scanLease)
	if err != nil {
		return nil, "", fmt.Errorf("store: list leases: %w", err)
	}
	list, next := trimPage(list, f.Limit, func(l store.Lease) int { return len(l.Resource) + len(l.Holder) + len(l.RevokeReason) + 512 },
		func(l store.Lease) (time.Time, string) { return l.IssuedAt, l.ID })
	return list, next, nil
}

// ExpireApprovalsAudited implements store.Store.
func (s *DB) ExpireApprovalsAudited(ctx context.Context, now time.Time, limit int, event func(store.Approval) audit.Event) ([]store.Approval, error) {
	return expireEach(ctx, s, "approval", limit,
		`SELECT id FROM approvals WHERE state IN (?, ?) AND expires_at <= ? ORDER BY expires_at, id LIMIT ?`,
		[]any{string(store.ApprovalPending), string(store.ApprovalApproved), micros(now)},
		`UPDATE approvals SET state = ?, version = version + 1 WHERE id = ? AND state IN (?, ?) AND expires_at <= ?`,
		func(id string) []any {
			return []any{string(store.ApprovalExpired), id, string(store.ApprovalPending), string(store.ApprovalApproved), micros(now)}
		},
		s.expiredApproval(ctx, event))
}

// WithdrawApprovalAudited implements store.Store.
func (s *DB) WithdrawApprovalAudited(ctx context.Context, id string, event func(store.Approval) audit.Event) (bool, error) {
	open := []any{string(store.ApprovalPending), string(store.ApprovalApproved)}
	done, err := expireEach(ctx, s, "withdrawn approval", 1,
		`SELECT id FROM approvals WHERE id = ? AND state IN (?, ?) LIMIT ?`,
		append([]any{id}, open...),
		`UPDATE approvals SET state = ?, version = version + 1 WHERE id = ? AND state IN (?, ?)`,
		func(id string) []any { return append([]any{string(store.ApprovalExpired), id}, open...) },
		s.expiredApproval(ctx, event))
	return len(done) == 1, err
}

// expiredApproval loads an approval just expired, with its event.
func (s *DB) expiredApproval(ctx context.Context, event func(store.Approval) audit.Event) func(*sql.Tx, string) (store.Approval, audit.Event, error) {
	return func(tx *sql.Tx, id string) (store.Approval, audit.Event, error) {
		a, err := s.loadApproval(ctx, tx, byID, id, "")
		if err != nil {
			return a, audit.Event{}, err
		}
		e := event(a)
		return a, e, defaultEvent(&e, a.JobID, a.Tenant)
	}
}

// ExpireChangesOfEndedJobsAudited implements store.Store.
func (s *DB) ExpireChangesOfEndedJobsAudited(ctx context.Context, limit int, event func(store.Approval) audit.Event) ([]store.Approval, error) {
	open := []any{string(store.ApprovalPending), string(store.ApprovalApproved)}
	ended := []any{string(store.StateFinished), string(store.StateFailed), string(store.StateCancelled)}
	return expireEach(ctx, s, "change approval", limit,
		`SELECT a.id FROM approvals a JOIN jobs j ON j.id = a.job_id
			WHERE a.kind IN ('change', 'start', 'port_forward') AND a.state IN (?, ?) AND j.state IN (?, ?, ?) ORDER BY a.created_at, a.id LIMIT ?`,
		append(open, ended...),
		`UPDATE approvals SET state = ?, version = version + 1 WHERE id = ? AND kind IN ('change', 'start', 'port_forward') AND state IN (?, ?)
			AND job_id IN (SELECT id FROM jobs WHERE state IN (?, ?, ?))`,
		func(id string) []any {
			return append(append([]any{string(store.ApprovalExpired), id}, open...), ended...)
		},
		s.expiredApproval(ctx, event))
}

// ExpireLeasesAudited implements store.Store.
func (s *DB) ExpireLeasesAudited(ctx context.Context, now time.Time, limit int, event func(store.Lease) audit.Event) ([]store.Lease, error) {
	return expireEach(ctx, s, "lease", limit,
		`SELECT id FROM leases WHERE revoked_at = 0 AND expires_at <= ? ORDER BY expires_at, id LIMIT ?`,
		[]any{micros(now)},
		`UPDATE leases SET revoked_at = expires_at, revoke_reason = ? WHERE id = ? AND revoked_at = 0 AND expires_at <= ?`,
		func(id string) []any { return []any{store.ExpiredReason, id, micros(now)} },
		func(tx *sql.Tx, id string) (store.Lease, audit.Event, error) {
			l, err := s.loadLease(ctx, tx, id)
			if err != nil {
				return l, audit.Event{}, err
			}
			e := event(l)
			return l, e, defaultEvent(&e, l.JobID, "")
		})
}

// RevokeLeasesAudited implements store.Store.
func (s *DB) RevokeLeasesAudited(ctx context.Context, r store.LeaseRevocation, limit int, event func(store.Lease, store.State) audit.Event) ([]store.Lease, error) {
	if r.Purpose == "" || r.At.IsZero() {
		return nil, fmt.Errorf("%w: store: revoke leases: a purpose and a time are required", errdefs.ErrInvalidArgument)
	}
	// The same conditions select the leases and guard each update, so a
	// lease a replica ended (or renewed) meanwhile is skipped.
	where := []string{"l.revoked_at = 0", "l.purpose = ?", "l.expires_at > ?"}
	args := []any{r.Purpose, micros(r.At)}
	if r.Holder != "" {
		where = append(where, "l.holder = ?")
		args = append(args, r.Holder)
	}
	if !r.IssuedBefore.IsZero() {
		where = append(where, "l.issued_at < ?")
		args = append(args, micros(r.IssuedBefore))
	}
	if r.JobEnded {
		where = append(where, "l.job_id IN (SELECT id FROM jobs WHERE state IN (?, ?, ?))")
		args = append(args, string(store.StateFinished), string(store.StateFailed), string(store.StateCancelled))
	}
	cond := strings.Join(where, " AND ")
	return expireEach(ctx, s, "lease", limit,
		`SELECT l.id FROM leases l WHERE `+cond+` ORDER BY l.issued_at, l.id LIMIT ?`, args,
		`UPDATE leases SET revoked_at = ? WHERE id IN (SELECT l.id FROM leases l WHERE l.id = ? AND `+cond+`)`,
		func(id string) []any { return append([]any{micros(r.At), id}, args...) },
		func(tx *sql.Tx, id string) (store.Lease, audit.Event, error) {
			// The reason is the event's, which needs the lease and its
			// job's state: written once the revocation holds the row.
			l, err := s.loadLease(ctx, tx, id)
			if err != nil {
				return l, audit.Event{}, err
			}
			var state string
			err = tx.QueryRowContext(ctx, s.Q(`SELECT state FROM jobs WHERE id = ?`), l.JobID).Scan(&state)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return l, audit.Event{}, err
			}
			e := event(l, store.State(state))
			if _, err := tx.ExecContext(ctx, s.Q(`UPDATE leases SET revoke_reason = ? WHERE id = ?`), e.Reason, id); err != nil {
				return l, audit.Event{}, err
			}
			l.RevokeReason = e.Reason
			return l, e, defaultEvent(&e, l.JobID, "")
		})
}

// expireEach selects up to limit ids with find (whose last argument is
// the limit), then, one transaction per id, runs the conditional update
// (which must change exactly that row, or the id is skipped: a replica
// got there first), loads the row and appends its event.
func expireEach[T any](ctx context.Context, s *DB, what string, limit int, find string, findArgs []any, update string, updateArgs func(id string) []any,
	load func(tx *sql.Tx, id string) (T, audit.Event, error)) ([]T, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: store: expire %ss: limit must be positive", errdefs.ErrInvalidArgument, what)
	}
	ids, err := s.ids(ctx, find, append(findArgs, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: expire %ss: %w", what, err)
	}
	var out []T
	for _, id := range ids {
		var row T
		err := s.Tx(ctx, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, s.Q(update), updateArgs(id)...)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return errSkip
			}
			var e audit.Event
			if row, e, err = load(tx, id); err != nil {
				return err
			}
			_, err = s.appendAudit(ctx, tx, e)
			return err
		})
		if errors.Is(err, errSkip) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("store: expire %s %q: %w", what, id, err)
		}
		out = append(out, row)
	}
	return out, nil
}

// errSkip ends a transaction that found nothing left to do.
var errSkip = errors.New("nothing to do")

// ids runs a query returning one id column.
func (s *DB) ids(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := s.SQL.QueryContext(ctx, s.Q(query), args...)
	if err != nil {
		return nil, err
	}
	return collect(rows, func(r scanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	})
}
