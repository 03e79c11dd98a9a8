// Package grant owns the authority's signed decision to run one job: Ed25519
// signing of a serialized airlock.types.v1.Grant by the authority, and
// verification by the executor before it parses or runs anything. The
// signature covers the exact bytes carried, so nothing in a grant can be
// changed or widened in transit. The authority imports Signer; the executor
// imports Verifier.
package grant

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/pki"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// FormatVersion is the Grant.version this build writes and accepts.
const FormatVersion = 1

// Errors from Verify. Each is wrapped with detail.
var (
	ErrMalformed    = errors.New("grant: malformed")
	ErrUnknownKey   = errors.New("grant: signed by an unknown key")
	ErrBadSignature = errors.New("grant: bad signature")
	ErrExpired      = errors.New("grant: expired")
)

// Signer signs grants with the authority's key.
type Signer struct {
	key   ed25519.PrivateKey
	keyID string
}

// KeyID names a public key: the hex sha256 of its raw bytes, shortened.
func KeyID(pub ed25519.PublicKey) string { return pki.Ed25519KeyID(pub) }

// LoadOrCreateSigner reads the PKCS#8 PEM Ed25519 key at path, creating it
// (0600, with its public key beside it as path + ".pub") when missing.
func LoadOrCreateSigner(path string) (*Signer, error) {
	key, err := pki.LoadOrCreateEd25519(path)
	if err != nil {
		return nil, fmt.Errorf("grant key: %w", err)
	}
	return NewSigner(key), nil
}

// NewSigner wraps key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, keyID: KeyID(key.Public().(ed25519.PublicKey))}
}

// PublicKey is the key executors verify with.
func (s *Signer) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// KeyID identifies the signing key in every SignedGrant.
func (s *Signer) KeyID() string { return s.keyID }

// Sign serializes g deterministically and signs the bytes. It sets
// g.Version when zero.
func (s *Signer) Sign(g *typesv1.Grant) (*typesv1.SignedGrant, error) {
	if g.GetVersion() == 0 {
		g.Version = FormatVersion
	}
	if err := checkShape(g); err != nil {
		return nil, err
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("grant: marshal: %w", err)
	}
	return &typesv1.SignedGrant{Body: body, Signature: ed25519.Sign(s.key, body), KeyId: s.keyID}, nil
}

// Digest is the sha256 of a signed grant's body, "sha256:<hex>": a stable
// name for exactly what was granted.
func Digest(sg *typesv1.SignedGrant) string {
	sum := sha256.Sum256(sg.GetBody())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Verifier checks grants against the authority's public keys, any of a
// set (more than one during a key rotation), chosen by the grant's key id.
type Verifier struct {
	mu   sync.RWMutex
	keys map[string]ed25519.PublicKey
	file *keyFile // set by NewFileVerifier: the keys' source, re-read on change
}

// NewVerifier trusts keys.
func NewVerifier(keys ...ed25519.PublicKey) *Verifier {
	v := &Verifier{}
	v.SetKeys(keys...)
	return v
}

// SetKeys replaces the trusted set with keys, for grants verified from now on.
func (v *Verifier) SetKeys(keys ...ed25519.PublicKey) {
	m := make(map[string]ed25519.PublicKey, len(keys))
	for _, k := range keys {
		m[KeyID(k)] = k
	}
	v.mu.Lock()
	v.keys = m
	v.mu.Unlock()
}

// KeyIDs lists the trusted keys' ids, sorted.
func (v *Verifier) KeyIDs() []string {
	v.refresh()
	v.mu.RLock()
	defer v.mu.RUnlock()
	ids := make([]string, 0, len(v.keys))
	for id := range v.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Verify checks the signature over the exact body bytes first, then parses
// them and checks the format version and expiry at now. Nothing of an
// unverified body is parsed.
func (v *Verifier) Verify(sg *typesv1.SignedGrant, now time.Time) (*typesv1.Grant, error) {
	g, err := v.VerifyRecord(sg)
	if err != nil {
		return nil, err
	}
	if exp := g.GetExpiresAt().AsTime(); !now.Before(exp) {
		return nil, fmt.Errorf("%w: at %s", ErrExpired, exp.Format(time.RFC3339))
	}
	return g, nil
}

// VerifyRecord is Verify without the expiry: it checks a grant kept as a
// record of what was granted (say, in a result bundle read long after the
// run), which proves what the authority signed, not that it may run now.
func (v *Verifier) VerifyRecord(sg *typesv1.SignedGrant) (*typesv1.Grant, error) {
	if sg == nil || len(sg.GetBody()) == 0 || len(sg.GetSignature()) == 0 {
		return nil, fmt.Errorf("%w: body and signature are required", ErrMalformed)
	}
	v.refresh()
	v.mu.RLock()
	key, ok := v.keys[sg.GetKeyId()]
	v.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: key id %q", ErrUnknownKey, sg.GetKeyId())
	}
	if !ed25519.Verify(key, sg.GetBody(), sg.GetSignature()) {
		return nil, ErrBadSignature
	}
	g := &typesv1.Grant{}
	if err := proto.Unmarshal(sg.GetBody(), g); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if g.GetVersion() != FormatVersion {
		return nil, fmt.Errorf("%w: version %d, this build accepts %d", ErrMalformed, g.GetVersion(), FormatVersion)
	}
	if err := checkShape(g); err != nil {
		return nil, err
	}
	return g, nil
}

var fullSHA = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// checkShape refuses grants missing what every run needs.
func checkShape(g *typesv1.Grant) error {
	switch {
	case g.GetJobId() == "":
		return fmt.Errorf("%w: job_id is required", ErrMalformed)
	case g.GetTenant() == "":
		return fmt.Errorf("%w: tenant is required", ErrMalformed)
	case !fullSHA.MatchString(g.GetCommit()):
		return fmt.Errorf("%w: commit %q is not a full lowercase hex SHA", ErrMalformed, g.GetCommit())
	case len(g.GetCommand()) == 0 && g.GetSession() == nil:
		return fmt.Errorf("%w: command is required", ErrMalformed)
	case len(g.GetCommand()) > 0 && g.GetSession() != nil:
		return fmt.Errorf("%w: a session's grant has no command (its execs are the work)", ErrMalformed)
	case g.GetLimits() == nil:
		return fmt.Errorf("%w: limits are required", ErrMalformed)
	case g.GetNetworkPolicy().GetMode() == nil:
		return fmt.Errorf("%w: network_policy with exactly one mode is required", ErrMalformed)
	case g.GetExpiresAt() == nil || g.GetIssuedAt() == nil:
		return fmt.Errorf("%w: issued_at and expires_at are required", ErrMalformed)
	}
	return nil
}

// MarshalPublicKey encodes pub as PEM "PUBLIC KEY".
func MarshalPublicKey(pub ed25519.PublicKey) ([]byte, error) { return pki.MarshalEd25519Public(pub) }

// LoadPublicKey reads a PEM Ed25519 public key.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	pub, err := pki.LoadEd25519Public(path)
	if err != nil {
		return nil, fmt.Errorf("grant public key: %w", err)
	}
	return pub, nil
}

// Timestamps is a helper for building grants.
func Timestamps(now time.Time, ttl time.Duration) (issued, expires *timestamppb.Timestamp) {
	return timestamppb.New(now), timestamppb.New(now.Add(ttl))
}
