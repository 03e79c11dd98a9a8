// Package checkpoints anchors the authority's audit log outside its
// database: it signs checkpoints of the chain's head (sequence, hash, time)
// with a key the database does not hold, at least every Every entries or
// Interval and at shutdown, appends each to a file of its own (fsynced, one
// JSON line each), logs it, and serves the series to the API. Whoever can
// rewrite the database, and recompute every hash after a changed entry,
// still cannot make the log agree with a checkpoint signed before. At start
// and before each new checkpoint the log is checked against the last one;
// a log that disagrees is reported and no further checkpoint is signed, so
// a rewritten history is never signed over. Only the authority's api and
// server packages import it.
package checkpoints

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// Defaults.
const (
	DefaultEvery    = 100
	DefaultInterval = time.Minute
)

// Config configures the checkpoints of one authority.
type Config struct {
	Store store.Store
	// Key signs checkpoints; it must not be kept in the database.
	Key ed25519.PrivateKey
	// File is the append-only file the checkpoints are written to.
	File string
	// Every is the most entries between two checkpoints (default
	// DefaultEvery); Interval the longest time a new entry waits for one
	// (default DefaultInterval).
	Every    int64
	Interval time.Duration
	Logger   *slog.Logger
	Now      func() time.Time
	// Meter makes the audit log metrics (metrics.go); nil is the global
	// meter provider.
	Meter metric.MeterProvider
}

// Service signs, keeps and serves the checkpoints.
type Service struct {
	cfg   Config
	keyID string
	poll  time.Duration

	mu       sync.Mutex
	cps      []audit.Checkpoint
	lastTime time.Time // when the last checkpoint was signed (or the service opened)
	halted   string    // why no checkpoint is signed any more; "" when it is
	file     *os.File

	seen     seen
	observed metric.Registration
}

// Open reads the checkpoint file (creating it when missing; a torn last
// line left by a crash is cut off), checks that every checkpoint in it is
// signed by cfg.Key, and checks the log against the last one.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pub := cfg.Key.Public().(ed25519.PublicKey)
	s := &Service{cfg: cfg, keyID: pki.Ed25519KeyID(pub), poll: min(cfg.Interval, time.Second), lastTime: cfg.Now()}
	f, err := os.OpenFile(cfg.File, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit checkpoints: %w", err)
	}
	s.file = f
	if err := s.load(pub); err != nil {
		f.Close()
		return nil, err
	}
	if len(s.cps) > 0 {
		s.lastTime = s.cps[len(s.cps)-1].Time
	}
	if err := s.checkLog(ctx); err != nil {
		f.Close()
		return nil, err
	}
	if n := len(s.cps); n > 0 {
		s.seen.signed.Store(s.cps[n-1].Sequence)
	}
	s.seen.halted.Store(s.halted != "")
	if s.observed, err = s.observe(cfg.Meter); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit checkpoints: metrics: %w", err)
	}
	return s, nil
}

// load reads the file into s.cps.
func (s *Service) load(pub ed25519.PublicKey) error {
	data, err := os.ReadFile(s.cfg.File)
	if err != nil {
		return fmt.Errorf("audit checkpoints: %w", err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		// A crash in the middle of an append: the line was never whole,
		// so no checkpoint of it was ever served or logged as written.
		s.cfg.Logger.Warn("audit checkpoints: cutting off a torn last line", "file", s.cfg.File, "bytes", len(data)-i-1)
		if err := s.file.Truncate(int64(i + 1)); err != nil {
			return fmt.Errorf("audit checkpoints: %w", err)
		}
		data = data[:i+1]
	}
	cps, _, err := audit.ReadCheckpoints(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("audit checkpoints %s: %w", s.cfg.File, err)
	}
	for _, c := range cps {
		if err := c.CheckSignature(pub); err != nil {
			return fmt.Errorf("audit checkpoints %s: %w (a checkpoint file of another key: move it aside to start a new series)", s.cfg.File, err)
		}
	}
	s.cps = cps
	return nil
}

// checkLog compares the log with the last checkpoint; on disagreement it
// finds the first checkpoint the log disagrees with, logs it and halts.
func (s *Service) checkLog(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted != "" || len(s.cps) == 0 {
		return nil
	}
	ok, err := s.agrees(ctx, s.cps[len(s.cps)-1])
	if err != nil || ok {
		return err
	}
	for _, c := range s.cps {
		ok, err := s.agrees(ctx, c)
		if err != nil {
			return err
		}
		if !ok {
			s.halted = fmt.Sprintf("the log disagrees with the checkpoint at sequence %d signed %s: its entry %d is gone or has another hash",
				c.Sequence, c.Time.Format(time.RFC3339), c.Sequence)
			break
		}
	}
	if s.halted == "" {
		// Only the last disagrees: a checkpoint of the same sequence twice.
		c := s.cps[len(s.cps)-1]
		s.halted = fmt.Sprintf("the log disagrees with the checkpoint at sequence %d signed %s", c.Sequence, c.Time.Format(time.RFC3339))
	}
	s.cfg.Logger.Error("AUDIT LOG TAMPERED: no more checkpoints are signed until an operator investigates", "reason", s.halted)
	return nil
}

// agrees reports whether the log's entry c.Sequence has c's hash.
func (s *Service) agrees(ctx context.Context, c audit.Checkpoint) (bool, error) {
	e, ok, err := s.entry(ctx, c.Sequence)
	if err != nil {
		return false, err
	}
	return ok && e.Hash == c.Hash, nil
}

// entry reads the log's entry seq.
func (s *Service) entry(ctx context.Context, seq int64) (audit.Event, bool, error) {
	events, err := s.cfg.Store.ListAudit(ctx, store.AuditFilter{AfterSequence: seq - 1, Limit: 1})
	if err != nil {
		return audit.Event{}, false, err
	}
	if len(events) == 0 || events[0].Sequence != seq {
		return audit.Event{}, false, nil
	}
	return events[0], true, nil
}

// Run signs checkpoints until ctx ends. The last one, of the head at
// shutdown, is Close's: it must come after everything else that writes the
// log has stopped.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.Tick(ctx, false); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Error("audit checkpoint", "error", err)
			}
		}
	}
}

// Close signs a checkpoint of the head (with up to 5 s for it) and closes
// the file. Call it once nothing else appends to the log, before the store
// closes.
func (s *Service) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Tick(ctx, true); err != nil {
		s.cfg.Logger.Error("audit checkpoint at shutdown", "error", err)
	}
	if err := s.observed.Unregister(); err != nil {
		s.cfg.Logger.Warn("unregister the audit log gauges", "error", err)
	}
	return s.file.Close()
}

// maxBacklog bounds how many multiples of Every one tick signs: after a
// burst only the newest are, and the head's checkpoint anchors all before.
const maxBacklog = 16

// Tick signs what is due: a checkpoint at each multiple of Every passed
// since the last, and one of the head when Interval has passed since the
// last or final is set.
func (s *Service) Tick(ctx context.Context, final bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted != "" {
		return nil
	}
	head, _, err := s.cfg.Store.AuditHead(ctx)
	if err != nil {
		return err
	}
	s.seen.head.Store(head)
	var last int64
	if n := len(s.cps); n > 0 {
		last = s.cps[n-1].Sequence
	}
	if head < last {
		s.halt(fmt.Sprintf("the log ends at entry %d, before the checkpoint at sequence %d", head, last))
		return nil
	}
	if head == last {
		s.lastTime = s.cfg.Now() // nothing new waits
		return nil
	}
	var due []int64
	first := (last/s.cfg.Every + 1) * s.cfg.Every
	if backlog := (head - first) / s.cfg.Every; backlog >= maxBacklog {
		first += (backlog - maxBacklog + 1) * s.cfg.Every
	}
	for seq := first; seq <= head; seq += s.cfg.Every {
		due = append(due, seq)
	}
	if (len(due) == 0 || due[len(due)-1] < head) && (final || !s.cfg.Now().Before(s.lastTime.Add(s.cfg.Interval))) {
		due = append(due, head)
	}
	if len(due) == 0 {
		return nil // the log is read again only when a checkpoint is due
	}
	// Before signing on top of the log, it must still be the log that was
	// signed, and every entry since must chain to it.
	if why, err := s.unbrokenSince(ctx, head); err != nil {
		return err
	} else if why != "" {
		s.halt(why)
		return nil
	}
	for _, seq := range due {
		if err := s.sign(ctx, seq); err != nil {
			return err
		}
	}
	return nil
}

// unbrokenSince says why the log from the last checkpoint to head is not
// the continuation of what was signed ("" when it is): the checkpointed
// entry changed, or an entry after it is missing, reordered or does not
// chain. Callers hold s.mu.
func (s *Service) unbrokenSince(ctx context.Context, head int64) (string, error) {
	v := audit.NewVerifier()
	after := int64(0)
	if n := len(s.cps); n > 0 {
		last := s.cps[n-1]
		e, ok, err := s.entry(ctx, last.Sequence)
		if err != nil {
			return "", err
		}
		if !ok || e.Hash != last.Hash {
			return fmt.Sprintf("the log's entry %d no longer has the hash checkpointed at %s", last.Sequence, last.Time.Format(time.RFC3339)), nil
		}
		v, after = audit.Resume(e), e.Sequence
	}
	for after < head {
		page, err := s.cfg.Store.ListAudit(ctx, store.AuditFilter{AfterSequence: after, Limit: 1000})
		if err != nil {
			return "", err
		}
		if len(page) == 0 {
			return fmt.Sprintf("the log's head says entry %d, but the log ends at %d", head, after), nil
		}
		if _, err := v.Check(page); err != nil {
			return "the log since the last checkpoint is broken: " + err.Error(), nil
		}
		after = page[len(page)-1].Sequence
	}
	return "", nil
}

func (s *Service) halt(reason string) {
	s.halted = reason
	s.seen.halted.Store(true)
	s.cfg.Logger.Error("AUDIT LOG TAMPERED: no more checkpoints are signed until an operator investigates", "reason", reason)
}

// sign checkpoints entry seq: signed, appended and synced, then logged.
// Callers hold s.mu.
func (s *Service) sign(ctx context.Context, seq int64) error {
	e, ok, err := s.entry(ctx, seq)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("audit checkpoint: the log has no entry %d", seq)
	}
	now := s.cfg.Now()
	c, err := audit.SignCheckpoint(s.cfg.Key, e, now)
	if err != nil {
		return err
	}
	line, err := c.MarshalLine()
	if err != nil {
		return err
	}
	st, err := s.file.Stat()
	if err != nil {
		return fmt.Errorf("audit checkpoint: %w", err)
	}
	if _, err := s.file.Write(line); err != nil {
		// A part of a line (a full disk) must not stay: the next whole
		// one would follow it, and the file would no longer read.
		if terr := s.file.Truncate(st.Size()); terr != nil {
			s.halt(fmt.Sprintf("a checkpoint could not be written (%v) nor its part removed (%v): %s needs repair", err, terr, s.cfg.File))
		}
		return fmt.Errorf("audit checkpoint: %w", err)
	}
	if err := s.file.Sync(); err != nil {
		return fmt.Errorf("audit checkpoint: %w", err)
	}
	s.cps = append(s.cps, c)
	s.seen.signed.Store(c.Sequence)
	s.lastTime = now
	// The log is a second copy, wherever the service's log goes.
	s.cfg.Logger.Info("audit checkpoint", "sequence", c.Sequence, "hash", c.Hash, "time", c.Time.Format(time.RFC3339Nano),
		"key_id", c.KeyID, "signature", base64.StdEncoding.EncodeToString(c.Signature))
	return nil
}

// Page is a page of checkpoints.
type Page struct {
	Checkpoints []audit.Checkpoint
	// More says checkpoints after the page exist.
	More bool
	// PublicKey and KeyID are the key every checkpoint is signed with.
	PublicKey ed25519.PublicKey
	KeyID     string
	// Halted, when set, says why no checkpoint is signed any more.
	Halted string
}

var errPageSize = fmt.Errorf("%w: page_size: must be between 0 and 1000", errdefs.ErrInvalidArgument)

// List returns up to limit checkpoints after sequence after (limit 0
// means 100).
func (s *Service) List(after int64, limit int) (Page, error) {
	if limit < 0 || limit > 1000 {
		return Page{}, errPageSize
	}
	if limit == 0 {
		limit = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := Page{PublicKey: s.cfg.Key.Public().(ed25519.PublicKey), KeyID: s.keyID, Halted: s.halted}
	for _, c := range s.cps {
		if c.Sequence <= after {
			continue
		}
		if len(p.Checkpoints) == limit {
			p.More = true
			break
		}
		p.Checkpoints = append(p.Checkpoints, c)
	}
	return p, nil
}
