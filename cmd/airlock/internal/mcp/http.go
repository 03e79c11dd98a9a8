package mcp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TokenEnv is the environment variable a token may come from.
const TokenEnv = "AIRLOCK_MCP_TOKEN"

// minToken is the shortest token taken from a file or the environment.
const minToken = 16

// CheckLoopback refuses an --http address that is not 127.0.0.1 or ::1
// with a port: the server acts with the client's certificate, so it
// listens where only this machine reaches it.
func CheckLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: want 127.0.0.1:PORT or [::1]:PORT: %v", addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || !(ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback)) {
		return fmt.Errorf("--http %q: the MCP server listens on loopback only (127.0.0.1 or ::1), never on %q: it acts with this client's certificate", addr, host)
	}
	if port == "" {
		return fmt.Errorf("--http %q: no port (0 picks a free one)", addr)
	}
	return nil
}

// Token is the bearer token for the HTTP transport: the first line of
// file when given, else $AIRLOCK_MCP_TOKEN, else a fresh random one
// (generated true, to be shown once).
func Token(file string) (tok string, generated bool, err error) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", false, fmt.Errorf("--token-file: %v", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		tok = strings.TrimSpace(line)
		if len(tok) < minToken {
			return "", false, fmt.Errorf("--token-file %s: the token must be at least %d characters", file, minToken)
		}
		return tok, false, nil
	case os.Getenv(TokenEnv) != "":
		tok = strings.TrimSpace(os.Getenv(TokenEnv))
		if len(tok) < minToken {
			return "", false, fmt.Errorf("$%s: the token must be at least %d characters", TokenEnv, minToken)
		}
		return tok, false, nil
	}
	return randomID("")[:32], true, nil
}

// RequireToken serves next only to requests whose Authorization header is
// "Bearer TOKEN"; every other gets 401. The comparison takes the same time
// whatever the header holds (SHA-256 of both, compared in constant time).
func RequireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock mcp"`)
			http.Error(w, "airlock mcp: a bearer token is required (Authorization: Bearer TOKEN; the token airlock mcp printed or was given)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxBody bounds a request's body: write_file's 1 MiB of content, each
// byte escaped as JSON's \u00XX at worst, fits.
const maxBody = 8 << 20

// RequireSameOrigin refuses (403) a request a web page made: one whose
// Origin is set and is not this server's own (the scheme http and the
// host:port of the Host header, itself a loopback name), or whose
// Sec-Fetch-Site says cross-site or same-site. An MCP client that is not a
// browser sends no Origin. With the SDK's check of Host (a DNS-rebound
// name is refused) this keeps a page on another site from POSTing to the
// loopback port even before it would need the token.
func RequireSameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		site := r.Header.Get("Sec-Fetch-Site")
		if (origin != "" && !sameOrigin(origin, r.Host)) || site == "cross-site" || site == "same-site" {
			http.Error(w, fmt.Sprintf("airlock mcp: a request from a web page (Origin %q, Sec-Fetch-Site %q) is refused: only a local MCP client, or a page served by this server, may call it", Line(origin), Line(site)), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameOrigin: origin is http://HOST where HOST is host (the request's
// Host header) and a loopback name.
func sameOrigin(origin, host string) bool {
	rest, ok := strings.CutPrefix(origin, "http://")
	if !ok || !strings.EqualFold(rest, host) {
		return false
	}
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return strings.EqualFold(h, "localhost") || (ip != nil && ip.IsLoopback())
}

// Handler is the streamable HTTP transport of s at /mcp behind the Origin
// check and the token, each request's body at most maxBody bytes.
func Handler(s *mcp.Server, token string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{MaxRequestBodyBytes: maxBody}))
	return RequireSameOrigin(RequireToken(token, mux))
}

// ServeHTTP listens on addr (loopback only), calls ready with the address
// it listens on, and serves s until ctx ends.
func ServeHTTP(ctx context.Context, s *mcp.Server, addr, token string, ready func(net.Addr)) error {
	if err := CheckLoopback(addr); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http %s: %v", addr, err)
	}
	// No ReadTimeout or WriteTimeout: a run streams for as long as its
	// command takes. Headers must come within 10s, an idle connection is
	// closed after 2 minutes, and the body is bounded (maxBody).
	srv := &http.Server{Handler: Handler(s, token), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	ready(ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
