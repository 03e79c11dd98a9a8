package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fake answers the console with fixed data and records decisions.
type fake struct{ decided []string }

func (f *fake) Identity() string { return "approver/test" }
func (f *fake) Approvals(context.Context) ([]Approval, error) {
	return []Approval{{ID: "a1", JobID: "j1", State: "pending", Pending: true}}, nil
}
func (f *fake) Review(_ context.Context, id string) (*Review, error) {
	return &Review{Approval: Approval{ID: id}}, nil
}
func (f *fake) FullReview(context.Context, string) (*Section, error) { return &Section{}, nil }
func (f *fake) Decide(_ context.Context, id, digest string, approve bool, comment string) (*Approval, error) {
	if id == "refused" {
		return nil, errors.New("permission denied: may not decide")
	}
	f.decided = append(f.decided, id)
	return &Approval{ID: id, State: "approved"}, nil
}
func (f *fake) Audit(context.Context, string) ([]AuditEvent, error) { return nil, nil }

func TestCheckListen(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:0": true, "[::1]:8080": true, "localhost:1": true, "127.1.2.3:9": true,
		"0.0.0.0:80": false, ":8080": false, "[::]:1": false, "192.168.1.1:80": false, "example.com:80": false, "127.0.0.1": false,
	} {
		err := CheckListen("--listen", addr)
		if (err == nil) != ok {
			t.Errorf("CheckListen(%q) = %v, want ok %v", addr, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--listen") {
			t.Errorf("CheckListen(%q): %v does not name the flag", addr, err)
		}
	}
}

// request sends one request to s as a browser on 127.0.0.1:port would.
func request(t *testing.T, s *Server, method, target, host string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Host = host
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	resp := w.Result()
	checkHeaders(t, method+" "+target+" (Host "+host+")", resp)
	return resp
}

// checkHeaders fails unless resp, whatever its status (a page, JSON, a
// static file, a redirect, 401, 403, 404, 405), carries the strict CSP and
// the other protective headers.
func checkHeaders(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	h := resp.Header
	if h.Get("Content-Security-Policy") != csp || !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe") ||
		h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" || h.Get("Cache-Control") != "no-store" ||
		h.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("%s: %d without the protective headers: %v", what, resp.StatusCode, h)
	}
}

func TestSecurity(t *testing.T) {
	f := &fake{}
	s, err := newServer(f, 4242)
	if err != nil {
		t.Fatal(err)
	}
	const host = "127.0.0.1:4242"
	cookie := s.cookie + "=" + s.token

	// Without the token: refused, with the headers still set.
	resp := request(t, s, "GET", "/", host, nil, "")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") ||
		strings.Contains(csp, "unsafe") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("headers: %v", resp.Header)
	}
	if resp := request(t, s, "GET", "/?token=wrong", host, nil, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d", resp.StatusCode)
	}
	// The token is traded for a cookie and dropped from the URL.
	resp = request(t, s, "GET", "/?token="+s.token, host, nil, "")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("the token: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if c := resp.Cookies(); len(c) != 1 || c[0].Value != s.token || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("the cookie: %+v", c)
	}
	// The redirect goes to the page, never to a path the request chose.
	if resp := request(t, s, "GET", "//evil.example/?token="+s.token, host, nil, ""); resp.Header.Get("Location") != "/" {
		t.Errorf("the redirect of //evil.example: %q", resp.Header.Get("Location"))
	}
	// A token in a POST is no credential.
	if resp := request(t, s, "POST", "/api/approvals/a1/decide?token="+s.token, host, map[string]string{"X-Airlock-CSRF": s.csrf, "Content-Type": "application/json"}, `{"decision":"approve","digest":"d"}`); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST with the token in the URL: %d", resp.StatusCode)
	}
	// With the cookie: the page, which carries the CSRF token and no inline script.
	resp = request(t, s, "GET", "/", host, map[string]string{"Cookie": cookie}, "")
	page, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(page), s.csrf) || strings.Contains(string(page), "<script>") || strings.Contains(string(page), "style=") {
		t.Fatalf("the page: %d\n%s", resp.StatusCode, page)
	}
	// Another Host (DNS rebinding) or port: refused even with the cookie.
	for _, h := range []string{"evil.example:4242", "127.0.0.1:4243", "localhost.evil.example:4242", "127.0.0.1",
		"127.0.0.2:4242", "[::ffff:127.0.0.1]:4242", "127.1:4242", "0x7f000001:4242", "LOCALHOST.:4242", ""} {
		if resp := request(t, s, "GET", "/api/approvals", h, map[string]string{"Cookie": cookie}, ""); resp.StatusCode != http.StatusForbidden {
			t.Errorf("Host %q: %d, want 403", h, resp.StatusCode)
		}
	}
	for _, h := range []string{"localhost:4242", "[::1]:4242"} {
		if resp := request(t, s, "GET", "/api/approvals", h, map[string]string{"Cookie": cookie}, ""); resp.StatusCode != 200 {
			t.Errorf("Host %q: %d, want 200", h, resp.StatusCode)
		}
	}
	// Mutations: POST only, with the CSRF header, JSON and the console's Origin.
	good := map[string]string{"Cookie": cookie, "X-Airlock-CSRF": s.csrf, "Content-Type": "application/json", "Origin": "http://" + host}
	decide := `{"decision":"approve","digest":"sha256:x","comment":"ok"}`
	for name, change := range map[string][2]string{
		"no CSRF header":   {"X-Airlock-CSRF", ""},
		"wrong CSRF":       {"X-Airlock-CSRF", s.token},
		"form post":        {"Content-Type", "application/x-www-form-urlencoded"},
		"other origin":     {"Origin", "http://evil.example"},
		"cross-site fetch": {"Sec-Fetch-Site", "cross-site"},
	} {
		h := map[string]string{}
		for k, v := range good {
			h[k] = v
		}
		h[change[0]] = change[1]
		if resp := request(t, s, "POST", "/api/approvals/a1/decide", host, h, decide); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, resp.StatusCode)
		}
	}
	if len(f.decided) != 0 {
		t.Fatalf("refused requests decided %v", f.decided)
	}
	if resp := request(t, s, "GET", "/api/approvals/a1/decide", host, good, ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET of decide: %d", resp.StatusCode)
	}
	if resp := request(t, s, "POST", "/api/approvals/a1/decide", host, good, `{"decision":"deny","digest":"sha256:x"}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a denial without a comment: %d", resp.StatusCode)
	}
	if resp := request(t, s, "POST", "/api/approvals/a1/decide", host, good, decide); resp.StatusCode != 200 || len(f.decided) != 1 {
		t.Errorf("a good decision: %d, decided %v", resp.StatusCode, f.decided)
	}
	resp = request(t, s, "POST", "/api/approvals/refused/decide", host, good, decide)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "may not decide") {
		t.Errorf("the authority's refusal: %d %s", resp.StatusCode, body)
	}
	// A decision body is one bounded JSON object.
	for name, body := range map[string]string{
		"trailing data": decide + `{"decision":"deny","digest":"sha256:y","comment":"x"}`,
		"unknown field": `{"decision":"approve","digest":"sha256:x","also":1}`,
		"too large":     `{"decision":"approve","digest":"sha256:x","comment":"` + strings.Repeat("a", maxDecision) + `"}`,
		"not JSON":      `decision=approve`,
	} {
		if resp := request(t, s, "POST", "/api/approvals/a1/decide", host, good, body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, resp.StatusCode)
		}
	}
	if len(f.decided) != 1 {
		t.Fatalf("refused bodies decided %v", f.decided)
	}
	// Every other answer carries the headers too: a missing static file,
	// a wrong method, an unknown path, the script and the style.
	for _, p := range []string{"/static/missing.js", "/static/", "/nothing", "/api/nothing", "/static/app.css"} {
		request(t, s, "GET", p, host, map[string]string{"Cookie": cookie}, "")
	}
	request(t, s, "DELETE", "/api/approvals/a1", host, map[string]string{"Cookie": cookie}, "")
	// The static files are the embedded ones, with their types.
	resp = request(t, s, "GET", "/static/app.js", host, map[string]string{"Cookie": cookie}, "")
	js, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") || strings.Contains(string(js), "innerHTML") {
		t.Errorf("app.js: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestScriptWritesText fails if the page's script gains a way to turn data
// into markup or code: every byte of data must reach the document as text.
func TestScriptWritesText(t *testing.T) {
	js, err := assets.ReadFile("assets/static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	code := string(js)
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
		"setTimeout(\"", "createContextualFragment", "DOMParser", "srcdoc", ".href =", ".src =", "javascript:", "location ="} {
		if strings.Contains(code, sink) {
			t.Errorf("app.js uses %q: data would reach the document as markup or code", sink)
		}
	}
	// Attributes come from el(); an href it is given must be a fragment
	// the script builds ("#/..."), never data.
	for _, line := range strings.Split(code, "\n") {
		if i := strings.Index(line, "href:"); i >= 0 && !strings.HasPrefix(strings.TrimSpace(line[i+len("href:"):]), `"#/`) {
			t.Errorf("app.js builds an href not under \"#/\": %s", strings.TrimSpace(line))
		}
	}
	page, err := assets.ReadFile("assets/index.html")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(page), "<script>") || strings.Contains(string(page), "style=") || strings.Contains(string(page), " on") && strings.Contains(string(page), "onload=") {
		t.Errorf("index.html has inline script or style")
	}
}

// TestHTTPServerBounds: a client that stalls or sends huge headers holds
// nothing for long.
func TestHTTPServerBounds(t *testing.T) {
	s, err := newServer(&fake{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	srv := s.httpServer()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 ||
		srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 1<<20 {
		t.Errorf("unbounded: %+v", srv)
	}
}
