package egressproxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
)

// admit decides c on name and port against the policy in force. It marks an
// allowed c under the lock SetPolicy takes, so that a narrowing either
// sees c (and cuts it) or came first (and c is decided on it).
func (p *Proxy) admit(c *conn, name string, port uint16) bool {
	c.d.Name, c.d.Port = name, port
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.cut != "" {
		c.d.Reason = c.cut
		return false
	}
	ok, why := egress.Decide(p.names, name, port)
	c.d.Reason = why
	if ok {
		c.admitted, c.name, c.port = true, name, port
	}
	return ok
}

// vet resolves name with the proxy's resolver and returns the addresses it
// may connect to: every answer, when none is internal. One internal answer
// refuses the name whole (a rebinding resolver mixes them), with the HTTP
// status to refuse it with.
func (p *Proxy) vet(c *conn, name string) ([]netip.Addr, int) {
	ctx, cancel := context.WithTimeout(c.ctx, p.cfg.ConnectTimeout)
	defer cancel()
	answers, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		c.refuse(fmt.Sprintf("resolving %s: %v", name, err))
		return nil, http.StatusBadGateway
	}
	if len(answers) == 0 {
		c.refuse(fmt.Sprintf("%s has no address", name))
		return nil, http.StatusBadGateway
	}
	extra := egressbase.Refused(p.cfg.Extra, p.cfg.Refused)
	for _, a := range answers {
		if why := egress.Internal(a, extra); why != "" {
			c.refuse(fmt.Sprintf("%s resolves to an internal address, so the name is refused whatever else it resolves to: %s", name, why))
			return nil, http.StatusForbidden
		}
	}
	vetted := make([]netip.Addr, 0, len(answers))
	for _, a := range answers {
		// A resolver may give IPv4 answers mapped (::ffff:a.b.c.d); they
		// were vetted as such and are dialled as IPv4.
		a = a.Unmap().WithZone("")
		if !slices.Contains(vetted, a) {
			vetted = append(vetted, a)
		}
	}
	return vetted, 0
}

// dial connects to one of addrs on port, in the resolver's order, each
// tried only when the one before failed, all within ConnectTimeout; the
// connection is made to an address vet checked and to nothing else. It
// returns nil, with c refused, when none answers or c was cut meanwhile.
func (p *Proxy) dial(c *conn, addrs []netip.Addr, port uint16) net.Conn {
	ctx, cancel := context.WithTimeout(c.ctx, p.cfg.ConnectTimeout)
	defer cancel()
	var failed []string
	for i, a := range addrs {
		ap := netip.AddrPortFrom(a, port)
		up, err := p.attempt(ctx, ap, len(addrs)-i)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", ap, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		p.mu.Lock()
		if c.cut != "" {
			p.mu.Unlock()
			up.Close()
			c.refuse(c.cut)
			return nil
		}
		c.upstream = up
		p.mu.Unlock()
		c.d.Allowed, c.d.Addr = true, ap
		return up
	}
	c.refuse(fmt.Sprintf("connecting to %s: %s", c.d.Name, strings.Join(failed, "; ")))
	return nil
}

// attempt dials ap with a share of what is left of ctx's time, so that one
// unreachable address does not use up the rest's (as net.Dialer shares it).
func (p *Proxy) attempt(ctx context.Context, ap netip.AddrPort, left int) (net.Conn, error) {
	if deadline, ok := ctx.Deadline(); ok && left > 1 {
		remaining := time.Until(deadline)
		share := max(remaining/time.Duration(left), min(remaining, 2*time.Second))
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, share)
		defer cancel()
	}
	return p.cfg.Dial(ctx, "tcp", ap)
}

// refuse marks c refused for why.
func (c *conn) refuse(why string) {
	c.d.Allowed = false
	c.d.Addr = netip.AddrPort{}
	c.d.Reason = why
}
