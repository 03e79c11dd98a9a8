package egressproxy

import (
	"fmt"
	"net/http"
	"time"
)

// tlsHandshake is the first byte of a TLS handshake record.
const tlsHandshake = 0x16

// serveTransparent handles one connection the kernel redirected from the
// job's TCP 443 or 80. Where the job was going is not asked (SO_ORIGINAL_DST
// is not read): the proxy decides on the name the connection itself
// carries, the ClientHello's SNI for TLS (to port 443) or the Host header for
// plain HTTP, and connects to that name's vetted addresses. So an allowed
// SNI sent to an attacker's address reaches the allowed name, not the
// attacker.
func (p *Proxy) serveTransparent(c *conn) {
	c.client.SetDeadline(time.Now().Add(p.cfg.ConnectTimeout))
	first, err := c.in.Peek(1)
	if err != nil {
		c.refuse(fmt.Sprintf("the connection sent nothing: %v", err))
		return
	}
	if first[0] != tlsHandshake {
		req, hosts, err := readRequest(c.in)
		if err != nil {
			c.refuse(fmt.Sprintf("neither a TLS ClientHello nor an HTTP request: %v", err))
			respond(c, http.StatusBadRequest, c.d.Reason)
			return
		}
		p.forward(c, req, hosts, false)
		return
	}

	const port = 443
	sni, hello, err := readHello(c.in)
	switch {
	case err != nil:
		c.refuse(err.Error())
		return
	case sni == "":
		c.d.Port = port
		c.refuse("the ClientHello has no SNI (an ECH hello without an outer name has none either): there is no name to decide on")
		return
	}
	name, why := nameOf(sni)
	if why != "" {
		c.d.Name, c.d.Port = name, port
		c.refuse("SNI: " + why)
		return
	}
	if !p.admit(c, name, port) {
		return
	}
	addrs, _ := p.vet(c, name)
	if addrs == nil {
		return
	}
	up := p.dial(c, addrs, port)
	if up == nil {
		return
	}
	p.joinTLS(c, up, hello)
}
