package egress

import "log/slog"

// Side is one end of a connection through the egress proxy.
type Side string

const (
	// SideJob is the job's end (the TLS client).
	SideJob Side = "job"
	// SideServer is the upstream's end (the TLS server).
	SideServer Side = "server"
)

// Known reports whether s is one of the sides ("" is not).
func (s Side) Known() bool { return s == SideJob || s == SideServer }

// Handshake is what a connection's TLS record layer showed of its
// handshake.
type Handshake string

const (
	// HandshakeCompleted: both ends went on past the handshake.
	HandshakeCompleted Handshake = "completed"
	// HandshakeFailed: the connection ended before the handshake
	// completed; TLS.By says who sent an alert, if one was seen.
	HandshakeFailed Handshake = "failed"
	// HandshakeNotTLS: after the job's ClientHello, TLS.By sent bytes that
	// are not TLS records (a plain-text server on port 443, say).
	HandshakeNotTLS Handshake = "not_tls"
	// HandshakeUndecided: the handshake neither completed nor failed
	// within the bytes the proxy watches (MaxTLSWatch each way).
	HandshakeUndecided Handshake = "undecided"
)

// MaxTLSWatch is how many bytes each way the egress proxy watches for the
// end of a handshake; past it the connection is no longer watched.
const MaxTLSWatch = 1 << 20

// Known reports whether h is one of the outcomes ("" is not).
func (h Handshake) Known() bool {
	switch h {
	case HandshakeCompleted, HandshakeFailed, HandshakeNotTLS, HandshakeUndecided:
		return true
	}
	return false
}

// TLS is what the egress proxy saw of a connection that began with a TLS
// ClientHello, from the record layer's headers alone (content type,
// version, length): nothing is decrypted. TLS 1.3 seals its handshake and
// its alerts as application data; the proxy tells them apart by their
// order and size, so a sealed alert is reported as one by its size.
type TLS struct {
	Handshake Handshake `json:"handshake"`
	// By is who sent the first alert before the handshake completed (""
	// when none was seen), or, for HandshakeNotTLS, whose bytes were not
	// TLS records.
	By Side `json:"by,omitempty"`
	// After is how many bytes the other side had sent by then.
	After int64 `json:"after,omitempty"`
}

// Bounded is t with what a record cannot say cleared: an unknown outcome
// or side (a record is read from a file a job's run wrote beside).
func (t *TLS) Bounded() *TLS {
	if t == nil || !t.Handshake.Known() {
		return nil
	}
	c := *t
	if !c.By.Known() {
		c.By = ""
	}
	c.After = max(c.After, 0)
	return &c
}

// LogValue is t as a group of the executor's log line (empty when nil).
func (t *TLS) LogValue() slog.Value {
	if t == nil {
		return slog.GroupValue()
	}
	return slog.GroupValue(slog.String("handshake", string(t.Handshake)), slog.String("by", string(t.By)), slog.Int64("after", t.After))
}
