// Package gitserve owns a small git server: bare repositories served over
// git's own smart HTTP protocol, by running `git http-backend` as a CGI
// program, over TLS, to clients that authenticate with HTTP Basic (the
// password is the token; git sends it from http.extraHeader). Each
// repository has read tokens, which may fetch, and push tokens, which may
// fetch and push; there is no anonymous access. Branches are protected the
// way git itself protects them: no non-fast-forward update and no deletion,
// whoever pushes. A fetch's ref listing in git's original protocol is
// answered from the last one while the refs are byte for byte as they were
// (advert.go).
//
// It is the dev stack's remote (the airlock CLI runs it as `dev git-serve`)
// and a test fixture. It knows nothing of Airlock's services or tenants, and
// no service imports it outside its tests.
package gitserve

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Defaults for the zero values of Config's bounds.
const (
	DefaultMaxFetchRequest = 64 << 20
	DefaultMaxPush         = 512 << 20
	DefaultMaxConcurrent   = 16
	// MinTokenLength keeps guessable tokens out of the configuration.
	MinTokenLength = 16
)

// Repository is one repository the server serves, at /NAME.git/, from the
// bare repository NAME.git under Config.Root.
type Repository struct {
	Name string
	// ReadTokens may fetch; PushTokens may fetch and push.
	ReadTokens, PushTokens []string
}

// Config is what New needs.
type Config struct {
	// Root holds the bare repositories, NAME.git each.
	Root string
	// Repositories are the only ones served; anything else under Root is not.
	Repositories []Repository
	// Git is the git binary; default git from $PATH.
	Git string
	// MaxFetchRequest bounds a fetch's request body (its negotiation),
	// compressed or not; default DefaultMaxFetchRequest.
	MaxFetchRequest int64
	// MaxPush bounds a push's request body and the pack in it; default
	// DefaultMaxPush.
	MaxPush int64
	// MaxConcurrent bounds the git processes serving requests at once;
	// default DefaultMaxConcurrent. Further requests wait.
	MaxConcurrent int
	// SpoolDir holds request bodies sent without a length (chunked), which
	// CGI cannot pass on, while they are read; default os.TempDir(). The
	// files are unlinked as soon as they are made.
	SpoolDir string
	// Logger gets one line per request; default slog.Default().
	Logger *slog.Logger
}

// Access is what a token may do with a repository.
type Access int

// Access levels, each including the one before.
const (
	NoAccess Access = iota
	ReadAccess
	PushAccess
)

func (a Access) String() string {
	switch a {
	case ReadAccess:
		return "read"
	case PushAccess:
		return "push"
	}
	return "none"
}

// Server serves the configured repositories. It is an http.Handler; Serve
// runs it over TLS.
type Server struct {
	cfg   Config
	git   string
	home  string
	repos map[string]*repo
	slots chan struct{}
	log   *slog.Logger
}

type repo struct {
	name, dir string
	tokens    []token
	advert    advertCache
}

// token is a token's SHA-256, so that comparing a presented token with it
// takes the same time whatever the lengths, and the server keeps no token.
type token struct {
	sum    [sha256.Size]byte
	access Access
}

// namePattern is what a repository name may be: one path element that no
// URL or file-system trick can widen.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$`)

// CheckName reports whether name may be served as /NAME.git.
func CheckName(name string) error {
	if len(name) > 100 || !namePattern.MatchString(name) || strings.HasSuffix(name, ".git") {
		return fmt.Errorf("repository name %q: want letters, digits, '-', '_' and inner dots, at most 100, not ending in .git", name)
	}
	return nil
}

// New checks cfg, applies the branch protection to each repository's
// config (see Protect) and returns a Server.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxFetchRequest == 0 {
		cfg.MaxFetchRequest = DefaultMaxFetchRequest
	}
	if cfg.MaxPush == 0 {
		cfg.MaxPush = DefaultMaxPush
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	}
	if cfg.MaxFetchRequest < 0 || cfg.MaxPush < 0 || cfg.MaxConcurrent < 0 {
		return nil, errors.New("gitserve: negative bound")
	}
	git, err := lookGit(cfg.Git)
	if err != nil {
		return nil, err
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("gitserve: root: %w", err)
	}
	if len(cfg.Repositories) == 0 {
		return nil, errors.New("gitserve: no repositories")
	}
	s := &Server{cfg: cfg, git: git, home: cfg.SpoolDir, repos: map[string]*repo{},
		slots: make(chan struct{}, cfg.MaxConcurrent), log: cfg.Logger}
	seen := map[[sha256.Size]byte]string{}
	for _, r := range cfg.Repositories {
		if err := CheckName(r.Name); err != nil {
			return nil, fmt.Errorf("gitserve: %w", err)
		}
		if _, dup := s.repos[r.Name]; dup {
			return nil, fmt.Errorf("gitserve: repository %q listed twice", r.Name)
		}
		rp := &repo{name: r.Name, dir: filepath.Join(root, r.Name+".git")}
		if !isBare(rp.dir) {
			return nil, fmt.Errorf("gitserve: repository %q: %s is not a bare git repository", r.Name, rp.dir)
		}
		if len(r.ReadTokens)+len(r.PushTokens) == 0 {
			return nil, fmt.Errorf("gitserve: repository %q has no token: nobody could reach it", r.Name)
		}
		for _, set := range []struct {
			tokens []string
			access Access
		}{{r.ReadTokens, ReadAccess}, {r.PushTokens, PushAccess}} {
			for i, t := range set.tokens {
				// Never the token itself in an error: it is a secret.
				where := fmt.Sprintf("repository %q: %s token %d", r.Name, set.access, i)
				if len(t) < MinTokenLength || strings.ContainsAny(t, "\x00\r\n") {
					return nil, fmt.Errorf("gitserve: %s: want at least %d characters on one line", where, MinTokenLength)
				}
				sum := sha256.Sum256([]byte(t))
				if other, dup := seen[sum]; dup {
					return nil, fmt.Errorf("gitserve: %s is also %s: give each its own", where, other)
				}
				seen[sum] = where
				rp.tokens = append(rp.tokens, token{sum: sum, access: set.access})
			}
		}
		if err := Protect(ctx, git, rp.dir); err != nil {
			return nil, err
		}
		s.repos[r.Name] = rp
	}
	return s, nil
}

// Serve serves s over TLS on ln until ctx ends, then stops: in-flight
// requests get a few seconds to finish. It speaks HTTP/1.1 only, which is
// what git's smart HTTP and CGI are made for.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tlsConfig *tls.Config) error {
	tc := tlsConfig.Clone()
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	tc.NextProtos = []string{"http/1.1"}
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         tc,
		ReadHeaderTimeout: 10 * time.Second,
		// A push of MaxPush over a slow link is the longest request.
		ReadTimeout:    10 * time.Minute,
		WriteTimeout:   30 * time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// healthPath answers 200 to anyone: it tells nothing but that the server
// is up.
const healthPath = "/healthz"

// request is what routing and authorization found out about one request,
// for its log line.
type request struct {
	repo    *repo
	service string
	access  Access
	reason  string
	bodyIn  int64
}

// ServeHTTP serves /healthz (200, to anyone: it tells nothing) and the smart
// HTTP endpoints of the configured repositories; anything else is 404.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	var q request
	s.serve(sw, r, &q)
	attrs := []any{"method", r.Method, "remote", r.RemoteAddr, "status", sw.status, "duration", time.Since(start)}
	// Only names the server configured reach the log: anything else in a
	// path or query is the client's and might be a secret pasted there.
	if q.repo != nil {
		attrs = append(attrs, "repository", q.repo.name)
	}
	if q.service != "" {
		// Not "service": Airlock's logs tag every line with the process's.
		attrs = append(attrs, "git_service", q.service)
	}
	if q.access != NoAccess {
		attrs = append(attrs, "access", q.access.String())
	}
	if q.bodyIn > 0 {
		attrs = append(attrs, "request_bytes", q.bodyIn)
	}
	switch {
	case q.reason != "":
		s.log.Warn("git request denied", append(attrs, "reason", q.reason)...)
	case r.URL.Path == healthPath:
		s.log.Debug("health check", attrs...)
	default:
		s.log.Info("git request", append(attrs, "bytes", sw.bytes)...)
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, q *request) {
	deny := func(code int, reason string) {
		q.reason = reason
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Basic realm="git", charset="UTF-8"`)
		}
		http.Error(w, http.StatusText(code), code)
	}
	if r.URL.Path == healthPath && r.Method == http.MethodGet {
		io.WriteString(w, "ok\n")
		return
	}
	name, endpoint, ok := splitPath(r.URL.Path)
	if !ok {
		deny(http.StatusNotFound, "not a repository endpoint")
		return
	}
	var need Access
	switch {
	case endpoint == "info/refs" && r.Method == http.MethodGet:
		switch r.URL.RawQuery {
		case "service=git-upload-pack":
			q.service, need = "git-upload-pack", ReadAccess
		case "service=git-receive-pack":
			q.service, need = "git-receive-pack", PushAccess
		default:
			// git's dumb protocol, or a query of the client's own.
			deny(http.StatusForbidden, "only the smart protocol is served")
			return
		}
	case endpoint == "git-upload-pack" && r.Method == http.MethodPost:
		q.service, need = endpoint, ReadAccess
	case endpoint == "git-receive-pack" && r.Method == http.MethodPost:
		q.service, need = endpoint, PushAccess
	case endpoint == "info/refs" || endpoint == "git-upload-pack" || endpoint == "git-receive-pack":
		deny(http.StatusMethodNotAllowed, "method not allowed")
		return
	default:
		deny(http.StatusNotFound, "not a repository endpoint")
		return
	}
	if r.Method == http.MethodPost && (r.URL.RawQuery != "" || r.Header.Get("Content-Type") != "application/x-"+q.service+"-request") {
		deny(http.StatusBadRequest, "not a "+q.service+" request")
		return
	}

	_, password, ok := r.BasicAuth()
	if !ok || password == "" {
		deny(http.StatusUnauthorized, "no credential")
		return
	}
	rp := s.repos[name]
	access, known := s.authorize(password, rp)
	switch {
	case !known:
		deny(http.StatusUnauthorized, "unknown credential")
		return
	case access == NoAccess:
		// A credential of another repository learns nothing of this one,
		// not even that it exists.
		deny(http.StatusNotFound, "no such repository for this credential")
		return
	}
	q.repo, q.access = rp, access
	if access < need {
		deny(http.StatusForbidden, q.service+" needs the push credential")
		return
	}

	limit := s.cfg.MaxFetchRequest
	if q.service == "git-receive-pack" {
		limit = s.cfg.MaxPush
	}
	body, n, err := s.boundBody(w, r, limit)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			deny(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", limit))
			return
		}
		deny(http.StatusBadRequest, "request body unreadable")
		return
	}
	defer body.Close()
	q.bodyIn = n

	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.slots <- struct{}{}:
			defer func() { <-s.slots }()
		case <-r.Context().Done():
			deny(http.StatusServiceUnavailable, "client gone while waiting for a free slot")
			return
		}
		s.backend(rp, access, limit).ServeHTTP(w, s.cgiRequest(r, body, n))
	})
	if cacheable(r, q.service) {
		s.serveAdvert(w, r, rp, backend)
		return
	}
	backend(w, r)
}

// splitPath parses /NAME.git/ENDPOINT, where NAME passes CheckName; git's
// own path handling never sees anything else.
func splitPath(p string) (name, endpoint string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/")
	if !ok {
		return "", "", false
	}
	first, endpoint, ok := strings.Cut(rest, "/")
	if !ok {
		return "", "", false
	}
	name, ok = strings.CutSuffix(first, ".git")
	if !ok || CheckName(name) != nil {
		return "", "", false
	}
	return name, endpoint, true
}

// authorize returns what password may do with rp (nil: an unknown
// repository, for which it may do nothing), and whether it is any
// repository's token at all. Every token is compared, in constant time, so
// the time taken says nothing about which one matched.
func (s *Server) authorize(password string, rp *repo) (Access, bool) {
	sum := sha256.Sum256([]byte(password))
	access, known := NoAccess, false
	for _, other := range s.repos {
		for _, t := range other.tokens {
			if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
				known = true
				if other == rp && t.access > access {
					access = t.access
				}
			}
		}
	}
	return access, known
}

// boundBody returns the request body, at most limit bytes. A body of
// unknown length (chunked, as git sends a large push) is read to a spool
// file first, since CGI hands the program a length.
func (s *Server) boundBody(w http.ResponseWriter, r *http.Request, limit int64) (io.ReadCloser, int64, error) {
	if r.ContentLength > limit {
		return nil, 0, &http.MaxBytesError{Limit: limit}
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength >= 0 {
		return body, r.ContentLength, nil
	}
	f, err := os.CreateTemp(s.cfg.SpoolDir, ".gitserve-body-*")
	if err != nil {
		return nil, 0, err
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, body)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, n, nil
}

// cgiRequest is r as the backend gets it: with a known length, and without
// the credential, which would otherwise reach the backend's environment as
// HTTP_AUTHORIZATION.
func (s *Server) cgiRequest(r *http.Request, body io.ReadCloser, n int64) *http.Request {
	out := r.Clone(r.Context())
	out.Body, out.ContentLength, out.TransferEncoding = body, n, nil
	for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie"} {
		out.Header.Del(h)
	}
	return out
}

// backend is `git http-backend` for one request of rp with the given
// access. Its config comes from the environment, which outranks every
// file: receive-pack only for a pusher, and the protection that Protect
// also writes into the repository.
func (s *Server) backend(rp *repo, access Access, limit int64) *cgi.Handler {
	cfg := append(protection(s.cfg.MaxPush),
		[2]string{"http.uploadpack", "true"},
		[2]string{"http.receivepack", strconv.FormatBool(access >= PushAccess)},
		[2]string{"http.getanyfile", "false"},
		[2]string{"core.hooksPath", os.DevNull},
		[2]string{"safe.directory", rp.dir},
	)
	env := append(sealedEnv(s.home, cfg),
		"GIT_PROJECT_ROOT="+filepath.Dir(rp.dir),
		"GIT_HTTP_EXPORT_ALL=1",
		"GIT_HTTP_MAX_REQUEST_BUFFER="+strconv.FormatInt(limit, 10),
		// The reflog's name for whoever pushed.
		"REMOTE_USER=airlock-"+access.String(),
	)
	return &cgi.Handler{
		Path:   s.git,
		Args:   []string{"http-backend"},
		Dir:    filepath.Dir(rp.dir),
		Env:    env,
		Logger: slog.NewLogLogger(s.log.With("repository", rp.name).Handler(), slog.LevelWarn),
		Stderr: &logWriter{log: s.log, repo: rp.name},
	}
}

// statusWriter remembers the status and size of a response for the log.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logWriter logs what the backend writes to stderr, a bounded line at a
// time (it holds no credential: the backend is never given one).
type logWriter struct {
	log  *slog.Logger
	repo string
}

func (l *logWriter) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		if len(line) > 1000 {
			line = line[:1000] + "…"
		}
		l.log.Warn("git http-backend", "repository", l.repo, "stderr", line)
	}
	return len(p), nil
}

func lookGit(git string) (string, error) {
	if git == "" {
		git = "git"
	}
	path, err := exec.LookPath(git)
	if err != nil {
		return "", fmt.Errorf("gitserve: git is required: %w", err)
	}
	// The CGI handler runs the path as given, without a search.
	return filepath.Abs(path)
}
