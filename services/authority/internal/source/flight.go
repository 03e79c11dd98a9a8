package source

import (
	"context"
	"sync"
	"time"
)

// flights runs one call per key at a time and lets concurrent callers share
// it, but only a call that started after they asked: a caller never gets an
// answer older than its own request (a ref listing from before a push, a
// fetch that began before the commit it wants existed). While a call runs,
// callers that arrive wait for the next one, which all of them share. Each
// caller waits under its own context; the call itself runs under its own
// deadline, whoever gave up on it.
type flights[T any] struct {
	mu    sync.Mutex
	calls map[string]*pending[T]
}

type pending[T any] struct {
	running, next *call[T]
}

type call[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// do returns the result of fn for key from a call that started after do
// was called, or ctx's error once ctx ends first.
func (f *flights[T]) do(ctx context.Context, key string, timeout time.Duration, fn func(context.Context) (T, error)) (T, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]*pending[T]{}
	}
	p := f.calls[key]
	var c *call[T]
	switch {
	case p == nil:
		c = &call[T]{done: make(chan struct{})}
		f.calls[key] = &pending[T]{running: c}
		go f.run(key, c, timeout, fn)
	case p.next == nil:
		c = &call[T]{done: make(chan struct{})}
		p.next = c
	default:
		c = p.next
	}
	f.mu.Unlock()
	return c.await(ctx)
}

// runningOrStart returns the call for key running now, or, when none
// runs, starts fn as one and returns it with started set: in one step,
// so two callers that find none cannot both start one (the second would
// run after the first, for nothing, if the first brought what both need).
func (f *flights[T]) runningOrStart(key string, timeout time.Duration, fn func(context.Context) (T, error)) (c *call[T], started bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]*pending[T]{}
	}
	if p := f.calls[key]; p != nil {
		return p.running, false
	}
	c = &call[T]{done: make(chan struct{})}
	f.calls[key] = &pending[T]{running: c}
	go f.run(key, c, timeout, fn)
	return c, true
}

// await waits for c under ctx.
func (c *call[T]) await(ctx context.Context) (T, error) {
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// run runs c, then the call that waited behind it, if any.
func (f *flights[T]) run(key string, c *call[T], timeout time.Duration, fn func(context.Context) (T, error)) {
	for c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		c.val, c.err = fn(ctx)
		cancel()
		close(c.done)
		f.mu.Lock()
		p := f.calls[key]
		c, p.running, p.next = p.next, p.next, nil
		if c == nil {
			delete(f.calls, key)
		}
		f.mu.Unlock()
	}
}
