package audit_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sign(t *testing.T, k ed25519.PrivateKey, e audit.Event) audit.Checkpoint {
	t.Helper()
	c, err := audit.SignCheckpoint(k, e, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// anchorCheck walks events through a Verifier and Anchors, as audit
// verify does, and returns the first error.
func anchorCheck(t *testing.T, events []audit.Event, cps []audit.Checkpoint, pinned ed25519.PublicKey) error {
	t.Helper()
	a, err := audit.NewAnchors(cps, pinned)
	if err != nil {
		return err
	}
	v := audit.NewVerifier()
	for _, e := range events {
		if _, err := v.Check([]audit.Event{e}); err != nil {
			return err
		}
		if err := a.Entry(e); err != nil {
			return err
		}
	}
	return a.End()
}

func TestCheckpointSignature(t *testing.T) {
	k := newKey(t)
	c := sign(t, k, chain(t, 3)[2])
	if err := c.CheckSignature(k.Public().(ed25519.PublicKey)); err != nil {
		t.Fatalf("a fresh checkpoint: %v", err)
	}
	for name, change := range map[string]func(c *audit.Checkpoint){
		"sequence": func(c *audit.Checkpoint) { c.Sequence++ },
		"hash":     func(c *audit.Checkpoint) { c.Hash = strings.Repeat("ab", 32) },
		"time":     func(c *audit.Checkpoint) { c.Time = c.Time.Add(time.Microsecond) },
		// The id is not signed, but it must name the key: a forger's
		// checkpoint may not pass for the authority's in a report.
		"key id":    func(c *audit.Checkpoint) { c.KeyID = "0123456789abcdef" },
		"signature": func(c *audit.Checkpoint) { c.Signature = append([]byte{c.Signature[0] ^ 1}, c.Signature[1:]...) },
		// Someone re-signs with their own key: it verifies with that key,
		// but not with the pinned one.
		"key": func(c *audit.Checkpoint) {
			other := newKey(t)
			*c = sign(t, other, audit.Event{Sequence: c.Sequence, Hash: c.Hash})
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := c
			change(&bad)
			if err := bad.CheckSignature(k.Public().(ed25519.PublicKey)); err == nil {
				t.Fatalf("a checkpoint with a changed %s verified", name)
			}
		})
	}
	if _, err := audit.SignCheckpoint(k, audit.Event{Sequence: 0, Hash: audit.GenesisHash}, t0); err == nil {
		t.Error("signed a checkpoint of sequence 0")
	}
}

func TestAnchorsAgreeWithTheirLog(t *testing.T) {
	k := newKey(t)
	events := chain(t, 10)
	cps := []audit.Checkpoint{sign(t, k, events[9]), sign(t, k, events[3])} // out of order on purpose
	if err := anchorCheck(t, events, cps, k.Public().(ed25519.PublicKey)); err != nil {
		t.Fatalf("the log they were signed for: %v", err)
	}
	a, _ := audit.NewAnchors(cps, nil)
	v := audit.NewVerifier()
	for _, e := range events[:6] {
		if _, err := v.Check([]audit.Event{e}); err != nil {
			t.Fatal(err)
		}
		if err := a.Entry(e); err != nil {
			t.Fatal(err)
		}
	}
	if a.Matched() != 1 || a.LastAnchored() != 4 || a.Total() != 2 {
		t.Errorf("after 6 entries: matched %d, last anchored %d, total %d; want 1, 4, 2", a.Matched(), a.LastAnchored(), a.Total())
	}
}

// TestAnchorsCatchARecomputedRewrite is the attack of issue 9 §6: an entry
// is changed and every later hash recomputed with this package's own code,
// so the chain verifies — but not against the checkpoints.
func TestAnchorsCatchARecomputedRewrite(t *testing.T) {
	k := newKey(t)
	events := chain(t, 10)
	cps := []audit.Checkpoint{sign(t, k, events[2]), sign(t, k, events[5]), sign(t, k, events[9])}

	forged := append([]audit.Event(nil), events...)
	forged[4].Reason = "nothing happened"
	for i := 4; i < len(forged); i++ {
		forged[i].PrevHash = forged[i-1].Hash
		rehash(t, &forged[i])
	}
	if i, err := audit.Verify(forged); err != nil {
		t.Fatalf("the forger's chain should verify on its own (break at %d: %v)", i, err)
	}
	err := anchorCheck(t, forged, cps, k.Public().(ed25519.PublicKey))
	var ce *audit.CheckpointError
	if !errors.As(err, &ce) || !errors.Is(err, audit.ErrCheckpoint) {
		t.Fatalf("got %v, want a CheckpointError", err)
	}
	if ce.Checkpoint.Sequence != 6 || !strings.Contains(err.Error(), "checkpoint at sequence 6") {
		t.Errorf("named %q, want the first checkpoint after the rewrite (sequence 6)", err)
	}

	// A log cut short, below the last checkpoint.
	err = anchorCheck(t, events[:8], cps, nil)
	if !errors.As(err, &ce) || ce.Checkpoint.Sequence != 10 || !strings.Contains(err.Error(), "removed") {
		t.Errorf("a log cut at 8: got %v, want checkpoint 10 named, entries removed", err)
	}
	// A log missing a checkpointed entry altogether (the forger renumbers).
	renumbered := append([]audit.Event(nil), events[:5]...)
	for _, e := range events[6:] {
		e.Sequence--
		e.PrevHash = renumbered[len(renumbered)-1].Hash
		rehash(t, &e)
		renumbered = append(renumbered, e)
	}
	if err := anchorCheck(t, renumbered, cps, nil); !errors.As(err, &ce) || ce.Checkpoint.Sequence != 6 {
		t.Errorf("entry 6 removed and the rest renumbered: got %v, want checkpoint 6 named", err)
	}
}

func TestAnchorsRefuseForeignOrMixedKeys(t *testing.T) {
	k, other := newKey(t), newKey(t)
	events := chain(t, 4)
	if _, err := audit.NewAnchors([]audit.Checkpoint{sign(t, other, events[1])}, k.Public().(ed25519.PublicKey)); err == nil ||
		!strings.Contains(err.Error(), "not the pinned key") {
		t.Errorf("a checkpoint of another key against a pinned key: %v", err)
	}
	if _, err := audit.NewAnchors([]audit.Checkpoint{sign(t, k, events[1]), sign(t, other, events[3])}, nil); err == nil {
		t.Error("checkpoints of two keys were taken without a pinned key")
	}
}

func TestReadCheckpoints(t *testing.T) {
	k := newKey(t)
	events := chain(t, 3)
	var file bytes.Buffer
	for _, e := range events {
		line, err := sign(t, k, e).MarshalLine()
		if err != nil {
			t.Fatal(err)
		}
		file.Write(line)
	}
	cps, torn, err := audit.ReadCheckpoints(bytes.NewReader(file.Bytes()))
	if err != nil || torn || len(cps) != 3 || cps[2].Hash != events[2].Hash {
		t.Fatalf("read %d checkpoints, torn %v, err %v", len(cps), torn, err)
	}
	if err := cps[1].CheckSignature(k.Public().(ed25519.PublicKey)); err != nil {
		t.Errorf("a checkpoint read back does not verify: %v", err)
	}
	// An append cut short by a crash: the torn line is not a checkpoint.
	cut := file.Bytes()[:file.Len()-20]
	if cps, torn, err := audit.ReadCheckpoints(bytes.NewReader(cut)); err != nil || !torn || len(cps) != 2 {
		t.Errorf("torn last line: %d checkpoints, torn %v, err %v; want 2, true, nil", len(cps), torn, err)
	}
	// A bad line in the middle is an error naming it.
	bad := append([]byte("{not json\n"), file.Bytes()...)
	if _, _, err := audit.ReadCheckpoints(bytes.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a bad first line: %v", err)
	}
	long := append(bytes.Repeat([]byte("x"), audit.MaxCheckpointLine+10), '\n')
	if _, _, err := audit.ReadCheckpoints(bytes.NewReader(long)); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("an overlong line: %v", err)
	}
}
