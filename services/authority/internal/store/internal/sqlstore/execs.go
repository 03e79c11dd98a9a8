package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

const execColumns = `session_id, exec_id, seq, spec_digest, summary, state, reason, exit_code, message,
	requested_by, requested_at, started_at, ended_at, stdout_size, stderr_size, stdout_truncated, stderr_truncated,
	stdout_sha256, stderr_sha256, updated_at, version`

func scanExec(row scanner) (store.Exec, error) {
	var (
		x                                 store.Exec
		state                             string
		requested, started, ended, update int64
		summary                           []byte
		outCut, errCut                    int64
	)
	err := row.Scan(&x.SessionID, &x.ExecID, &x.Seq, &x.SpecDigest, &summary, &state, &x.Reason, &x.ExitCode, &x.Message,
		&x.RequestedBy, &requested, &started, &ended, &x.StdoutSize, &x.StderrSize, &outCut, &errCut,
		&x.StdoutSHA256, &x.StderrSHA256, &update, &x.Version)
	if err != nil {
		return store.Exec{}, err
	}
	x.State, x.Summary = store.ExecState(state), summary
	x.StdoutTruncated, x.StderrTruncated = outCut != 0, errCut != 0
	x.RequestedAt, x.StartedAt, x.EndedAt, x.UpdatedAt = fromMicros(requested), fromMicros(started), fromMicros(ended), fromMicros(update)
	return x, nil
}

func validExecState(s store.ExecState) bool {
	return s == store.ExecRequested || s == store.ExecRunning || s == store.ExecEnded
}

func flag(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// execValues are x's columns in execColumns order.
func execValues(x store.Exec) []any {
	return []any{x.SessionID, x.ExecID, x.Seq, x.SpecDigest, nonNil(x.Summary), string(x.State), x.Reason, x.ExitCode, x.Message,
		x.RequestedBy, micros(x.RequestedAt), micros(x.StartedAt), micros(x.EndedAt), x.StdoutSize, x.StderrSize,
		flag(x.StdoutTruncated), flag(x.StderrTruncated), x.StdoutSHA256, x.StderrSHA256, micros(x.UpdatedAt), x.Version}
}

const selectExec = `SELECT ` + execColumns + ` FROM execs WHERE session_id = ? AND exec_id = ?`

// CreateExecAudited implements store.Store.
func (s *DB) CreateExecAudited(ctx context.Context, x store.Exec, event func(*store.Exec) (audit.Event, error)) (store.Exec, bool, error) {
	if x.SessionID == "" || x.ExecID == "" || !validExecState(x.State) {
		return store.Exec{}, false, fmt.Errorf("store: create exec: session id, exec id and a valid state are required")
	}
	var (
		out     store.Exec
		created bool
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// A concurrent insert of the same id makes this one wait for it and
		// then do nothing, in both databases; the stored one is then read.
		x.Version = 1
		res, err := tx.ExecContext(ctx, s.Q(`INSERT INTO execs (`+execColumns+`) VALUES (`+placeholders(21)+`)
			ON CONFLICT (session_id, exec_id) DO NOTHING`), execValues(x)...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		out, err = scanExec(tx.QueryRowContext(ctx, s.Q(selectExec+s.D.ForUpdate), x.SessionID, x.ExecID))
		if err != nil {
			return err
		}
		created = n == 1
		var existing *store.Exec
		if !created {
			existing = &out
		}
		e, err := event(existing)
		if err != nil {
			userErr = err
			return err
		}
		if e.JobID == "" {
			e.JobID = x.SessionID
		}
		if err := e.Validate(); err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
		}
		_, err = s.appendAudit(ctx, tx, e)
		return err
	})
	if userErr != nil {
		return store.Exec{}, false, userErr
	}
	if err != nil {
		return store.Exec{}, false, fmt.Errorf("store: create exec: %w", err)
	}
	return out, created, nil
}

// UpdateExec implements store.Store.
func (s *DB) UpdateExec(ctx context.Context, sessionID, execID string, update func(*store.Exec, bool) error) (store.Exec, error) {
	if sessionID == "" || execID == "" {
		return store.Exec{}, fmt.Errorf("store: update exec: session id and exec id are required")
	}
	var (
		out     store.Exec
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// A first sighting inserts a placeholder that the update below
		// fills (or the rollback removes): two first sightings at once then
		// serialize on the row like any two updates.
		res, err := tx.ExecContext(ctx, s.Q(`INSERT INTO execs (`+execColumns+`) VALUES (`+placeholders(21)+`)
			ON CONFLICT (session_id, exec_id) DO NOTHING`), execValues(store.Exec{SessionID: sessionID, ExecID: execID, State: store.ExecRequested})...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		found := n == 0
		x, err := scanExec(tx.QueryRowContext(ctx, s.Q(selectExec+s.D.ForUpdate), sessionID, execID))
		if err != nil {
			return err
		}
		if !found {
			x = store.Exec{SessionID: sessionID, ExecID: execID}
		}
		if err := update(&x, found); err != nil {
			userErr = err
			return err
		}
		x.SessionID, x.ExecID = sessionID, execID
		if !validExecState(x.State) {
			return fmt.Errorf("invalid exec state %q", x.State)
		}
		x.Version++
		v := execValues(x)
		_, err = tx.ExecContext(ctx, s.Q(`UPDATE execs SET seq = ?, spec_digest = ?, summary = ?, state = ?, reason = ?, exit_code = ?, message = ?,
			requested_by = ?, requested_at = ?, started_at = ?, ended_at = ?, stdout_size = ?, stderr_size = ?,
			stdout_truncated = ?, stderr_truncated = ?, stdout_sha256 = ?, stderr_sha256 = ?, updated_at = ?, version = ?
			WHERE session_id = ? AND exec_id = ?`), append(slices.Clone(v[2:]), sessionID, execID)...)
		if err != nil {
			return err
		}
		out = x
		return nil
	})
	if userErr != nil {
		return store.Exec{}, userErr
	}
	if err != nil {
		return store.Exec{}, fmt.Errorf("store: update exec %s/%s: %w", sessionID, execID, err)
	}
	return out, nil
}

// GetExec implements store.Store.
func (s *DB) GetExec(ctx context.Context, sessionID, execID string) (store.Exec, error) {
	x, err := scanExec(s.SQL.QueryRowContext(ctx, s.Q(selectExec), sessionID, execID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Exec{}, fmt.Errorf("%w: exec %q of session %q", errdefs.ErrNotFound, execID, sessionID)
	}
	if err != nil {
		return store.Exec{}, fmt.Errorf("store: get exec: %w", err)
	}
	return x, nil
}

// ListExecs implements store.Store.
func (s *DB) ListExecs(ctx context.Context, sessionID string, last int) ([]store.Exec, int64, error) {
	if last <= 0 {
		return nil, 0, fmt.Errorf("store: list execs: last must be positive")
	}
	var total int64
	if err := s.SQL.QueryRowContext(ctx, s.Q(`SELECT COUNT(*) FROM execs WHERE session_id = ?`), sessionID).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("store: list execs: %w", err)
	}
	rows, err := s.SQL.QueryContext(ctx, s.Q(`SELECT `+execColumns+` FROM execs WHERE session_id = ?
		ORDER BY requested_at DESC, exec_id DESC LIMIT ?`), sessionID, last)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list execs: %w", err)
	}
	list, err := collect(rows, scanExec)
	if err != nil {
		return nil, 0, fmt.Errorf("store: list execs: %w", err)
	}
	slices.Reverse(list)
	return list, total, nil
}
