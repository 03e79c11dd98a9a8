package source

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/gitobj"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// refs are the names a repository resolves: each full ref name ("HEAD",
// "refs/heads/main") to the object it names. An annotated tag names the
// tag object; peelCommit follows it from the objects themselves, never
// from what a listing claims the tag points at.
type refs struct {
	ids map[string]string
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

// lookup returns the object rev names in r, and whether any name matched.
func (r refs) lookup(rev string) (string, bool) {
	for _, name := range candidates(rev) {
		if id, ok := r.ids[name]; ok {
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
// refs in place. Concurrent listings of one repository share one request,
// never one that started before they asked (flights).
func (s *Source) remoteRefs(ctx context.Context, repo policy.Repository) (refs, error) {
	if strings.HasPrefix(repo.URL, "file://") {
		u, err := url.Parse(repo.URL)
		if err != nil {
			return refs{}, fmt.Errorf("%w: repository %q: url: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
		}
		gitDir, err := localGitDir(u.Path)
		if err != nil {
			return refs{}, fmt.Errorf("%w: repository %q could not be reached: %v", errdefs.ErrUnavailable, repo.Name, err)
		}
		r, err := readLocalRefs(gitDir)
		if err != nil {
			return refs{}, fmt.Errorf("%w: repository %q could not be reached: %v", errdefs.ErrUnavailable, repo.Name, err)
		}
		// What a mirror fetched by git would hold: HEAD, branches, tags.
		for name := range r.ids {
			if !mirrored(name) {
				delete(r.ids, name)
			}
		}
		return r, nil
	}
	key := repo.URL + "\x00" + repo.CA + "\x00" + repo.Credential
	r, err := s.listings.do(ctx, key, time.Minute, func(ctx context.Context) (refs, error) {
		return s.http.fetchRefs(ctx, repo)
	})
	if err != nil {
		if ctx.Err() != nil {
			return refs{}, ctx.Err()
		}
		// The reason is the server's and the transport's: it may echo
		// what it was sent.
		return refs{}, fmt.Errorf("%w: repository %q could not be reached: %s", errdefs.ErrUnavailable, repo.Name, redact(repo, err.Error()))
	}
	return r, nil
}

// httpRemotes keeps one HTTP client per CA bundle.
type httpRemotes struct {
	mu      sync.Mutex
	clients map[string]remoteClient
}

type remoteClient struct {
	sum    [32]byte
	client *http.Client
}

// client returns the pooled client for repo's CA bundle. A bundle whose
// content changed (an operator replaced the file) gets a new client, and
// the old one's idle connections are closed.
func (h *httpRemotes) client(repo policy.Repository) (*http.Client, error) {
	var pem []byte
	if repo.CA != "" {
		var err error
		if pem, err = gitobj.ReadFile(repo.CA, maxCABytes); err != nil {
			return nil, fmt.Errorf("%w: repository %q: ca: %v", errdefs.ErrFailedPrecondition, repo.Name, err)
		}
	}
	sum := sha256.Sum256(pem)
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.clients[repo.CA]; ok {
		if c.sum == sum {
			return c.client, nil
		}
		c.client.CloseIdleConnections()
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
		h.clients = map[string]remoteClient{}
	}
	h.clients[repo.CA] = remoteClient{sum: sum, client: c}
	return c, nil
}

// maxCABytes bounds a repository's CA bundle.
const maxCABytes = 1 << 20

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
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return refs{}, ctx.Err()
		}
		// The error names the URL (configuration, never a secret) and
		// what failed: DNS, TCP, TLS.
		return refs{}, err
	}
	defer func() {
		// Read to the end, so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	// Nothing the server wrote reaches an error: it may echo the
	// credential it was sent, or bytes meant for a terminal.
	status := fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return refs{}, fmt.Errorf("the server answered %s; a redirect is not followed (it could carry the credential elsewhere): configure the repository's final URL", status)
	case resp.StatusCode != http.StatusOK:
		return refs{}, fmt.Errorf("the server answered %s", status)
	case resp.Header.Get("Content-Type") != "application/x-git-upload-pack-advertisement":
		return refs{}, errors.New("the server does not speak git's smart HTTP protocol (its answer is not a git-upload-pack advertisement)")
	}
	r, err := parseAdvertisement(io.LimitReader(resp.Body, maxAdvertisement+1))
	if err != nil {
		return refs{}, fmt.Errorf("its ref listing: %v", err)
	}
	return r, nil
}

// parseAdvertisement reads a smart HTTP ref advertisement (gitprotocol-http(5)):
// the "# service=git-upload-pack" section, then one "id name" line per
// ref (capabilities after a NUL on the first, "name^{}" lines giving an
// annotated tag's target), ending in a flush packet. Only HEAD, branches
// and tags are kept.
func parseAdvertisement(r io.Reader) (refs, error) {
	out := refs{ids: map[string]string{}}
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
		return refs{}, errors.New("no service line")
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
			return refs{}, fmt.Errorf("ref line %d is not an object id and a name", i+1)
		}
		if strings.HasSuffix(name, "^{}") {
			continue // a tag's target, which peelCommit reads itself
		}
		if mirrored(name) {
			out.ids[name] = id
		}
	}
}

// Bounds on the files of a repository read in place.
const (
	maxRefFileBytes    = 4 << 10
	maxPackedRefsBytes = 64 << 20
	maxRefs            = 1 << 20
)

// readLocalRefs reads the refs of the repository at gitDir in place, the
// way git does: HEAD from the git directory itself (a linked worktree has
// its own), every other ref from the common directory's loose ref files,
// which outrank its packed-refs file. Symbolic refs are followed. Only
// regular files are read, each within a bound: the repository may be
// hostile, and a FIFO or /dev/zero where a ref belongs must not hang or
// fill the authority.
func readLocalRefs(gitDir string) (refs, error) {
	common, err := commonDir(gitDir)
	if err != nil {
		return refs{}, err
	}
	raw := map[string]string{}
	data, err := gitobj.ReadFile(filepath.Join(common, "packed-refs"), maxPackedRefsBytes)
	switch {
	case err == nil:
		for line := range strings.Lines(string(data)) {
			line = strings.TrimRight(line, "\n")
			if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "^") || line == "" {
				continue
			}
			if id, name, ok := strings.Cut(line, " "); ok && isFullSHA(id) {
				raw[name] = id
			}
		}
	case !errors.Is(err, os.ErrNotExist):
		return refs{}, fmt.Errorf("packed-refs: %v", err)
	}
	root := filepath.Join(common, "refs")
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || len(raw) > maxRefs {
			if len(raw) > maxRefs {
				return fmt.Errorf("more than %d refs", maxRefs)
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil // git's own files backend reads no FIFO or device either
		}
		data, err := gitobj.ReadFile(p, maxRefFileBytes)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(common, p)
		raw[filepath.ToSlash(rel)] = strings.TrimSpace(string(data))
		return nil
	})
	if err != nil {
		return refs{}, fmt.Errorf("refs: %v", err)
	}
	if data, err := gitobj.ReadFile(filepath.Join(gitDir, "HEAD"), maxRefFileBytes); err == nil {
		raw["HEAD"] = strings.TrimSpace(string(data))
	}
	out := refs{ids: map[string]string{}}
	for name := range raw {
		if id, ok := follow(raw, name); ok {
			out.ids[name] = id
		}
	}
	return out, nil
}

// commonDir is where a git directory's objects and refs live: its own, or
// a linked worktree's common directory.
func commonDir(gitDir string) (string, error) {
	data, err := gitobj.ReadFile(filepath.Join(gitDir, "commondir"), maxRefFileBytes)
	if errors.Is(err, os.ErrNotExist) {
		return gitDir, nil
	}
	if err != nil {
		return "", fmt.Errorf("commondir: %v", err)
	}
	c := strings.TrimSpace(string(data))
	if !filepath.IsAbs(c) {
		c = filepath.Join(gitDir, c)
	}
	return c, nil
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
