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

const forwardColumns = `id, session_id, tenant, requester, port, state, created_at, expires_at, closed_at, close_reason,
	approval_id, connections, bytes_in, bytes_out, version`

const selectForward = `SELECT ` + forwardColumns + ` FROM port_forwards WHERE id = ?`

func scanForward(row scanner) (store.PortForward, error) {
	var (
		f                        store.PortForward
		state                    string
		port                     int64
		created, expires, closed int64
	)
	err := row.Scan(&f.ID, &f.SessionID, &f.Tenant, &f.Requester, &port, &state, &created, &expires, &closed, &f.CloseReason,
		&f.ApprovalID, &f.Connections, &f.BytesIn, &f.BytesOut, &f.Version)
	if err != nil {
		return store.PortForward{}, err
	}
	f.Port, f.State = uint32(port), store.ForwardState(state)
	f.CreatedAt, f.ExpiresAt, f.ClosedAt = fromMicros(created), fromMicros(expires), fromMicros(closed)
	return f, nil
}

func validForwardState(s store.ForwardState) bool {
	return s == store.ForwardPending || s == store.ForwardOpen || s == store.ForwardClosed
}

// CreatePortForwardAudited implements store.Store.
func (s *DB) CreatePortForwardAudited(ctx context.Context, f store.PortForward, maxOpen int, e audit.Event) (store.PortForward, error) {
	if f.ID == "" || f.SessionID == "" || f.Tenant == "" || f.Requester == "" || f.Port == 0 || f.ExpiresAt.IsZero() ||
		(f.State != store.ForwardPending && f.State != store.ForwardOpen) {
		return store.PortForward{}, fmt.Errorf("%w: store: create port forward: id, session, tenant, requester, port, expiry and a pending or open state are required", errdefs.ErrInvalidArgument)
	}
	if err := defaultEvent(&e, f.SessionID, f.Tenant); err != nil {
		return store.PortForward{}, fmt.Errorf("store: create port forward: %w", err)
	}
	var out store.PortForward
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		// A tenant's creations take turns (SQLite's write transactions
		// already exclude each other), so two at once cannot both find
		// room for one.
		if s.D.KeyLock != "" {
			if _, err := tx.ExecContext(ctx, s.Q(s.D.KeyLock), "port_forwards:"+f.Tenant); err != nil {
				return err
			}
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.Q(`SELECT COUNT(*) FROM port_forwards WHERE tenant = ? AND state IN (?, ?)`),
			f.Tenant, string(store.ForwardPending), string(store.ForwardOpen)).Scan(&n); err != nil {
			return err
		}
		if n >= maxOpen {
			return fmt.Errorf("%w: tenant %q has %d port forwards open or pending, its port_forward.max_open", errdefs.ErrResourceExhausted, f.Tenant, n)
		}
		if _, err := tx.ExecContext(ctx, s.Q(`INSERT INTO port_forwards (`+forwardColumns+`) VALUES (`+placeholders(15)+`)`),
			f.ID, f.SessionID, f.Tenant, f.Requester, int64(f.Port), string(f.State), micros(f.CreatedAt), micros(f.ExpiresAt),
			micros(f.ClosedAt), f.CloseReason, f.ApprovalID, int64(0), int64(0), int64(0), int64(1)); err != nil {
			return err
		}
		if _, err := s.appendAudit(ctx, tx, e); err != nil {
			return err
		}
		var err error
		out, err = scanForward(tx.QueryRowContext(ctx, s.Q(selectForward), f.ID))
		return err
	})
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return store.PortForward{}, err
	}
	if err != nil {
		return store.PortForward{}, fmt.Errorf("store: create port forward: %w", err)
	}
	return out, nil
}

// GetPortForward implements store.Store.
func (s *DB) GetPortForward(ctx context.Context, id string) (store.PortForward, error) {
	f, err := scanForward(s.SQL.QueryRowContext(ctx, s.Q(selectForward), id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.PortForward{}, fmt.Errorf("%w: port forward %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return store.PortForward{}, fmt.Errorf("store: get port forward: %w", err)
	}
	return f, nil
}

// ListPortForwards implements store.Store.
func (s *DB) ListPortForwards(ctx context.Context, f store.ForwardFilter) ([]store.PortForward, error) {
	if f.Limit <= 0 || (f.SessionID == "" && f.Tenant == "") {
		return nil, fmt.Errorf("%w: store: list port forwards: a session or tenant and a positive limit are required", errdefs.ErrInvalidArgument)
	}
	var (
		where []string
		args  []any
	)
	if f.SessionID != "" {
		where, args = append(where, "session_id = ?"), append(args, f.SessionID)
	}
	if f.Tenant != "" {
		where, args = append(where, "tenant = ?"), append(args, f.Tenant)
	}
	if len(f.States) > 0 {
		marks := make([]string, len(f.States))
		for i, st := range f.States {
			marks[i] = "?"
			args = append(args, string(st))
		}
		where = append(where, "state IN ("+strings.Join(marks, ", ")+")")
	}
	args = append(args, f.Limit)
	list, err := queryAll(ctx, s, s.SQL, scanForward, `SELECT `+forwardColumns+` FROM port_forwards WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list port forwards: %w", err)
	}
	return list, nil
}

// UpdatePortForwardAudited implements store.Store.
func (s *DB) UpdatePortForwardAudited(ctx context.Context, id string, update func(*store.PortForward) (*audit.Event, error)) (store.PortForward, error) {
	var (
		out     store.PortForward
		userErr error
	)
	err := s.Tx(ctx, func(tx *sql.Tx) error {
		f, err := scanForward(tx.QueryRowContext(ctx, s.Q(selectForward+s.D.ForUpdate), id))
		if errors.Is(err, sql.ErrNoRows) {
			userErr = fmt.Errorf("%w: port forward %q", errdefs.ErrNotFound, id)
			return userErr
		}
		if err != nil {
			return err
		}
		cur := f
		e, err := update(&cur)
		if err != nil {
			userErr = err
			return err
		}
		if !validForwardState(cur.State) {
			return fmt.Errorf("%w: state %q", errdefs.ErrInvalidArgument, cur.State)
		}
		if e != nil {
			if err := defaultEvent(e, f.SessionID, f.Tenant); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, s.Q(`UPDATE port_forwards SET state = ?, expires_at = ?, closed_at = ?, close_reason = ?,
			approval_id = ?, version = version + 1 WHERE id = ?`),
			string(cur.State), micros(cur.ExpiresAt), micros(cur.ClosedAt), cur.CloseReason, cur.ApprovalID, id); err != nil {
			return err
		}
		if e != nil {
			if _, err := s.appendAudit(ctx, tx, *e); err != nil {
				return err
			}
		}
		out, err = scanForward(tx.QueryRowContext(ctx, s.Q(selectForward), id))
		return err
	})
	if userErr != nil {
		return store.PortForward{}, userErr
	}
	if err != nil {
		return store.PortForward{}, fmt.Errorf("store: update port forward %q: %w", id, err)
	}
	return out, nil
}

// AddForwardTraffic implements store.Store.
func (s *DB) AddForwardTraffic(ctx context.Context, id string, connections, bytesIn, bytesOut int64) error {
	if connections < 0 || bytesIn < 0 || bytesOut < 0 {
		return fmt.Errorf("%w: store: forward traffic is never negative", errdefs.ErrInvalidArgument)
	}
	res, err := s.SQL.ExecContext(ctx, s.Q(`UPDATE port_forwards SET connections = connections + ?, bytes_in = bytes_in + ?,
		bytes_out = bytes_out + ?, version = version + 1 WHERE id = ?`), connections, bytesIn, bytesOut, id)
	if err != nil {
		return fmt.Errorf("store: forward traffic: %w", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("%w: port forward %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// ForwardsToEnd implements store.Store.
func (s *DB) ForwardsToEnd(ctx context.Context, now time.Time, limit int) ([]store.PortForward, error) {
	list, err := queryAll(ctx, s, s.SQL, scanForward, `SELECT `+prefixed("f.", forwardColumns)+` FROM port_forwards f
		LEFT JOIN jobs j ON j.id = f.session_id
		WHERE f.state IN (?, ?) AND (f.expires_at <= ? OR j.id IS NULL OR j.state IN (?, ?, ?))
		ORDER BY f.expires_at, f.id LIMIT ?`,
		string(store.ForwardPending), string(store.ForwardOpen), micros(now),
		string(store.StateFinished), string(store.StateFailed), string(store.StateCancelled), limit)
	if err != nil {
		return nil, fmt.Errorf("store: forwards to end: %w", err)
	}
	return list, nil
}

// prefixed qualifies each of a column list's names with p.
func prefixed(p, columns string) string {
	parts := strings.Split(columns, ",")
	for i, c := range parts {
		parts[i] = p + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
