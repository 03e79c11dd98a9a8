package egressproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// joinTLS joins c, whose ClientHello (hello, already read) names an
// allowed name, to up: through the proxy's own TLS when a credential is
// brokered for the name, spliced otherwise.
func (p *Proxy) joinTLS(c *conn, up net.Conn, hello []byte) {
	if cred := p.claim(c); cred != nil {
		p.intercept(c, up, hello, cred)
		return
	}
	p.spliceTLS(c, up, hello)
}

// claim marks c intercepted for the credential in force for its name, under
// the lock SetCredentials takes, and returns it; nil when none is.
func (p *Proxy) claim(c *conn) *Credential {
	// HTTPS's port only: a credential's hosts are checked against the
	// job's policy on 443, and another service on another port of the
	// same name is not what the credential is for.
	if p.ca == nil || c.port != 443 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cr := credentialFor(p.creds, c.name)
	if cr == nil {
		// Only its name and hosts are kept: every request is refused.
		cr = credentialFor(p.revoked, c.name)
	}
	if cr == nil || c.cut != "" {
		return nil
	}
	c.cred = cr.Name
	cred := *cr
	return &cred
}

// intercept terminates the job's TLS with a leaf of the job's CA for c's
// name and serves its requests (HTTP/1.1 and HTTP/2), each forwarded to the
// vetted address c was dialled to, over TLS verified for the name, with the
// credential added. up is the first upstream connection; more go to the
// same address.
func (p *Proxy) intercept(c *conn, up net.Conn, hello []byte, cred *Credential) {
	c.d.Reason += "; intercepted for brokered credential " + cred.Name
	leaf, err := p.ca.leaf(c.name)
	if err != nil {
		c.d.End = fmt.Sprintf("issuing a certificate for %s: %v", c.name, err)
		return
	}
	job := &countedConn{Conn: c.client, r: io.MultiReader(bytes.NewReader(hello), c.in), c: c, idle: p.cfg.IdleTimeout}
	tc := tls.Server(job, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	c.client.SetDeadline(time.Now().Add(p.cfg.ConnectTimeout))
	if err := tc.HandshakeContext(c.ctx); err != nil {
		c.d.End = fmt.Sprintf("the job's TLS handshake with the proxy: %v", err)
		return
	}
	c.client.SetDeadline(time.Time{})

	roots := cred.Roots
	if roots == nil {
		roots = p.cfg.Roots
	}
	idle := p.cfg.IdleTimeout
	ups := &upstreams{first: &idleConn{Conn: up, idle: idle}, dial: func(ctx context.Context) (net.Conn, error) {
		nc, err := p.cfg.Dial(ctx, "tcp", c.d.Addr)
		if err != nil {
			return nil, err
		}
		return &idleConn{Conn: nc, idle: idle}, nil
	}}
	tr := &http.Transport{
		DialContext:         ups.dialContext,
		TLSClientConfig:     &tls.Config{ServerName: c.name, RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: p.cfg.ConnectTimeout,
		// As a splice is cut when nothing moves for IdleTimeout.
		ResponseHeaderTimeout: p.cfg.IdleTimeout,
		IdleConnTimeout:       p.cfg.IdleTimeout,
		// An HTTP/2 job opens many streams at once; an HTTP/1.1 upstream
		// takes a connection for each, up to this many.
		MaxConnsPerHost: 32,
		// What the job asked for goes as it asked: no Accept-Encoding
		// added, no body decoded.
		DisableCompression: true,
	}
	defer func() {
		tr.CloseIdleConnections()
		ups.closeAll()
	}()

	done := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(done) }) }
	ix := &interception{p: p, c: c, tr: tr, end: end}
	srv := &http.Server{
		Handler:           ix,
		ReadHeaderTimeout: p.cfg.ConnectTimeout,
		IdleTimeout:       p.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHead,
		BaseContext:       func(net.Listener) context.Context { return c.ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				end()
			}
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv.Serve(&oneConn{conn: tc, done: done, cut: c.ctx.Done()})
	// A cut (which closed the job's end) says so in finish.
	c.client.Close()
	ix.active.close()
	c.d.End = "closed"
}

// interception serves the requests of one intercepted connection.
type interception struct {
	p   *Proxy
	c   *conn
	tr  *http.Transport
	end func() // the connection is over (a hijacked one, once closed)
	// active are the requests being served, each recorded before the
	// connection is.
	active inFlight
}

func (ix *interception) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !ix.active.add() {
		return // the connection is over
	}
	defer ix.active.done()
	c := ix.c
	st := &requestState{start: time.Now(), req: Request{Method: r.Method, Path: r.URL.Path}}
	defer func() { ix.p.emit(st.decision(c)) }()

	host, port, err := splitTarget(r.Host, 443)
	if err != nil || !sameHost(host, c.name) || port != c.port {
		st.reason = fmt.Sprintf("refused: the request is for %q, not %s port %d, which the connection was made for", r.Host, c.name, c.port)
		plain(w, http.StatusMisdirectedRequest, fmt.Sprintf("this connection is for %s port %d only", c.name, c.port))
		return
	}
	if !forwardedMethods[r.Method] {
		// CONNECT would be a tunnel inside the tunnel, bytes the proxy
		// cannot see; TRACE (and TRACK) make a server echo the request,
		// the credential's header among it, back to the job.
		st.reason = fmt.Sprintf("refused: method %q is not forwarded with a brokered credential", r.Method)
		plain(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not forwarded on a connection the proxy adds a credential to", r.Method))
		return
	}
	cred := ix.p.credential(c.name)
	if cred == nil || cred.Name != c.cred || (!cred.Expires.IsZero() && !time.Now().Before(cred.Expires)) {
		st.reason = fmt.Sprintf("refused: the brokered credential %s is no longer leased", c.cred)
		plain(w, http.StatusForbidden, fmt.Sprintf("the brokered credential %s is no longer leased", c.cred))
		return
	}
	authority := c.name
	if c.port != 443 {
		authority = net.JoinHostPort(c.name, strconv.Itoa(int(c.port)))
	}
	rp := &httputil.ReverseProxy{
		Transport:     ix.tr,
		FlushInterval: -1, // stream: the job sees each byte as it comes
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", authority, ""
			inject(pr.Out.Header, cred)
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
				pr.Out.Body = &countedBody{ReadCloser: pr.Out.Body, n: &st.out}
			}
			st.req.Allowed, st.req.Credential = true, cred.Name
		},
		ModifyResponse: func(resp *http.Response) error {
			st.req.Status = resp.StatusCode
			// A server that echoes a request header back (CORS, request
			// ids, metadata) must not hand the job the credential.
			scrub(resp.Header, cred)
			resp.Body = &countedBody{ReadCloser: resp.Body, n: &st.in, atEOF: func() { scrub(resp.Trailer, cred) }}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			msg := upstreamError(c.name, err)
			if errors.As(err, new(*tls.CertificateVerificationError)) {
				// The handshake failed: nothing was sent.
				st.req.Allowed, st.req.Credential = false, ""
				st.reason = "refused: " + msg
			} else {
				st.reason = fmt.Sprintf("brokered credential %s added; %s", cred.Name, msg)
			}
			st.reason = redact(st.reason, cred)
			plain(w, http.StatusBadGateway, redact(msg, cred))
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	st.reason = "brokered credential " + cred.Name + " added"
	rp.ServeHTTP(&hijackWatch{ResponseWriter: w, end: ix.end}, r)
}

// forwardedMethods are the methods an intercepted connection forwards:
// not CONNECT, TRACE or TRACK.
var forwardedMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// inject sets cred's header on h, replacing any the job sent under any
// spelling (the placeholder the job may have put there with it). The
// placeholder is swapped for the secret in that header alone: swapped in
// any header, it would go out in one a server echoes back (Origin, a
// request id, object metadata) and reach the job.
func inject(h http.Header, cred *Credential) {
	for k := range h {
		if strings.EqualFold(k, cred.Header) {
			delete(h, k)
		}
	}
	h.Set(cred.Header, cred.Value)
}

// scrub replaces cred's secret and header value wherever they appear in h
// (a response's header or trailer).
func scrub(h http.Header, cred *Credential) {
	for _, vs := range h {
		for i, v := range vs {
			vs[i] = redact(v, cred)
		}
	}
}

// redact takes cred's secret and header value out of s, which is for the
// job or the record.
func redact(s string, cred *Credential) string {
	for _, v := range []string{cred.Value, cred.Secret} {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// upstreamError says what went wrong forwarding a request to name.
func upstreamError(name string, err error) string {
	if ve := new(tls.CertificateVerificationError); errors.As(err, &ve) {
		return fmt.Sprintf("the certificate of %s did not verify: %v", name, ve.Err)
	}
	return fmt.Sprintf("forwarding to %s: %v", name, err)
}

// plain answers a request the proxy refuses or could not forward.
func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, "airlock egress proxy: "+msg+"\n")
}

// requestState is what one request's decision is made of.
type requestState struct {
	start   time.Time
	req     Request
	reason  string
	in, out atomic.Int64
}

func (st *requestState) decision(c *conn) Decision {
	req := st.req
	return Decision{
		Time:     st.start,
		Mode:     ModeRequest,
		Name:     c.name,
		Port:     c.port,
		Allowed:  req.Allowed,
		Reason:   st.reason,
		Addr:     c.d.Addr,
		BytesIn:  st.in.Load(),
		BytesOut: st.out.Load(),
		Duration: time.Since(st.start),
		Request:  &req,
	}
}

// countedBody counts what is read of a body.
type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
	// atEOF, if set, runs when the body has been read to its end (a
	// response's trailers are in by then).
	atEOF func()
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if err == io.EOF && b.atEOF != nil {
		b.atEOF()
		b.atEOF = nil
	}
	return n, err
}

// countedConn is the job's end of an intercepted connection, read from
// what the proxy already read (the ClientHello) on, counting into c's
// bytes; a write that makes no progress for idle fails.
type countedConn struct {
	net.Conn
	r    io.Reader
	c    *conn
	idle time.Duration
}

func (cc *countedConn) Read(p []byte) (int, error) {
	n, err := cc.r.Read(p)
	cc.c.bytesOut.Add(int64(n))
	return n, err
}

func (cc *countedConn) Write(p []byte) (int, error) {
	cc.Conn.SetWriteDeadline(time.Now().Add(cc.idle))
	n, err := cc.Conn.Write(p)
	cc.c.bytesIn.Add(int64(n))
	return n, err
}

// idleConn is an upstream connection on which a read or a write that
// makes no progress for idle fails, as a splice is cut when nothing moves.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (ic *idleConn) Read(p []byte) (int, error) {
	ic.Conn.SetReadDeadline(time.Now().Add(ic.idle))
	return ic.Conn.Read(p)
}

func (ic *idleConn) Write(p []byte) (int, error) {
	ic.Conn.SetWriteDeadline(time.Now().Add(ic.idle))
	return ic.Conn.Write(p)
}

// upstreams dials an intercepted connection's upstream connections: the
// one the proxy made first, then more to the same vetted address, all
// closed when the connection ends.
type upstreams struct {
	dial func(context.Context) (net.Conn, error)

	mu    sync.Mutex
	first net.Conn
	all   []net.Conn
	done  bool
}

func (u *upstreams) dialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	u.mu.Lock()
	if first := u.first; first != nil {
		u.first = nil
		u.mu.Unlock()
		return first, nil
	}
	u.mu.Unlock()
	nc, err := u.dial(ctx)
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		nc.Close()
		return nil, net.ErrClosed
	}
	u.all = append(u.all, nc)
	return nc, nil
}

func (u *upstreams) closeAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.done = true
	for _, nc := range u.all {
		nc.Close()
	}
}

// inFlight counts requests being served until close, which waits for
// them and admits no more.
type inFlight struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{} // closed when n drops to 0 after close
}

func (f *inFlight) add() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.closed && f.n == 0 {
		close(f.zero)
	}
}

func (f *inFlight) close() {
	f.mu.Lock()
	f.closed = true
	f.zero = make(chan struct{})
	if f.n == 0 {
		close(f.zero)
	}
	zero := f.zero
	f.mu.Unlock()
	<-zero
}

// oneConn is a listener that gives one connection, then waits for done
// or cut.
type oneConn struct {
	mu        sync.Mutex
	conn      net.Conn
	done, cut <-chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.conn
	l.conn = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	select {
	case <-l.done:
	case <-l.cut:
	}
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return &net.TCPAddr{} }

// hijackWatch is a response writer whose hijacked connection (an upgrade,
// a WebSocket) ends the interception when it closes, not when it is
// hijacked.
type hijackWatch struct {
	http.ResponseWriter
	end func()
}

func (h *hijackWatch) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func (h *hijackWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	return &closeWatch{Conn: nc, end: h.end}, rw, nil
}

type closeWatch struct {
	net.Conn
	end func()
}

func (c *closeWatch) Close() error {
	err := c.Conn.Close()
	c.end()
	return err
}
