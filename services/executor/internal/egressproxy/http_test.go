package egressproxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A plain HTTP request by absolute URI reaches the name's vetted address on
// port 80 in origin form, body and all, without the proxy's headers and
// asking the upstream to close after it.
func TestHTTPAllowed(t *testing.T) {
	h := newHarness(t)
	status, body := get(t, h.proxyClient(), "http://api.example.com/plain")
	if want := "host=api.example.com path=/plain sni=-"; status != http.StatusOK || body != want {
		t.Errorf("GET: %d %q, want 200 %q", status, body, want)
	}
	want{Mode: ModeHTTP, Name: "api.example.com", Port: 80, Allowed: true, Reason: "allowed by api.example.com ports [80 443]", Addr: "203.0.113.10:80", End: endedByPeers}.check(t, h.nth(1))

	status, body = raw(t, h.explicit, "POST http://API.example.com/echo HTTP/1.1\r\nHost: api.example.com:80\r\n"+
		"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nContent-Length: 5\r\n\r\nhello")
	if want := `POST API.example.com "hello" proxy-authorization="" connection="close"`; status != http.StatusOK || body != want {
		t.Errorf("POST: %d %q, want 200 %q", status, body, want)
	}
	want{Mode: ModeHTTP, Name: "api.example.com", Port: 80, Allowed: true, Reason: "allowed by api.example.com", Addr: "203.0.113.10:80", End: endedByPeers}.check(t, h.nth(2))
	if n := h.res.count("api.example.com"); n != 2 {
		t.Errorf("%d lookups, want 2", n)
	}
}

// What is not a plain HTTP request by absolute URI to an allowed name, with
// a Host header naming the same, is answered with why.
func TestHTTPRefused(t *testing.T) {
	h := newHarness(t)
	for i, tc := range []struct {
		req    string
		status int
		name   string
		port   uint16
		reason string
	}{
		{"GET http://denied.example.com/ HTTP/1.1\r\nHost: denied.example.com\r\n\r\n", 403, "denied.example.com", 80, "denied.example.com is not in the policy"},
		{"GET http://pkg.example.com/ HTTP/1.1\r\nHost: pkg.example.com\r\n\r\n", 403, "pkg.example.com", 80, "matches only names below it"},
		{"GET http://only443.example.com/ HTTP/1.1\r\nHost: only443.example.com\r\n\r\n", 403, "only443.example.com", 80, "port 80 is not allowed for only443.example.com"},
		{"GET http://203.0.113.10/ HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n", 403, "203.0.113.10", 80, "203.0.113.10 is an IP address"},
		{"GET http://api.example.com/ HTTP/1.1\r\nHost: denied.example.com\r\n\r\n", 400, "api.example.com", 80, `the Host header "denied.example.com" does not name the request's host "api.example.com"`},
		{"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n", 400, "api.example.com", 80, "does not name the request's host"},
		{"GET http://api.example.com/ HTTP/1.0\r\n\r\n", 400, "", 0, "the request has no Host header"},
		{"GET /path HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, "", 0, "not a proxy request"},
		{"GET https://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, "", 0, `scheme "https": only http:// goes as a plain request`},
		{"OPTIONS * HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 405, "", 0, "OPTIONS * is for the proxy itself"},
		{"GET http://mixed.rebind.example.com/ HTTP/1.1\r\nHost: mixed.rebind.example.com\r\n\r\n", 403, "mixed.rebind.example.com", 80, "10.0.0.5 is private"},
		{"HELLO\r\n\r\n", 400, "", 0, "reading the request: malformed HTTP request"},
	} {
		status, body := raw(t, h.explicit, tc.req)
		if status != tc.status || !strings.Contains(body, tc.reason) {
			t.Errorf("%q: %d %q, want %d %q", tc.req, status, body, tc.status, tc.reason)
		}
		want{Mode: ModeHTTP, Name: tc.name, Port: tc.port, Reason: tc.reason}.check(t, h.nth(i+1))
	}
	if d := h.dials(); len(d) != 0 {
		t.Errorf("dialled %v, want nothing", d)
	}
}

// onlyFirstForwarded sends first with a second request for a name the
// policy does not allow pipelined behind it, and checks the first is
// answered and nothing of the second went upstream: what went is the first
// request, rewritten (a few headers more or less).
func onlyFirstForwarded(t *testing.T, first string) {
	t.Helper()
	h := newHarness(t)
	second := "GET http://denied.example.com/" + strings.Repeat("x", 4000) + " HTTP/1.1\r\nHost: denied.example.com\r\n\r\n"
	status, body := raw(t, h.explicit, first+second)
	if want := "host=api.example.com path=/plain sni=-"; status != http.StatusOK || body != want {
		t.Fatalf("first request: %d %q, want 200 %q", status, body, want)
	}
	d := h.nth(1)
	if !d.Allowed || d.Name != "api.example.com" {
		t.Fatalf("decision %+v", d)
	}
	if d.BytesOut > int64(len(first))+64 {
		t.Errorf("%d bytes went upstream for a %d-byte request: the pipelined one went too", d.BytesOut, len(first))
	}
}

// A plain HTTP request is one per connection: a second request pipelined
// behind an allowed one is never forwarded to the first one's server.
func TestHTTPPipelinedRequestNotForwarded(t *testing.T) {
	onlyFirstForwarded(t, "GET http://api.example.com/plain HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
}

// The upstream does not see the job leave once its request is written: a
// server that watches for its client going away (Go's request context,
// nginx's 499) still answers.
func TestHTTPUpstreamKeepsItsClient(t *testing.T) {
	h := newHarness(t)
	if status, body := get(t, h.proxyClient(), "http://api.example.com/patient"); status != http.StatusOK || body != "ok" {
		t.Errorf("GET /patient: %d %q, want 200 ok", status, body)
	}
}

// An Upgrade does not turn a plain HTTP connection into one the proxy no
// longer decides on: the header is removed, and a request pipelined behind
// it is never forwarded.
func TestHTTPUpgradeIsNotATunnel(t *testing.T) {
	onlyFirstForwarded(t, "GET http://api.example.com/plain HTTP/1.1\r\nHost: api.example.com\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n")
}

// What the job sends while its one request is being answered is read and
// dropped, so it cannot reset the connection under the response: a large
// response arrives whole though a second request follows it.
func TestHTTPResponseWholeDespiteLaterBytes(t *testing.T) {
	h := newHarness(t)
	c, err := dialTimeout(h.explicit)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 16 << 20
	fmt.Fprintf(c, "GET http://api.example.com/zeros?n=%d HTTP/1.1\r\nHost: api.example.com\r\n\r\n", size)
	go func() {
		time.Sleep(100 * time.Millisecond)
		io.WriteString(c, "GET http://api.example.com/plain HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	}()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the second request arrive before the body is read
	n, err := io.Copy(io.Discard, resp.Body)
	if n != size || err != nil {
		t.Errorf("read %d of %d bytes: %v", n, size, err)
	}
}
