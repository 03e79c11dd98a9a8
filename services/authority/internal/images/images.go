// Package images resolves a job's OCI image reference to a digest under
// its tenant's policy, and reads the image's manifest, config and layers
// from the registry with the tenant's credential, for the executor, which
// never holds the credential. The registry protocol and the image formats
// are go-containerregistry's; this package adds the policy, the transport
// rules (TLS only, the tenant's CA) and errors that carry nothing the
// registry wrote but its status and error codes. It imports nothing of
// gRPC.
package images

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/imagecache"
	"github.com/airlockhq/airlock/pkg/ocilayer"
	"github.com/airlockhq/airlock/pkg/registryserver"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// Bounds on what a registry may make the authority read and hold.
const (
	// MaxConfigBytes bounds an image config.
	MaxConfigBytes = 4 << 20
	// maxRefBytes bounds a reference as a job writes it.
	maxRefBytes = 512
	// resolvedCache is how many resolved manifests are kept, by digest,
	// for the executor's blob requests.
	resolvedCache = 512
)

// The platform every image is run as.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Config is what the authority honours of an image's config at
// submission: its user (the executor reads the rest from the config blob
// it pulls).
type Config struct {
	User string `json:"user,omitempty"`
}

// Blob is one blob a manifest names.
type Blob struct {
	Digest    string
	MediaType string
	Size      int64
}

// Resolved is an image reference resolved to its linux/amd64 manifest.
type Resolved struct {
	// Name is the reference as given.
	Name string
	// Registry ("host[:port]") and Repository locate it.
	Registry, Repository string
	// Digest and MediaType are the platform manifest's; IndexDigest is the
	// index it was picked from, if any.
	Digest, MediaType, IndexDigest string
	// Size is the config's and the compressed layers' bytes.
	Size int64
	// Manifest is the manifest's exact bytes.
	Manifest []byte
	// ConfigBlob and Layers are what the manifest names, layers bottom
	// first.
	ConfigBlob Blob
	Layers     []Blob
	Config     Config

	// credential is the credential file it was resolved with; hasConfig
	// says Config was read.
	credential string
	hasConfig  bool
}

// Reference is "registry/repository@digest".
func (r Resolved) Reference() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

// Blob finds digest among the manifest and the blobs it names.
func (r Resolved) Blob(digest string) (Blob, bool) {
	if digest == r.Digest {
		return Blob{Digest: r.Digest, MediaType: r.MediaType, Size: int64(len(r.Manifest))}, true
	}
	if digest == r.ConfigBlob.Digest {
		return r.ConfigBlob, true
	}
	for _, l := range r.Layers {
		if l.Digest == digest {
			return l, true
		}
	}
	return Blob{}, false
}

// Client reads registries for the authority.
type Client struct {
	// Timeout bounds one resolution (every request it makes); 0 is 2m.
	Timeout time.Duration

	mu         sync.Mutex
	transports map[string]*cachedTransport // by CA path
	resolved   map[string]Resolved         // by registry/repository@digest
	order      []string                    // resolved's keys, oldest first
}

type cachedTransport struct {
	modTime time.Time
	rt      *http.Transport
}

// New returns a Client.
func New() *Client {
	return &Client{transports: map[string]*cachedTransport{}, resolved: map[string]Resolved{}}
}

// Close releases the idle connections of every pooled transport.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.transports {
		t.rt.CloseIdleConnections()
	}
}

// CheckDigest says whether d is "sha256:" and 64 lowercase hex digits.
func CheckDigest(d string) error { return digest.Check(d) }

// Parse checks a reference as a job or a policy writes it and splits it
// into registry and repository. It names a registry explicitly: a bare
// "python:3.12" has no registry here (there is no default registry to
// fall back on).
func Parse(ref string) (name.Reference, error) {
	switch {
	case ref == "":
		return nil, errors.New("empty")
	case len(ref) > maxRefBytes:
		return nil, fmt.Errorf("at most %d bytes (got %d)", maxRefBytes, len(ref))
	case strings.HasPrefix(ref, "-"):
		return nil, errors.New("must not start with '-'")
	}
	first, _, ok := strings.Cut(ref, "/")
	if !ok || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		return nil, fmt.Errorf("%q names no registry: write HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST]", ref)
	}
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("%q is not an image reference: write HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST]", ref)
	}
	if d, ok := r.(name.Digest); ok {
		if err := CheckDigest(d.DigestStr()); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Allowed finds the pattern of p that allows ref's repository.
func Allowed(p policy.Images, ref name.Reference) (policy.ImagePattern, bool) {
	reg, repo := ref.Context().RegistryStr(), ref.Context().RepositoryStr()
	for _, pat := range p.Allowed {
		if pat.Matches(reg, repo) {
			return pat, true
		}
	}
	return policy.ImagePattern{}, false
}

// Resolve resolves ref under the tenant's policy p: its repository must be
// allowed, its linux/amd64 manifest is read (picked from an index), its
// config read, and its size checked against the policy's bound. Errors
// name the field "spec.image" where the reference or the policy is at
// fault (errdefs.ErrInvalidArgument, ErrPermissionDenied), and the
// registry where it is (ErrUnavailable, ErrNotFound).
func (c *Client) Resolve(ctx context.Context, p policy.Images, ref string) (Resolved, error) {
	r, err := Parse(ref)
	if err != nil {
		return Resolved{}, fmt.Errorf("%w: spec.image: %v", errdefs.ErrInvalidArgument, err)
	}
	pat, ok := Allowed(p, r)
	if !ok {
		return Resolved{}, fmt.Errorf("%w: spec.image: %s is not allowed by the tenant's image policy (allowed: %s)", errdefs.ErrPermissionDenied, r.Context().Name(), patterns(p))
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	reg, repo := r.Context().RegistryStr(), r.Context().RepositoryStr()
	cred := p.Registries[reg].Credential
	if d, ok := r.(name.Digest); ok {
		// Resolved before with the same credential: nothing to ask the
		// registry (the digest cannot have changed).
		if known, ok := c.cached(reg+"/"+repo+"@"+d.DigestStr(), cred); ok && known.IndexDigest == "" {
			return known.checked(ref, pat, p)
		}
	}
	opts, err := c.options(ctx, p, reg)
	if err != nil {
		return Resolved{}, err
	}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return Resolved{}, c.registryError(reg, repo, err)
	}
	out := Resolved{Name: ref, Registry: reg, Repository: repo}
	img := desc
	switch desc.MediaType {
	case types.OCIImageIndex, types.DockerManifestList:
		out.IndexDigest = desc.Digest.String()
		idx, err := desc.ImageIndex()
		if err != nil {
			return Resolved{}, c.registryError(reg, repo, err)
		}
		child, err := pick(idx)
		if err != nil {
			return Resolved{}, fmt.Errorf("%w: spec.image: %s: %v", errdefs.ErrInvalidArgument, ref, err)
		}
		img, err = remote.Get(r.Context().Digest(child.Digest.String()), opts...)
		if err != nil {
			return Resolved{}, c.registryError(reg, repo, err)
		}
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
	default:
		return Resolved{}, fmt.Errorf("%w: spec.image: %s is a %q, not an image manifest (OCI or Docker schema 2)", errdefs.ErrInvalidArgument, ref, clip(string(desc.MediaType)))
	}
	out.Digest, out.MediaType, out.Manifest = img.Digest.String(), string(img.MediaType), img.Manifest
	if known, ok := c.cached(out.Reference(), cred); ok {
		// A tag that names a manifest this credential read before: its
		// config is known.
		known.IndexDigest = out.IndexDigest
		return known.checked(ref, pat, p)
	}
	if err := out.parseManifest(); err != nil {
		return Resolved{}, fmt.Errorf("%w: spec.image: %s: %v", errdefs.ErrInvalidArgument, ref, err)
	}
	if _, err := out.checked(ref, pat, p); err != nil {
		return Resolved{}, err
	}
	cfg, err := c.readConfig(ctx, opts, r, out.ConfigBlob, len(out.Layers))
	if err != nil {
		return Resolved{}, err
	}
	out.Config, out.credential, out.hasConfig = cfg, cred, true
	c.remember(out)
	return out, nil
}

// checked is r as resolved for ref, if the policy's pin and size bound
// allow it.
func (r Resolved) checked(ref string, pat policy.ImagePattern, p policy.Images) (Resolved, error) {
	r.Name = ref
	if pat.Digest != "" && pat.Digest != r.Digest && pat.Digest != r.IndexDigest {
		return Resolved{}, fmt.Errorf("%w: spec.image: %s resolves to %s, but the tenant's policy pins %s to %s", errdefs.ErrPermissionDenied, ref, r.Digest, pat.Registry+"/"+pat.Repository, pat.Digest)
	}
	max := p.MaxBytes
	if max <= 0 {
		max = policy.DefaultMaxImageBytes
	}
	if r.Size > max {
		return Resolved{}, fmt.Errorf("%w: spec.image: %s is %d bytes, above the tenant's max_size of %d", errdefs.ErrPermissionDenied, ref, r.Size, max)
	}
	return r, nil
}

// cached is the resolution of key (registry/repository@digest) made with
// credential cred (a file path, "" for none), if one is held with its
// config.
func (c *Client) cached(key, cred string) (Resolved, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.resolved[key]
	return r, ok && r.hasConfig && r.credential == cred
}

// pick is the index's linux/amd64 image.
func pick(idx v1.ImageIndex) (v1.Descriptor, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	var seen []string
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.Satisfies(platform) && (d.MediaType == types.OCIManifestSchema1 || d.MediaType == types.DockerManifestSchema2) {
			return d, nil
		}
		if d.Platform != nil && len(seen) < 8 {
			seen = append(seen, clip(d.Platform.String()))
		}
	}
	return v1.Descriptor{}, fmt.Errorf("the index has no %s image (it has: %s)", platform, strings.Join(seen, ", "))
}

// parseManifest checks r.Manifest and fills in the blobs and size.
func (r *Resolved) parseManifest() error {
	m, err := v1.ParseManifest(bytes.NewReader(r.Manifest))
	if err != nil {
		return errors.New("the manifest is not valid JSON of an image manifest")
	}
	if len(m.Layers) == 0 {
		return errors.New("the image has no layers")
	}
	if len(m.Layers) > imagecache.MaxLayers {
		return fmt.Errorf("the image has %d layers; at most %d", len(m.Layers), imagecache.MaxLayers)
	}
	if err := CheckDigest(m.Config.Digest.String()); err != nil {
		return fmt.Errorf("config: %v", err)
	}
	if m.Config.Size <= 0 || m.Config.Size > MaxConfigBytes {
		return fmt.Errorf("config: size %d: must be 1 to %d bytes", m.Config.Size, MaxConfigBytes)
	}
	r.ConfigBlob = Blob{Digest: m.Config.Digest.String(), MediaType: string(m.Config.MediaType), Size: m.Config.Size}
	r.Size = m.Config.Size
	for i, l := range m.Layers {
		switch {
		case CheckDigest(l.Digest.String()) != nil:
			return fmt.Errorf("layers[%d]: %v", i, CheckDigest(l.Digest.String()))
		case ocilayer.CheckMediaType(string(l.MediaType)) != nil:
			return fmt.Errorf("layers[%d]: media type %q is not a layer type the executor unpacks (OCI or Docker tar, tar+gzip, tar+zstd)", i, clip(string(l.MediaType)))
		case len(l.URLs) > 0:
			return fmt.Errorf("layers[%d]: a foreign layer (fetched from its own URLs) is not supported", i)
		case l.Size <= 0:
			return fmt.Errorf("layers[%d]: size %d: must be positive", i, l.Size)
		}
		r.Layers = append(r.Layers, Blob{Digest: l.Digest.String(), MediaType: string(l.MediaType), Size: l.Size})
		r.Size += l.Size
	}
	return nil
}

// readConfig reads and checks the image's config: its platform, and what
// the executor honours of it.
func (c *Client) readConfig(ctx context.Context, opts []remote.Option, r name.Reference, b Blob, layers int) (Config, error) {
	reg, repo := r.Context().RegistryStr(), r.Context().RepositoryStr()
	rc, err := c.blob(ctx, opts, r.Context().Digest(b.Digest))
	if err != nil {
		return Config{}, c.registryError(reg, repo, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxConfigBytes+1))
	if err != nil {
		return Config{}, c.registryError(reg, repo, err)
	}
	var f v1.ConfigFile
	if err := json.Unmarshal(data, &f); err != nil {
		return Config{}, fmt.Errorf("%w: spec.image: %s: the image config is not valid JSON", errdefs.ErrInvalidArgument, r)
	}
	if (f.OS != "" && f.OS != platform.OS) || (f.Architecture != "" && f.Architecture != platform.Architecture) {
		return Config{}, fmt.Errorf("%w: spec.image: %s is for %s/%s; this executor runs %s", errdefs.ErrInvalidArgument, r, clip(f.OS), clip(f.Architecture), platform)
	}
	// The executor checks each layer's uncompressed digest against its
	// diff_id as it unpacks; the count is checked here, at submission.
	if len(f.RootFS.DiffIDs) != layers {
		return Config{}, fmt.Errorf("%w: spec.image: %s: its config lists %d layer diff_ids for %d layers", errdefs.ErrInvalidArgument, r, len(f.RootFS.DiffIDs), layers)
	}
	return Config{User: f.Config.User}, nil
}

// Manifest returns the exact bytes and media type of the manifest with
// the given digest in registry/repository: from the resolution that
// granted it when the authority still holds it, else read again.
func (c *Client) Manifest(ctx context.Context, p policy.Images, registry, repository, digest string) (Resolved, error) {
	key := registry + "/" + repository + "@" + digest
	c.mu.Lock()
	r, ok := c.resolved[key]
	c.mu.Unlock()
	if ok {
		return r, nil
	}
	ref, err := name.NewDigest(key, name.StrictValidation)
	if err != nil {
		return Resolved{}, fmt.Errorf("%w: image %s: %v", errdefs.ErrInvalidArgument, key, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	opts, err := c.options(ctx, p, registry)
	if err != nil {
		return Resolved{}, err
	}
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return Resolved{}, c.registryError(registry, repository, err)
	}
	r = Resolved{Name: key, Registry: registry, Repository: repository, Digest: desc.Digest.String(), MediaType: string(desc.MediaType), Manifest: desc.Manifest}
	if r.Digest != digest {
		return Resolved{}, fmt.Errorf("%w: registry %s: manifest %s arrived as %s", errdefs.ErrUnavailable, registry, digest, r.Digest)
	}
	if err := r.parseManifest(); err != nil {
		return Resolved{}, fmt.Errorf("%w: image %s: %v", errdefs.ErrFailedPrecondition, key, err)
	}
	c.remember(r)
	return r, nil
}

// Blob opens the blob digest of registry/repository, read with the
// tenant's credential. What it reads is checked against the digest as it
// goes: the reader fails at its end on a mismatch.
func (c *Client) Blob(ctx context.Context, p policy.Images, registry, repository, digest string) (io.ReadCloser, error) {
	ref, err := name.NewDigest(registry+"/"+repository+"@"+digest, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("%w: image blob %s: %v", errdefs.ErrInvalidArgument, digest, err)
	}
	opts, err := c.options(ctx, p, registry)
	if err != nil {
		return nil, err
	}
	rc, err := c.blob(ctx, opts, ref)
	if err != nil {
		return nil, c.registryError(registry, repository, err)
	}
	return &errorMapper{rc: rc, c: c, registry: registry, repository: repository}, nil
}

// CheckBlob proves that the tenant's credential reaches the blob: its
// size bytes are read from the registry and must hash to digest. A
// registry's answer to a HEAD proves nothing (a registry the tenant runs
// can say yes to any digest); only the bytes do.
func (c *Client) CheckBlob(ctx context.Context, p policy.Images, registry, repository, digest string, size int64) error {
	rc, err := c.Blob(ctx, p, registry, repository, digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(rc, size+1))
	switch {
	case err != nil:
		return err
	case n != size:
		return fmt.Errorf("%w: registry %s: blob %s is %d bytes, its manifest says %d", errdefs.ErrUnavailable, registry, digest, n, size)
	}
	return nil
}

func (c *Client) blob(ctx context.Context, opts []remote.Option, ref name.Digest) (io.ReadCloser, error) {
	l, err := remote.Layer(ref, append(opts, remote.WithContext(ctx))...)
	if err != nil {
		return nil, err
	}
	return l.Compressed()
}

type errorMapper struct {
	rc                   io.ReadCloser
	c                    *Client
	registry, repository string
}

func (e *errorMapper) Read(p []byte) (int, error) {
	n, err := e.rc.Read(p)
	if err != nil && err != io.EOF {
		err = e.c.registryError(e.registry, e.repository, err)
	}
	return n, err
}

func (e *errorMapper) Close() error { return e.rc.Close() }

func (c *Client) remember(r Resolved) {
	key := r.Reference()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.resolved[key]; !ok {
		c.order = append(c.order, key)
	}
	c.resolved[key] = r
	for len(c.order) > resolvedCache {
		delete(c.resolved, c.order[0])
		c.order = c.order[1:]
	}
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return 2 * time.Minute
}

// options are the remote options for registry reg under p: its transport
// and the tenant's credential, read now (so a rotated file takes effect).
func (c *Client) options(ctx context.Context, p policy.Images, reg string) ([]remote.Option, error) {
	r := p.Registries[reg]
	rt, err := c.transport(r.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: registry %s: its CA file: %v", errdefs.ErrFailedPrecondition, reg, err)
	}
	auth := authn.Anonymous
	if r.Credential != "" {
		user, pass, err := registryserver.ReadCredential(r.Credential)
		if err != nil {
			return nil, fmt.Errorf("%w: registry %s: its credential file: %v", errdefs.ErrFailedPrecondition, reg, err)
		}
		auth = authn.FromConfig(authn.AuthConfig{Username: user, Password: pass})
	}
	return []remote.Option{
		remote.WithContext(ctx), remote.WithTransport(httpsOnly{rt}), remote.WithAuth(auth),
		remote.WithPlatform(platform), remote.WithUserAgent("airlock-authority"),
		remote.WithRetryBackoff(remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 3}),
	}, nil
}

// CheckCredentialFile checks a credential file the way each request reads
// it, for the config's check at start.
func CheckCredentialFile(path string) error {
	_, _, err := registryserver.ReadCredential(path)
	return err
}

// transport is the pooled transport trusting ca ("" for the system's
// roots), made again when the file changes.
func (c *Client) transport(ca string) (*http.Transport, error) {
	var mod time.Time
	if ca != "" {
		st, err := os.Stat(ca)
		if err != nil {
			return nil, errors.New("cannot be read")
		}
		mod = st.ModTime()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.transports[ca]; ok && t.modTime.Equal(mod) {
		return t.rt, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pool, err := tlsconfig.LoadRoots(ca)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	rt := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	if old, ok := c.transports[ca]; ok {
		old.rt.CloseIdleConnections()
	}
	c.transports[ca] = &cachedTransport{modTime: mod, rt: rt}
	return rt, nil
}

// httpsOnly refuses every request that is not https: go-containerregistry
// falls back to plain HTTP for loopback and private addresses, and a
// token realm or a redirect may name one; a credential never travels in
// the clear.
type httpsOnly struct{ rt http.RoundTripper }

var errPlaintext = errors.New("plain HTTP refused: registries are reached over TLS only")

func (h httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errPlaintext
	}
	return h.rt.RoundTrip(req)
}

var codeRE = regexp.MustCompile(`^[A-Z_]{1,40}$`)

// registryError describes err without anything the registry wrote but
// its HTTP status and its error codes (the distribution spec's fixed
// names: MANIFEST_UNKNOWN, DENIED, ...).
func (c *Client) registryError(reg, repo string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: registry %s: repository %s: no answer in time", errdefs.ErrUnavailable, reg, repo)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		var codes []string
		for _, d := range te.Errors {
			if codeRE.MatchString(string(d.Code)) && len(codes) < 4 {
				codes = append(codes, string(d.Code))
			}
		}
		what := fmt.Sprintf("HTTP %d", te.StatusCode)
		if len(codes) > 0 {
			what += " " + strings.Join(codes, ", ")
		}
		kind := errdefs.ErrUnavailable
		switch te.StatusCode {
		case http.StatusNotFound:
			kind = errdefs.ErrNotFound
		case http.StatusUnauthorized, http.StatusForbidden:
			what += " (check the tenant's credential for this registry)"
		}
		return fmt.Errorf("%w: registry %s: repository %s: %s", kind, reg, repo, what)
	}
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) {
		return fmt.Errorf("%w: registry %s: its certificate is not trusted (the tenant's registries.%s.ca)", errdefs.ErrUnavailable, reg, reg)
	}
	if errors.Is(err, errPlaintext) {
		return fmt.Errorf("%w: registry %s: %v", errdefs.ErrUnavailable, reg, errPlaintext)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("%w: registry %s: cannot be reached", errdefs.ErrUnavailable, reg)
	}
	if strings.Contains(err.Error(), "error verifying") || strings.Contains(err.Error(), "digest") {
		return fmt.Errorf("%w: registry %s: repository %s: what arrived does not match its digest", errdefs.ErrUnavailable, reg, repo)
	}
	return fmt.Errorf("%w: registry %s: repository %s: the request failed", errdefs.ErrUnavailable, reg, repo)
}

func patterns(p policy.Images) string {
	if len(p.Allowed) == 0 {
		return "none: the host template only"
	}
	var s []string
	for _, pat := range p.Allowed {
		s = append(s, pat.String())
	}
	return strings.Join(s, ", ")
}

// clip bounds a string from a registry for an error message and keeps it
// printable ASCII.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}
