package egressproxy

import (
	"net"
	"sync"

	"github.com/airlockhq/airlock/pkg/egress"
)

// TLS record content types (RFC 8446 §5.1, RFC 5246 §6.2.1).
const (
	recordCCS       = 20 // change_cipher_spec
	recordAlert     = 21
	recordHandshake = 22
	recordAppData   = 23
	recordHeartbeat = 24
)

const (
	// recordHeader is a record's header: type, version (2), length (2).
	recordHeader = 5
	// maxRecord is the longest record body TLS allows (2^14 + 2048, TLS
	// 1.2's ciphertext bound; TLS 1.3's is lower).
	maxRecord = 1<<14 + 2048
	// maxSealedAlert is the longest TLS 1.3 application_data record read
	// as a sealed alert before the job's Finished: an alert (2 bytes) and
	// its inner type, under a 16-byte tag, is 19; the shortest Finished
	// so sealed is 53, an empty client Certificate 25.
	maxSealedAlert = 24
)

const (
	dirJob    = 0 // bytes from the job to the server
	dirServer = 1 // bytes from the server to the job
)

var sideOf = [2]egress.Side{egress.SideJob, egress.SideServer}

// recordReader finds record headers in one direction's bytes, skipping
// the bodies. Its state is one header and a count.
type recordReader struct {
	hdr  [recordHeader]byte
	have int // header bytes held
	skip int // body bytes of the current record still to come
}

// tlsWatch follows the TLS record layer of one connection in both
// directions until the handshake is decided: it reads the record headers
// only (never a body: nothing is decrypted), and its state is bounded
// whatever the bytes are. Its methods may be called from both directions'
// goroutines.
type tlsWatch struct {
	mu      sync.Mutex
	dirs    [2]recordReader
	seen    [2]int64 // bytes watched each way
	decided bool
	out     egress.TLS

	// tls13: the server sent application data before the job did, so
	// this is TLS 1.3, whose handshake after the ServerHello is sealed as
	// application data.
	tls13 bool
	// jobFinished: under TLS 1.3, the job sent a sealed record longer
	// than an alert (its Finished): it accepted the server.
	jobFinished bool
	ccs         [2]bool // sent change_cipher_spec
	finished    [2]bool // sent a record after its change_cipher_spec
	app         [2]bool // sent application_data
	alertBy     egress.Side
	alertAfter  int64
}

// done reports whether the handshake is decided: the bytes need no more
// watching.
func (w *tlsWatch) done() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.decided
}

// feed watches p, the next bytes of direction dir.
func (w *tlsWatch) feed(dir int, p []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(p) > 0 && !w.decided {
		take := len(p)
		if w.seen[dir]+int64(take) > egress.MaxTLSWatch {
			take = int(egress.MaxTLSWatch - w.seen[dir])
		}
		if take <= 0 {
			w.decide(egress.HandshakeUndecided, "", 0)
			return
		}
		n := w.scan(dir, p[:take])
		w.seen[dir] += int64(n)
		p = p[n:]
	}
}

// scan takes p's bytes until a header is complete (which it acts on) or p
// ends, and returns how many it took.
func (w *tlsWatch) scan(dir int, p []byte) int {
	r := &w.dirs[dir]
	if r.skip > 0 {
		n := min(r.skip, len(p))
		r.skip -= n
		return n
	}
	n := copy(r.hdr[r.have:], p)
	r.have += n
	if r.have < recordHeader {
		return n
	}
	r.have = 0
	typ, major, minor := r.hdr[0], r.hdr[1], r.hdr[2]
	length := int(r.hdr[3])<<8 | int(r.hdr[4])
	if typ < recordCCS || typ > recordHeartbeat || major != 3 || minor > 4 || length > maxRecord {
		w.decide(egress.HandshakeNotTLS, sideOf[dir], w.seen[1-dir])
		return n
	}
	r.skip = length
	w.record(dir, typ, length)
	return n
}

// record takes one record header of direction dir, in the order the proxy
// saw them.
func (w *tlsWatch) record(dir int, typ byte, length int) {
	other := 1 - dir
	alert := func() {
		if w.alertBy == "" {
			w.alertBy, w.alertAfter = sideOf[dir], w.seen[other]
		}
	}
	if w.ccs[dir] && typ != recordCCS {
		w.finished[dir] = true
	}
	switch typ {
	case recordCCS:
		w.ccs[dir] = true
	case recordAlert:
		// Under TLS 1.2, an alert after both Finished messages is a
		// close_notify or later; until then it ends the handshake.
		if w.tls13 || !(w.finished[dirJob] && w.finished[dirServer]) {
			alert()
		}
	case recordAppData:
		if dir == dirServer && !w.app[dirJob] {
			w.tls13 = true
		}
		if dir == dirJob && w.tls13 && !w.jobFinished {
			if length <= maxSealedAlert {
				alert()
			} else {
				w.jobFinished = true
			}
		}
		w.app[dir] = true
	}
	switch {
	case w.tls13 && w.jobFinished,
		!w.tls13 && w.app[dirJob] && w.app[dirServer]:
		w.decide(egress.HandshakeCompleted, "", 0)
	}
}

func (w *tlsWatch) decide(h egress.Handshake, by egress.Side, after int64) {
	if !w.decided {
		w.decided, w.out = true, egress.TLS{Handshake: h, By: by, After: after}
	}
}

// result is the outcome once the connection has ended.
func (w *tlsWatch) result() *egress.TLS {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.decided {
		switch {
		case w.alertBy != "":
			w.decide(egress.HandshakeFailed, w.alertBy, w.alertAfter)
		case !w.tls13 && w.finished[dirJob] && w.finished[dirServer]:
			// TLS 1.2 finished both ways, and closed with no data.
			w.decide(egress.HandshakeCompleted, "", 0)
		default:
			w.decide(egress.HandshakeFailed, "", 0)
		}
	}
	out := w.out
	return &out
}

// spliceTLS joins c to up after hello, the bytes the proxy read to find the
// ClientHello, watching the record layer both ways from there.
func (p *Proxy) spliceTLS(c *conn, up net.Conn, hello []byte) {
	c.tls = &tlsWatch{}
	c.tls.feed(dirJob, hello)
	p.splice(c, up, replay(hello))
}
