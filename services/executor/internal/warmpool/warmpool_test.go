package warmpool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// The items here are strings naming their key and a sequence number: the
// pool's bookkeeping is what is under test (the sandboxes it keeps are
// tested in package runs, made for real).

type key struct{ tenant, shape string }

type maker struct {
	mu        sync.Mutex
	n         int
	made      []string
	discarded []string
	fail      map[key]error
	block     chan struct{} // if set, each Make waits on it
}

func (m *maker) make(ctx context.Context, k key) (string, error) {
	if m.block != nil {
		select {
		case <-m.block:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail[k]; err != nil {
		return "", err
	}
	m.n++
	v := fmt.Sprintf("%s/%s#%d", k.tenant, k.shape, m.n)
	m.made = append(m.made, v)
	return v, nil
}

func (m *maker) discard(v string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.discarded = append(m.discarded, v)
}

func (m *maker) counts() (made, discarded int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.made), len(m.discarded)
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func start(t *testing.T, cfg Config[key, string]) (*Pool[key, string], *maker, func()) {
	t.Helper()
	mk := &maker{fail: map[key]error{}}
	cfg.Make, cfg.Discard = mk.make, mk.discard
	if cfg.RefillDelay == 0 {
		cfg.RefillDelay = time.Millisecond
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return p, mk, stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func ready(p *Pool[key, string], k key) int {
	for _, s := range p.Status() {
		if s.Key == k {
			return s.Ready
		}
	}
	return 0
}

// TestFillTakeRefill: a pool fills each key to its target; a claim gets an
// item made for exactly its key, never one handed out before, and the
// pool makes another; a key with no target, or another tenant's key of
// the same shape, misses.
func TestFillTakeRefill(t *testing.T) {
	p, mk, _ := start(t, Config[key, string]{Max: 8})
	a, b := key{"a", "small"}, key{"b", "small"}
	p.SetTarget(a, 2)
	waitFor(t, "a's two", func() bool { return ready(p, a) == 2 })
	if _, ok := p.Take(b); ok {
		t.Fatal("tenant b took an item made for tenant a")
	}
	seen := map[string]bool{}
	for i := range 6 {
		waitFor(t, "a's refill", func() bool { return ready(p, a) == 2 })
		v, ok := p.Take(a)
		if !ok {
			t.Fatalf("take %d: a miss with two ready", i)
		}
		if seen[v] {
			t.Fatalf("item %s handed out twice", v)
		}
		seen[v] = true
		if v[:len("a/small#")] != "a/small#" {
			t.Fatalf("a claim for %v got %s", a, v)
		}
	}
	waitFor(t, "a's refill", func() bool { return ready(p, a) == 2 })
	st := p.Status()
	if len(st) != 1 || st[0].Hits != 6 || st[0].Misses != 0 || st[0].Made != 8 || st[0].Target != 2 || st[0].RefillMedian <= 0 {
		t.Errorf("status: %+v", st)
	}
	if made, discarded := mk.counts(); made != 8 || discarded != 0 {
		t.Errorf("made %d, discarded %d; want 8, 0", made, discarded)
	}
	// b has a target now, of its own.
	p.SetTarget(b, 1)
	waitFor(t, "b's one", func() bool { return ready(p, b) == 1 })
	if v, ok := p.Take(b); !ok || v[:2] != "b/" {
		t.Errorf("b's take: %q %v", v, ok)
	}
}

// TestBounds: Max bounds every key together, Room and Paused hold refills
// back, and lowering a target discards the oldest extra items.
func TestBounds(t *testing.T) {
	var room, paused sync.Map
	room.Store("ok", true)
	paused.Store("on", false)
	p, mk, _ := start(t, Config[key, string]{Max: 3,
		Room:   func(key, map[key]int) bool { v, _ := room.Load("ok"); return v.(bool) },
		Paused: func() bool { v, _ := paused.Load("on"); return v.(bool) }})
	a, b := key{"a", "s"}, key{"b", "s"}
	p.SetTarget(a, 2)
	p.SetTarget(b, 2)
	waitFor(t, "three made", func() bool { m, _ := mk.counts(); return m == 3 })
	time.Sleep(50 * time.Millisecond)
	if m, _ := mk.counts(); m != 3 {
		t.Fatalf("made %d with max 3", m)
	}
	if held := p.Held(); held[a]+held[b] != 3 {
		t.Errorf("held %v", held)
	}
	room.Store("ok", false)
	p.Take(a)
	time.Sleep(50 * time.Millisecond)
	if m, _ := mk.counts(); m != 3 {
		t.Fatalf("made %d with no room", m)
	}
	room.Store("ok", true)
	paused.Store("on", true)
	p.SetTarget(a, 2) // a poke
	time.Sleep(50 * time.Millisecond)
	if m, _ := mk.counts(); m != 3 {
		t.Fatalf("made %d while paused", m)
	}
	paused.Store("on", false)
	waitFor(t, "the refill after the pause", func() bool { m, _ := mk.counts(); return m == 4 })
	waitFor(t, "a and b full", func() bool { return ready(p, a)+ready(p, b) == 3 })
	before := slices.Clone(mk.made)
	p.SetTarget(a, 0)
	p.SetTarget(b, 0)
	// In the background.
	waitFor(t, fmt.Sprintf("the three ready (of %v) discarded", before), func() bool { _, d := mk.counts(); return d == 3 })
	if st := p.Status(); len(st) != 0 {
		t.Errorf("status after the targets went: %+v", st)
	}
	if n := p.Shed(5); n != 0 {
		t.Errorf("shed %d from an empty pool", n)
	}
}

// TestIdleFailureClose: an item that waited MaxIdle is discarded and made
// again; a failing Make backs off and says why; closing the pool discards
// every item, and one made after is discarded too.
func TestIdleFailureClose(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	p, mk, stop := start(t, Config[key, string]{Max: 4, MaxIdle: time.Minute, Now: c.Now})
	a, bad := key{"a", "s"}, key{"bad", "s"}
	mk.mu.Lock()
	mk.fail[bad] = errors.New("no loop device")
	mk.mu.Unlock()
	p.SetTarget(a, 1)
	p.SetTarget(bad, 1)
	waitFor(t, "a's one", func() bool { return ready(p, a) == 1 })
	waitFor(t, "bad's failure", func() bool {
		for _, s := range p.Status() {
			if s.Key == bad && s.Failed >= 1 && s.LastError == "no loop device" {
				return true
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond)
	for _, s := range p.Status() {
		if s.Key == bad && s.Failed > 1 {
			t.Errorf("a failing key retried at once: %+v", s)
		}
	}
	c.add(2 * time.Minute)
	p.SetTarget(a, 1) // a poke
	waitFor(t, "the idle item made again", func() bool { _, d := mk.counts(); return d == 1 && ready(p, a) == 1 })
	stop()
	if m, d := mk.counts(); m != d {
		t.Errorf("after close: made %d, discarded %d", m, d)
	}
	if _, ok := p.Take(a); ok {
		t.Error("a take from a closed pool")
	}
}

// TestShedOldestFirst: Shed gives back the oldest ready items first.
func TestShedOldestFirst(t *testing.T) {
	c := &clock{now: time.Unix(1e9, 0)}
	p, mk, _ := start(t, Config[key, string]{Max: 4, Now: c.Now})
	a, b := key{"a", "s"}, key{"b", "s"}
	p.SetTarget(a, 1)
	waitFor(t, "a's", func() bool { return ready(p, a) == 1 })
	c.add(time.Second)
	p.SetTarget(b, 1)
	waitFor(t, "b's", func() bool { return ready(p, b) == 1 })
	if n := p.Shed(1); n != 1 {
		t.Fatalf("shed %d", n)
	}
	mk.mu.Lock()
	defer mk.mu.Unlock()
	if len(mk.discarded) != 1 || mk.discarded[0][:2] != "a/" {
		t.Errorf("shed %v, want a's (the oldest)", mk.discarded)
	}
}
