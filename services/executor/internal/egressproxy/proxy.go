// Package egressproxy is the executor's egress proxy for jobs whose network
// policy lists domain names (issue 11 §2 and §4). It decides on the NAME a
// job asks for, never on an address the job chose: the name is checked
// against the policy's name rules (pkg/egress), resolved by the proxy's own
// resolver, refused whole when any answer is internal (egress.Internal, plus
// the executor's own refusals), and the proxy connects to one of exactly the
// addresses it checked, so a rebinding resolver gets nothing.
//
// It serves two kinds of listener. Serve takes an explicit HTTP proxy's:
// CONNECT name:port for TLS, where the ClientHello is read before anything is
// dialled and its SNI must be the CONNECT name, and absolute-URI requests
// (GET http://name/path) for plain HTTP, whose Host header must name the same
// host. ServeTransparent takes connections the kernel redirected from a job's
// TCP 443 and 80: the name is the ClientHello's SNI or the request's Host
// header, and the address the job dialled is ignored. A ClientHello without
// SNI is refused, and so is an ECH hello without an outer name; an ECH hello
// is decided on its outer name (the inner one is sealed from the proxy).
// Brokered credentials are the one exception to "never decrypted" (issue
// "credentials a job uses but never holds"). When a TLS connection's name
// is allowed, its SNI (which must already be the CONNECT name) is one of
// a Config.Credentials' hosts, and the connection came by CONNECT or was
// redirected from TCP 443, the proxy terminates the job's TLS with a
// leaf for exactly that name from a per-job CA (ECDSA P-256, name
// constraints to the credentials' hosts, its key in this process's memory
// only; the job trusts CACertPEM), serves HTTP/1.1 and HTTP/2, and sends
// each request on over TLS it verifies for the name (against the
// credential's roots or Config.Roots, never skipped) to the vetted address
// the connection was dialled to. It sets the credential's header, swaps its
// placeholder for its secret in header values, answers 421 to a request
// for any other name or port (HTTP/2 coalescing included) and 403 once the
// credential is expired or taken away, follows no redirect, and records
// each request (ModeRequest) without the secret. That is so the job can
// use the secret without ever holding it. Nothing else is intercepted:
// plain HTTP to a credential host goes as ever, without the credential
// (a secret never goes in clear), and what a job sends inside TLS to any
// other allowed name is between it and that name's servers (domain
// fronting within an allowed CDN stays open).
//
// Every connection ends in one Decision, handed to Config.Record when it
// closes or is refused; refusals past a cap per name per minute are counted
// and summarised instead of listed. SetPolicy applies a new policy at once
// and cuts open connections to names it no longer allows, intercepted ones
// included; SetCredentials does the same for credentials; Close stops the
// listeners and cuts everything.
//
// CIDR rules are not its business (the kernel enforces those), nor is DNS
// inside the job (package jobdns). The run manager starts one per domains
// job on the host end of the job's veth, where netpolicy's Proxied rules
// carry the job's explicit proxy connections and its TCP 80 and 443; only
// the executor's run manager imports it.
package egressproxy

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/acceptloop"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
)

// Resolver answers a name with addresses (egressbase.Resolver).
type Resolver = egressbase.Resolver

// Config is what a Proxy is made with.
type Config struct {
	// Policy's name rules are what the proxy allows; its prefix rules are
	// ignored (the kernel enforces them).
	Policy egress.Policy
	// Resolver resolves every name the proxy connects to. Required.
	Resolver Resolver
	// Extra are ranges refused beyond egress.Internal's, whatever a name
	// resolves to: the host's own addresses, the executor's job pools,
	// network.always_deny.
	Extra []netip.Prefix
	// Refused, if set, is asked for more such ranges at every decision:
	// the host's addresses as they are now, not as they were when the job
	// started. It must be quick (the executor's caches them).
	Refused func() []netip.Prefix
	// Dial connects to one vetted address; nil is a net.Dialer. Tests pass
	// one that takes a public-looking address to a loopback listener.
	Dial func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error)
	// Record receives one Decision per connection, when it ends or is
	// refused, and one per request on a connection intercepted for a
	// credential (ModeRequest), never two calls at once. It must not block for long: it is
	// called on the connection's goroutine. Nil discards them.
	Record func(Decision)

	// ConnectTimeout bounds reading what a job sends first (a request head,
	// a ClientHello), and again resolving and connecting upstream. Zero is
	// 10s.
	ConnectTimeout time.Duration
	// IdleTimeout closes a connection when no byte has moved either way for
	// that long, and a write that makes no progress for that long. Zero is
	// 5 minutes.
	IdleTimeout time.Duration
	// MaxConns is how many connections may be open at once over all
	// listeners; one more is refused at once. Zero is 1024.
	MaxConns int
	// DenialsPerMinute is how many refusals of one name are recorded one by
	// one in a minute; the rest are counted into a summary (and past ten
	// times as many over all names, into one summary for them all). Zero
	// is 20.
	DenialsPerMinute int

	// Credentials are added to the job's HTTPS requests to their hosts,
	// whose connections the proxy then intercepts (see the package doc):
	// to a name several list, the first that lists it.
	Credentials []Credential
	// Roots verify the certificates of intercepted connections' upstreams
	// (a Credential's own Roots come first); nil is the system's roots.
	Roots *x509.CertPool
}

// ErrClosed is what Serve and ServeTransparent return after Close.
var ErrClosed = errors.New("egressproxy: proxy closed")

// Proxy is one job's egress proxy.
type Proxy struct {
	cfg Config

	mu        sync.Mutex
	names     []egress.Name
	conns     map[*conn]struct{}
	listeners map[net.Listener]struct{}
	closed    bool
	handlers  sync.WaitGroup

	log *egressbase.Log[Decision]

	// ca is the job's CA, nil without credentials. creds and revoked
	// (the ones SetCredentials took away, name and hosts only) are
	// guarded by mu.
	ca      *jobCA
	creds   []Credential
	revoked []Credential
}

// New checks cfg and returns a Proxy that serves nothing until Serve or
// ServeTransparent.
func New(cfg Config) (*Proxy, error) {
	if err := egressbase.Check("egressproxy", cfg.Resolver, cfg.Extra); err != nil {
		return nil, err
	}
	names, err := policyNames(cfg.Policy)
	if err != nil {
		return nil, err
	}
	creds, err := checkCredentials(cfg.Credentials)
	if err != nil {
		return nil, err
	}
	var ca *jobCA
	if len(creds) > 0 {
		if ca, err = newJobCA(creds); err != nil {
			return nil, err
		}
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
			return d.DialContext(ctx, network, addr.String())
		}
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 1024
	}
	p := &Proxy{
		cfg:       cfg,
		names:     names,
		conns:     make(map[*conn]struct{}),
		listeners: make(map[net.Listener]struct{}),
		ca:        ca,
		creds:     creds,
	}
	p.log = egressbase.NewLog(cfg.DenialsPerMinute, cfg.Record, summary)
	return p, nil
}

func policyNames(p egress.Policy) ([]egress.Name, error) { return egressbase.Names("egressproxy", p) }

// SetPolicy makes p's name rules the ones in force, at once: a connection
// decided after it returns is decided on p, and every open connection to a
// name and port p does not allow has been cut. A p that does not normalise
// is refused and changes nothing.
func (p *Proxy) SetPolicy(pol egress.Policy) error {
	names, err := policyNames(pol)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names = names
	for c := range p.conns {
		if !c.admitted {
			continue
		}
		if ok, _ := egress.Decide(names, c.name, c.port); !ok {
			p.cutLocked(c, fmt.Sprintf("cut: the policy no longer allows %s port %d", c.name, c.port))
		}
	}
	return nil
}

// Serve accepts explicit proxy connections (CONNECT, absolute-URI HTTP) on
// l until Close, and then returns ErrClosed. It closes l.
func (p *Proxy) Serve(l net.Listener) error {
	return p.serve(l, ModeHTTP, p.serveExplicit)
}

// ServeTransparent accepts connections redirected from a job's TCP 443 and
// 80 on l until Close, and then returns ErrClosed. It closes l.
func (p *Proxy) ServeTransparent(l net.Listener) error {
	return p.serve(l, ModeTransparent, p.serveTransparent)
}

// Close stops every listener, cuts every connection, and returns once each
// has been recorded (with the summaries of refusals still being counted).
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		p.cutLocked(c, "cut: the proxy closed")
	}
	p.mu.Unlock()
	p.handlers.Wait()
	p.log.Flush()
	return nil
}

func (p *Proxy) serve(l net.Listener, mode Mode, handle func(*conn)) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
		l.Close()
	}()

	return acceptloop.Serve(l, p.isClosed, ErrClosed, func(nc net.Conn) {
		c, why := p.track(nc, mode)
		if c == nil {
			nc.Close()
			p.emit(Decision{Time: time.Now(), Mode: mode, Reason: why})
			return
		}
		go func() {
			defer p.handlers.Done()
			handle(c)
			p.finish(c)
		}()
	})
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// maxHead is the longest request head the proxy reads.
const maxHead = 64 << 10

// conn is one connection from the job, from accept to its decision.
type conn struct {
	client net.Conn
	// in is everything read from the client: setup reads a head or a
	// ClientHello through it, and the splice takes what it buffered on.
	in     *bufio.Reader
	reader *idleReader
	start  time.Time
	ctx    context.Context // cancelled when the connection is cut or ends
	cancel context.CancelFunc
	act    activity
	// Bytes from the upstream to the job, and from the job to the
	// upstream (what the proxy replays or rewrites included).
	bytesIn, bytesOut atomic.Int64

	// d is filled in by the connection's own goroutine only.
	d Decision
	// tls watches the record layer of a connection that began with a
	// ClientHello (nil for plain HTTP), from the splice's two goroutines.
	tls *tlsWatch

	// Guarded by Proxy.mu.
	admitted bool // name and port passed the policy; SetPolicy rechecks them
	name     string
	port     uint16
	upstream net.Conn
	cut      string // why the proxy cut it, "" while it has not
	cred     string // the credential it was intercepted for, "" when spliced
}

// track registers a new connection, or says why it is refused.
func (p *Proxy) track(nc net.Conn, mode Mode) (*conn, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, "refused: the proxy is closing"
	}
	if len(p.conns) >= p.cfg.MaxConns {
		return nil, fmt.Sprintf("refused: the proxy has as many connections open as it takes (%d)", len(p.conns))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &idleReader{conn: nc}
	c := &conn{
		client: nc,
		in:     bufio.NewReaderSize(r, maxHead),
		reader: r,
		start:  time.Now(),
		ctx:    ctx,
		cancel: cancel,
		d:      Decision{Mode: mode},
	}
	c.d.Time = c.start
	p.conns[c] = struct{}{}
	p.handlers.Add(1)
	return c, ""
}

// cutLocked ends c at once for why; p.mu is held.
func (p *Proxy) cutLocked(c *conn, why string) {
	if c.cut != "" {
		return
	}
	c.cut = why
	c.cancel()
	c.client.Close()
	if c.upstream != nil {
		c.upstream.Close()
	}
}

// finish closes what is left of c and records its decision.
func (p *Proxy) finish(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	cut, admitted, up := c.cut, c.admitted, c.upstream
	p.mu.Unlock()
	c.cancel()
	c.client.Close()
	if up != nil {
		up.Close()
	}
	d := c.d
	d.BytesIn, d.BytesOut = c.bytesIn.Load(), c.bytesOut.Load()
	d.Duration = time.Since(c.start)
	if c.tls != nil && d.Allowed {
		d.TLS = c.tls.result()
	}
	switch {
	case cut == "":
	case d.Allowed:
		d.End = cut
	case admitted:
		d.Reason = cut // whatever failed did because of the cut
	}
	p.emit(d)
}
