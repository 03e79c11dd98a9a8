// Package jobdns is the DNS server a job with a domains policy uses as its
// only resolver (issue 11 §3). It answers A and AAAA questions for the names
// the policy allows (pkg/egress name rules: exact names, and one label below
// a wildcard's suffix, never the apex), resolving them with its own upstream
// Resolver and answering only when every address is one a job may reach
// (egress.Internal, plus the executor's own refusals): when any answer is
// internal the name is REFUSED whole, so a rebinding upstream hands the job
// nothing.
//
// Everything else is REFUSED (FORMERR when it does not parse) and is never
// forwarded: names the policy does not allow, other types and classes,
// several questions, records in a query's answer or authority sections,
// anything in its additional section but one EDNS OPT, responses, other
// opcodes, oversize messages. The upstream Resolver is called only for an
// allowed name, so a job cannot carry data out in the names it looks up
// (<data>.attacker.test reaches nobody).
//
// Serve takes a UDP socket, ServeTCP a listener of length-prefixed TCP
// messages. Queries are rate limited per server (a token bucket) and every
// query ends in one QueryDecision handed to Config.Record; refusals past a
// cap per name per minute are counted and summarised instead of listed.
// SetPolicy applies a new policy at once; Close stops serving.
//
// It does not map allowed names to private addresses: the transparent
// proxy decides on the SNI or Host a connection carries, so the job gets the
// names' real (vetted) addresses. The run manager starts one per domains job
// on the host end of the job's veth, the only resolver in the job's
// /etc/resolv.conf; only the executor's run manager imports it.
package jobdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/acceptloop"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
)

// Resolver answers a name with addresses (egressbase.Resolver).
type Resolver = egressbase.Resolver

// Config is what a Server is made with.
type Config struct {
	// Policy's name rules are the names the server answers; its prefix
	// rules are ignored (the kernel enforces them).
	Policy egress.Policy
	// Resolver resolves allowed names, and only those. Required.
	Resolver Resolver
	// Extra are ranges refused beyond egress.Internal's: the host's own
	// addresses, the executor's job pools, network.always_deny.
	Extra []netip.Prefix
	// Refused, if set, is asked for more such ranges at every lookup: the
	// host's addresses as they are now. It must be quick.
	Refused func() []netip.Prefix
	// Record receives one QueryDecision per query, never two calls at once.
	// It must not block for long. Nil discards them.
	Record func(QueryDecision)

	// TTL is the time to live of every answer. Zero is 5s.
	TTL time.Duration
	// LookupTimeout bounds one upstream lookup. Zero is 5s.
	LookupTimeout time.Duration
	// QueriesPerSecond and Burst make the token bucket every query takes a
	// token from; a query that finds none is REFUSED. Zero is 50 and 100.
	QueriesPerSecond float64
	Burst            int
	// MaxAnswers is how many addresses one answer carries at most (the
	// first ones, in the upstream's order). Zero is 8; at most 16, which
	// keeps every response within 512 bytes.
	MaxAnswers int
	// MaxTCPConns is how many TCP connections may be open at once; one more
	// is closed at once. Zero is 16.
	MaxTCPConns int
	// TCPIdleTimeout closes a TCP connection that sends no whole query for
	// that long. Zero is 10s.
	TCPIdleTimeout time.Duration
	// DenialsPerMinute is how many refusals of one name are recorded one by
	// one in a minute; the rest are counted into a summary (and past ten
	// times as many over all names, into one summary for them all). Zero
	// is 20.
	DenialsPerMinute int
}

// ErrClosed is what Serve and ServeTCP return after Close.
var ErrClosed = errors.New("jobdns: server closed")

// Server is one job's DNS server.
type Server struct {
	cfg    Config
	ctx    context.Context // cancelled by Close: lookups in flight end
	cancel context.CancelFunc
	bucket bucket

	mu        sync.Mutex
	names     []egress.Name
	closed    bool
	packets   map[net.PacketConn]struct{}
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	handlers  sync.WaitGroup

	log *egressbase.Log[QueryDecision]
}

// New checks cfg and returns a Server that serves nothing until Serve or
// ServeTCP.
func New(cfg Config) (*Server, error) {
	if err := egressbase.Check("jobdns", cfg.Resolver, cfg.Extra); err != nil {
		return nil, err
	}
	names, err := policyNames(cfg.Policy)
	if err != nil {
		return nil, err
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 5 * time.Second
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = 5 * time.Second
	}
	if cfg.QueriesPerSecond <= 0 {
		cfg.QueriesPerSecond = 50
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 100
	}
	if cfg.MaxAnswers <= 0 {
		cfg.MaxAnswers = 8
	}
	cfg.MaxAnswers = min(cfg.MaxAnswers, maxAnswers)
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = 16
	}
	if cfg.TCPIdleTimeout <= 0 {
		cfg.TCPIdleTimeout = 10 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:       cfg,
		ctx:       ctx,
		cancel:    cancel,
		bucket:    newBucket(cfg.QueriesPerSecond, cfg.Burst, time.Now()),
		names:     names,
		packets:   make(map[net.PacketConn]struct{}),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
	}
	s.log = egressbase.NewLog(cfg.DenialsPerMinute, cfg.Record, summary)
	return s, nil
}

func policyNames(p egress.Policy) ([]egress.Name, error) { return egressbase.Names("jobdns", p) }

// SetPolicy makes p's name rules the ones in force: every query decided
// after it returns is decided on p. A p that does not normalise is refused
// and changes nothing.
func (s *Server) SetPolicy(p egress.Policy) error {
	names, err := policyNames(p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.names = names
	s.mu.Unlock()
	return nil
}

func (s *Server) policy() []egress.Name {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names
}

// Close stops every socket and listener, closes every TCP connection,
// cancels lookups in flight, and returns once each query has been recorded
// (with the summaries of refusals still being counted).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for pc := range s.packets {
		pc.Close()
	}
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.handlers.Wait()
	s.log.Flush()
	return nil
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// maxUDPInflight is how many UDP queries are answered at once; a query
// beyond it is answered REFUSED without a lookup.
const maxUDPInflight = 64

// Serve answers the queries that reach pc until Close, and then returns
// ErrClosed. It closes pc.
func (s *Server) Serve(pc net.PacketConn) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		pc.Close()
		return ErrClosed
	}
	s.packets[pc] = struct{}{}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.packets, pc)
		s.mu.Unlock()
		pc.Close()
		s.handlers.Done()
	}()

	sem := make(chan struct{}, maxUDPInflight)
	// One byte more than a query may have tells an oversize one apart.
	buf := make([]byte, maxQuery+1)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if s.isClosed() {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return err
			}
			// A transient error (an ICMP error surfaced on a read): keep
			// serving.
			continue
		}
		msg := append([]byte(nil), buf[:n]...)
		select {
		case sem <- struct{}{}:
			s.handlers.Add(1)
			go func() {
				defer func() { <-sem; s.handlers.Done() }()
				if resp := s.answer(msg, "udp", true); resp != nil {
					pc.WriteTo(resp, from)
				}
			}()
		default:
			if resp := s.answer(msg, "udp", false); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}
}

// ServeTCP answers length-prefixed queries on the connections l accepts
// until Close, and then returns ErrClosed. It closes l.
func (s *Server) ServeTCP(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()

	return acceptloop.Serve(l, s.isClosed, ErrClosed, func(c net.Conn) {
		if !s.track(c) {
			c.Close()
			return
		}
		go func() {
			defer s.handlers.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	})
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.conns) >= s.cfg.MaxTCPConns {
		return false
	}
	s.conns[c] = struct{}{}
	s.handlers.Add(1)
	return true
}

// serveConn answers one TCP connection's queries in turn. A query longer
// than a query may be, or one that gets no answer, ends the connection.
func (s *Server) serveConn(c net.Conn) {
	var size [2]byte
	for {
		c.SetDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(size[:]))
		if n > maxQuery {
			// Read no more of it than its header: enough to answer, and
			// the connection ends after.
			head := make([]byte, min(n, headerLen))
			if _, err := io.ReadFull(c, head); err != nil {
				return
			}
			if resp := s.oversize(head, "tcp", fmt.Sprintf("%d bytes, longer than %d", n, maxQuery)); resp != nil {
				writeTCP(c, resp)
			}
			return
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp := s.answer(msg, "tcp", true)
		if resp == nil || writeTCP(c, resp) != nil {
			return
		}
	}
}

func writeTCP(c net.Conn, resp []byte) error {
	out := make([]byte, 2+len(resp))
	binary.BigEndian.PutUint16(out, uint16(len(resp)))
	copy(out[2:], resp)
	_, err := c.Write(out)
	return err
}
