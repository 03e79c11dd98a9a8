package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/airlockhq/airlock/pkg/pki"
)

// A Checkpoint is the authority's signed statement that the log's entry
// Sequence had hash Hash at Time. Since each hash covers every entry before
// it, a checkpoint anchors the whole log up to Sequence: whoever rewrites
// an entry and recomputes every later hash (as anyone with write access to
// the database and the source could) still cannot produce the checkpointed
// hash, and a log that lost its tail no longer reaches a checkpoint's
// sequence. The key that signs checkpoints is kept outside the database.
type Checkpoint struct {
	Sequence int64     `json:"sequence"`
	Hash     string    `json:"hash"`
	Time     time.Time `json:"time"`
	// KeyID names PublicKey (pki.Ed25519KeyID).
	KeyID string `json:"key_id"`
	// PublicKey is the raw Ed25519 key the signature verifies with; a
	// verifier pins the key it trusts rather than taking this one on faith.
	PublicKey ed25519.PublicKey `json:"public_key"`
	Signature []byte            `json:"signature"`
}

// checkpointTag starts every signed checkpoint body, so no other signature
// of the same key (or a hash of an event) can pass for one.
const checkpointTag = "airlock.audit.checkpoint.v1\x00"

// signedBytes is what the signature covers: the tag, Sequence and Time (Unix
// microseconds) as 8-byte big-endian integers, and the raw hash.
func (c Checkpoint) signedBytes() ([]byte, error) {
	h, err := decodeHash(c.Hash)
	if err != nil {
		return nil, fmt.Errorf("hash: %w", err)
	}
	b := make([]byte, 0, len(checkpointTag)+16+len(h))
	b = append(b, checkpointTag...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Sequence))
	b = binary.BigEndian.AppendUint64(b, uint64(c.Time.UnixMicro()))
	return append(b, h...), nil
}

// SignCheckpoint signs that entry e is in the log, as of at.
func SignCheckpoint(key ed25519.PrivateKey, e Event, at time.Time) (Checkpoint, error) {
	pub := key.Public().(ed25519.PublicKey)
	c := Checkpoint{Sequence: e.Sequence, Hash: e.Hash, Time: Normalize(at), KeyID: pki.Ed25519KeyID(pub), PublicKey: pub}
	if c.Sequence < 1 {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: sequence %d: must be at least 1", c.Sequence)
	}
	msg, err := c.signedBytes()
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	c.Signature = ed25519.Sign(key, msg)
	return c, nil
}

// CheckSignature reports whether c is signed by its PublicKey and, when
// pinned is not nil, whether that key is pinned.
func (c Checkpoint) CheckSignature(pinned ed25519.PublicKey) error {
	if len(c.PublicKey) != ed25519.PublicKeySize {
		return fmt.Errorf("checkpoint at sequence %d: public_key: %d bytes, want %d", c.Sequence, len(c.PublicKey), ed25519.PublicKeySize)
	}
	if c.KeyID != pki.Ed25519KeyID(c.PublicKey) {
		// The id is not signed: one that does not name the key would let a
		// forger's checkpoint pass for the authority's in a report.
		return fmt.Errorf("checkpoint at sequence %d: key_id %q does not name its public key", c.Sequence, c.KeyID)
	}
	if pinned != nil && !bytes.Equal(pinned, c.PublicKey) {
		return fmt.Errorf("checkpoint at sequence %d: signed by key %s, not the pinned key", c.Sequence, c.KeyID)
	}
	msg, err := c.signedBytes()
	if err != nil {
		return fmt.Errorf("checkpoint at sequence %d: %w", c.Sequence, err)
	}
	if !ed25519.Verify(c.PublicKey, msg, c.Signature) {
		return fmt.Errorf("checkpoint at sequence %d: the signature does not verify", c.Sequence)
	}
	return nil
}

// MaxCheckpointLine bounds one line of a checkpoint file.
const MaxCheckpointLine = 4096

// ReadCheckpoints parses a checkpoint file: one JSON Checkpoint per line,
// blank lines ignored. A line that does not parse is an error naming it,
// except a last line without its newline, which an interrupted append
// leaves behind: it is reported as torn (torn true) and not returned.
func ReadCheckpoints(r io.Reader) (cps []Checkpoint, torn bool, err error) {
	br := bufio.NewReaderSize(r, MaxCheckpointLine)
	for line := 1; ; line++ {
		b, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return nil, false, fmt.Errorf("checkpoints line %d: longer than %d bytes", line, MaxCheckpointLine)
		case errors.Is(err, io.EOF):
			if len(bytes.TrimSpace(b)) == 0 {
				return cps, false, nil
			}
			var c Checkpoint
			if json.Unmarshal(b, &c) != nil {
				return cps, true, nil
			}
			return append(cps, c), false, nil
		case err != nil:
			return nil, false, err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var c Checkpoint
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, false, fmt.Errorf("checkpoints line %d: %v", line, err)
		}
		cps = append(cps, c)
	}
}

// MarshalLine is c as one line of a checkpoint file, newline included.
func (c Checkpoint) MarshalLine() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ErrCheckpoint is what every disagreement with a checkpoint wraps.
var ErrCheckpoint = errors.New("audit log disagrees with a signed checkpoint")

// CheckpointError names the first checkpoint the log disagrees with.
type CheckpointError struct {
	Checkpoint Checkpoint
	// Reason says how the log disagrees.
	Reason string
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("%v: checkpoint at sequence %d (signed %s by key %s): %s", ErrCheckpoint,
		e.Checkpoint.Sequence, e.Checkpoint.Time.Format(time.RFC3339), e.Checkpoint.KeyID, e.Reason)
}

// Unwrap makes errors.Is(err, ErrCheckpoint) hold.
func (e *CheckpointError) Unwrap() error { return ErrCheckpoint }

// Anchors checks a log, entry by entry in sequence order (as a Verifier
// walks it), against signed checkpoints.
type Anchors struct {
	cps     []Checkpoint // sorted by Sequence
	next    int          // the first checkpoint not yet reached
	matched int
	last    int64 // the highest sequence seen
}

// NewAnchors checks every checkpoint's signature (against pinned when it is
// not nil; else every checkpoint must be signed by one and the same key)
// and returns what checks a log against them.
func NewAnchors(cps []Checkpoint, pinned ed25519.PublicKey) (*Anchors, error) {
	cps = slices.Clone(cps)
	for _, c := range cps {
		key := pinned
		if key == nil {
			key = cps[0].PublicKey
		}
		if err := c.CheckSignature(key); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(cps, func(a, b Checkpoint) int {
		switch {
		case a.Sequence < b.Sequence:
			return -1
		case a.Sequence > b.Sequence:
			return 1
		}
		return 0
	})
	return &Anchors{cps: cps}, nil
}

// Entry checks e, the next entry of a log whose chain the caller verified
// up to e, against every checkpoint at its sequence.
func (a *Anchors) Entry(e Event) error {
	a.last = e.Sequence
	for a.next < len(a.cps) && a.cps[a.next].Sequence <= e.Sequence {
		c := a.cps[a.next]
		if c.Sequence == e.Sequence && c.Hash != e.Hash {
			return &CheckpointError{Checkpoint: c, Reason: fmt.Sprintf("the log's entry %d has hash %s, the checkpoint says %s: the log was rewritten at or before that entry", e.Sequence, e.Hash, c.Hash)}
		}
		if c.Sequence < e.Sequence {
			return &CheckpointError{Checkpoint: c, Reason: fmt.Sprintf("the log has no entry %d", c.Sequence)}
		}
		a.next++
		a.matched++
	}
	return nil
}

// End is called after the log's last entry. A checkpoint beyond it means
// entries the authority once signed for are gone.
func (a *Anchors) End() error {
	if a.next < len(a.cps) {
		c := a.cps[a.next]
		return &CheckpointError{Checkpoint: c, Reason: fmt.Sprintf("the log ends at entry %d: entries up to %d were removed", a.last, c.Sequence)}
	}
	return nil
}

// Matched is how many checkpoints the log reached and agreed with.
func (a *Anchors) Matched() int { return a.matched }

// Newest is the checkpoint signed last, and false when there is none.
func (a *Anchors) Newest() (Checkpoint, bool) {
	var n Checkpoint
	for _, c := range a.cps {
		if c.Time.After(n.Time) {
			n = c
		}
	}
	return n, len(a.cps) > 0
}

// Total is how many checkpoints there are.
func (a *Anchors) Total() int { return len(a.cps) }

// LastAnchored is the highest checkpointed sequence reached so far, 0 when
// none.
func (a *Anchors) LastAnchored() int64 {
	if a.next == 0 {
		return 0
	}
	return a.cps[a.next-1].Sequence
}
