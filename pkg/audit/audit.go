// Package audit owns the authority's audit event and the hash chain that
// makes its log tamper-evident: the event type, its canonical encoding, the
// hash that links each entry to the one before, and the verifier that walks
// a chain. It does no I/O; the authority's store persists events and any
// program holding a copy of the log (the CLI, an auditor's tool) may import
// it to check one.
package audit

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// GenesisHash is the PrevHash of the first entry of every log.
const GenesisHash = "0000000000000000000000000000000000000000000000000000000000000000"

// Event is one entry of the audit log: who (Caller) did what (Kind) to
// what (Subject, Tenant, JobID), whether it was allowed (Outcome) and why
// (Reason). The store assigns Sequence, PrevHash and Hash, and Time when it
// is zero.
type Event struct {
	// Sequence numbers the log's entries 1, 2, 3, … without gaps.
	Sequence int64
	// Time is when the event happened, in UTC at microsecond precision
	// (what both stores keep; Normalize rounds it so).
	Time time.Time
	// Kind names what happened, one of Kinds() (e.g. "job.granted"); required.
	Kind string
	// Caller is the SPIFFE ID of whoever asked for it.
	Caller string
	// Subject is what it happened to (a job, an approval, an RPC method).
	Subject string
	Tenant  string
	JobID   string
	// Outcome is e.g. "allowed", "denied" or "failed".
	Outcome string
	Reason  string
	// PrevHash is the Hash of the entry before, GenesisHash for the first.
	PrevHash string
	// Hash is hex(sha256(PrevHash as bytes ‖ Canonical())).
	Hash string
}

// Outcomes as the log stores them.
const (
	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
)

// canonicalTag starts every encoding, so a hash over some other structure
// can never be mistaken for one over an event (and a later format changes
// the tag).
const canonicalTag = "airlock.audit.v1\x00"

// Canonical returns the event without its Hash as bytes that no other
// event encodes to: the tag, Sequence and Time (Unix microseconds) as
// 8-byte big-endian integers, then Kind, Caller, Subject, Tenant, JobID,
// Outcome, Reason and PrevHash, each prefixed by its length as an 8-byte
// big-endian integer.
func (e Event) Canonical() []byte {
	fields := []string{e.Kind, e.Caller, e.Subject, e.Tenant, e.JobID, e.Outcome, e.Reason, e.PrevHash}
	n := len(canonicalTag) + 16
	for _, f := range fields {
		n += 8 + len(f)
	}
	b := make([]byte, 0, n)
	b = append(b, canonicalTag...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Sequence))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Time.UnixMicro()))
	for _, f := range fields {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

// ComputeHash returns the Hash e must carry given its PrevHash, or an error
// if PrevHash is not 64 hex digits.
func (e Event) ComputeHash() (string, error) {
	prev, err := decodeHash(e.PrevHash)
	if err != nil {
		return "", fmt.Errorf("audit: prev hash: %w", err)
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(e.Canonical())
	return hex.EncodeToString(h.Sum(nil)), nil
}

func decodeHash(s string) ([]byte, error) {
	// Lower case only, so one hash has one spelling and string comparison
	// of hashes is exact.
	if len(s) != 2*sha256.Size || strings.ToLower(s) != s {
		return nil, errors.New("want 64 lower-case hex digits")
	}
	return hex.DecodeString(s)
}

// Normalize returns t as events keep it: UTC, truncated to microseconds.
func Normalize(t time.Time) time.Time {
	return t.UTC().Truncate(time.Microsecond)
}

// Validate reports whether e's descriptive fields can be stored and hashed
// alike by every store: Kind is set and every text field is valid UTF-8
// without NUL bytes (which PostgreSQL's text type refuses).
func (e Event) Validate() error {
	if e.Kind == "" {
		return errors.New("audit event: kind is required")
	}
	for _, f := range []struct{ name, v string }{
		{"kind", e.Kind}, {"caller", e.Caller}, {"subject", e.Subject}, {"tenant", e.Tenant},
		{"job id", e.JobID}, {"outcome", e.Outcome}, {"reason", e.Reason},
	} {
		if !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0) {
			return fmt.Errorf("audit event: %s must be UTF-8 text without NUL bytes", f.name)
		}
	}
	return nil
}

// ErrBroken is what every chain break wraps.
var ErrBroken = errors.New("audit chain broken")

// BreakError says where a chain breaks and why.
type BreakError struct {
	// Index is the position in the slice given to Check or Verify.
	Index int
	// Sequence is the Sequence that entry carries.
	Sequence int64
	Reason   string
}

func (e *BreakError) Error() string {
	return fmt.Sprintf("%v at entry %d (sequence %d): %s", ErrBroken, e.Index, e.Sequence, e.Reason)
}

// Unwrap makes errors.Is(err, ErrBroken) hold.
func (e *BreakError) Unwrap() error { return ErrBroken }

// Verifier walks a log in sequence order, one page after another, carrying
// the last good entry's hash and sequence from each page to the next, so a
// log of any length is checked in bounded memory.
type Verifier struct {
	next int64
	prev string
}

// NewVerifier returns a Verifier for a log read from its first entry.
func NewVerifier() *Verifier { return &Verifier{next: 1, prev: GenesisHash} }

// Resume returns a Verifier that continues after last, an entry the caller
// has already verified or otherwise trusts (say, one whose hash was
// published).
func Resume(last Event) *Verifier { return &Verifier{next: last.Sequence + 1, prev: last.Hash} }

// Next returns the sequence number and PrevHash the next entry must have.
func (v *Verifier) Next() (sequence int64, prevHash string) { return v.next, v.prev }

// Check verifies events as the continuation of what v has seen: each entry
// must have the next sequence number, link to the previous entry's hash and
// carry its own hash. It returns -1 and nil when all hold, else the index
// of the first entry that breaks the chain and a *BreakError; v then stays
// after the last good entry.
func (v *Verifier) Check(events []Event) (firstBreak int, err error) {
	for i, e := range events {
		var reason string
		switch want, err := e.ComputeHash(); {
		case e.Sequence > v.next:
			reason = fmt.Sprintf("sequence %d follows %d: %d entries missing", e.Sequence, v.next-1, e.Sequence-v.next)
		case e.Sequence < v.next:
			reason = fmt.Sprintf("sequence %d where %d was expected: reordered or repeated", e.Sequence, v.next)
		case e.PrevHash != v.prev:
			reason = "prev hash does not match the previous entry's hash"
		case err != nil:
			reason = err.Error()
		case e.Hash != want:
			reason = "hash does not match the entry's content"
		}
		if reason != "" {
			return i, &BreakError{Index: i, Sequence: e.Sequence, Reason: reason}
		}
		v.next, v.prev = e.Sequence+1, e.Hash
	}
	return -1, nil
}

// Verify checks a stretch of a log given in sequence order. A stretch that
// starts at sequence 1 must start from GenesisHash; one that starts
// anywhere else takes its first entry's PrevHash as given (its own hash is
// still checked), so the caller can check any window of the log; to link a
// window to what came before it, include the entry before it, or use
// Resume. It returns -1 and nil for an unbroken stretch, else the index of
// the first entry whose sequence, PrevHash or Hash is wrong and a
// *BreakError.
func Verify(events []Event) (firstBreak int, err error) {
	if len(events) == 0 {
		return -1, nil
	}
	v := NewVerifier()
	if first := events[0]; first.Sequence > 1 {
		v = &Verifier{next: first.Sequence, prev: first.PrevHash}
	}
	return v.Check(events)
}

// Field bounds: what one entry keeps of each field. Callers choose much of
// an entry's text (a tenant or repository name, a command, a comment), and
// every approver reads the log, so no entry may grow with what a caller
// sends: a longer field is cut on a rune boundary and ends with a mark
// saying how much was cut and the digest of the whole.
var fieldBounds = struct{ kind, caller, subject, tenant, jobID, outcome, reason int }{
	kind: 128, caller: 1024, subject: 1024, tenant: 256, jobID: 256, outcome: 64, reason: 8192,
}

// Bounded returns e with every field cut to its bound (see fieldBounds).
func (e Event) Bounded() Event {
	b := fieldBounds
	e.Kind, e.Caller, e.Subject = bound(e.Kind, b.kind), bound(e.Caller, b.caller), bound(e.Subject, b.subject)
	e.Tenant, e.JobID, e.Outcome = bound(e.Tenant, b.tenant), bound(e.JobID, b.jobID), bound(e.Outcome, b.outcome)
	e.Reason = bound(e.Reason, b.reason)
	return e
}

// bound cuts s to at most max bytes, the mark included.
func bound(s string, max int) string {
	if len(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	mark := fmt.Sprintf("…[cut: %d bytes in all, sha256:%s]", len(s), hex.EncodeToString(sum[:]))
	keep := max - len(mark)
	if keep < 0 {
		keep = 0
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	out := s[:keep] + mark
	if len(out) > max {
		// Only a bound shorter than the mark: keep the mark's end.
		out = out[len(out)-max:]
		for len(out) > 0 && !utf8.RuneStart(out[0]) {
			out = out[1:]
		}
	}
	return out
}
