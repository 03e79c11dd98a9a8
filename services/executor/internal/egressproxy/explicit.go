package egressproxy

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
)

// serveExplicit handles one connection to the explicit proxy: a CONNECT
// tunnel, or one plain HTTP request by absolute URI.
func (p *Proxy) serveExplicit(c *conn) {
	c.client.SetDeadline(time.Now().Add(p.cfg.ConnectTimeout))
	req, hosts, err := readRequest(c.in)
	if err != nil {
		c.refuse(fmt.Sprintf("reading the request: %v", err))
		respond(c, http.StatusBadRequest, c.d.Reason)
		return
	}
	if req.Method == http.MethodConnect {
		c.d.Mode = ModeConnect
		p.connect(c, req)
		return
	}
	p.forward(c, req, hosts, true)
}

// decide takes host on port through the proxy's checks: a name (not an
// address), allowed by the policy, resolving to vetted addresses only. It
// returns the name and those addresses, or the status to answer the job
// with, the decision recording why.
func (p *Proxy) decide(c *conn, host string, port uint16) (string, []netip.Addr, int) {
	name, why := nameOf(host)
	if why != "" {
		c.d.Name, c.d.Port = name, port
		c.refuse(why)
		return name, nil, http.StatusForbidden
	}
	if !p.admit(c, name, port) {
		return name, nil, http.StatusForbidden
	}
	addrs, status := p.vet(c, name)
	if addrs == nil {
		return name, nil, status
	}
	return name, addrs, 0
}

// connect handles CONNECT name:port. The name is decided on and resolved
// before the tunnel is granted; then the ClientHello is read, before
// anything is dialled, and its SNI must be the CONNECT name.
func (p *Proxy) connect(c *conn, req *http.Request) {
	host, port, err := splitTarget(req.Host, 443)
	if err != nil {
		c.refuse(fmt.Sprintf("CONNECT target: %v", err))
		respond(c, http.StatusBadRequest, c.d.Reason)
		return
	}
	name, addrs, status := p.decide(c, host, port)
	if status != 0 {
		respond(c, status, c.d.Reason)
		return
	}
	// The hello gets a ConnectTimeout of its own, whatever resolving took.
	c.client.SetDeadline(time.Now().Add(p.cfg.ConnectTimeout))
	if _, err := io.WriteString(c.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		c.refuse(fmt.Sprintf("answering CONNECT: %v", err))
		return
	}
	sni, hello, err := readHello(c.in)
	switch {
	case err != nil:
		c.refuse(fmt.Sprintf("CONNECT carries TLS only: %v", err))
		return
	case sni == "":
		c.refuse(fmt.Sprintf("the ClientHello for %s has no SNI (an ECH hello without an outer name has none either)", name))
		return
	}
	if got, _ := egress.NormalizeName(sni); got != name {
		c.refuse(fmt.Sprintf("the ClientHello's SNI %q is not the CONNECT name %s", sni, name))
		return
	}
	up := p.dial(c, addrs, port)
	if up == nil {
		return
	}
	p.joinTLS(c, up, hello)
}

// forward handles one plain HTTP request: decided on its host, sent to the
// upstream with the proxy's own headers removed and "Connection: close", so
// that each request on a connection is decided on its own host (a client
// reconnects for the next). The connection carries that one request: what
// the job sends after it is read and dropped, and an Upgrade is removed, so
// a plain ws:// WebSocket does not work (wss://, a CONNECT tunnel, does).
func (p *Proxy) forward(c *conn, req *http.Request, hosts []string, explicit bool) {
	host, port, status, why := httpTarget(req, hosts, explicit)
	if why != "" {
		c.d.Name, c.d.Port = host, port
		c.refuse(why)
		respond(c, status, why)
		return
	}
	_, addrs, status := p.decide(c, host, port)
	if status != 0 {
		respond(c, status, c.d.Reason)
		return
	}
	up := p.dial(c, addrs, port)
	if up == nil {
		respond(c, http.StatusBadGateway, c.d.Reason)
		return
	}
	clean(req)
	// One request per connection: what the job sends after it (a second,
	// pipelined request, perhaps for another host) is never forwarded.
	p.splice(c, up, func(w io.Writer) error {
		if err := req.Write(w); err != nil {
			return err
		}
		return errRequestDone
	})
}

// httpTarget is the host and port a plain HTTP request is for: an absolute
// URI's, whose Host header must then name the same (on the explicit proxy
// an absolute URI is required), or else the Host header's. Otherwise it
// says why not, with the status to answer.
func httpTarget(req *http.Request, hosts []string, explicit bool) (string, uint16, int, string) {
	origin := req.URL.Scheme == "" && req.URL.Host == ""
	switch {
	case req.Method == http.MethodConnect:
		return "", 0, http.StatusMethodNotAllowed, "CONNECT is for the explicit proxy"
	case req.RequestURI == "*":
		return "", 0, http.StatusMethodNotAllowed, fmt.Sprintf("%s * is for the proxy itself, which answers nothing", req.Method)
	case origin && explicit:
		return "", 0, http.StatusBadRequest, "not a proxy request: plain HTTP goes by absolute URI (GET http://name/path), TLS by CONNECT"
	}
	if len(hosts) != 1 || hosts[0] == "" {
		return "", 0, http.StatusBadRequest, "the request has no Host header"
	}
	hh, hp, err := splitTarget(hosts[0], 80)
	if err != nil {
		return "", 0, http.StatusBadRequest, fmt.Sprintf("Host header: %v", err)
	}
	if origin {
		return hh, hp, 0, ""
	}
	if req.URL.Scheme != "http" {
		return "", 0, http.StatusBadRequest, fmt.Sprintf("scheme %q: only http:// goes as a plain request (https goes by CONNECT)", req.URL.Scheme)
	}
	uh, up, err := splitTarget(req.URL.Host, 80)
	if err != nil {
		return "", 0, http.StatusBadRequest, fmt.Sprintf("request URI: %v", err)
	}
	if !sameHost(uh, hh) || up != hp {
		return uh, up, http.StatusBadRequest, fmt.Sprintf("the Host header %q does not name the request's host %q", hosts[0], req.URL.Host)
	}
	return uh, up, 0, ""
}

func sameHost(a, b string) bool {
	na, errA := egress.NormalizeName(a)
	nb, errB := egress.NormalizeName(b)
	if errA == nil && errB == nil {
		return na == nb
	}
	return strings.EqualFold(a, b)
}

// clean removes what was for the proxy from req, and the hop-by-hop
// headers (an Upgrade among them: a plain HTTP connection carries one
// request, never an upgraded protocol, which would be bytes the proxy
// cannot decide on), and asks the upstream to close after its response.
func clean(req *http.Request) {
	h := req.Header
	h.Del("Proxy-Connection")
	h.Del("Proxy-Authorization")
	for _, v := range h.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			h.Del(strings.TrimSpace(t))
		}
	}
	for _, k := range []string{"Keep-Alive", "Upgrade", "Http2-Settings"} {
		h.Del(k)
	}
	h.Set("Connection", "close")
	req.Close = false // the header says it; Write would say it again
}

// replay writes b first to the upstream: what the proxy read to decide.
func replay(b []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}
}

// respond answers a refused request (on the explicit proxy, and plain
// HTTP on the transparent one) and lets the connection close.
func respond(c *conn, status int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(c.client, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}
