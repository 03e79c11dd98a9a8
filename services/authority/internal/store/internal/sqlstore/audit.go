package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// The audit log is two tables: audit_log, one row per event, append-only
// (the schema's triggers refuse UPDATE and DELETE), and audit_head, one row
// holding the last entry's sequence and hash. Every append locks the head
// row (or, in SQLite, the whole database) for the rest of its transaction,
// so appends from any number of goroutines and replicas form one chain; and
// because the head, not the last row, says where the chain goes on, an
// entry deleted from the end leaves a gap the next append makes visible.

const auditColumns = `seq, occurred_at, kind, caller, subject, tenant, job_id, outcome, reason, prev_hash, hash`

func scanEvent(row scanner) (audit.Event, error) {
	var (
		e  audit.Event
		at int64
	)
	err := row.Scan(&e.Sequence, &at, &e.Kind, &e.Caller, &e.Subject, &e.Tenant, &e.JobID, &e.Outcome, &e.Reason, &e.PrevHash, &e.Hash)
	// Unlike a job's times an event's is never unset, so 0 is the epoch.
	e.Time = time.UnixMicro(at).UTC()
	return e, err
}

// appendAudit links e to the chain's head and writes it within tx; e has
// been validated.
func (s *DB) appendAudit(ctx context.Context, tx *sql.Tx, e audit.Event) (audit.Event, error) {
	// No entry grows with what a caller sent (a name, a command, a
	// comment): every reader of the log pages through it.
	e = e.Bounded()
	var (
		last int64
		prev string
	)
	if err := tx.QueryRowContext(ctx, `SELECT seq, hash FROM audit_head WHERE id = 1`+s.D.ForUpdate).Scan(&last, &prev); err != nil {
		return audit.Event{}, fmt.Errorf("audit head: %w", err)
	}
	e.Sequence, e.PrevHash = last+1, prev
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = audit.Normalize(e.Time)
	hash, err := e.ComputeHash()
	if err != nil {
		return audit.Event{}, fmt.Errorf("audit head holds a malformed hash: %w", err)
	}
	e.Hash = hash
	if _, err := tx.ExecContext(ctx, s.Q(`INSERT INTO audit_log (`+auditColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		e.Sequence, e.Time.UnixMicro(), e.Kind, e.Caller, e.Subject, e.Tenant, e.JobID, e.Outcome, e.Reason, e.PrevHash, e.Hash); err != nil {
		return audit.Event{}, fmt.Errorf("audit entry %d: %w", e.Sequence, err)
	}
	if _, err := tx.ExecContext(ctx, s.Q(`UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1`), e.Sequence, e.Hash); err != nil {
		return audit.Event{}, fmt.Errorf("audit head: %w", err)
	}
	return e, nil
}

// AppendAudit implements store.Store.
func (s *DB) AppendAudit(ctx context.Context, e audit.Event) (audit.Event, error) {
	if err := e.Validate(); err != nil {
		return audit.Event{}, fmt.Errorf("store: append audit: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	var out audit.Event
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = s.appendAudit(ctx, tx, e)
		return err
	})
	if err != nil {
		return audit.Event{}, fmt.Errorf("store: append audit: %w", err)
	}
	return out, nil
}

// AuditHead implements store.Store.
func (s *DB) AuditHead(ctx context.Context) (int64, string, error) {
	var (
		seq  int64
		hash string
	)
	if err := s.SQL.QueryRowContext(ctx, `SELECT seq, hash FROM audit_head WHERE id = 1`).Scan(&seq, &hash); err != nil {
		return 0, "", fmt.Errorf("store: audit head: %w", err)
	}
	return seq, hash, nil
}

// ceilMicros is t in microseconds, rounded up, so that a bound between two
// microseconds neither takes in nor leaves out an event it should not.
func ceilMicros(t time.Time) int64 {
	us := t.UnixMicro()
	if t.Nanosecond()%1000 != 0 {
		us++
	}
	return us
}

// ListAudit implements store.Store.
func (s *DB) ListAudit(ctx context.Context, f store.AuditFilter) ([]audit.Event, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("%w: audit filter: limit must be positive", errdefs.ErrInvalidArgument)
	}
	where := []string{"seq > ?"}
	args := []any{f.AfterSequence}
	for _, c := range []struct{ column, value string }{
		{"job_id", f.JobID}, {"tenant", f.Tenant}, {"caller", f.Caller}, {"kind", f.Kind},
	} {
		if c.value != "" {
			where = append(where, c.column+" = ?")
			args = append(args, c.value)
		}
	}
	if !f.Since.IsZero() {
		where = append(where, "occurred_at >= ?")
		args = append(args, ceilMicros(f.Since))
	}
	if !f.Until.IsZero() {
		where = append(where, "occurred_at < ?")
		args = append(args, ceilMicros(f.Until))
	}
	args = append(args, f.Limit)
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+auditColumns+` FROM audit_log WHERE `+strings.Join(where, " AND ")+
		` ORDER BY seq LIMIT ?`), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	events, err := collect(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	return events, nil
}
