package egressproxy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
)

// The test's public-looking upstream addresses (documentation ranges, which
// egress.Internal lets through); the Dial substitution takes them to
// loopback listeners. Every other address fails to dial.
var (
	public4 = netip.MustParseAddr("203.0.113.10")
	public6 = netip.MustParseAddr("2001:db8::10")
	// untrusted4 is an upstream with a certificate the test's roots do
	// not verify.
	untrusted4 = netip.MustParseAddr("203.0.113.20")
	// hostAddr is "the host's own address", refused through Extra.
	hostAddr = netip.MustParseAddr("203.0.113.77")
)

// testPolicy is the harness's policy unless a test sets another.
var testPolicy = egress.Policy{Names: []egress.Name{
	{Name: "api.example.com"},
	{Name: "*.pkg.example.com"},
	{Name: "other.example.com"},
	{Name: "bad.example.com"},
	{Name: "only443.example.com", Ports: []uint16{443}},
	{Name: "v6.example.com"},
	{Name: "mapped.example.com"},
	{Name: "*.rebind.example.com"},
}}

// testAnswers are what the fake resolver answers; a name with several
// lists gets them in turn (the last repeats).
func testAnswers() map[string][][]netip.Addr {
	one := func(s ...string) [][]netip.Addr {
		var a []netip.Addr
		for _, x := range s {
			a = append(a, netip.MustParseAddr(x))
		}
		return [][]netip.Addr{a}
	}
	return map[string][][]netip.Addr{
		"api.example.com":              one("203.0.113.10"),
		"x.pkg.example.com":            one("203.0.113.10"),
		"pkg.example.com":              one("203.0.113.10"),
		"other.example.com":            one("203.0.113.10"),
		"only443.example.com":          one("203.0.113.10"),
		"denied.example.com":           one("203.0.113.10"),
		"bad.example.com":              one("203.0.113.20"),
		"v6.example.com":               one("2001:db8::10"),
		"mapped.example.com":           one("::ffff:203.0.113.10"),
		"lo.rebind.example.com":        one("127.0.0.1"),
		"meta.rebind.example.com":      one("169.254.169.254"),
		"mapped.rebind.example.com":    one("::ffff:127.0.0.1"),
		"sixtofour.rebind.example.com": one("2002:7f00:1::"),
		"host.rebind.example.com":      one("203.0.113.77"),
		"pool.rebind.example.com":      one("2001:db8:77::5"),
		"mixed.rebind.example.com":     one("203.0.113.10", "10.0.0.5"),
		"mixed6.rebind.example.com":    one("2001:db8::10", "fd00:ec2::254"),
		"flip.rebind.example.com": {
			{netip.MustParseAddr("203.0.113.10")},
			{netip.MustParseAddr("127.0.0.1")},
		},
	}
}

// testExtra is the executor's own refusals: the host's address and a job
// pool that is public-looking, so only Extra refuses it.
var testExtra = []netip.Prefix{
	netip.PrefixFrom(hostAddr, 32),
	netip.MustParsePrefix("2001:db8:77::/48"),
}

// fakeResolver answers from a table and counts the lookups of each name.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	lookups map[string]int
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if network != "ip" {
		return nil, fmt.Errorf("fake resolver: network %q", network)
	}
	r.lookups[host]++
	a, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(a[min(r.lookups[host], len(a))-1]), nil
}

func (r *fakeResolver) count(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups[host]
}

// harness is a proxy with both listeners on loopback, a TLS and a plain
// HTTP upstream, and everything the proxy recorded and dialled.
type harness struct {
	t        testing.TB
	p        *Proxy
	explicit string // the explicit listener's address
	trans    string // the transparent listener's address
	res      *fakeResolver
	roots    *x509.CertPool
	release  chan struct{} // ends every /stream response (at cleanup)

	mu        sync.Mutex
	seen      []seenRequest            // by /cred, on every upstream
	ends      map[string]chan struct{} // by /stream?id=
	decisions []Decision
	dialled   []netip.AddrPort
	served    []error
}

// end is closed to end the /stream response of that id.
func (h *harness) end(id string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ends[id] == nil {
		h.ends[id] = make(chan struct{})
	}
	return h.ends[id]
}

// option changes the Config the harness makes its proxy with, or the
// proxy before it serves.
type option struct {
	config func(*Config)
	proxy  func(*Proxy)
	// h2 makes the TLS upstream offer HTTP/2.
	h2 bool
}

func newHarness(t testing.TB, opts ...option) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		res:     &fakeResolver{answers: testAnswers(), lookups: map[string]int{}},
		release: make(chan struct{}),
		ends:    map[string]chan struct{}{},
	}
	cert, roots := testCertificate(t)
	h.roots = roots

	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-h.release:
		case <-h.end(r.URL.Query().Get("id")):
			io.WriteString(w, "last\n")
		}
	})
	mux.HandleFunc("/ticks", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		every, _ := time.ParseDuration(r.URL.Query().Get("every"))
		for range n {
			time.Sleep(every)
			io.WriteString(w, "tick\n")
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/patient", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			io.WriteString(w, "the client went away")
		case <-time.After(300 * time.Millisecond):
			io.WriteString(w, "ok")
		}
	})
	mux.HandleFunc("/zeros", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := make([]byte, min(n, 256<<10))
		for n > 0 {
			m, err := w.Write(chunk[:min(n, len(chunk))])
			if err != nil {
				return
			}
			n -= m
		}
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %q proxy-authorization=%q connection=%q", r.Method, r.Host, body,
			r.Header.Get("Proxy-Authorization"), r.Header.Get("Connection"))
	})
	mux.HandleFunc("/cred", h.recordRequest("api"))
	// /reflect is a server that echoes request headers back in its own
	// (as CORS, request ids and object metadata do) and answers TRACE.
	mux.HandleFunc("/reflect", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.seen = append(h.seen, seenRequest{"api", r.Host, r.Proto, r.Header.Clone()})
		h.mu.Unlock()
		for _, k := range []string{"Authorization", "X-Key"} {
			w.Header().Set("X-Echo-"+k, r.Header.Get(k))
		}
		w.Header().Set("Trailer", "X-Echo-Trailer")
		fmt.Fprintf(w, "reflected %s", r.Method)
		w.Header().Set("X-Echo-Trailer", r.Header.Get("Authorization"))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		sni := "-"
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		fmt.Fprintf(w, "host=%s path=%s sni=%s", r.Host, r.URL.Path, sni)
	})
	tlsSrv := httptest.NewUnstartedServer(mux)
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	// Handshakes the proxy gives up on (an interception that forwards
	// nothing, an untrusted upstream) are expected.
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	for _, o := range opts {
		tlsSrv.EnableHTTP2 = tlsSrv.EnableHTTP2 || o.h2
	}
	tlsSrv.StartTLS()
	// untrusted is an upstream whose certificate no root of the test's
	// trusts (bad.example.com).
	badCert, _ := testCertificate(t)
	badMux := http.NewServeMux()
	badMux.HandleFunc("/", h.recordRequest("untrusted"))
	badSrv := httptest.NewUnstartedServer(badMux)
	badSrv.TLS = &tls.Config{Certificates: []tls.Certificate{badCert}}
	badSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	badSrv.StartTLS()
	t.Cleanup(badSrv.Close)
	httpSrv := httptest.NewServer(mux)
	t.Cleanup(func() {
		close(h.release)
		tlsSrv.Close()
		httpSrv.Close()
	})
	routes := map[netip.AddrPort]string{
		netip.AddrPortFrom(public4, 443):    tlsSrv.Listener.Addr().String(),
		netip.AddrPortFrom(public4, 80):     httpSrv.Listener.Addr().String(),
		netip.AddrPortFrom(public6, 443):    tlsSrv.Listener.Addr().String(),
		netip.AddrPortFrom(public6, 80):     httpSrv.Listener.Addr().String(),
		netip.AddrPortFrom(untrusted4, 443): badSrv.Listener.Addr().String(),
	}

	cfg := Config{
		Policy:   testPolicy,
		Resolver: h.res,
		Extra:    testExtra,
		Dial: func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
			h.mu.Lock()
			h.dialled = append(h.dialled, addr)
			h.mu.Unlock()
			if why := egress.Internal(addr.Addr(), testExtra); why != "" {
				t.Errorf("the proxy dialled %s: %s", addr, why)
				return nil, errors.New("internal")
			}
			to, ok := routes[addr]
			if !ok {
				return nil, fmt.Errorf("no route to %s in this test", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, to)
		},
		Record: func(d Decision) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.decisions = append(h.decisions, d)
		},
		ConnectTimeout: 5 * time.Second,
		Roots:          roots,
	}
	for _, o := range opts {
		if o.config != nil {
			o.config(&cfg)
		}
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		if o.proxy != nil {
			o.proxy(p)
		}
	}
	h.p = p

	explicit, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	trans, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.explicit, h.trans = explicit.Addr().String(), trans.Addr().String()
	var served sync.WaitGroup
	for _, run := range []func() error{
		func() error { return p.Serve(explicit) },
		func() error { return p.ServeTransparent(trans) },
	} {
		served.Go(func() {
			err := run()
			h.mu.Lock()
			h.served = append(h.served, err)
			h.mu.Unlock()
		})
	}
	t.Cleanup(func() {
		p.Close()
		served.Wait()
		for _, err := range h.served {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Serve returned %v, want ErrClosed", err)
			}
		}
	})
	return h
}

func withConfig(f func(*Config)) option { return option{config: f} }

// seenRequest is what an upstream's /cred handler saw.
type seenRequest struct {
	upstream string
	host     string
	proto    string
	header   http.Header
}

// recordRequest is a handler that keeps what it was sent, as upstream,
// and answers with nothing of it but the protocol.
func (h *harness) recordRequest(upstream string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.seen = append(h.seen, seenRequest{upstream, r.Host, r.Proto, r.Header.Clone()})
		h.mu.Unlock()
		fmt.Fprintf(w, "seen %s", r.Proto)
	}
}

// requests are what the upstreams' /cred handlers saw.
func (h *harness) requests() []seenRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// withFloodWindow makes the refusal cap's minute d.
func withFloodWindow(d time.Duration) option {
	return option{proxy: func(p *Proxy) { p.log.Gate.Every = d }}
}

// waitDecisions waits until n decisions have been recorded and returns them.
func (h *harness) waitDecisions(n int) []Decision {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		got := slices.Clone(h.decisions)
		h.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d decisions recorded, want %d: %+v", len(got), n, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nth waits for the nth decision and returns it.
func (h *harness) nth(n int) Decision {
	h.t.Helper()
	return h.waitDecisions(n)[n-1]
}

func (h *harness) dials() []netip.AddrPort {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.dialled)
}

// proxyClient goes by the explicit proxy, verifying the upstream with the
// test CA, one connection per request.
func (h *harness) proxyClient() *http.Client {
	u := &url.URL{Scheme: "http", Host: h.explicit}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(u),
		TLSClientConfig:   &tls.Config{RootCAs: h.roots},
		DisableKeepAlives: true,
	}}
}

// redirectedClient is a tool that ignores proxy variables, with the kernel's
// redirect stood in for: whatever address it dials, it reaches the
// transparent listener.
func (h *harness) redirectedClient() *http.Client {
	var d net.Dialer
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", h.trans)
		},
		TLSClientConfig:   &tls.Config{RootCAs: h.roots},
		DisableKeepAlives: true,
	}}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := roundTrip(t, c, req)
	return resp.StatusCode, body
}

// roundTrip sends req and returns the response with its body read.
func roundTrip(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, string(b)
}

// connect sends CONNECT target to the explicit proxy and returns the
// connection and the answer's status and body.
func (h *harness) connect(target string) (net.Conn, *bufio.Reader, int, string) {
	h.t.Helper()
	c, err := net.DialTimeout("tcp", h.explicit, 5*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		h.t.Fatalf("CONNECT %s: %v", target, err)
	}
	var body []byte
	if resp.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(resp.Body)
	}
	return c, br, resp.StatusCode, strings.TrimSpace(string(body))
}

// raw sends req as is to addr and returns the answer's status and body.
func raw(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// tunnel is a TLS connection through a CONNECT tunnel, with a request sent
// on it and the answer's head read.
type tunnel struct {
	conn *tls.Conn
	br   *bufio.Reader
}

func (h *harness) openStream(name, path string) *tunnel {
	h.t.Helper()
	c, br, status, body := h.connect(name + ":443")
	if status != http.StatusOK {
		h.t.Fatalf("CONNECT %s: %d %s", name, status, body)
	}
	if br.Buffered() != 0 {
		h.t.Fatalf("the proxy sent %d bytes after its 200", br.Buffered())
	}
	return h.request(c, name, path)
}

// openRedirected is openStream by the transparent listener.
func (h *harness) openRedirected(name, path string) *tunnel {
	h.t.Helper()
	c, err := dialTimeout(h.trans)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return h.request(c, name, path)
}

// request starts TLS for name on c and sends GET path.
func (h *harness) request(c net.Conn, name, path string) *tunnel {
	h.t.Helper()
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: h.roots})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, name)
	tbr := bufio.NewReader(tc)
	resp, err := http.ReadResponse(tbr, nil)
	if err != nil {
		h.t.Fatalf("GET https://%s%s: %v", name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("GET https://%s%s: %s", name, path, resp.Status)
	}
	return &tunnel{conn: tc, br: tbr}
}

// readLine reads the next line of a chunked body well enough for the
// stream handler: chunk sizes and data alike are lines.
func (tu *tunnel) readLine() (string, error) {
	tu.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		line, err := tu.br.ReadString('\n')
		if err != nil {
			return line, err
		}
		line = strings.TrimSpace(line)
		if _, err := strconv.ParseUint(line, 16, 32); err == nil || line == "" {
			continue // a chunk size, or the CRLF after a chunk
		}
		return line, nil
	}
}

// testCertificate is a throwaway CA and a certificate it signed for the
// test names.
func testCertificate(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "egressproxy test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "example.com"},
		DNSNames:     []string{"*.example.com", "*.pkg.example.com", "*.rebind.example.com"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, roots
}

// want is what a test expects of a decision; Reason is a substring.
type want struct {
	Mode    Mode
	Name    string
	Port    uint16
	Allowed bool
	Reason  string
	Addr    string // "" for none
	End     string // a substring; "" when not checked, endedByPeers for either of theirs
}

// endedByPeers is a want.End for a connection its ends closed: "closed",
// or what a peer's kernel answers when late bytes (a TLS close_notify, the
// rest of a response) reach a socket it has closed.
const endedByPeers = "(closed, reset or broken pipe)"

func (w want) check(t *testing.T, d Decision) {
	t.Helper()
	var addr string
	if d.Addr.IsValid() {
		addr = d.Addr.String()
	}
	end := strings.Contains(d.End, w.End)
	if w.End == endedByPeers {
		end = d.End == "closed" || strings.HasPrefix(d.End, "reset (") || strings.HasPrefix(d.End, "broken pipe (")
	}
	if d.Mode != w.Mode || d.Name != w.Name || d.Port != w.Port || d.Allowed != w.Allowed || addr != w.Addr ||
		!strings.Contains(d.Reason, w.Reason) || !end {
		t.Errorf("decision %+v\nwant %+v", d, w)
	}
	if d.Time.IsZero() || d.Duration <= 0 {
		t.Errorf("decision %+v has no time or duration", d)
	}
	if w.Allowed && (d.BytesIn == 0 || d.BytesOut == 0) {
		t.Errorf("allowed decision %+v moved no bytes", d)
	}
	if !w.Allowed && (d.BytesIn != 0 || d.BytesOut != 0) {
		t.Errorf("refused decision %+v counts bytes", d)
	}
}

func dialTimeout(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}
