// Package seal owns how the authority wraps a secret for exactly one
// caller: the secret is encrypted to the public key in that caller's mTLS
// certificate (ECDH P-256 with a fresh ephemeral key, HKDF-SHA256, AES-256-GCM),
// bound to the caller's SPIFFE ID and to a context such as a lease id, so
// only the holder of that certificate's key can open it, and only for that
// purpose. The authority seals leased credentials; their holders open them.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/pkg/identity"
)

const version = 1

// ErrOpen is returned for any box that cannot be opened: wrong key, wrong
// context, altered bytes. The causes are deliberately not told apart.
var ErrOpen = errors.New("seal: cannot open")

// Seal encrypts secret for the holder of recipient's key. context is bound
// into the box (it must be given again to open it) and is not secret.
func Seal(recipient *x509.Certificate, context, secret []byte) ([]byte, error) {
	id, err := identity.FromCertificate(recipient)
	if err != nil {
		return nil, fmt.Errorf("seal: recipient: %w", err)
	}
	pub, ok := recipient.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("seal: recipient key is %T; only ECDSA P-256 is supported", recipient.PublicKey)
	}
	rpub, err := pub.ECDH()
	if err != nil {
		return nil, fmt.Errorf("seal: recipient key: %w", err)
	}
	eph, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	shared, err := eph.ECDH(rpub)
	if err != nil {
		return nil, err
	}
	aead, err := newAEAD(shared, eph.PublicKey().Bytes(), id)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := append([]byte{version}, eph.PublicKey().Bytes()...)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, secret, context), nil
}

// OpenTLS decrypts a box sealed for the leaf of cert, a holder's own mTLS
// certificate with its ECDSA key.
func OpenTLS(cert *tls.Certificate, context, box []byte) ([]byte, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, errors.New("seal: no certificate of one's own")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("seal: own certificate: %w", err)
	}
	key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("seal: the own key is %T, not ECDSA: sealed boxes cannot be opened", cert.PrivateKey)
	}
	return Open(leaf, key, context, box)
}

// Open decrypts a box sealed for the certificate whose key is key.
func Open(cert *x509.Certificate, key *ecdsa.PrivateKey, context, box []byte) ([]byte, error) {
	id, err := identity.FromCertificate(cert)
	if err != nil {
		return nil, fmt.Errorf("seal: own certificate: %w", err)
	}
	priv, err := key.ECDH()
	if err != nil {
		return nil, err
	}
	const pubLen = 65
	if len(box) < 1+pubLen+12+16 || box[0] != version {
		return nil, ErrOpen
	}
	ephPub, err := ecdh.P256().NewPublicKey(box[1 : 1+pubLen])
	if err != nil {
		return nil, ErrOpen
	}
	shared, err := priv.ECDH(ephPub)
	if err != nil {
		return nil, ErrOpen
	}
	aead, err := newAEAD(shared, box[1:1+pubLen], id)
	if err != nil {
		return nil, err
	}
	nonce := box[1+pubLen : 1+pubLen+aead.NonceSize()]
	secret, err := aead.Open(nil, nonce, box[1+pubLen+aead.NonceSize():], context)
	if err != nil {
		return nil, ErrOpen
	}
	return secret, nil
}

// newAEAD derives the box key from the shared secret, bound to the
// ephemeral key and the recipient's identity.
func newAEAD(shared, ephPub []byte, id identity.ID) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, shared, ephPub, "airlock seal v1 "+id.String(), 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// LeaseContext is the context a leased credential is sealed with: the
// lease, job and resource it is for, so a box opened under any other lease
// fails. The authority seals with it; the holder opens with it.
func LeaseContext(leaseID, jobID, resource string) []byte {
	return []byte("airlock lease\x00" + leaseID + "\x00" + jobID + "\x00" + resource)
}
