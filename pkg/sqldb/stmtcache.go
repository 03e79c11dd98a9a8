package sqldb

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"
)

// SQLite's driver parses a query's text at every call that is not on a
// prepared statement, and the stores' queries are few and fixed: parsing
// was half of a job's lookup by id (and a tenth of the authority's CPU in
// a session's busy loop). stmtConnector keeps, per connection, each
// query's prepared statement and hands it out again, which the driver
// supports (it resets a statement for reuse rather than finalizing it).
// It is transparent to the stores: a connection it makes has no direct
// query path, so database/sql prepares every query, and the prepare is
// answered from the connection's cache. PostgreSQL's driver keeps its own.

// stmtCacheMax bounds the statements a connection keeps; a query past it
// is prepared for its call alone, as are queries longer than
// stmtCacheMaxLen (migrations, run once).
const (
	stmtCacheMax    = 256
	stmtCacheMaxLen = 4096
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
	if _, taken := c.stmts[query]; taken || len(c.stmts) >= stmtCacheMax || len(query) > stmtCacheMaxLen {
		return inner, nil
	}
	s := &cachedStmt{Stmt: inner, conn: c, busy: true}
	c.stmts[query] = s
	return s, nil
}

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
