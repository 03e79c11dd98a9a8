package sqldb

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"
)

// SQLite's driver parses a query's text at every call that is not on a
// prepared statement, and the stores' queries are few and fixed (a row by
// key: 14.8 µs parsed, 11.1 µs prepared; BenchmarkLookup). stmtConnector
// keeps, per connection, each query's prepared statement and hands it out
// again, which the driver supports (it resets a statement for reuse
// rather than finalizing it). The stores' code is unchanged: a connection
// it makes has no direct query path, so database/sql prepares every
// query, and the prepare is answered from the connection's cache.
// PostgreSQL's driver keeps its own.

// stmtCacheMax bounds the statements a connection keeps: past it, one not
// in use is finalized to make room (queries whose text depends on a
// caller, as an IN list's length does, cannot pile up). A query longer
// than stmtCacheMaxLen is prepared for its call alone.
const (
	stmtCacheMax    = 128
	stmtCacheMaxLen = 2048
)

// stmtConnector opens dsn with drv, each connection with a statement cache.
type stmtConnector struct {
	drv driver.Driver
	dsn string
	// prepared counts the statements prepared by the driver (tests).
	prepared atomic.Int64
}

func (c *stmtConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	if !implements[driver.ConnPrepareContext](conn) || !implements[driver.ConnBeginTx](conn) {
		conn.Close()
		return nil, errors.New("sqldb: the SQLite driver's connection lacks PrepareContext or BeginTx")
	}
	return &stmtConn{inner: conn, connector: c, stmts: map[string]*cachedStmt{}}, nil
}

func (c *stmtConnector) Driver() driver.Driver { return c.drv }

func implements[T any](v any) bool {
	_, ok := v.(T)
	return ok
}

// stmtConn is a connection whose prepares are answered from its cache. It
// implements neither QueryerContext nor ExecerContext, so that
// database/sql prepares each query (and closes the statement when the
// call, or its rows, are done).
type stmtConn struct {
	inner     driver.Conn
	connector *stmtConnector

	mu    sync.Mutex
	stmts map[string]*cachedStmt
}

var (
	_ driver.Conn               = (*stmtConn)(nil)
	_ driver.ConnPrepareContext = (*stmtConn)(nil)
	_ driver.ConnBeginTx        = (*stmtConn)(nil)
	_ driver.SessionResetter    = (*stmtConn)(nil)
	_ driver.Validator          = (*stmtConn)(nil)
	_ driver.Pinger             = (*stmtConn)(nil)
)

func (c *stmtConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext hands out query's cached statement if it is not in use
// (a query run again while its own rows are still open, in one
// transaction, gets a statement of its own).
func (c *stmtConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.stmts[query]; ok && !s.busy {
		s.busy = true
		return s, nil
	}
	inner, err := c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.connector.prepared.Add(1)
	if _, taken := c.stmts[query]; taken || len(query) > stmtCacheMaxLen || !c.makeRoom() {
		return inner, nil
	}
	s := &cachedStmt{Stmt: inner, conn: c, busy: true}
	c.stmts[query] = s
	return s, nil
}

// makeRoom finalizes a cached statement not in use if the cache is full
// (which one: the map's order) and says whether there is room. Callers
// hold c.mu.
func (c *stmtConn) makeRoom() bool {
	if len(c.stmts) < stmtCacheMax {
		return true
	}
	for q, s := range c.stmts {
		if !s.busy {
			delete(c.stmts, q)
			_ = s.Stmt.Close() // a finalize error is the statement's last; it is gone either way
			return true
		}
	}
	return false
}

// Unwrap is the driver's own connection, for conn.Raw users that need
// what it offers beyond database/sql.
func (c *stmtConn) Unwrap() driver.Conn { return c.inner }

func (c *stmtConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *stmtConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// Close finalizes the cached statements, then closes the connection.
func (c *stmtConn) Close() error {
	c.mu.Lock()
	var errs []error
	for q, s := range c.stmts {
		errs = append(errs, s.Stmt.Close())
		delete(c.stmts, q)
	}
	c.mu.Unlock()
	return errors.Join(append(errs, c.inner.Close())...)
}

func (c *stmtConn) ResetSession(ctx context.Context) error {
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *stmtConn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *stmtConn) Ping(ctx context.Context) error {
	if p, ok := c.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// cachedStmt is a cached prepared statement; busy while database/sql
// holds it (between the prepare and the Close of its call or rows).
type cachedStmt struct {
	driver.Stmt
	conn *stmtConn
	busy bool // under conn.mu
}

// Close gives the statement back to its connection's cache; the
// connection finalizes it when it closes.
func (s *cachedStmt) Close() error {
	s.conn.mu.Lock()
	s.busy = false
	s.conn.mu.Unlock()
	return nil
}

func (s *cachedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return nil, errors.New("sqldb: the SQLite driver's statement lacks ExecContext")
}

func (s *cachedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	return nil, errors.New("sqldb: the SQLite driver's statement lacks QueryContext")
}
