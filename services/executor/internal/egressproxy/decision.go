package egressproxy

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Mode is how a connection reached the proxy.
type Mode string

const (
	// ModeConnect is an explicit proxy's CONNECT tunnel (TLS).
	ModeConnect Mode = "connect"
	// ModeHTTP is an explicit proxy's absolute-URI request (plain HTTP), and
	// anything on the explicit listener that is not a CONNECT.
	ModeHTTP Mode = "http"
	// ModeTransparent is a connection redirected from the job's TCP 443
	// (TLS) or 80 (plain HTTP).
	ModeTransparent Mode = "transparent"
)

// Decision is the record of one connection: what it asked for, whether it
// went through and why, and what it carried.
type Decision struct {
	// Time is when the proxy accepted the connection.
	Time time.Time
	Mode Mode
	// Name is the normalised name decided on; as the job gave it when it
	// is not a name (an address, garbage), and "" when none was read.
	Name string
	// Port is the destination port decided on (0 when none was read).
	Port uint16
	// Allowed reports whether the connection was joined to an upstream.
	Allowed bool
	// Reason says why: the rule that allowed it, or what refused it.
	Reason string
	// Addr is the vetted address the proxy connected to (zero when none).
	Addr netip.AddrPort
	// BytesIn went from the upstream to the job, BytesOut from the job to
	// the upstream (the ClientHello or request the proxy read first
	// included).
	BytesIn, BytesOut int64
	Duration          time.Duration
	// End says how an allowed connection ended: "closed" by its ends (or
	// "reset (...)" or "broken pipe (...)", as a peer's kernel answers late
	// bytes, a TLS close_notify or the rest of a response, to a socket its
	// owner closed), "idle for ...", "cut: ..." by the proxy, or the error
	// that broke it and in which direction.
	End string
	// Suppressed, when not zero, makes this a summary: that many refusals
	// of Name past the cap, from Time over a minute, were not recorded one
	// by one. Name is "" both for refusals that named nothing and for the
	// summary over all names; Reason tells which.
	Suppressed int
}

// emit records d, unless it is a refusal past the cap, which is counted.
func (p *Proxy) emit(d Decision) {
	p.emitMu.Lock()
	defer p.emitMu.Unlock()
	if d.Allowed {
		p.cfg.Record(d)
		return
	}
	p.gate.refused(d, time.Now())
}

// gate caps the refusals recorded one by one: perName for each name and
// ten times that over all of them, in windows that start at a refusal and
// last a minute. What it holds back is summarised when the window ends (or
// at Close). Its methods run under mu (Proxy.emitMu).
type gate struct {
	perName, overall int
	every            time.Duration
	record           func(Decision)
	mu               *sync.Mutex

	names map[string]*window
	all   *window
}

// window is one name's minute (or every name's, overall).
type window struct {
	name       string
	overall    bool
	mode       Mode
	start      time.Time
	recorded   int
	suppressed int
	timer      *time.Timer
	flushed    bool
}

func (g *gate) refused(d Decision, now time.Time) {
	w := g.current(g.names[d.Name], now)
	if w != nil && w.recorded >= g.perName {
		g.hold(w, d, now)
		return
	}
	g.all = g.current(g.all, now)
	if g.all == nil {
		g.all = &window{overall: true, start: now}
	}
	if g.all.recorded >= g.overall {
		g.hold(g.all, d, now)
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

// hold counts d into w, and makes sure w's summary comes when its minute
// ends even if no refusal follows.
func (g *gate) hold(w *window, d Decision, now time.Time) {
	if w.suppressed == 0 {
		w.mode = d.Mode
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
	g.record(Decision{
		Time:       w.start,
		Mode:       w.mode,
		Name:       w.name,
		Reason:     fmt.Sprintf("%d more refusals %s in the %s from %s, not recorded one by one (the cap is %d)", w.suppressed, what, g.every, w.start.Format(time.RFC3339), limit),
		Suppressed: w.suppressed,
	})
}

// sweep ends the windows whose minute is over, so that a job refused ever
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
