package egressproxy

import (
	"net/netip"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/refusalcap"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
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
	// ModeRequest is one HTTP request inside a connection the proxy
	// intercepted to add a brokered credential.
	ModeRequest Mode = "request"
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
	// ClosedFirst is the end whose side closed first, when one did.
	ClosedFirst egress.Side
	// TLS is what the record layer showed of an allowed connection that
	// began with a ClientHello (nil otherwise).
	TLS *egress.TLS
	// Suppressed, when not zero, makes this a summary: that many refusals
	// of Name past the cap, from Time over a minute, were not recorded one
	// by one. Name is "" both for refusals that named nothing and for the
	// summary over all names; Reason tells which.
	Suppressed int
	// Request is set on a ModeRequest decision: BytesIn is then its
	// response's body, BytesOut its request's, Allowed whether it was
	// sent upstream.
	Request *Request
}

// Request is one HTTP request inside an intercepted connection.
type Request struct {
	Method string
	// Path is the URL's path, without query or fragment.
	Path string
	// Status is the upstream's answer, 0 when none came back.
	Status int
	// Credential is the brokered credential added, "" when none was.
	Credential string
	Allowed    bool
}

// emit records d, unless it is a refusal past the cap, which is counted.
func (p *Proxy) emit(d Decision) { p.log.Emit(d, d.Allowed, d.Name) }

// summary is the record of the refusals a window of the cap held back.
func summary(w refusalcap.Summary[Decision]) Decision {
	return Decision{
		Time:       w.Start,
		Mode:       w.First.Mode,
		Name:       w.Key,
		Reason:     egressbase.SummaryReason("refusals", w),
		Suppressed: w.Suppressed,
	}
}
