// Package provenance owns the signed statement that ties a result bundle to
// the run that produced it: an in-toto v1 Statement whose subject is the
// bundle's sha256, in a DSSE envelope signed with the executor's own mTLS
// key, carried with the certificate that proves the signer's SPIFFE ID. The
// executor signs; the publisher (and any auditor) verifies against the CA.
package provenance

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
)

// Media and predicate types.
const (
	PayloadType   = "application/vnd.in-toto+json"
	StatementType = "https://in-toto.io/Statement/v1"
	PredicateType = "https://airlock.dev/attestations/run/v1"
)

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("provenance: invalid")

// Statement is an in-toto v1 statement about one bundle.
type Statement struct {
	Type          string    `json:"_type"`
	Subject       []Subject `json:"subject"`
	PredicateType string    `json:"predicateType"`
	Predicate     Run       `json:"predicate"`
}

// Subject names an artifact by digest.
type Subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// Run is the predicate: what ran, where, under which grant, with what end.
type Run struct {
	JobID           string `json:"job_id"`
	Tenant          string `json:"tenant"`
	Requester       string `json:"requester"`
	Repository      string `json:"repository"`
	BaseCommit      string `json:"base_commit"`
	GrantDigest     string `json:"grant_digest"`
	Executor        string `json:"executor"`
	RuntimeClass    string `json:"runtime_class"`
	RuntimeVersion  string `json:"runtime_version"`
	TemplateVersion string `json:"template_version"`
	// Image is the OCI image the run's root was, by digest
	// ("registry/repository@sha256:..."); empty for the host template.
	Image      string    `json:"image,omitempty"`
	Reason     string    `json:"reason"`
	ExitCode   int       `json:"exit_code"`
	StartedOn  time.Time `json:"started_on"`
	FinishedOn time.Time `json:"finished_on"`
}

// Envelope is a DSSE envelope plus the signer's certificate chain (leaf
// first), which DSSE itself leaves to the transport.
type Envelope struct {
	PayloadType  string      `json:"payloadType"`
	Payload      string      `json:"payload"`
	Signatures   []Signature `json:"signatures"`
	Certificates []string    `json:"certificates"`
}

// Signature is one DSSE signature.
type Signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// pae is DSSE's pre-authentication encoding: what is actually signed.
func pae(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
}

// Sign makes the envelope for a bundle with digest ("sha256:<hex>"). key is
// the private key of leaf, whose SPIFFE ID becomes the key id.
func Sign(bundleName, digest string, run Run, key crypto.Signer, chain []*x509.Certificate) ([]byte, error) {
	hexDigest, err := parseDigest(digest)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 {
		return nil, errors.New("provenance: a signing certificate is required")
	}
	id, err := identity.FromCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("provenance: signing certificate: %w", err)
	}
	st := Statement{
		Type:          StatementType,
		Subject:       []Subject{{Name: bundleName, Digest: map[string]string{"sha256": hexDigest}}},
		PredicateType: PredicateType,
		Predicate:     run,
	}
	payload, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	sig, err := sign(key, pae(PayloadType, payload))
	if err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	env := Envelope{
		PayloadType: PayloadType,
		Payload:     base64.StdEncoding.EncodeToString(payload),
		Signatures:  []Signature{{KeyID: id.String(), Sig: base64.StdEncoding.EncodeToString(sig)}},
	}
	for _, c := range chain {
		env.Certificates = append(env.Certificates, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
	}
	return json.Marshal(env)
}

func sign(key crypto.Signer, msg []byte) ([]byte, error) {
	if _, ok := key.(ed25519.PrivateKey); ok {
		return key.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	sum := sha256.Sum256(msg)
	return key.Sign(rand.Reader, sum[:], crypto.SHA256)
}

// Verified is what Verify proved.
type Verified struct {
	Signer    identity.ID
	Statement Statement
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// parseDigest returns the hex of a "sha256:<64 lowercase hex>" digest.
func parseDigest(digest string) (string, error) {
	hexDigest, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !sha256Hex.MatchString(hexDigest) {
		return "", fmt.Errorf("provenance: digest %q: want sha256:<64 lowercase hex>", digest)
	}
	return hexDigest, nil
}

// Verify checks that envelope is signed by a certificate chaining to roots
// and valid now, whose SPIFFE ID is signer, that the run the statement
// describes finished while that certificate was valid, and that its
// statement's subject is digest.
func Verify(envelope []byte, digest string, roots *x509.CertPool, signer identity.ID) (*Verified, error) {
	want, err := parseDigest(digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var env Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return nil, fmt.Errorf("%w: envelope: %v", ErrInvalid, err)
	}
	if env.PayloadType != PayloadType || len(env.Signatures) != 1 || len(env.Certificates) == 0 {
		return nil, fmt.Errorf("%w: want one %s signature with a certificate", ErrInvalid, PayloadType)
	}
	var chain []*x509.Certificate
	for _, p := range env.Certificates {
		block, _ := pem.Decode([]byte(p))
		if block == nil {
			return nil, fmt.Errorf("%w: certificate is not PEM", ErrInvalid)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate: %v", ErrInvalid, err)
		}
		chain = append(chain, c)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("%w: signing certificate: %v", ErrInvalid, err)
	}
	id, err := identity.FromCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if id != signer {
		return nil, fmt.Errorf("%w: signed by %s, want %s", ErrInvalid, id, signer)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrInvalid, err)
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrInvalid, err)
	}
	if !verifySig(chain[0].PublicKey, pae(env.PayloadType, payload), sig) {
		return nil, fmt.Errorf("%w: signature does not verify", ErrInvalid)
	}
	var st Statement
	if err := json.Unmarshal(payload, &st); err != nil {
		return nil, fmt.Errorf("%w: statement: %v", ErrInvalid, err)
	}
	if st.Type != StatementType || st.PredicateType != PredicateType || len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != want {
		return nil, fmt.Errorf("%w: statement is not about bundle %s", ErrInvalid, digest)
	}
	if fin := st.Predicate.FinishedOn; fin.Before(chain[0].NotBefore) || fin.After(chain[0].NotAfter) {
		return nil, fmt.Errorf("%w: the run finished at %s, outside the signing certificate's validity", ErrInvalid, fin.Format(time.RFC3339))
	}
	return &Verified{Signer: id, Statement: st}, nil
}

func verifySig(pub any, msg, sig []byte) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		return ecdsa.VerifyASN1(k, sum[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	}
	return false
}
