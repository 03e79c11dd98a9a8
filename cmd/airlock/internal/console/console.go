// Package console is the approver's web page, `airlock console`: a small
// HTTP server on loopback that acts for one approver with the approver's
// own certificate, as `kubectl proxy` does, so no credential reaches the
// browser. It lists the pending approvals, shows one request's whole
// review, approves or denies it with a comment, and lists a job's audit
// trail. What it shows comes from a Backend (package cli implements it
// with the CLI's own client and review text); this package owns the HTTP
// side and its security: a random token per start that the first request
// trades for a SameSite=Strict, HttpOnly cookie; Host and Origin checks
// against DNS rebinding and cross-site requests; mutations by POST with a
// per-start CSRF token in a header; a strict Content-Security-Policy; and
// a page whose script and style are files embedded here (go:embed), never
// inline, that writes every byte of data as text (textContent).
package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
)

// Backend is what the console shows and does, as the approver. Every
// string it returns that came from a job, a caller or a repository is
// already escaped for display (package termtext's form for files: an
// escape stands between ⟦ and ⟧); the page shows it as text.
type Backend interface {
	// Identity is whom the console acts as, e.g. approver/alice.
	Identity() string
	// Approvals lists the pending requests the approver may see.
	Approvals(ctx context.Context) ([]Approval, error)
	// Review is one request with its review material.
	Review(ctx context.Context, id string) (*Review, error)
	// FullReview streams the request's whole bundle through the authority
	// and says whether the authority vouched for every byte.
	FullReview(ctx context.Context, id string) (*Section, error)
	// Decide approves or denies the request for digest, the bundle digest
	// the approver reviewed.
	Decide(ctx context.Context, id, digest string, approve bool, comment string) (*Approval, error)
	// Audit lists a job's audit events, oldest first.
	Audit(ctx context.Context, jobID string) ([]AuditEvent, error)
}

// Approval is one request as the list shows it.
type Approval struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	JobID     string `json:"job_id"`
	State     string `json:"state"`
	Pending   bool   `json:"pending"`
	Votes     string `json:"votes"`
	What      string `json:"what"`
	Requester string `json:"requester"`
	Digest    string `json:"digest"`
	Expires   string `json:"expires"`
}

// Review is one request and its review, in sections of text.
type Review struct {
	Approval Approval `json:"approval"`
	// HasBundle says a full, verified review can be streamed.
	HasBundle bool      `json:"has_bundle"`
	Sections  []Section `json:"sections"`
}

// Section is a titled text of any length; the page virtualizes long ones.
type Section struct {
	Title string `json:"title"`
	Text  string `json:"text"`
	// Verdict is a one-line conclusion, e.g. whether the bundle was
	// verified; Failed marks it as a failure.
	Verdict string `json:"verdict,omitempty"`
	Failed  bool   `json:"failed,omitempty"`
}

// AuditEvent is one audit event as the trail shows it.
type AuditEvent struct {
	Sequence int64  `json:"seq"`
	Time     string `json:"time"`
	Kind     string `json:"kind"`
	Outcome  string `json:"outcome"`
	Caller   string `json:"caller"`
	Subject  string `json:"subject"`
	Reason   string `json:"reason"`
}

// CheckListen refuses a listen address that is not a loopback one: the
// console acts with the approver's certificate for whoever can reach it.
// flag names the flag in the error.
func CheckListen(flag, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT on loopback, e.g. 127.0.0.1:0: %v", flag, addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s %q: the console listens on loopback only (127.0.0.1, ::1 or localhost): it acts with the approver's certificate for anyone who reaches it", flag, addr)
	}
	return nil
}

//go:embed assets
var assets embed.FS

// Server is the console's HTTP side for one start.
type Server struct {
	backend Backend
	token   string // in the URL once, then the cookie's value
	csrf    string // the header every POST carries
	port    string // the port listened on: Host must name it
	// listenHost is the loopback IP listened on (e.g. 127.1.2.3), which
	// Host may name too.
	listenHost string
	cookie     string
	page       *template.Template
	static     fs.FS
}

// Listen listens on addr (checked by CheckListen) and returns a server for
// it and the URL to open, which carries the token.
func Listen(addr string, b Backend) (*Server, net.Listener, string, error) {
	if err := CheckListen("--listen", addr); err != nil {
		return nil, nil, "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, "", fmt.Errorf("--listen %q: %w", addr, err)
	}
	s, err := newServer(b, ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		ln.Close()
		return nil, nil, "", err
	}
	s.listenHost = ln.Addr().(*net.TCPAddr).IP.String()
	u := url.URL{Scheme: "http", Host: ln.Addr().String(), Path: "/", RawQuery: "token=" + s.token}
	return s, ln, u.String(), nil
}

func newServer(b Backend, port int) (*Server, error) {
	token, err := random()
	if err != nil {
		return nil, err
	}
	csrf, err := random()
	if err != nil {
		return nil, err
	}
	page, err := template.ParseFS(assets, "assets/index.html")
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	p := strconv.Itoa(port)
	return &Server{backend: b, token: token, csrf: csrf, port: p, cookie: "airlock_console_" + p, page: page, static: static}, nil
}

// random is 32 random bytes in hex.
func random() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("console token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Serve serves on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := s.httpServer()
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		case <-done:
		}
	}()
	err := srv.Serve(ln)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// httpServer is the console's http.Server: bounded headers, and every
// phase of a request timed out, so a client that stalls holds nothing for
// long. A full review streams a whole bundle before it answers: the write
// deadline leaves it minutes.
func (s *Server) httpServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      10 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// csp is the page's Content-Security-Policy: its own script and style
// files, nothing inline, nothing from elsewhere, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// Handler is the console's whole HTTP handler: every request passes the
// Host check and the token check before any route.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.index)
	mux.HandleFunc("GET /static/{name}", s.staticFile)
	mux.HandleFunc("GET /api/approvals", s.listApprovals)
	mux.HandleFunc("GET /api/approvals/{id}", s.getReview)
	mux.HandleFunc("GET /api/approvals/{id}/full", s.getFull)
	mux.HandleFunc("POST /api/approvals/{id}/decide", s.decide)
	mux.HandleFunc("GET /api/audit", s.audit)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if !s.hostOK(r.Host) {
			// A DNS-rebinding page reaches us under its own name.
			http.Error(w, "forbidden: the console answers only to its loopback address (Host "+strconv.Quote(r.Host)+")", http.StatusForbidden)
			return
		}
		if !s.authorized(w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// hostOK reports whether host is 127.0.0.1, [::1], localhost or the
// address listened on, with the console's port: the names a browser uses
// for the printed URL, and never one a DNS-rebinding page can be reached
// under.
func (s *Server) hostOK(host string) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != s.port {
		return false
	}
	return h == "127.0.0.1" || h == "::1" || h == "localhost" || (s.listenHost != "" && h == s.listenHost)
}

// authorized checks the cookie, or trades a valid ?token= for it with a
// redirect that drops the token from the URL; it answers 401 otherwise.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if c, err := r.Cookie(s.cookie); err == nil && equal(c.Value, s.token) {
		if r.URL.Query().Has("token") && r.Method == http.MethodGet {
			s.redirectClean(w, r)
			return false
		}
		return true
	}
	if t := r.URL.Query().Get("token"); t != "" && r.Method == http.MethodGet && equal(t, s.token) {
		http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: s.token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		s.redirectClean(w, r)
		return false
	}
	http.Error(w, "unauthorized: open the URL airlock console printed (it carries this start's token)", http.StatusUnauthorized)
	return false
}

// redirectClean redirects to the page, without the token: always to "/",
// so no path of the request's choosing ends up in a Location.
func (s *Server) redirectClean(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	// Rendered whole before a byte is sent: never half a page.
	var page bytes.Buffer
	if err := s.page.Execute(&page, struct{ CSRF, Identity string }{s.csrf, s.backend.Identity()}); err != nil {
		http.Error(w, "the console's page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(page.Bytes())
}

// staticFile answers one embedded file by name, with its type; nothing
// else (no directory listing, and a 404 that keeps every header the
// handler set, which http.FileServer's error answers drop in part).
func (s *Server) staticFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	data, err := fs.ReadFile(s.static, name)
	ctype := mime.TypeByExtension(path.Ext(name))
	if err != nil || ctype == "" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Write(data)
}

// writeJSON answers v as JSON, encoded whole before a byte is sent.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "the console's answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// fail answers an error as {"error": text}: the authority's answer (its
// message, escaped by the backend) with 502, the page's own mistakes 400.
func fail(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	list, err := s.backend.Approvals(r.Context())
	if err != nil {
		fail(w, http.StatusBadGateway, err)
		return
	}
	if list == nil {
		list = []Approval{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": list})
}

func (s *Server) getReview(w http.ResponseWriter, r *http.Request) {
	rv, err := s.backend.Review(r.Context(), r.PathValue("id"))
	if err != nil {
		fail(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, rv)
}

func (s *Server) getFull(w http.ResponseWriter, r *http.Request) {
	sec, err := s.backend.FullReview(r.Context(), r.PathValue("id"))
	if err != nil {
		fail(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, sec)
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	job := r.URL.Query().Get("job")
	if job == "" {
		fail(w, http.StatusBadRequest, errors.New("job: required"))
		return
	}
	events, err := s.backend.Audit(r.Context(), job)
	if err != nil {
		fail(w, http.StatusBadGateway, err)
		return
	}
	if events == nil {
		events = []AuditEvent{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": events})
}

// maxDecision bounds a decision's body.
const maxDecision = 64 << 10

func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	if err := s.checkMutation(r); err != nil {
		fail(w, http.StatusForbidden, err)
		return
	}
	var d struct {
		Decision string `json:"decision"`
		Comment  string `json:"comment"`
		Digest   string `json:"digest"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDecision))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		fail(w, http.StatusBadRequest, fmt.Errorf("decision: %v", err))
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		// One JSON object and nothing after it.
		fail(w, http.StatusBadRequest, errors.New("decision: one JSON object, and nothing after it"))
		return
	}
	if d.Decision != "approve" && d.Decision != "deny" {
		fail(w, http.StatusBadRequest, fmt.Errorf("decision %q: want approve or deny", d.Decision))
		return
	}
	if d.Digest == "" {
		fail(w, http.StatusBadRequest, errors.New("digest: required, the bundle digest reviewed"))
		return
	}
	if d.Decision == "deny" && strings.TrimSpace(d.Comment) == "" {
		fail(w, http.StatusBadRequest, errors.New("comment: required when denying"))
		return
	}
	a, err := s.backend.Decide(r.Context(), r.PathValue("id"), d.Digest, d.Decision == "approve", d.Comment)
	if err != nil {
		fail(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// checkMutation refuses a POST that did not come from the console's own
// page: it must carry the CSRF header and JSON, and an Origin, when sent,
// must be the console's own.
func (s *Server) checkMutation(r *http.Request) error {
	if !equal(r.Header.Get("X-Airlock-CSRF"), s.csrf) {
		return errors.New("forbidden: missing or wrong X-Airlock-CSRF header")
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("forbidden: Content-Type %q, want application/json", ct)
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host {
		return fmt.Errorf("forbidden: Origin %q is not the console's", o)
	}
	if sf := r.Header.Get("Sec-Fetch-Site"); sf != "" && sf != "same-origin" {
		return fmt.Errorf("forbidden: Sec-Fetch-Site %q", sf)
	}
	return nil
}
