package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// hub tells in-process watchers about every stored change of a job.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan store.Job]struct{}
}

func newHub() *hub { return &hub{subs: map[string]map[chan store.Job]struct{}{}} }

// subscribe returns a channel of the job's new versions and a function
// that ends the subscription.
func (h *hub) subscribe(id string) (<-chan store.Job, func()) {
	ch := make(chan store.Job, 16)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan store.Job]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[id], ch)
		if len(h.subs[id]) == 0 {
			delete(h.subs, id)
		}
	}
}

// publish never blocks: a watcher that has fallen 16 versions behind loses
// its oldest, which the newest supersedes anyway.
func (h *hub) publish(j store.Job) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[j.ID] {
		select {
		case ch <- j:
			continue
		default:
		}
		select {
		case <-ch:
		default:
		}
		select {
		case ch <- j:
		default:
		}
	}
}

// WatchEvent is one message to a watcher: a job, a piece of output, or a
// decision of the egress record.
type WatchEvent struct {
	Job    *store.Job
	Output *Output
	Egress *EgressEntry
}

// Watch sends the job as it is, then the job again on every change and the
// run's output (and egress record, when from asks) from the executor
// starting at from, until the job has ended and its output is drained
// (then it returns nil), send fails, or ctx ends.
func (s *Service) Watch(ctx context.Context, caller identity.ID, id string, from Offsets, send func(WatchEvent) error) error {
	if from.Stdout < 0 || from.Stderr < 0 {
		return fmt.Errorf("%w: stdout_offset and stderr_offset must not be negative", errdefs.ErrInvalidArgument)
	}
	if from.EgressIndex < 0 {
		return fmt.Errorf("%w: egress_offset must not be negative", errdefs.ErrInvalidArgument)
	}
	// Subscribe before reading, so no change falls in between.
	changes, unsubscribe := s.hub.subscribe(id)
	defer unsubscribe()
	j, err := s.visible(ctx, caller, id)
	if err != nil {
		return err
	}
	if err := send(WatchEvent{Job: &j}); err != nil {
		return err
	}

	w := &outputWatch{s: s, id: id, next: from}
	defer w.stop()
	poll := time.NewTicker(watchPoll)
	defer poll.Stop()
	var (
		drained  bool
		drainBy  <-chan time.Time
		retryAt  <-chan time.Time
		wait     = s.cfg.Retry.Min
		watching bool
	)
	for {
		// The executor has the run once it accepted the job; a job it never
		// accepted has no output to wait for.
		accepted := j.State == store.StateStaging || j.State == store.StateRunning || (j.State.Terminal() && !j.DispatchedAt.IsZero())
		if !watching && !drained && retryAt == nil && accepted {
			w.executor = j.Executor
			w.start(ctx)
			watching = true
		}
		if j.State.Terminal() {
			if drained || !accepted {
				return nil
			}
			if drainBy == nil {
				drainBy = time.After(s.cfg.DrainTimeout)
			}
		}
		select {
		case nj := <-changes:
			if nj.Version > j.Version {
				j = nj
				if err := send(WatchEvent{Job: &j}); err != nil {
					return err
				}
			}
		case <-poll.C:
			// Another replica may drive the job: its changes reach this
			// one's watchers through the store.
			if nj, err := s.cfg.Store.GetJob(ctx, id); err == nil && nj.Version > j.Version {
				j = nj
				if err := send(WatchEvent{Job: &j}); err != nil {
					return err
				}
			}
		case ev := <-w.out:
			if out, ok := w.advance(ev); ok {
				if err := send(out); err != nil {
					return err
				}
			}
		case err := <-w.done:
			watching = false
			switch {
			case err == nil, errors.Is(err, errdefs.ErrNotFound), j.State.Terminal():
				drained = true
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				s.cfg.Logger.Debug("output stream broke; resuming", "job", id, "error", err)
				retryAt = time.After(wait)
				wait = min(2*wait, s.cfg.Retry.Max)
			}
		case <-retryAt:
			retryAt = nil
		case <-drainBy:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return fmt.Errorf("%w: the authority is shutting down; watch again to resume", errdefs.ErrUnavailable)
		}
	}
}

// watchPoll is how often a watcher reads the job from the store, for the
// changes another replica makes.
const watchPoll = time.Second

// outputWatch proxies one executor output stream at a time to a watcher,
// remembering how far each stream (output and egress record) got so a
// broken stream resumes there. One event is in flight at a time: a slow
// watcher holds the executor's stream back rather than growing a queue.
type outputWatch struct {
	s  *Service
	id string
	// executor is the SPIFFE ID of the executor the job is placed on.
	executor string
	next     Offsets
	out      chan RunEvent
	done     chan error
	cancel   context.CancelFunc
}

func (w *outputWatch) start(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	w.out, w.done = make(chan RunEvent), make(chan error, 1)
	out, done, from := w.out, w.done, w.next
	go func() {
		done <- w.s.cfg.Executors.For(w.executor).Watch(ctx, w.id, from, func(ev RunEvent) error {
			if ev.Output == nil && ev.Egress == nil {
				return nil
			}
			select {
			case out <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
}

func (w *outputWatch) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// advance drops what the watcher already has and moves the stream's
// offset past ev.
func (w *outputWatch) advance(ev RunEvent) (WatchEvent, bool) {
	if e := ev.Egress; e != nil {
		if !w.next.Egress || e.Index < w.next.EgressIndex {
			return WatchEvent{}, false
		}
		w.next.EgressIndex = e.Index + 1
		return WatchEvent{Egress: e}, true
	}
	o, ok := w.advanceOutput(*ev.Output)
	return WatchEvent{Output: &o}, ok
}

// advanceOutput drops what the watcher already has of o and moves its
// stream's offset past it.
func (w *outputWatch) advanceOutput(o Output) (Output, bool) {
	next := &w.next.Stdout
	if o.Stream == Stderr {
		next = &w.next.Stderr
	}
	end := o.Offset + int64(len(o.Data))
	if end <= *next && !(len(o.Data) == 0 && o.Truncated) {
		return o, false
	}
	if o.Offset < *next {
		o.Data = o.Data[*next-o.Offset:]
		o.Offset = *next
	}
	*next = max(*next, end)
	return o, true
}
