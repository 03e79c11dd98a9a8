package egressproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
)

// chunk is bytes one end sent, as a relay between the two read them.
type chunk struct {
	dir  int
	data []byte
}

// exchange is what the two ends of a TLS connection do: the job (the
// client) and the server, each on its own end of a relay.
type exchange struct {
	client, server *tls.Config
	job, srv       func(*tls.Conn)
}

// transcript runs x through an in-memory relay and returns every chunk
// each end sent, in the order the relay read them: what the proxy sees.
func transcript(t testing.TB, x exchange) []chunk {
	t.Helper()
	jobEnd, relayJob := net.Pipe()
	relaySrv, srvEnd := net.Pipe()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range []net.Conn{jobEnd, relayJob, relaySrv, srvEnd} {
		c.SetDeadline(deadline)
	}
	var (
		mu     sync.Mutex
		chunks []chunk
		wg     sync.WaitGroup
	)
	relay := func(dst, src net.Conn, dir int) {
		buf := make([]byte, 4096)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				mu.Lock()
				chunks = append(chunks, chunk{dir, bytes.Clone(buf[:n])})
				mu.Unlock()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// net.Pipe has no half close: the other end hears EOF.
		dst.Close()
		src.Close()
	}
	wg.Go(func() { relay(relaySrv, relayJob, dirJob) })
	wg.Go(func() { relay(relayJob, relaySrv, dirServer) })
	wg.Go(func() {
		c := tls.Server(srvEnd, x.server)
		x.srv(c)
		srvEnd.Close()
	})
	c := tls.Client(jobEnd, x.client)
	x.job(c)
	jobEnd.Close()
	wg.Wait()
	return chunks
}

// Behaviours of the ends.
var (
	// jobRequests completes the handshake, sends a line, reads the answer
	// and closes.
	jobRequests = func(c *tls.Conn) {
		if err := c.Handshake(); err != nil {
			return
		}
		io.WriteString(c, "ping\n")
		buf := make([]byte, 5)
		io.ReadFull(c, buf)
		c.Close()
	}
	// jobHandshakes completes the handshake (or fails it) and closes.
	jobHandshakes = func(c *tls.Conn) {
		c.Handshake()
		c.Close()
	}
	// srvAnswers answers one line and waits for the job to close.
	srvAnswers = func(c *tls.Conn) {
		if err := c.Handshake(); err != nil {
			return
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err == nil {
			io.WriteString(c, "pong\n")
		}
		io.Copy(io.Discard, c)
	}
	// srvHandshakes completes the handshake (or fails it), then waits for
	// the job to close.
	srvHandshakes = func(c *tls.Conn) {
		c.Handshake()
		io.Copy(io.Discard, c)
	}
)

// tlsCases are real exchanges between crypto/tls ends, with what the
// record layer must say of each.
func tlsCases(t testing.TB) []struct {
	name string
	x    exchange
	want egress.TLS
} {
	cert, roots := testCertificate(t)
	trusting := &tls.Config{ServerName: "api.example.com", RootCAs: roots}
	distrusting := &tls.Config{ServerName: "api.example.com", RootCAs: x509.NewCertPool()}
	with := func(c *tls.Config, f func(*tls.Config)) *tls.Config { c = c.Clone(); f(c); return c }
	tls12 := func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }
	// A server with only P-384 makes a client that offered P-256 alone
	// try again (HelloRetryRequest).
	retry := func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.CurveP256, tls.CurveP384} }
	server := &tls.Config{Certificates: []tls.Certificate{cert}}
	serverRetry := with(server, func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.CurveP384} })
	server13 := with(server, func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 })
	completed := egress.TLS{Handshake: egress.HandshakeCompleted}
	return []struct {
		name string
		x    exchange
		want egress.TLS
	}{
		{"TLS 1.3 request", exchange{trusting, server, jobRequests, srvAnswers}, completed},
		{"TLS 1.2 request", exchange{with(trusting, tls12), server, jobRequests, srvAnswers}, completed},
		{"TLS 1.3 handshake alone", exchange{trusting, server, jobHandshakes, srvHandshakes}, completed},
		{"TLS 1.2 handshake alone", exchange{with(trusting, tls12), server, jobHandshakes, srvHandshakes}, completed},
		{"TLS 1.3 after a retry", exchange{with(trusting, retry), serverRetry, jobRequests, srvAnswers}, completed},
		{"TLS 1.3 job distrusts the server", exchange{distrusting, server, jobHandshakes, srvHandshakes},
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob}},
		{"TLS 1.2 job distrusts the server", exchange{with(distrusting, tls12), server, jobHandshakes, srvHandshakes},
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob}},
		{"TLS 1.3 after a retry, job distrusts the server", exchange{with(distrusting, retry), serverRetry, jobHandshakes, srvHandshakes},
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob}},
		{"server refuses the job's versions", exchange{with(trusting, tls12), server13, jobHandshakes, srvHandshakes},
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideServer}},
	}
}

func sent(chunks []chunk, dir int) int64 {
	var n int64
	for _, c := range chunks {
		if c.dir == dir {
			n += int64(len(c.data))
		}
	}
	return n
}

// watchAll feeds chunks to a new watch, each whole or a byte at a time,
// and returns its outcome.
func watchAll(chunks []chunk, bytewise bool) *egress.TLS {
	w := &tlsWatch{}
	for _, c := range chunks {
		if !bytewise {
			w.feed(c.dir, c.data)
			continue
		}
		for i := range c.data {
			w.feed(c.dir, c.data[i:i+1])
		}
	}
	return w.result()
}

// The record layer alone tells a completed handshake from a failed one,
// and who sent the alert, for TLS 1.2 and 1.3 (whose handshake and alerts
// are sealed), however the bytes are cut.
func TestTLSWatchRealHandshakes(t *testing.T) {
	for _, tc := range tlsCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			chunks := transcript(t, tc.x)
			want := tc.want
			switch want.By {
			case egress.SideJob:
				// The alert comes after the server's whole flight.
				want.After = sent(chunks, dirServer)
			case egress.SideServer:
				want.After = sent(chunks, dirJob)
			}
			for _, bytewise := range []bool{false, true} {
				if got := watchAll(chunks, bytewise); *got != want {
					t.Errorf("bytewise %v: %+v, want %+v", bytewise, *got, want)
				}
			}
		})
	}
}

// recordBytes is a record header for a body of n bytes, and the body.
func recordBytes(typ byte, n int) []byte {
	return append([]byte{typ, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...)
}

// Bytes that are not TLS, a record cut short, and a handshake that never
// ends are each recorded sanely, and the watch stops.
func TestTLSWatchHostileBytes(t *testing.T) {
	hello := clientHello(t)
	cases := []struct {
		name   string
		chunks []chunk
		want   egress.TLS
	}{
		{"garbage after the ClientHello", []chunk{{dirJob, hello}, {dirJob, []byte("\x00\x01garbage, not a record")}},
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideJob}},
		{"a plain-text server", []chunk{{dirJob, hello}, {dirServer, []byte("HTTP/1.1 400 Bad Request\r\n\r\n")}},
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideServer, After: int64(len(hello))}},
		{"a record longer than TLS allows", []chunk{{dirJob, hello}, {dirServer, []byte{recordHandshake, 3, 3, 0xff, 0xff}}},
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideServer, After: int64(len(hello))}},
		{"an SSL 2 version", []chunk{{dirJob, hello}, {dirServer, []byte{recordHandshake, 2, 0, 0, 1, 0}}},
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideServer, After: int64(len(hello))}},
		{"a record cut short", []chunk{{dirJob, hello}, {dirServer, recordBytes(recordHandshake, 16000)[:100]}},
			egress.TLS{Handshake: egress.HandshakeFailed}},
		{"a header cut short", []chunk{{dirJob, hello[:3]}},
			egress.TLS{Handshake: egress.HandshakeFailed}},
		{"nothing after the hello", []chunk{{dirJob, hello}},
			egress.TLS{Handshake: egress.HandshakeFailed}},
		{"a plain-text alert from the server", []chunk{{dirJob, hello}, {dirServer, recordBytes(recordAlert, 2)}},
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideServer, After: int64(len(hello))}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, bytewise := range []bool{false, true} {
				if got := watchAll(tc.chunks, bytewise); *got != tc.want {
					t.Errorf("bytewise %v: %+v, want %+v", bytewise, *got, tc.want)
				}
			}
		})
	}

	// Handshake records without end: the watch gives up at MaxTLSWatch,
	// holding nothing of what it read.
	w := &tlsWatch{}
	w.feed(dirJob, hello)
	rec := recordBytes(recordHandshake, maxRecord)
	for range egress.MaxTLSWatch/len(rec) + 2 {
		w.feed(dirServer, rec)
	}
	if !w.done() {
		t.Fatal("still watching past MaxTLSWatch")
	}
	if got := w.result(); got.Handshake != egress.HandshakeUndecided {
		t.Errorf("past MaxTLSWatch: %+v, want undecided", *got)
	}
	if w.seen[dirServer] > egress.MaxTLSWatch {
		t.Errorf("watched %d bytes, past MaxTLSWatch", w.seen[dirServer])
	}
}

// clientHello is the first flight of a crypto/tls client.
func clientHello(t testing.TB) []byte {
	t.Helper()
	chunks := transcript(t, exchange{
		client: &tls.Config{ServerName: "api.example.com"},
		server: &tls.Config{},
		job:    jobHandshakes,
		srv:    srvHandshakes, // no certificate: it reads the hello, then fails
	})
	var hello []byte
	for _, c := range chunks {
		if c.dir == dirJob {
			hello = append(hello, c.data...)
			break
		}
	}
	if len(hello) < recordHeader || hello[0] != recordHandshake {
		t.Fatalf("no ClientHello: %x", hello)
	}
	return hello
}

// encodeChunks is the fuzz input for chunks: per chunk, its direction and
// its length (two bytes), then its bytes.
func encodeChunks(chunks []chunk) []byte {
	var b []byte
	for _, c := range chunks {
		for len(c.data) > 0 {
			n := min(len(c.data), 0xffff)
			b = append(b, byte(c.dir), byte(n>>8), byte(n))
			b = append(b, c.data[:n]...)
			c.data = c.data[n:]
		}
	}
	return b
}

func decodeChunks(b []byte) []chunk {
	var out []chunk
	for len(b) >= 3 {
		dir, n := int(b[0]&1), int(b[1])<<8|int(b[2])
		b = b[3:]
		n = min(n, len(b))
		out = append(out, chunk{dir, b[:n]})
		b = b[n:]
	}
	return out
}

// Whatever bytes come either way, in whatever pieces, the watch never
// panics, decides an outcome the record can say, watches at most
// MaxTLSWatch each way, and decides the same however the bytes are cut.
func FuzzTLSWatch(f *testing.F) {
	for _, tc := range tlsCases(f) {
		f.Add(encodeChunks(transcript(f, tc.x)))
	}
	f.Add(encodeChunks([]chunk{{dirJob, recordBytes(recordHandshake, 10)}, {dirServer, []byte("HTTP/1.1 200 OK\r\n")}}))
	f.Add([]byte{0, 0, 5, recordAppData, 3, 3, 0, 19})
	f.Fuzz(func(t *testing.T, in []byte) {
		chunks := decodeChunks(in)
		w := &tlsWatch{}
		for _, c := range chunks {
			w.feed(c.dir, c.data)
		}
		got := w.result()
		if !got.Handshake.Known() || (got.By != "" && !got.By.Known()) || got.After < 0 {
			t.Fatalf("outcome %+v", *got)
		}
		if got.Handshake == egress.HandshakeNotTLS && got.By == "" {
			t.Fatalf("not TLS, from nobody: %+v", *got)
		}
		for d := range w.seen {
			if w.seen[d] > egress.MaxTLSWatch {
				t.Fatalf("watched %d bytes one way", w.seen[d])
			}
		}
		if again := watchAll(chunks, true); *again != *got {
			t.Fatalf("a byte at a time: %+v; whole: %+v", *again, *got)
		}
	})
}

// upstream is a TCP server of the test's that hands each connection to
// serve, standing in for a name's server.
func upstream(t *testing.T, serve func(net.Conn)) option {
	l := mustListen(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				serve(c)
			}()
		}
	}()
	return withConfig(func(cfg *Config) {
		cfg.Dial = func(ctx context.Context, network string, _ netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, l.Addr().String())
		}
	})
}

// The proxy's record of a connection says how its TLS went and which end
// closed first: a job that does not trust the server (as curl without CA
// roots) is "failed, the job sent an alert", not a plain "closed".
func TestTLSOutcomeRecorded(t *testing.T) {
	cert, roots := testCertificate(t)
	server := &tls.Config{Certificates: []tls.Certificate{cert}}
	trusting := &tls.Config{ServerName: "api.example.com", RootCAs: roots}
	distrusting := &tls.Config{ServerName: "api.example.com", RootCAs: x509.NewCertPool()}
	tls12 := trusting.Clone()
	tls12.MaxVersion = tls.VersionTLS12
	server13 := server.Clone()
	server13.MinVersion = tls.VersionTLS13
	// Ends that wait for the other's close before their own, so which
	// end closed first is the test's choice, not a race.
	waitEOF := func(c net.Conn) { io.Copy(io.Discard, c) }
	tlsServer := func(cfg *tls.Config, then func(*tls.Conn)) func(net.Conn) {
		return func(c net.Conn) {
			tc := tls.Server(c, cfg)
			if err := tc.Handshake(); err != nil {
				waitEOF(c)
				return
			}
			then(tc)
		}
	}
	answer := func(tc *tls.Conn) {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(tc, buf); err == nil {
			io.WriteString(tc, "pong\n")
		}
		waitEOF(tc)
	}
	jobTLS := func(cfg *tls.Config, request, waitClose bool) func(net.Conn) {
		return func(c net.Conn) {
			tc := tls.Client(c, cfg)
			err := tc.Handshake()
			if err == nil && request {
				io.WriteString(tc, "ping\n")
				io.ReadFull(tc, make([]byte, 5))
			}
			if waitClose {
				waitEOF(c)
			}
		}
	}
	jobRaw := func(b []byte) func(net.Conn) {
		return func(c net.Conn) { c.Write(b) }
	}
	hello := clientHello(t)
	cases := []struct {
		name   string
		serve  func(net.Conn)
		job    func(net.Conn)
		want   egress.TLS
		closed egress.Side
	}{
		{"job distrusts the server (TLS 1.3)", tlsServer(server, answer), jobTLS(distrusting, false, false),
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob}, egress.SideJob},
		{"job distrusts the server (TLS 1.2)", tlsServer(server, answer), jobTLS(func() *tls.Config { c := distrusting.Clone(); c.MaxVersion = tls.VersionTLS12; return c }(), false, false),
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideJob}, egress.SideJob},
		{"server refuses the job's versions", func(c net.Conn) { tls.Server(c, server13).Handshake() }, jobTLS(tls12, false, true),
			egress.TLS{Handshake: egress.HandshakeFailed, By: egress.SideServer}, egress.SideServer},
		{"completed (TLS 1.3)", tlsServer(server, answer), jobTLS(trusting, true, false),
			egress.TLS{Handshake: egress.HandshakeCompleted}, egress.SideJob},
		{"completed (TLS 1.2)", tlsServer(server, answer), jobTLS(tls12, true, false),
			egress.TLS{Handshake: egress.HandshakeCompleted}, egress.SideJob},
		{"a plain-text server", func(c net.Conn) {
			c.Read(make([]byte, 4096))
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
		}, jobTLS(trusting, false, true),
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideServer}, egress.SideServer},
		{"garbage after the ClientHello", waitEOF, jobRaw(append(bytes.Clone(hello), "\x00garbage"...)),
			egress.TLS{Handshake: egress.HandshakeNotTLS, By: egress.SideJob}, egress.SideJob},
		{"a record cut short", waitEOF, jobRaw(append(bytes.Clone(hello), recordBytes(recordHandshake, 9000)[:50]...)),
			egress.TLS{Handshake: egress.HandshakeFailed}, egress.SideJob},
	}
	for _, tc := range cases {
		for _, via := range []Mode{ModeConnect, ModeTransparent} {
			t.Run(tc.name+"/"+string(via), func(t *testing.T) {
				h := newHarness(t, upstream(t, tc.serve))
				var c net.Conn
				if via == ModeConnect {
					var status int
					var body string
					c, _, status, body = h.connect("api.example.com:443")
					if status != 200 {
						t.Fatalf("CONNECT: %d %s", status, body)
					}
				} else {
					var err error
					if c, err = dialTimeout(h.trans); err != nil {
						t.Fatal(err)
					}
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				tc.job(c)
				c.Close()
				d := h.nth(1)
				if !d.Allowed || d.TLS == nil {
					t.Fatalf("decision %+v: want an allowed connection with a TLS outcome", d)
				}
				want := tc.want
				switch want.By {
				case egress.SideJob:
					if want.Handshake == egress.HandshakeFailed {
						want.After = d.BytesIn // the alert came after all the server sent
					}
				case egress.SideServer:
					want.After = d.BytesOut
				}
				if *d.TLS != want {
					t.Errorf("TLS %+v, want %+v (in %d, out %d bytes)", *d.TLS, want, d.BytesIn, d.BytesOut)
				}
				if d.ClosedFirst != tc.closed {
					t.Errorf("closed first: %q, want %q (end %q)", d.ClosedFirst, tc.closed, d.End)
				}
			})
		}
	}
}

// Plain HTTP carries no TLS outcome.
func TestPlainHTTPHasNoTLSOutcome(t *testing.T) {
	h := newHarness(t)
	get(t, h.proxyClient(), "http://api.example.com/")
	if d := h.nth(1); d.TLS != nil {
		t.Errorf("plain HTTP recorded with TLS %+v", *d.TLS)
	}
}
