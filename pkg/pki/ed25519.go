package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Ed25519KeyID names a public key: the hex sha256 of its raw bytes,
// shortened to 16 digits.
func Ed25519KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// LoadOrCreateEd25519 reads the PKCS#8 PEM Ed25519 key at path, creating it
// (0600, with its public key beside it as path + ".pub", 0644) when
// missing. Errors name the path.
func LoadOrCreateEd25519(path string) (ed25519.PrivateKey, error) {
	key, err := LoadEd25519(path)
	if errors.Is(err, os.ErrNotExist) {
		return createEd25519(path)
	}
	return key, err
}

// LoadEd25519 reads an existing PKCS#8 PEM Ed25519 key at path; it never
// makes one. A missing file is an error that is os.ErrNotExist, which
// LoadOrCreateEd25519 creates and --check-config reports as to be created.
func LoadEd25519(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseEd25519Private(path, data)
}

func parseEd25519Private(path string, data []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: not a PEM PRIVATE KEY", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: %T, want an Ed25519 key", path, k)
	}
	return key, nil
}

// CanCreateEd25519 says whether LoadOrCreateEd25519 would make the missing
// key at path: an error when it would refuse.
func CanCreateEd25519(path string) error {
	// A public key without its private key is a key lost, not one never
	// made: whoever pinned it must hear of a new one, so none is made here.
	if _, err := os.Stat(path + ".pub"); err == nil {
		return fmt.Errorf("%s is missing but its public key %s.pub exists: restore the private key, or move the .pub aside to make a new key (and re-pin it wherever the old one was pinned)", path, path)
	}
	return nil
}

func createEd25519(path string) (ed25519.PrivateKey, error) {
	if err := CanCreateEd25519(path); err != nil {
		return nil, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), dirPerm); err != nil {
		return nil, err
	}
	pub, err := MarshalEd25519Public(key.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	// Public half first: a crash in between leaves no private key whose
	// public half nobody can find.
	if err := WriteFileAtomic(path+".pub", pub, certPerm); err != nil {
		return nil, err
	}
	if err := WriteFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), keyPerm); err != nil {
		return nil, err
	}
	return key, nil
}

// MarshalEd25519Public encodes pub as PEM "PUBLIC KEY".
func MarshalEd25519Public(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParseEd25519Public decodes a PEM "PUBLIC KEY" holding an Ed25519 key.
func ParseEd25519Public(data []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%T, want Ed25519", k)
	}
	return pub, nil
}

// LoadEd25519Public reads a PEM Ed25519 public key; errors name the path.
func LoadEd25519Public(path string) (ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pub, err := ParseEd25519Public(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pub, nil
}
