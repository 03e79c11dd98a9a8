package audit_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/pkg/audit"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)

// chain builds n linked events the way a store does.
func chain(t *testing.T, n int) []audit.Event {
	t.Helper()
	prev := audit.GenesisHash
	var out []audit.Event
	for i := 1; i <= n; i++ {
		e := audit.Event{
			Sequence: int64(i), Time: t0.Add(time.Duration(i) * time.Second),
			Kind: "job.updated", Caller: "spiffe://airlock.test/client/dev", Subject: fmt.Sprintf("job/j%d", i),
			Tenant: "dev", JobID: fmt.Sprintf("j%d", i), Outcome: "allowed", Reason: fmt.Sprintf("step %d", i),
			PrevHash: prev,
		}
		h, err := e.ComputeHash()
		if err != nil {
			t.Fatal(err)
		}
		e.Hash = h
		prev = h
		out = append(out, e)
	}
	return out
}

// rehash recomputes e's hash, as a forger who knows the scheme would.
func rehash(t *testing.T, e *audit.Event) {
	t.Helper()
	h, err := e.ComputeHash()
	if err != nil {
		t.Fatal(err)
	}
	e.Hash = h
}

func TestGolden(t *testing.T) {
	// A fixed event and its hash: a change to the encoding breaks every
	// stored log, so it must show up here first. The value was checked
	// against an independent implementation of the encoding (in Python).
	e := audit.Event{
		Sequence: 1, Time: time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC),
		Kind: "job.submitted", Caller: "spiffe://airlock.test/client/dev", Subject: "job/j1",
		Tenant: "dev", JobID: "j1", Outcome: "allowed", Reason: "", PrevHash: audit.GenesisHash,
	}
	got, err := e.ComputeHash()
	if err != nil {
		t.Fatal(err)
	}
	const want = "0345980921d0ed275e6689f6422b81086ee967099cc2a48351165390169b6813"
	if got != want {
		t.Fatalf("hash = %s, want %s", got, want)
	}
}

func TestCanonicalIsUnambiguous(t *testing.T) {
	base := chain(t, 1)[0]
	variants := map[string]func(e *audit.Event){
		"field boundary moved": func(e *audit.Event) { e.Kind, e.Caller = e.Kind+e.Caller[:1], e.Caller[1:] },
		"sequence":             func(e *audit.Event) { e.Sequence++ },
		"time by 1µs":          func(e *audit.Event) { e.Time = e.Time.Add(time.Microsecond) },
		"subject and tenant":   func(e *audit.Event) { e.Subject, e.Tenant = e.Tenant, e.Subject },
		"reason":               func(e *audit.Event) { e.Reason += " " },
		"outcome":              func(e *audit.Event) { e.Outcome = "denied" },
		"job id":               func(e *audit.Event) { e.JobID = "" },
		"prev hash":            func(e *audit.Event) { e.PrevHash = strings.Repeat("1", 64) },
	}
	seen := map[string]string{string(base.Canonical()): "base"}
	for name, change := range variants {
		e := base
		change(&e)
		c := string(e.Canonical())
		if other, dup := seen[c]; dup {
			t.Errorf("%s encodes like %s", name, other)
		}
		seen[c] = name
		if h, _ := e.ComputeHash(); h == base.Hash {
			t.Errorf("%s: same hash", name)
		}
	}
	// The time zone and sub-microsecond digits are not part of an event.
	e := base
	e.Time = base.Time.In(time.FixedZone("x", 3600)).Add(999 * time.Nanosecond)
	if h, _ := e.ComputeHash(); h != base.Hash {
		t.Errorf("the same instant in another zone hashes differently")
	}
	if got := audit.Normalize(e.Time); !got.Equal(base.Time) || got.Location() != time.UTC {
		t.Errorf("Normalize = %v, want %v", got, base.Time)
	}
}

func TestVerifyGood(t *testing.T) {
	events := chain(t, 10)
	if i, err := audit.Verify(events); err != nil || i != -1 {
		t.Fatalf("Verify(good) = %d, %v", i, err)
	}
	if i, err := audit.Verify(nil); err != nil || i != -1 {
		t.Fatalf("Verify(nil) = %d, %v", i, err)
	}
	// A window anywhere in the log takes its first entry's link as given.
	if i, err := audit.Verify(events[4:8]); err != nil || i != -1 {
		t.Fatalf("Verify(window) = %d, %v", i, err)
	}
}

func TestVerifyPages(t *testing.T) {
	events := chain(t, 10)
	v := audit.NewVerifier()
	for start := 0; start < len(events); start += 3 {
		page := events[start:min(start+3, len(events))]
		if i, err := v.Check(page); err != nil {
			t.Fatalf("page at %d: break %d: %v", start, i, err)
		}
	}
	if seq, prev := v.Next(); seq != 11 || prev != events[9].Hash {
		t.Fatalf("Next = %d, %s", seq, prev)
	}
	// Resuming after a trusted entry checks the link to it.
	if _, err := audit.Resume(events[3]).Check(events[4:]); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if i, err := audit.Resume(events[3]).Check(events[5:]); i != 0 || err == nil {
		t.Fatalf("resume across a gap = %d, %v", i, err)
	}
}

func TestVerifyDetects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, events []audit.Event) []audit.Event
		// want is the index of the first bad entry after tampering.
		want   int
		reason string
	}{
		{"altered reason", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[4].Reason = "nothing to see"
			return ev
		}, 4, "hash does not match"},
		{"altered time", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[2].Time = ev[2].Time.Add(-time.Hour)
			return ev
		}, 2, "hash does not match"},
		{"altered and rehashed", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[4].Outcome = "denied"
			rehash(t, &ev[4])
			return ev
		}, 5, "prev hash"},
		{"replaced hash", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[6].Hash = strings.Repeat("ab", 32)
			return ev
		}, 6, "hash does not match"},
		{"deleted entry", func(t *testing.T, ev []audit.Event) []audit.Event {
			return append(ev[:3:3], ev[4:]...)
		}, 3, "1 entries missing"},
		{"deleted and relinked", func(t *testing.T, ev []audit.Event) []audit.Event {
			// The forger fixes the link but cannot renumber without
			// rehashing everything after.
			ev[4].PrevHash = ev[2].Hash
			rehash(t, &ev[4])
			return append(ev[:3:3], ev[4:]...)
		}, 3, "missing"},
		{"swapped entries", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[5], ev[6] = ev[6], ev[5]
			return ev
		}, 5, "entries missing"},
		{"repeated entry", func(t *testing.T, ev []audit.Event) []audit.Event {
			return append(ev[:5:5], ev[4:]...)
		}, 5, "reordered or repeated"},
		{"first entry not from genesis", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[0].PrevHash = strings.Repeat("1", 64)
			rehash(t, &ev[0])
			return ev
		}, 0, "prev hash"},
		{"upper-case prev hash", func(t *testing.T, ev []audit.Event) []audit.Event {
			ev[1].PrevHash = strings.ToUpper(ev[1].PrevHash)
			ev[2].PrevHash = ev[1].Hash
			return ev
		}, 1, "prev hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := tc.tamper(t, chain(t, 10))
			i, err := audit.Verify(events)
			if i != tc.want || !errors.Is(err, audit.ErrBroken) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Verify = %d, %v; want break at %d (%s)", i, err, tc.want, tc.reason)
			}
			var be *audit.BreakError
			if !errors.As(err, &be) || be.Index != i || be.Sequence != events[i].Sequence {
				t.Fatalf("error %#v does not name entry %d", err, i)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := audit.Event{Kind: "job.submitted", Reason: "ünïcode is fine"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, e := range map[string]audit.Event{
		"no kind":      {},
		"NUL":          {Kind: "k", Reason: "a\x00b"},
		"invalid UTF8": {Kind: "k", Caller: "\xff"},
	} {
		if err := e.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestVerifyWindowWithMalformedAnchor(t *testing.T) {
	window := chain(t, 3)[1:]
	window[0].PrevHash = "not a hash"
	if i, err := audit.Verify(window); i != 0 || !errors.Is(err, audit.ErrBroken) || !strings.Contains(err.Error(), "64 lower-case hex") {
		t.Fatalf("Verify = %d, %v; want a break at 0 for the malformed prev hash", i, err)
	}
}

// Bounded keeps short fields as they are and cuts long ones on a rune
// boundary, with a mark naming the whole length and digest.
func TestBounded(t *testing.T) {
	long := strings.Repeat("é", 2<<20) // 4 MiB of two-byte runes
	e := audit.Event{Kind: "job.refused", Caller: "spiffe://x/client/a", Subject: long, Tenant: long, Reason: long + long}.Bounded()
	if e.Kind != "job.refused" || e.Caller != "spiffe://x/client/a" {
		t.Errorf("short fields changed: %+v", e)
	}
	for name, f := range map[string]string{"subject": e.Subject, "tenant": e.Tenant, "reason": e.Reason} {
		if len(f) > 8192 || !utf8.ValidString(f) || !strings.Contains(f, "…[cut: ") || !strings.Contains(f, "sha256:") {
			t.Errorf("%s: %d bytes, valid UTF-8 %v: %q", name, len(f), utf8.ValidString(f), f[max(0, len(f)-120):])
		}
	}
	if !strings.Contains(e.Reason, fmt.Sprintf("[cut: %d bytes in all", 2*len(long))) {
		t.Errorf("reason mark: %q", e.Reason[len(e.Reason)-120:])
	}
	if err := e.Validate(); err != nil {
		t.Errorf("a bounded event does not validate: %v", err)
	}
}
