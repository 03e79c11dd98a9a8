package source

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// refs are the names a repository resolves: HEAD and its branches and tags,
// each to the object it names and, for an annotated tag, to what the tag
// points at (peeled).
type refs struct {
	ids    map[string]string // full ref name ("HEAD", "refs/heads/main") → object id
	peeled map[string]string // ref name → the tag's target, when the server said
}

// candidates are the full names git tries for rev, in git's order
// (git-rev-parse(1), "SPECIFYING REVISIONS"): the name itself when it is
// HEAD or a full ref, then under refs/, refs/tags/, refs/heads/ and
// refs/remotes/.
func candidates(rev string) []string {
	var out []string
	if rev == "HEAD" || strings.HasPrefix(rev, "refs/") {
		out = append(out, rev)
	}
	return append(out, "refs/"+rev, "refs/tags/"+rev, "refs/heads/"+rev, "refs/remotes/"+rev, "refs/remotes/"+rev+"/HEAD")
}

// lookup returns the object rev names in r, peeled where the listing says
// what an annotated tag points at, and whether any name matched.
func (r refs) lookup(rev string) (string, bool) {
	for _, name := range candidates(rev) {
		if id, ok := r.ids[name]; ok {
			if p, ok := r.peeled[name]; ok {
				return p, true
			}
			return id, true
		}
	}
	return "", false
}

// mirrored reports whether a ref of the remote's is one a mirror keeps:
// HEAD, branches and tags (what fetch copies), so that a name resolves to
// what it did when the mirror was fetched by git.
func mirrored(name string) bool {
	return name == "HEAD" || strings.HasPrefix(name, "refs/heads/") || strings.HasPrefix(name, "refs/tags/")
}

// Bounds on what a git server may send for a ref listing.
const (
	maxAdvertisement = 64 << 20
	maxPktLine       = 65520
)

// remoteRefs lists a URL repository's refs: for https, with one request
// over the repository's pooled connection (git's smart HTTP protocol, the
// same GET git ls-remote makes); for file://, by reading the repository's
// refs in place. Concurrent listings of one repository share one request.
func (s *Source) remoteRefs(ctx context.Context, repo policy.Repository) (refs, error) {
	if path, ok := strings.CutPrefix(repo.URL, "file://"); ok {
		gitDir, err := localGitDir(path)
		if err != nil {
			return refs{}, fmt.Errorf("%w: repository %q: %v", errdefs.ErrUnavailable, repo.Name, err)
		}
		return readLocalRefs(gitDir)
	}
	return s.http.list(ctx, repo)
}

// httpRemotes keeps one HTTP client per (CA bundle) and coalesces
// concurrent listings of the same repository.
type httpRemotes struct {
	mu      sync.Mutex
	clients map[string]*http.Client
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	refs refs
	err  error
}

func (h *httpRemotes) list(ctx context.Context, repo policy.Repository) (refs, error) {
	key := repo.URL + "\x00" + repo.CA + "\x00" + repo.Credential
	h.mu.Lock()
	if f, ok := h.flights[key]; ok {
		h.mu.Unlock()
		select {
		case <-f.done:
			return f.refs, f.err
		case <-ctx.Done():
			return refs{}, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	if h.flights == nil {
		h.flights = map[string]*flight{}
	}
	h.flights[key] = f
	h.mu.Unlock()
	// The listing outlives a caller that gives up: others may wait on it.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	f.refs, f.err = h.fetchRefs(lctx, repo)
	cancel()
	h.mu.Lock()
	delete(h.flights, key)
	h.mu.Unlock()
	close(f.done)
	return f.refs, f.err
}

// client returns the pooled client for repo's CA bundle, made once per
// bundle content (an operator who replaces the file gets a new one).
func (h *httpRemotes) client(repo policy.Repository) (*http.Client, error) {
	var pem []byte
	if repo.CA != "" {
		var err error
		if pem, err = os.ReadFile(repo.CA); err != nil {
			return nil, fmt.Errorf("%w: repository %q: ca: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
		}
	}
	sum := sha256.Sum256(pem)
	key := repo.CA + "\x00" + hex.EncodeToString(sum[:])
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.clients[key]; ok {
		return c, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if repo.CA != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: repository %q: ca: no certificate in %s", errdefs.ErrFailedPrecondition, repo.Name, repo.CA)
		}
		tc.RootCAs = pool
	}
	c := &http.Client{
		Transport: &http.Transport{
			// No proxy from the environment: git in the sealed
			// environment used none either.
			Proxy:                 nil,
			TLSClientConfig:       tc,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   15 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
		},
		// A redirect could carry the credential to another host; git
		// here never followed one (http.followRedirects=false) either.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if h.clients == nil {
		h.clients = map[string]*http.Client{}
	}
	h.clients[key] = c
	return c, nil
}

func (h *httpRemotes) fetchRefs(ctx context.Context, repo policy.Repository) (refs, error) {
	c, err := h.client(repo)
	if err != nil {
		return refs{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(repo.URL, "/")+"/info/refs?service=git-upload-pack", nil)
	if err != nil {
		return refs{}, fmt.Errorf("%w: repository %q: url: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
	}
	// Servers speak the smart protocol to git's own user agent.
	req.Header.Set("User-Agent", "git/2.39.5 (airlock)")
	req.Header.Set("Accept", "application/x-git-upload-pack-advertisement")
	cfg, err := remoteConfig(repo)
	if err != nil {
		return refs{}, err
	}
	for _, kv := range cfg {
		if name, value, ok := strings.Cut(kv[1], ": "); kv[0] == "http.extraHeader" && ok {
			req.Header.Set(name, value)
		}
	}
	unreachable := func(why string) error {
		return fmt.Errorf("%w: repository %q could not be reached: %s", errdefs.ErrUnavailable, repo.Name, why)
	}
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return refs{}, ctx.Err()
		}
		// The error names the URL (configuration, never a secret) and
		// what failed: DNS, TCP, TLS.
		return refs{}, unreachable(redact(repo, err.Error()))
	}
	defer func() {
		// Read to the end, so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return refs{}, unreachable(fmt.Sprintf("the server answered %s; a redirect is not followed (it could carry the credential elsewhere): configure the repository's final URL", resp.Status))
	case resp.StatusCode != http.StatusOK:
		return refs{}, unreachable("the server answered " + resp.Status)
	case resp.Header.Get("Content-Type") != "application/x-git-upload-pack-advertisement":
		return refs{}, unreachable(fmt.Sprintf("the server does not speak git's smart HTTP protocol (Content-Type %q)", resp.Header.Get("Content-Type")))
	}
	r, err := parseAdvertisement(io.LimitReader(resp.Body, maxAdvertisement+1))
	if err != nil {
		return refs{}, unreachable("its ref listing: " + err.Error())
	}
	return r, nil
}

// parseAdvertisement reads a smart HTTP ref advertisement (gitprotocol-http(5)):
// the "# service=git-upload-pack" section, then one "id name" line per
// ref (capabilities after a NUL on the first, "name^{}" lines giving an
// annotated tag's target), ending in a flush packet. Only HEAD, branches
// and tags are kept.
func parseAdvertisement(r io.Reader) (refs, error) {
	out := refs{ids: map[string]string{}, peeled: map[string]string{}}
	br := bufio.NewReader(r)
	total := 0
	next := func() ([]byte, bool, error) {
		var hdr [4]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return nil, false, fmt.Errorf("truncated: %v", err)
		}
		n, err := strconv.ParseUint(string(hdr[:]), 16, 16)
		if err != nil {
			return nil, false, fmt.Errorf("bad packet length %q", hdr[:])
		}
		if n == 0 {
			return nil, true, nil
		}
		if n < 4 || n > maxPktLine {
			return nil, false, fmt.Errorf("packet length %d out of range", n)
		}
		total += int(n)
		if total > maxAdvertisement {
			return nil, false, fmt.Errorf("over %d bytes", maxAdvertisement)
		}
		line := make([]byte, n-4)
		if _, err := io.ReadFull(br, line); err != nil {
			return nil, false, fmt.Errorf("truncated: %v", err)
		}
		return bytes.TrimSuffix(line, []byte("\n")), false, nil
	}
	first, flush, err := next()
	if err != nil {
		return refs{}, err
	}
	if flush || string(first) != "# service=git-upload-pack" {
		return refs{}, fmt.Errorf("no service line (got %q)", first)
	}
	if _, flush, err := next(); err != nil || !flush {
		return refs{}, fmt.Errorf("no flush after the service line")
	}
	for i := 0; ; i++ {
		line, flush, err := next()
		if err != nil {
			return refs{}, err
		}
		if flush {
			return out, nil
		}
		if i == 0 {
			line, _, _ = bytes.Cut(line, []byte{0})
		}
		id, name, ok := strings.Cut(string(line), " ")
		if !ok || !isFullSHA(id) {
			return refs{}, fmt.Errorf("bad ref line %q", truncate(string(line), 120))
		}
		if base, ok := strings.CutSuffix(name, "^{}"); ok {
			if mirrored(base) {
				out.peeled[base] = id
			}
			continue
		}
		if mirrored(name) {
			out.ids[name] = id
		}
	}
}

// readLocalRefs reads the refs of the repository at gitDir in place, the
// way git does: HEAD from the git directory itself (a linked worktree has
// its own), the rest from the common directory's loose ref files, then
// its packed-refs file. Symbolic refs are followed.
func readLocalRefs(gitDir string) (refs, error) {
	common := gitDir
	if data, err := os.ReadFile(filepath.Join(gitDir, "commondir")); err == nil {
		c := strings.TrimSpace(string(data))
		if !filepath.IsAbs(c) {
			c = filepath.Join(gitDir, c)
		}
		common = c
	}
	out := refs{ids: map[string]string{}, peeled: map[string]string{}}
	raw := map[string]string{}
	if data, err := os.ReadFile(filepath.Join(common, "packed-refs")); err == nil {
		last := ""
		for line := range strings.Lines(string(data)) {
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "#") || line == "":
			case strings.HasPrefix(line, "^"):
				if last != "" && isFullSHA(line[1:]) {
					out.peeled[last] = line[1:]
				}
			default:
				id, name, ok := strings.Cut(line, " ")
				if ok && isFullSHA(id) {
					raw[name], last = id, name
				}
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return refs{}, fmt.Errorf("source: %w", err)
	}
	for _, dir := range []string{"refs/heads", "refs/tags"} {
		root := filepath.Join(common, dir)
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, _ := filepath.Rel(common, p)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			name := filepath.ToSlash(rel)
			raw[name] = strings.TrimSpace(string(data))
			// A loose ref outranks a packed one, and its peeled value.
			delete(out.peeled, name)
			return nil
		})
		if err != nil {
			return refs{}, fmt.Errorf("source: refs: %w", err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(gitDir, "HEAD")); err == nil {
		raw["HEAD"] = strings.TrimSpace(string(data))
	}
	for name := range raw {
		if id, ok := follow(raw, name); ok {
			out.ids[name] = id
		}
	}
	return out, nil
}

// follow resolves a ref to an object id through symbolic refs ("ref:
// NAME"), at most five deep as git does.
func follow(raw map[string]string, name string) (string, bool) {
	for range 5 {
		v, ok := raw[name]
		if !ok {
			return "", false
		}
		target, sym := strings.CutPrefix(v, "ref: ")
		if !sym {
			return v, isFullSHA(v)
		}
		name = strings.TrimSpace(target)
	}
	return "", false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
