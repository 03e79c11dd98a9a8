package refusalcap

import (
	"sync"
	"testing"
	"time"
)

type rec struct {
	key        string
	suppressed int
	overall    bool
}

func newGate(perKey, overall int, every time.Duration) (*Gate[rec], *[]rec, *sync.Mutex) {
	var mu sync.Mutex
	var got []rec
	g := &Gate[rec]{PerKey: perKey, Overall: overall, Every: every, Mu: &mu,
		Record:    func(r rec) { got = append(got, r) },
		Summarise: func(s Summary[rec]) rec { return rec{key: s.Key, suppressed: s.Suppressed, overall: s.Overall} }}
	return g, &got, &mu
}

func TestPerKeyAndOverall(t *testing.T) {
	g, got, mu := newGate(2, 3, time.Hour)
	now := time.Now()
	mu.Lock()
	for range 5 {
		g.Refused("a", rec{key: "a"}, now)
	}
	g.Refused("b", rec{key: "b"}, now) // the third overall: recorded
	g.Refused("c", rec{key: "c"}, now) // past the overall cap: held
	if len(*got) != 3 {
		t.Fatalf("recorded %v, want a, a, b", *got)
	}
	g.Flush()
	mu.Unlock()
	var perKey, all rec
	for _, r := range (*got)[3:] {
		if r.overall {
			all = r
		} else {
			perKey = r
		}
	}
	if perKey.key != "a" || perKey.suppressed != 3 || all.suppressed != 1 {
		t.Errorf("summaries %v, want a's 3 and one over all keys", (*got)[3:])
	}
}

// A window's summary comes when it ends, with no refusal after it.
func TestSummaryOnTime(t *testing.T) {
	g, got, mu := newGate(1, 10, 50*time.Millisecond)
	mu.Lock()
	now := time.Now()
	g.Refused("a", rec{key: "a"}, now)
	g.Refused("a", rec{key: "a"}, now)
	mu.Unlock()
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		n := len(*got)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no summary after the window: %v", *got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if s := (*got)[1]; s.key != "a" || s.suppressed != 1 {
		t.Errorf("summary %v", s)
	}
	// A new window after the old one ended records one by one again.
	g.Refused("a", rec{key: "a"}, now.Add(time.Second))
	if len(*got) != 3 || (*got)[2].suppressed != 0 {
		t.Errorf("after the window: %v", *got)
	}
}
