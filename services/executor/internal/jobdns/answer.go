package jobdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
)

const (
	// headerLen is a DNS message's fixed header.
	headerLen = 12
	// maxQuery is the longest query answered: one question and an OPT
	// record fit many times over; a longer one is someone's payload.
	maxQuery = 512
	// maxAnswers keeps a response within 512 bytes whatever the name's
	// length: header 12, question at most 259, eight AAAA records 28 each
	// (the owner name compressed).
	maxAnswers = 8
)

// answer decides msg, records the decision and returns the response to
// send (nil for none). lookup false refuses an allowed name without
// resolving it (too many queries in flight).
func (s *Server) answer(msg []byte, proto string, lookup bool) []byte {
	if len(msg) > maxQuery {
		return s.oversize(msg[:headerLen], proto, fmt.Sprintf("longer than %d bytes", maxQuery))
	}
	d := QueryDecision{Time: time.Now(), Proto: proto}
	if len(msg) < headerLen {
		d.Reason = fmt.Sprintf("malformed: %d bytes, shorter than a DNS header", len(msg))
		s.emit(d)
		return nil
	}
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		d.Reason = "malformed: " + err.Error()
		s.emit(d)
		return nil
	}
	if h.Response {
		// Never answer a response: two servers would answer each other.
		d.Reason = "a response, not a query: not answered"
		s.emit(d)
		return nil
	}
	reply := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	refuse := func(rc dnsmessage.RCode, q *dnsmessage.Question, why string) []byte {
		d.RCode, d.Reason = rc, why
		s.emit(d)
		return build(reply, rc, q, nil, 0)
	}

	limited := !s.bucket.take(time.Now())
	qs, qerr := p.AllQuestions()
	var q *dnsmessage.Question
	if qerr == nil && len(qs) == 1 {
		q = &qs[0]
		d.Name, d.Type = strings.ToLower(strings.TrimSuffix(q.Name.String(), ".")), q.Type
	}
	switch {
	case limited:
		return refuse(dnsmessage.RCodeRefused, q, fmt.Sprintf("rate limited: more than %g queries a second (burst %d)", s.cfg.QueriesPerSecond, s.cfg.Burst))
	case qerr != nil:
		return refuse(dnsmessage.RCodeFormatError, nil, "malformed question section: "+qerr.Error())
	case h.OpCode != 0:
		return refuse(dnsmessage.RCodeRefused, nil, fmt.Sprintf("opcode %d: only standard queries are answered", h.OpCode))
	case len(qs) != 1:
		return refuse(dnsmessage.RCodeRefused, nil, fmt.Sprintf("%d questions: only a query of one is answered", len(qs)))
	}
	if why, rc := checkRest(&p); why != "" {
		return refuse(rc, q, why)
	}
	name, why := nameOf(q.Name.String())
	if why != "" {
		return refuse(dnsmessage.RCodeRefused, q, why)
	}
	d.Name = name
	ok, why := egress.Decide(s.policy(), name, 0)
	if !ok {
		return refuse(dnsmessage.RCodeRefused, q, why)
	}
	if q.Class != dnsmessage.ClassINET {
		return refuse(dnsmessage.RCodeRefused, q, fmt.Sprintf("class %s: only IN is answered", typeName(q.Class.String(), "Class")))
	}
	if q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA {
		return refuse(dnsmessage.RCodeRefused, q, fmt.Sprintf("type %s is not answered (only A and AAAA)", typeName(q.Type.String(), "Type")))
	}
	if !lookup {
		return refuse(dnsmessage.RCodeRefused, q, fmt.Sprintf("%d queries in flight already", maxUDPInflight))
	}

	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.LookupTimeout)
	addrs, err := s.cfg.Resolver.LookupNetIP(ctx, "ip", name)
	cancel()
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			d.Allowed, d.RCode, d.Reason = true, dnsmessage.RCodeNameError, why+"; the upstream has no such name"
			s.emit(d)
			return build(reply, dnsmessage.RCodeNameError, q, nil, 0)
		}
		return refuse(dnsmessage.RCodeServerFailure, q, fmt.Sprintf("%s; the upstream lookup failed: %v", why, err))
	}
	extra := egressbase.Refused(s.cfg.Extra, s.cfg.Refused)
	for _, a := range addrs {
		if bad := egress.Internal(a, extra); bad != "" {
			return refuse(dnsmessage.RCodeRefused, q, fmt.Sprintf("%s resolves to an address no job may reach: %s", name, bad))
		}
	}
	answers := ofType(addrs, q.Type, s.cfg.MaxAnswers)
	d.Allowed, d.RCode, d.Reason, d.Answers = true, dnsmessage.RCodeSuccess, why, answers
	s.emit(d)
	return build(reply, dnsmessage.RCodeSuccess, q, answers, uint32(s.cfg.TTL/time.Second))
}

// checkRest refuses a query that carries records: any in the answer or
// authority sections, and in the additional section anything but one EDNS
// OPT record of the root name.
func checkRest(p *dnsmessage.Parser) (string, dnsmessage.RCode) {
	malformed := func(err error) (string, dnsmessage.RCode) {
		return "malformed: " + err.Error(), dnsmessage.RCodeFormatError
	}
	if _, err := p.AnswerHeader(); err == nil {
		return "a query with records in its answer section", dnsmessage.RCodeRefused
	} else if !errors.Is(err, dnsmessage.ErrSectionDone) {
		return malformed(err)
	}
	if err := p.SkipAllAnswers(); err != nil {
		return malformed(err)
	}
	if _, err := p.AuthorityHeader(); err == nil {
		return "a query with records in its authority section", dnsmessage.RCodeRefused
	} else if !errors.Is(err, dnsmessage.ErrSectionDone) {
		return malformed(err)
	}
	if err := p.SkipAllAuthorities(); err != nil {
		return malformed(err)
	}
	for n := 0; ; n++ {
		rh, err := p.AdditionalHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return "", 0
		}
		if err != nil {
			return malformed(err)
		}
		if n > 0 || rh.Type != dnsmessage.TypeOPT || rh.Name.String() != "." {
			return "a query with records in its additional section other than one EDNS OPT", dnsmessage.RCodeRefused
		}
		if err := p.SkipAdditional(); err != nil {
			return malformed(err)
		}
	}
}

// nameOf is a question's name as the policy compares names, or why it is
// not one the server will look up. Names on the wire are already ASCII
// (punycode); one that normalisation would change is refused rather than
// looked up as something other than what was asked.
func nameOf(wire string) (string, string) {
	name := strings.ToLower(strings.TrimSuffix(wire, "."))
	for _, r := range name {
		if !('a' <= r && r <= 'z') && !('0' <= r && r <= '9') && r != '-' && r != '.' {
			return "", fmt.Sprintf("%q is not a host name", wire)
		}
	}
	norm, err := egress.NormalizeName(name)
	if err != nil {
		return "", err.Error()
	}
	if norm != name {
		return "", fmt.Sprintf("%q is not a host name in normal form", wire)
	}
	return name, ""
}

// ofType is the addresses of addrs that answer a question of type t (an
// IPv4-mapped address is an IPv4 one), without repeats, at most max.
func ofType(addrs []netip.Addr, t dnsmessage.Type, max int) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.WithZone("")
		if a.Is4In6() {
			a = a.Unmap()
		}
		if a.Is4() != (t == dnsmessage.TypeA) || slices.Contains(out, a) {
			continue
		}
		out = append(out, a)
		if len(out) == max {
			break
		}
	}
	return out
}

// oversize answers a message too long to be a query, from its header
// alone.
func (s *Server) oversize(head []byte, proto, why string) []byte {
	d := QueryDecision{Time: time.Now(), Proto: proto, Reason: "oversize: " + why}
	var p dnsmessage.Parser
	h, err := p.Start(head)
	if err != nil || h.Response {
		s.emit(d)
		return nil
	}
	d.RCode = dnsmessage.RCodeRefused
	s.emit(d)
	return build(dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true},
		dnsmessage.RCodeRefused, nil, nil, 0)
}

// build is a response with rc, q echoed when not nil, and answers to it.
func build(h dnsmessage.Header, rc dnsmessage.RCode, q *dnsmessage.Question, answers []netip.Addr, ttl uint32) []byte {
	h.RCode = rc
	b := dnsmessage.NewBuilder(make([]byte, 0, maxQuery), h)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil
	}
	if q != nil {
		if err := b.Question(*q); err != nil {
			return nil
		}
	}
	if err := b.StartAnswers(); err != nil {
		return nil
	}
	for _, a := range answers {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}
		var err error
		if a.Is4() {
			err = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		} else {
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

func typeName(s, prefix string) string { return strings.TrimPrefix(s, prefix) }
