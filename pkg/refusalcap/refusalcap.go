// Package refusalcap bounds how many refusals a record takes one by one,
// so a hostile job refused again and again cannot flood a log: at most
// PerKey refusals for each key (a name a job asked for) and Overall over
// all keys, in windows that start at a refusal and last Every; what a
// window holds back is summarised, in one record, when it ends (or at
// Flush). The egress proxy's connection decisions and the job DNS
// server's query decisions use it. It imports no grpc or proto.
package refusalcap

import (
	"sync"
	"time"
)

// Summary is what a window held back: Suppressed refusals of Key (or of
// every key, when Overall) from Start, beyond Limit recorded one by one;
// First is the first refusal it held back.
type Summary[D any] struct {
	Key        string
	Overall    bool
	First      D
	Start      time.Time
	Every      time.Duration
	Suppressed int
	Limit      int
}

// What names whose refusals the summary counts: "of KEY", "over all
// keys" (name the keys with allName), or, for the key "", "that named
// nothing".
func (s Summary[D]) What(allName string) string {
	switch {
	case s.Overall:
		return "over all " + allName
	case s.Key == "":
		return "that named nothing"
	}
	return "of " + s.Key
}

// Gate caps the refusals passed to Refused. Its methods must be called
// with Mu held; the timers that end windows take Mu themselves.
type Gate[D any] struct {
	PerKey, Overall int
	Every           time.Duration
	// Record takes a refusal let through; Summarise turns a window's
	// summary into a record.
	Record    func(D)
	Summarise func(Summary[D]) D
	Mu        *sync.Mutex

	keys map[string]*window[D]
	all  *window[D]
}

// window is one key's window (or every key's, overall).
type window[D any] struct {
	key        string
	overall    bool
	first      D
	start      time.Time
	recorded   int
	suppressed int
	timer      *time.Timer
	flushed    bool
}

// Refused records d, a refusal of key, or holds it back for a summary.
func (g *Gate[D]) Refused(key string, d D, now time.Time) {
	if g.keys == nil {
		g.keys = map[string]*window[D]{}
	}
	w := g.current(g.keys[key], now)
	if w != nil && w.recorded >= g.PerKey {
		g.hold(w, d, now)
		return
	}
	g.all = g.current(g.all, now)
	if g.all == nil {
		g.all = &window[D]{overall: true, start: now}
	}
	if g.all.recorded >= g.Overall {
		g.hold(g.all, d, now)
		return
	}
	if w == nil {
		if len(g.keys) >= 2*g.Overall {
			g.sweep(now)
		}
		w = &window[D]{key: key, start: now}
		g.keys[key] = w
	}
	w.recorded++
	g.all.recorded++
	g.Record(d)
}

// current is w while its window lasts, and nil (w's summary recorded)
// after.
func (g *Gate[D]) current(w *window[D], now time.Time) *window[D] {
	if w != nil && now.Sub(w.start) >= g.Every {
		g.flush(w)
		return nil
	}
	return w
}

// hold counts d into w, and makes sure w's summary comes when its window
// ends even if no refusal follows.
func (g *Gate[D]) hold(w *window[D], d D, now time.Time) {
	if w.suppressed == 0 {
		w.first = d
		w.timer = time.AfterFunc(w.start.Add(g.Every).Sub(now), func() {
			g.Mu.Lock()
			defer g.Mu.Unlock()
			g.flush(w)
		})
	}
	w.suppressed++
}

// flush ends w, recording its summary if it held anything back.
func (g *Gate[D]) flush(w *window[D]) {
	if w.flushed {
		return
	}
	w.flushed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.overall {
		if g.all == w {
			g.all = nil
		}
	} else if g.keys[w.key] == w {
		delete(g.keys, w.key)
	}
	if w.suppressed == 0 {
		return
	}
	limit := g.PerKey
	if w.overall {
		limit = g.Overall
	}
	g.Record(g.Summarise(Summary[D]{Key: w.key, Overall: w.overall, First: w.first, Start: w.start, Every: g.Every, Suppressed: w.suppressed, Limit: limit}))
}

// sweep ends the windows that are over, so that refusals of ever new keys
// do not grow the map.
func (g *Gate[D]) sweep(now time.Time) {
	for _, w := range g.keys {
		g.current(w, now)
	}
}

// Flush ends every window now, recording what each held back.
func (g *Gate[D]) Flush() {
	for _, w := range g.keys {
		g.flush(w)
	}
	if g.all != nil {
		g.flush(g.all)
	}
}
