package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/airlockhq/airlock/pkg/egress"
)

const (
	testSecret      = "s3cr3t-0123456789"
	testValue       = "Bearer " + testSecret
	testPlaceholder = "airlock-cred:api-token:Zq81"
)

// apiToken is a credential for api.example.com (and what else hosts add).
func apiToken(hosts ...string) Credential {
	return Credential{
		Name:        "api-token",
		Hosts:       append([]string{"api.example.com"}, hosts...),
		Header:      "Authorization",
		Value:       testValue,
		Secret:      testSecret,
		Placeholder: testPlaceholder,
	}
}

func withCredentials(creds ...Credential) option {
	return withConfig(func(c *Config) { c.Credentials = creds })
}

// jobClient is a job's HTTP client that trusts the job's CA beside the
// test's roots, by the explicit proxy or redirected to the transparent
// listener, speaking HTTP/2 when h2. It follows no redirect.
func (h *harness) jobClient(transparent, h2 bool) *http.Client {
	h.t.Helper()
	pool := h.roots.Clone()
	if !pool.AppendCertsFromPEM(h.p.CACertPEM()) {
		h.t.Fatal("CACertPEM holds no certificate")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	if transparent {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", h.trans)
		}
	} else {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: h.explicit})
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Timeout:       10 * time.Second,
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends a GET with the job's own Authorization and the placeholder in
// X-Key, and returns the response with its body read.
func do(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer the-jobs-own")
	req.Header["authorization"] = []string{"lower-case-variant"}
	req.Header.Set("X-Key", "key="+testPlaceholder)
	return roundTrip(t, c, req)
}

// noSecret fails when the job's response, or any decision recorded,
// carries the secret or the header value.
func (h *harness) noSecret(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	var where []string
	if resp != nil {
		head, _ := json.Marshal(resp.Header)
		where = append(where, "response head "+string(head), "response body "+body)
	}
	h.mu.Lock()
	for _, d := range h.decisions {
		j, _ := json.Marshal(d)
		where = append(where, "decision "+string(j))
	}
	h.mu.Unlock()
	for _, w := range where {
		if strings.Contains(w, testSecret) || strings.Contains(w, testValue) {
			t.Errorf("the secret is in the %s", w)
		}
	}
}

// requestDecision waits for the decision of a request to path.
func (h *harness) requestDecision(path string) Decision {
	h.t.Helper()
	return h.waitFor(func(d Decision) bool { return d.Mode == ModeRequest && d.Request != nil && d.Request.Path == path })
}

// waitFor waits for a decision that is, and returns the first.
func (h *harness) waitFor(is func(Decision) bool) Decision {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		for _, d := range h.decisions {
			if is(d) {
				h.mu.Unlock()
				return d
			}
		}
		h.mu.Unlock()
		if time.Now().After(deadline) {
			h.t.Fatalf("no such decision in %+v", h.waitDecisions(0))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The credential is set on requests to a listed host, by CONNECT and
// redirected alike, over HTTP/1.1 and HTTP/2 on either side: the job's own
// Authorization (any spelling) is replaced, the placeholder swapped, the
// job sees the job CA's certificate and never the secret.
func TestCredentialInjected(t *testing.T) {
	for _, transparent := range []bool{false, true} {
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("transparent=%v/h2=%v", transparent, h2), func(t *testing.T) {
				h := newHarness(t, withCredentials(apiToken()), option{h2: h2})
				c := h.jobClient(transparent, h2)
				proto := "HTTP/1.1"
				if h2 {
					proto = "HTTP/2.0"
				}
				for i := range 2 { // the second over the same connection
					resp, body := do(t, c, "https://api.example.com/cred")
					if resp.StatusCode != http.StatusOK || body != "seen "+proto || resp.Proto != proto {
						t.Fatalf("%d: %s %q, want 200 %q over %s", i, resp.Status, body, "seen "+proto, proto)
					}
					if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "Airlock job egress CA" {
						t.Errorf("the job saw a certificate issued by %q", iss)
					}
					h.noSecret(t, resp, body)
				}
				seen := h.requests()
				if len(seen) != 2 {
					t.Fatalf("the upstream saw %d requests, want 2", len(seen))
				}
				if d := h.dials(); len(d) != 1 {
					t.Errorf("the proxy dialled %v for two requests on one connection, want one upstream connection", d)
				}
				for _, s := range seen {
					if got := s.header.Values("Authorization"); len(got) != 1 || got[0] != testValue {
						t.Errorf("the upstream saw Authorization %q", got)
					}
					if got := s.header["authorization"]; got != nil {
						t.Errorf("the upstream saw a lower-case authorization %q", got)
					}
					// The placeholder stands in for the value in the
					// credential's own header alone: elsewhere it goes out as
					// the job wrote it, never swapped (a header a server
					// echoes would hand the job the value).
					if got := s.header.Get("X-Key"); got != "key="+testPlaceholder {
						t.Errorf("the upstream saw X-Key %q", got)
					}
					if s.host != "api.example.com" {
						t.Errorf("the upstream saw Host %q", s.host)
					}
				}
				d := h.requestDecision("/cred")
				if r := d.Request; d.Name != "api.example.com" || d.Port != 443 || !d.Allowed || r.Method != "GET" ||
					r.Status != 200 || r.Credential != "api-token" || !r.Allowed || d.BytesIn != int64(len("seen "+proto)) ||
					!strings.Contains(d.Reason, "brokered credential api-token added") {
					t.Errorf("request decision %+v %+v", d, *d.Request)
				}
				c.Transport.(*http.Transport).CloseIdleConnections()
				mode := ModeConnect
				if transparent {
					mode = ModeTransparent
				}
				d = h.waitFor(func(d Decision) bool { return d.Mode == mode })
				want{Mode: mode, Name: "api.example.com", Port: 443, Allowed: true,
					Reason: "intercepted for brokered credential api-token", Addr: "203.0.113.10:443", End: "closed"}.check(t, d)
				h.noSecret(t, nil, "")
			})
		}
	}
}

// A host the credential does not list is spliced as ever: the job sees
// the upstream's own certificate, and its headers, placeholder included,
// go as it sent them.
func TestCredentialUnlistedSpliced(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	c := h.jobClient(false, false)
	resp, body := do(t, c, "https://other.example.com/cred")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %q", resp.Status, body)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "egressproxy test CA" {
		t.Errorf("the job saw a certificate issued by %q, want the upstream's own", iss)
	}
	seen := h.requests()
	if len(seen) != 1 || seen[0].header.Get("Authorization") != "Bearer the-jobs-own" || seen[0].header.Get("X-Key") != "key="+testPlaceholder {
		t.Errorf("the upstream saw %+v", seen)
	}
	d := h.nth(1)
	if d.Mode != ModeConnect || strings.Contains(d.Reason, "intercepted") || d.TLS == nil {
		t.Errorf("decision %+v", d)
	}
}

// Plain HTTP to a listed host never carries the credential.
func TestCredentialNotInPlainHTTP(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	resp, body := do(t, h.jobClient(false, false), "http://api.example.com/cred")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %q", resp.Status, body)
	}
	seen := h.requests()
	if len(seen) != 1 || seen[0].header.Get("Authorization") != "Bearer the-jobs-own" || seen[0].header.Get("X-Key") != "key="+testPlaceholder {
		t.Errorf("the upstream saw %+v", seen)
	}
}

// tlsThrough opens TLS to name through a CONNECT tunnel, trusting the job
// CA, offering protos.
func (h *harness) tlsThrough(name string, protos ...string) *tls.Conn {
	h.t.Helper()
	c, _, status, body := h.connect(name + ":443")
	if status != http.StatusOK {
		h.t.Fatalf("CONNECT %s: %d %s", name, status, body)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACertPEM())
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: pool, NextProtos: protos})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		h.t.Fatalf("TLS to %s: %v", name, err)
	}
	return tc
}

// A request on an intercepted connection for any other name or port is
// 421 and goes nowhere: an HTTP/1.1 Host of another name, and HTTP/2
// coalescing onto the connection to a name that is allowed but unlisted.
func TestCredentialMisdirected(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()), option{h2: true})
	t.Run("http1", func(t *testing.T) {
		tc := h.tlsThrough("api.example.com", "http/1.1")
		br := bufio.NewReader(tc)
		fmt.Fprintf(tc, "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n")
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("CONNECT inside: %s, want 405", resp.Status)
		}
		for _, host := range []string{"other.example.com", "api.example.com:8443", "203.0.113.10"} {
			fmt.Fprintf(tc, "GET /cred HTTP/1.1\r\nHost: %s\r\nAuthorization: x\r\n\r\n", host)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(string(body), "api.example.com port 443 only") {
				t.Errorf("Host %s: %s %q, want 421", host, resp.Status, body)
			}
		}
	})
	t.Run("h2", func(t *testing.T) {
		tc := h.tlsThrough("api.example.com", "h2")
		cc, err := (&http2.Transport{}).NewClientConn(tc)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		for _, tt := range []struct {
			url    string
			status int
		}{
			{"https://api.example.com/cred", 200},
			{"https://other.example.com/cred", 421},
			{"https://api.example.com/cred", 200},
		} {
			req, _ := http.NewRequest(http.MethodGet, tt.url, nil)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", tt.url, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("%s: %s %q, want %d", tt.url, resp.Status, body, tt.status)
			}
		}
	})
	for _, s := range h.requests() {
		if s.host != "api.example.com" {
			t.Errorf("the upstream saw a request for %s", s.host)
		}
	}
	if n := len(h.requests()); n != 2 {
		t.Errorf("the upstream saw %d requests, want 2", n)
	}
	h.requestDecision("/cred")
	h.mu.Lock()
	var refused int
	for _, d := range h.decisions {
		if d.Mode == ModeRequest && d.Request.Status == 0 {
			refused++
			if d.Allowed || d.Request.Credential != "" || !strings.HasPrefix(d.Reason, "refused: ") {
				t.Errorf("misdirected request decision %+v %+v", d, *d.Request)
			}
		}
	}
	h.mu.Unlock()
	if refused == 0 {
		t.Error("no misdirected request was recorded (refusals may be capped, but not the first)")
	}
	h.noSecret(t, nil, "")
}

// A redirect, to another host too, goes back to the job as it came.
func TestCredentialRedirectNotFollowed(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	to := "https://other.example.com/cred"
	resp, body := do(t, h.jobClient(false, false), "https://api.example.com/redirect?to="+url.QueryEscape(to))
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != to {
		t.Errorf("%s Location %q %q, want 302 to %s", resp.Status, resp.Header.Get("Location"), body, to)
	}
	if seen := h.requests(); len(seen) != 0 {
		t.Errorf("the proxy followed the redirect: %+v", seen)
	}
	if d := h.requestDecision("/redirect"); d.Request.Status != http.StatusFound {
		t.Errorf("request decision %+v", *d.Request)
	}
}

// Taking the credential away cuts its open connections at once; a new
// connection's requests are 403 and go nowhere. A credential past its
// Expires is 403 likewise.
func TestCredentialRevoked(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	tc := h.tlsThrough("api.example.com", "http/1.1")
	br := bufio.NewReader(tc)
	fmt.Fprintf(tc, "GET /cred HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("before: %v %v", resp, err)
	}
	io.ReadAll(resp.Body)
	if err := h.p.SetCredentials(nil); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err == nil || errorsIsTimeout(err) {
		t.Errorf("the open connection was not cut: %d bytes, %v", n, err)
	}

	resp, body := do(t, h.jobClient(false, false), "https://api.example.com/cred")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "brokered credential api-token is no longer leased") {
		t.Errorf("after: %s %q, want 403", resp.Status, body)
	}
	if n := len(h.requests()); n != 1 {
		t.Errorf("the upstream saw %d requests, want 1", n)
	}
	h.waitFor(func(d Decision) bool {
		return strings.Contains(d.End, "cut: the brokered credential api-token is no longer leased")
	})

	t.Run("expired", func(t *testing.T) {
		cred := apiToken()
		cred.Expires = time.Now().Add(-time.Second)
		h := newHarness(t, withCredentials(cred))
		resp, body := do(t, h.jobClient(true, true), "https://api.example.com/cred")
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "brokered credential api-token is no longer leased") {
			t.Errorf("%s %q, want 403", resp.Status, body)
		}
		if n := len(h.requests()); n != 0 {
			t.Errorf("the upstream saw %d requests, want none", n)
		}
		h.noSecret(t, resp, body)
	})
	h.noSecret(t, nil, "")
}

func errorsIsTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A policy narrowing that drops a credential's host cuts its intercepted
// connections at once.
func TestCredentialSetPolicyCuts(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	tc := h.tlsThrough("api.example.com", "http/1.1")
	if err := h.p.SetPolicy(egress.Policy{Names: []egress.Name{{Name: "other.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := tc.Read(make([]byte, 1)); err == nil || errorsIsTimeout(err) {
		t.Errorf("the intercepted connection was not cut: %d bytes, %v", n, err)
	}
	d := h.nth(1)
	if !strings.Contains(d.End, "cut: the policy no longer allows api.example.com") {
		t.Errorf("decision %+v", d)
	}
}

// An upstream whose certificate does not chain to the roots gets nothing:
// the job gets a 502 naming the host, and no credential went out.
func TestCredentialUpstreamUnverified(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken("bad.example.com")))
	resp, body := do(t, h.jobClient(false, false), "https://bad.example.com/cred")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate of bad.example.com did not verify") {
		t.Errorf("%s %q, want 502", resp.Status, body)
	}
	if seen := h.requests(); len(seen) != 0 {
		t.Errorf("the untrusted upstream saw %+v", seen)
	}
	d := h.requestDecision("/cred")
	if d.Allowed || d.Request.Credential != "" || !strings.Contains(d.Reason, "did not verify") {
		t.Errorf("request decision %+v %+v", d, *d.Request)
	}
	h.noSecret(t, resp, body)
}

// New refuses credentials it cannot use, naming the field; the CA it
// makes is constrained to the credentials' hosts.
func TestCredentialConfig(t *testing.T) {
	good := apiToken("*.pkg.example.com")
	for _, tc := range []struct {
		change func(*Credential)
		want   string
	}{
		{func(c *Credential) { c.Name = "" }, "Name is empty"},
		{func(c *Credential) { c.Hosts = nil }, "Hosts is empty"},
		{func(c *Credential) { c.Hosts = []string{"a*.example.com"} }, "Hosts[0]"},
		{func(c *Credential) { c.Hosts = []string{"10.0.0.1"} }, "Hosts[0]"},
		{func(c *Credential) { c.Header = "Bad Header" }, "Header"},
		{func(c *Credential) { c.Header = "host" }, "frames the request"},
		{func(c *Credential) { c.Value = "x\r\nHost: evil" }, "Value has a CR, LF or NUL"},
		{func(c *Credential) { c.Secret = "" }, "Secret is empty"},
	} {
		cred := good
		tc.change(&cred)
		_, err := New(Config{Resolver: &fakeResolver{}, Credentials: []Credential{cred}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", cred, err, tc.want)
		}
	}
	if _, err := New(Config{Resolver: &fakeResolver{}, Credentials: []Credential{good, good}}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("a name twice: %v", err)
	}

	p, err := New(Config{Resolver: &fakeResolver{}})
	if err != nil || p.CACertPEM() != nil {
		t.Fatalf("without credentials: %v, CA %q", err, p.CACertPEM())
	}
	if err := p.SetCredentials([]Credential{good}); err == nil {
		t.Error("SetCredentials gave a proxy made without credentials some")
	}
	p, err = New(Config{Resolver: &fakeResolver{}, Credentials: []Credential{good}})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(p.ca.cert.Raw)
	if err != nil || !ca.IsCA || !ca.PermittedDNSDomainsCritical ||
		strings.Join(ca.PermittedDNSDomains, ",") != "api.example.com,pkg.example.com" ||
		ca.PublicKeyAlgorithm != x509.ECDSA || ca.NotAfter.After(time.Now().Add(25*time.Hour)) {
		t.Errorf("job CA %+v: %v", ca, err)
	}
	if err := p.SetCredentials([]Credential{apiToken("elsewhere.example.org")}); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("SetCredentials widened the CA's hosts: %v", err)
	}
	wild := good
	wild.Hosts = []string{"*.pkg.example.com"}
	// One label below, as a network policy's wildcard matches.
	for name, want := range map[string]bool{"a.pkg.example.com": true, "a.b.pkg.example.com": false, "pkg.example.com": false, "xpkg.example.com": false} {
		if got := wild.matches(name); got != want {
			t.Errorf("*.pkg.example.com matches %s: %v, want %v", name, got, want)
		}
	}
	// A leaf outside the constraints does not verify under the CA.
	leaf, err := p.ca.leaf("elsewhere.example.org")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca.cert)
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "elsewhere.example.org"}); err == nil {
		t.Error("a leaf outside the CA's name constraints verified")
	}
}

// A request's body goes up and its response comes back through the
// interception, each counted into the request's decision.
func TestCredentialRequestBody(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	c := h.jobClient(true, false)
	body := strings.Repeat("x", 100000)
	resp, err := c.Post("https://api.example.com/echo", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(got), "POST api.example.com \"xxx") {
		t.Fatalf("%s %.60q", resp.Status, got)
	}
	d := h.requestDecision("/echo")
	if d.BytesOut != int64(len(body)) || d.BytesIn != int64(len(got)) || d.Request.Method != "POST" {
		t.Errorf("request decision %+v, want %d bytes out, %d in", d, len(body), len(got))
	}
	h.noSecret(t, resp, string(got))
}

// A response streams through an interception: the job reads what the
// upstream has sent before the upstream has finished.
func TestCredentialStreams(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()), option{h2: true})
	for _, h2 := range []bool{false, true} {
		id := fmt.Sprint(h2)
		resp, err := h.jobClient(false, h2).Get("https://api.example.com/stream?id=" + id)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); line != "first\n" {
			t.Fatalf("h2=%v: %q %v before the upstream finished", h2, line, err)
		}
		close(h.end(id))
		if rest, err := io.ReadAll(br); string(rest) != "last\n" {
			t.Errorf("h2=%v: then %q %v", h2, rest, err)
		}
		resp.Body.Close()
	}
}

// An upstream that goes silent is cut after IdleTimeout, as a splice is.
func TestCredentialIdleUpstream(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()), withConfig(func(c *Config) { c.IdleTimeout = 300 * time.Millisecond }))
	resp, err := h.jobClient(false, false).Get("https://api.example.com/stream?id=silent")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	rest, err := io.ReadAll(resp.Body)
	if err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("read %q, %v after %s; want an error after about 300ms", rest, err, time.Since(start))
	}
}

// A renewed lease (the same credential, a new value) applies from the next
// request on, on the connections already open.
func TestCredentialRenewed(t *testing.T) {
	h := newHarness(t, withCredentials(apiToken()))
	c := h.jobClient(false, true)
	do(t, c, "https://api.example.com/cred")
	renewed := apiToken()
	renewed.Value, renewed.Secret = "Bearer renewed", "renewed"
	if err := h.p.SetCredentials([]Credential{renewed}); err != nil {
		t.Fatal(err)
	}
	do(t, c, "https://api.example.com/cred")
	seen := h.requests()
	if len(seen) != 2 || seen[0].header.Get("Authorization") != testValue || seen[1].header.Get("Authorization") != "Bearer renewed" {
		t.Errorf("the upstream saw %+v", seen)
	}
	if d := h.dials(); len(d) != 1 {
		t.Errorf("dialled %v: the renewal cut the connection", d)
	}
}

// A server that reflects request headers cannot hand the job the value:
// the proxy forwards no TRACE or TRACK (which echo the whole request),
// takes the value out of the response's headers and trailers, and never
// swaps the placeholder into a header other than the credential's.
func TestCredentialNotReflected(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			h := newHarness(t, withCredentials(apiToken()), option{h2: h2})
			c := h.jobClient(false, h2)
			for _, m := range []string{"TRACE", "TRACK", "CONNECT"} {
				req, _ := http.NewRequest(m, "https://api.example.com/reflect", nil)
				if m == "CONNECT" {
					req.URL.Path = ""
					req.Host = "api.example.com:443"
				}
				resp, body := roundTrip(t, c, req)
				if resp.StatusCode != http.StatusMethodNotAllowed {
					t.Errorf("%s: %s %q, want 405", m, resp.Status, body)
				}
				h.noSecret(t, resp, body)
			}
			if n := len(h.requests()); n != 0 {
				t.Errorf("the upstream saw %d refused requests", n)
			}
			req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/reflect", nil)
			req.Header.Set("X-Key", testPlaceholder)
			resp, body := roundTrip(t, c, req)
			if resp.StatusCode != http.StatusOK || body != "reflected GET" {
				t.Fatalf("GET /reflect: %s %q", resp.Status, body)
			}
			h.noSecret(t, resp, body)
			for k, vs := range resp.Header {
				for _, v := range vs {
					if strings.Contains(v, testSecret) || strings.Contains(v, testValue) {
						t.Errorf("the response's header %s holds the value", k)
					}
				}
			}
			for k, vs := range resp.Trailer {
				for _, v := range vs {
					if strings.Contains(v, testSecret) || strings.Contains(v, testValue) {
						t.Errorf("the response's trailer %s holds the value", k)
					}
				}
			}
			if got := resp.Header.Get("X-Echo-X-Key"); got != testPlaceholder {
				t.Errorf("X-Key came back as %q, want the placeholder unswapped", got)
			}
			if got := resp.Header.Get("X-Echo-Authorization"); got != "[redacted]" {
				t.Errorf("the echoed Authorization came back as %q, want it redacted", got)
			}
		})
	}
}
