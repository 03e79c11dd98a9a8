// Package warmpool keeps items made ahead of the work that claims them:
// an executor's pooled sandboxes, ready for the sessions that will want
// them. Each item is made for one key (whatever must match for an item to
// serve a claim: tenant, runtime class, user, sizes), is handed out at
// most once, and is never given back: the pool makes another in the
// background, one at a time, within its bounds and as the executor's room
// allows.
//
// The package knows nothing of sandboxes: Config.Make makes an item and
// Config.Discard destroys one no claim took.
package warmpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Config is what a Pool needs.
type Config[K comparable, T any] struct {
	// Make makes one item for k; Discard destroys one that no claim took
	// (its key's target fell, it waited MaxIdle, or the pool closed).
	Make    func(ctx context.Context, k K) (T, error)
	Discard func(T)
	// Max bounds the items ready and being made, all keys together. Zero
	// pools nothing.
	Max int
	// Room reports whether one more item for k fits beside what the
	// executor's runs hold now and the pool holds (held: the items ready
	// or being made, per key); nil is always.
	Room func(k K, held map[K]int) bool
	// Paused reports whether refills must wait (the executor is fenced or
	// draining); nil never pauses.
	Paused func() bool
	// MaxIdle is how long an item may wait for a claim before it is made
	// again (a fresh one, so a long-lived item never carries a stale
	// template); zero is an hour.
	MaxIdle time.Duration
	// RefillDelay is how long after a claim its refill waits, so that
	// making the next item does not take the CPU from the claim's first
	// milliseconds; zero is 250ms (a short job is done by then).
	RefillDelay time.Duration
	Now         func() time.Time
	Logger      *slog.Logger
}

// Pool keeps items per key. Its methods are safe for concurrent use.
type Pool[K comparable, T any] struct {
	cfg  Config[K, T]
	wake chan struct{}
	// discards counts the discards SetTarget left running, which Run's
	// end waits for.
	discards sync.WaitGroup

	mu      sync.Mutex
	keys    []K // in the order their targets were first set, for turns
	targets map[K]int
	ready   map[K][]item[T]
	making  map[K]int
	stats   map[K]*stats
	// notBefore holds refills back after a claim (RefillDelay).
	notBefore time.Time
	closed    bool
}

type item[T any] struct {
	v    T
	made time.Time
}

type stats struct {
	hits, misses, made, failed int64
	// refills are the last refill durations, newest last.
	refills []time.Duration
	// retryAt holds the key's refills back after a failure.
	retryAt  time.Time
	failures int
	lastErr  string
}

// refillWindow is how many refill durations Status's median is over.
const refillWindow = 32

// New returns a pool; Run makes its items.
func New[K comparable, T any](cfg Config[K, T]) (*Pool[K, T], error) {
	if cfg.Make == nil || cfg.Discard == nil {
		return nil, errors.New("warmpool: Make and Discard are required")
	}
	if cfg.Max < 0 {
		return nil, fmt.Errorf("warmpool: max %d: must not be negative", cfg.Max)
	}
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = time.Hour
	}
	if cfg.RefillDelay <= 0 {
		cfg.RefillDelay = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Pool[K, T]{
		cfg:     cfg,
		wake:    make(chan struct{}, 1),
		targets: map[K]int{},
		ready:   map[K][]item[T]{},
		making:  map[K]int{},
		stats:   map[K]*stats{},
	}, nil
}

// SetTarget sets how many items of key k the pool keeps ready (0 or less
// stops keeping any: those ready are discarded, in the background).
func (p *Pool[K, T]) SetTarget(k K, n int) {
	n = max(n, 0)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	if _, known := p.targets[k]; !known && n > 0 {
		p.keys = append(p.keys, k)
		p.stat(k)
	}
	var drop []item[T]
	if n == 0 {
		delete(p.targets, k)
		p.keys = slices.DeleteFunc(p.keys, func(x K) bool { return x == k })
		drop = p.ready[k]
		delete(p.ready, k)
		if p.making[k] == 0 {
			delete(p.making, k)
			delete(p.stats, k)
		}
	} else {
		p.targets[k] = n
		if r := p.ready[k]; len(r) > n {
			// The oldest go first.
			drop = slices.Clone(r[:len(r)-n])
			p.ready[k] = slices.Clone(r[len(r)-n:])
		}
	}
	p.mu.Unlock()
	if len(drop) > 0 {
		p.discards.Add(1)
		go func() { defer p.discards.Done(); p.discard(drop) }()
	}
	p.poke()
}

// Target is key k's target (0 when none is set).
func (p *Pool[K, T]) Target(k K) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.targets[k]
}

// Take hands out an item made for exactly key k, if one is ready, and
// counts a hit or a miss for k. The item is the caller's for good.
func (p *Pool[K, T]) Take(k K) (T, bool) {
	p.mu.Lock()
	defer p.poke()
	defer p.mu.Unlock()
	var zero T
	if _, pooled := p.targets[k]; !pooled {
		return zero, false // not a key the pool keeps: nothing to count
	}
	st := p.stat(k)
	r := p.ready[k]
	if p.closed || len(r) == 0 {
		st.misses++
		return zero, false
	}
	// The newest: the oldest may be close to its MaxIdle.
	it := r[len(r)-1]
	p.ready[k] = r[:len(r)-1]
	st.hits++
	p.notBefore = p.cfg.Now().Add(p.cfg.RefillDelay)
	return it.v, true
}

// Held is how many items are ready or being made, per key.
func (p *Pool[K, T]) Held() map[K]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held()
}

// held is Held. Callers hold p.mu.
func (p *Pool[K, T]) held() map[K]int {
	out := map[K]int{}
	for k, r := range p.ready {
		if len(r) > 0 {
			out[k] += len(r)
		}
	}
	for k, n := range p.making {
		if n > 0 {
			out[k] += n
		}
	}
	return out
}

// Shed discards up to n ready items, the oldest first, to give their room
// back to runs; it returns how many it discarded.
func (p *Pool[K, T]) Shed(n int) int {
	p.mu.Lock()
	var drop []item[T]
	for ; n > 0; n-- {
		var oldest K
		found := false
		for k, r := range p.ready {
			if len(r) > 0 && (!found || r[0].made.Before(p.ready[oldest][0].made)) {
				oldest, found = k, true
			}
		}
		if !found {
			break
		}
		drop = append(drop, p.ready[oldest][0])
		p.ready[oldest] = p.ready[oldest][1:]
	}
	p.mu.Unlock()
	p.discard(drop)
	return len(drop)
}

// Status is one key's state.
type Status[K comparable] struct {
	Key                        K
	Ready, Making, Target      int
	Hits, Misses, Made, Failed int64
	// RefillLast and RefillMedian are the last refill's duration and the
	// median of the last refillWindow; zero before the first.
	RefillLast, RefillMedian time.Duration
	// LastError is the last failed refill's error, "" after a success.
	LastError string
}

// Status reports every key with a target or a count, in the order keys
// were first seen.
func (p *Pool[K, T]) Status() []Status[K] {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[K]bool{}
	var order []K
	for _, k := range p.keys {
		seen[k] = true
		order = append(order, k)
	}
	for k := range p.stats {
		if !seen[k] {
			order = append(order, k)
		}
	}
	out := make([]Status[K], 0, len(order))
	for _, k := range order {
		st := p.stats[k]
		s := Status[K]{Key: k, Ready: len(p.ready[k]), Making: p.making[k], Target: p.targets[k],
			Hits: st.hits, Misses: st.misses, Made: st.made, Failed: st.failed, LastError: st.lastErr}
		if n := len(st.refills); n > 0 {
			s.RefillLast = st.refills[n-1]
			sorted := slices.Clone(st.refills)
			slices.Sort(sorted)
			s.RefillMedian = sorted[n/2]
		}
		out = append(out, s)
	}
	return out
}

// Run makes items until ctx ends, then discards every item still ready.
// Items are made one at a time: the key whose turn it is among those
// below target, while the pool is within Max, not paused, and the
// executor has room.
func (p *Pool[K, T]) Run(ctx context.Context) {
	defer p.close()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		p.expire()
		k, wait, ok := p.next()
		if !ok {
			var after <-chan time.Time
			if wait > 0 {
				after = time.After(wait)
			}
			select {
			case <-ctx.Done():
			case <-p.wake:
			case <-tick.C:
			case <-after:
			}
			continue
		}
		p.refill(ctx, k)
	}
}

// next picks the key to make an item for, if any may be made now; else
// how long to wait before asking again (0: until woken or the tick).
func (p *Pool[K, T]) next() (k K, wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cfg.Max == 0 || (p.cfg.Paused != nil && p.cfg.Paused()) {
		return k, 0, false
	}
	now := p.cfg.Now()
	if now.Before(p.notBefore) {
		return k, p.notBefore.Sub(now), false
	}
	held, total := p.held(), 0
	for _, n := range held {
		total += n
	}
	if total >= p.cfg.Max {
		return k, 0, false
	}
	for i, c := range p.keys {
		if len(p.ready[c])+p.making[c] >= p.targets[c] || now.Before(p.stats[c].retryAt) {
			continue
		}
		if p.cfg.Room != nil && !p.cfg.Room(c, held) {
			continue
		}
		// Its turn taken: to the back of the line.
		p.keys = append(append(p.keys[:i:i], p.keys[i+1:]...), c)
		p.making[c]++
		return c, 0, true
	}
	return k, 0, false
}

// refill makes one item for k.
func (p *Pool[K, T]) refill(ctx context.Context, k K) {
	began := p.cfg.Now()
	v, err := p.cfg.Make(ctx, k)
	took := p.cfg.Now().Sub(began)
	p.mu.Lock()
	p.making[k]--
	if p.making[k] == 0 {
		delete(p.making, k)
	}
	st := p.stats[k]
	if _, kept := p.targets[k]; !kept && p.making[k] == 0 {
		// Its key was dropped meanwhile: counted nowhere.
		delete(p.stats, k)
		st = nil
	}
	if st == nil {
		st = &stats{}
	}
	if err != nil {
		st.failed++
		st.failures++
		st.lastErr = err.Error()
		// Back off: 1s, 2s, 4s ... a minute.
		st.retryAt = p.cfg.Now().Add(min(time.Second<<min(st.failures-1, 6), time.Minute))
		p.mu.Unlock()
		if ctx.Err() == nil {
			p.cfg.Logger.Warn("warm pool: refill failed", "key", fmt.Sprint(k), "error", err, "failures", st.failures)
		}
		return
	}
	st.made++
	st.failures, st.lastErr = 0, ""
	st.refills = append(st.refills, took)
	if len(st.refills) > refillWindow {
		st.refills = slices.Delete(st.refills, 0, len(st.refills)-refillWindow)
	}
	keep := !p.closed && len(p.ready[k]) < p.targets[k]
	if keep {
		p.ready[k] = append(p.ready[k], item[T]{v: v, made: p.cfg.Now()})
	}
	p.mu.Unlock()
	if !keep {
		// Its target fell, or the pool closed, while it was made.
		p.cfg.Discard(v)
	}
}

// expire discards items that waited MaxIdle.
func (p *Pool[K, T]) expire() {
	p.mu.Lock()
	cutoff := p.cfg.Now().Add(-p.cfg.MaxIdle)
	var drop []item[T]
	for k, r := range p.ready {
		keep := r[:0:0]
		for _, it := range r {
			if it.made.Before(cutoff) {
				drop = append(drop, it)
			} else {
				keep = append(keep, it)
			}
		}
		p.ready[k] = keep
	}
	p.mu.Unlock()
	p.discard(drop)
}

// close discards every ready item; an item being made is discarded once
// made.
func (p *Pool[K, T]) close() {
	p.mu.Lock()
	p.closed = true
	var drop []item[T]
	for _, r := range p.ready {
		drop = append(drop, r...)
	}
	p.ready = map[K][]item[T]{}
	p.mu.Unlock()
	p.discard(drop)
	p.discards.Wait()
}

func (p *Pool[K, T]) discard(items []item[T]) {
	for _, it := range items {
		p.cfg.Discard(it.v)
	}
}

// stat is k's stats, made on first use. Callers hold p.mu.
func (p *Pool[K, T]) stat(k K) *stats {
	st := p.stats[k]
	if st == nil {
		st = &stats{}
		p.stats[k] = st
	}
	return st
}

func (p *Pool[K, T]) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}
