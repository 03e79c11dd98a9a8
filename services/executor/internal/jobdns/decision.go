package jobdns

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// QueryDecision is the record of one query: what it asked, whether it was
// answered and why, and with what.
type QueryDecision struct {
	// Time is when the server read the query.
	Time time.Time
	// Proto is "udp" or "tcp".
	Proto string
	// Name is the question's name, normalised when it is a host name (as
	// the job sent it, without the trailing dot, when it is not); "" when
	// no single question was read.
	Name string
	// Type is the question's type (zero when none was read).
	Type dnsmessage.Type
	// Allowed reports whether the policy allowed the name and the server
	// answered with what the upstream resolver said.
	Allowed bool
	// Reason says why: the rule that allowed it, or what refused it.
	Reason string
	// RCode is the response's code; a query left unanswered (a response,
	// a message shorter than a header) has RCodeSuccess and no Answers.
	RCode dnsmessage.RCode
	// Answers are the vetted addresses answered.
	Answers []netip.Addr
	// Suppressed, when not zero, makes this a summary: that many refusals
	// of Name past the cap, from Time over a minute, were not recorded one
	// by one. Name is "" both for refusals that named nothing and for the
	// summary over all names; Reason tells which.
	Suppressed int
}

// emit records d, unless it is a refusal past the cap, which is counted.
func (s *Server) emit(d QueryDecision) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	if d.Allowed {
		s.cfg.Record(d)
		return
	}
	s.gate.refused(d, time.Now())
}

// gate caps the refusals recorded one by one, as the egress proxy's does:
// perName for each name and ten times that over all of them, in windows
// that start at a refusal and last a minute. What it holds back is
// summarised when the window ends (or at Close). Its methods run under mu
// (Server.emitMu).
type gate struct {
	perName, overall int
	every            time.Duration
	record           func(QueryDecision)
	mu               *sync.Mutex

	names map[string]*window
	all   *window
}

// window is one name's minute (or every name's, overall).
type window struct {
	name       string
	overall    bool
	start      time.Time
	recorded   int
	suppressed int
	timer      *time.Timer
	flushed    bool
}

func (g *gate) refused(d QueryDecision, now time.Time) {
	w := g.current(g.names[d.Name], now)
	if w != nil && w.recorded >= g.perName {
		g.hold(w, now)
		return
	}
	g.all = g.current(g.all, now)
	if g.all == nil {
		g.all = &window{overall: true, start: now}
	}
	if g.all.recorded >= g.overall {
		g.hold(g.all, now)
		return
	}
	if w == nil {
		if len(g.names) >= 2*g.overall {
			g.sweep(now)
		}
		w = &window{name: d.Name, start: now}
		g.names[d.Name] = w
	}
	w.recorded++
	g.all.recorded++
	g.record(d)
}

// current is w while its minute lasts, and nil (w's summary recorded)
// after.
func (g *gate) current(w *window, now time.Time) *window {
	if w != nil && now.Sub(w.start) >= g.every {
		g.flush(w)
		return nil
	}
	return w
}

// hold counts one refusal into w, and makes sure w's summary comes when
// its minute ends even if no refusal follows.
func (g *gate) hold(w *window, now time.Time) {
	if w.suppressed == 0 {
		w.timer = time.AfterFunc(w.start.Add(g.every).Sub(now), func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.flush(w)
		})
	}
	w.suppressed++
}

// flush ends w, recording its summary if it held anything back.
func (g *gate) flush(w *window) {
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
	} else if g.names[w.name] == w {
		delete(g.names, w.name)
	}
	if w.suppressed == 0 {
		return
	}
	what, limit := "of "+w.name, g.perName
	switch {
	case w.overall:
		what, limit = "over all names", g.overall
	case w.name == "":
		what = "that named nothing"
	}
	g.record(QueryDecision{
		Time:       w.start,
		Name:       w.name,
		Reason:     fmt.Sprintf("%d more refused queries %s in the %s from %s, not recorded one by one (the cap is %d)", w.suppressed, what, g.every, w.start.Format(time.RFC3339), limit),
		Suppressed: w.suppressed,
	})
}

// sweep ends the windows whose minute is over, so that a job asking ever
// new names does not grow the map.
func (g *gate) sweep(now time.Time) {
	for _, w := range g.names {
		g.current(w, now)
	}
}

func (g *gate) flushAll() {
	for _, w := range g.names {
		g.flush(w)
	}
	if g.all != nil {
		g.flush(g.all)
	}
}
