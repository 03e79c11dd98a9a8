package grant_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/grant"
)

func pubPEM(t *testing.T, key ed25519.PrivateKey) []byte {
	t.Helper()
	p, err := grant.MarshalPublicKey(pubOf(key))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func privPEM(t *testing.T, key ed25519.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// verifies signs a valid grant with key and verifies it with v.
func verifies(t *testing.T, v *grant.Verifier, key ed25519.PrivateKey) error {
	t.Helper()
	_, err := v.Verify(mustSign(t, grant.NewSigner(key), validGrant()), now)
	return err
}

// wantUnknown: a grant signed by key is refused as unknown, naming its key id.
func wantUnknown(t *testing.T, err error, key ed25519.PrivateKey, msg string) {
	t.Helper()
	if !errors.Is(err, grant.ErrUnknownKey) || !strings.Contains(err.Error(), grant.KeyID(pubOf(key))) {
		t.Errorf("%s: error = %v, want %v naming %s", msg, err, grant.ErrUnknownKey, grant.KeyID(pubOf(key)))
	}
}

// TestFileVerifierFollowsTheFile rotates through one file holding several
// keys: each change takes effect on the next grant, with no new Verifier.
func TestFileVerifierFollowsTheFile(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	path := filepath.Join(t.TempDir(), "grant.pub")
	writeFile(t, path, pubPEM(t, k1))
	var logs bytes.Buffer
	v, err := grant.NewFileVerifier(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := verifies(t, v, k1); err != nil {
		t.Fatalf("key 1 at start: %v", err)
	}
	wantUnknown(t, verifies(t, v, k2), k2, "key 2 before it is added")

	writeFile(t, path, append(pubPEM(t, k1), pubPEM(t, k2)...))
	for name, k := range map[string]ed25519.PrivateKey{"1": k1, "2": k2} {
		if err := verifies(t, v, k); err != nil {
			t.Errorf("key %s with both in the file: %v", name, err)
		}
	}

	writeFile(t, path, pubPEM(t, k2))
	wantUnknown(t, verifies(t, v, k1), k1, "key 1 after it is removed")
	if err := verifies(t, v, k2); err != nil {
		t.Errorf("key 2 alone: %v", err)
	}

	// Bad changes keep the last good set: never an empty trust set, and
	// never the removed key back.
	for name, data := range map[string][]byte{
		"truncated":   pubPEM(t, k2)[:40],
		"empty":       nil,
		"private key": privPEM(t, k1),
		"garbage":     append(pubPEM(t, k2), "junk\n"...),
	} {
		logs.Reset()
		writeFile(t, path, data)
		if err := verifies(t, v, k2); err != nil {
			t.Errorf("%s file: key 2 of the last good set refused: %v", name, err)
		}
		wantUnknown(t, verifies(t, v, k1), k1, name+" file: key 1")
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), path) {
			t.Errorf("%s file: no error logged naming %s: %q", name, path, logs.String())
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := verifies(t, v, k2); err != nil {
		t.Errorf("file removed: key 2 of the last good set refused: %v", err)
	}
	writeFile(t, path, pubPEM(t, k1))
	if err := verifies(t, v, k1); err != nil {
		t.Errorf("file restored with key 1: %v", err)
	}
	wantUnknown(t, verifies(t, v, k2), k2, "key 2 after the file names key 1 only")
}

// TestFileVerifierFollowsADirectory adds and removes *.pub files.
func TestFileVerifierFollowsADirectory(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "1.pub"), pubPEM(t, k1))
	writeFile(t, filepath.Join(dir, "README"), []byte("not a key, not read\n"))
	v, err := grant.NewFileVerifier(dir, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := v.KeyIDs(); len(got) != 1 || got[0] != grant.KeyID(pubOf(k1)) {
		t.Errorf("KeyIDs = %v, want key 1 only", got)
	}
	writeFile(t, filepath.Join(dir, "2.pub"), pubPEM(t, k2))
	if err := verifies(t, v, k2); err != nil {
		t.Errorf("key 2 added as 2.pub: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "1.pub")); err != nil {
		t.Fatal(err)
	}
	wantUnknown(t, verifies(t, v, k1), k1, "key 1 after 1.pub is removed")
	if err := os.Remove(filepath.Join(dir, "2.pub")); err != nil {
		t.Fatal(err)
	}
	if err := verifies(t, v, k2); err != nil {
		t.Errorf("every .pub removed: the last good set must stay, got %v", err)
	}
}

func TestLoadPublicKeysRefusesBadSets(t *testing.T) {
	k := newKey(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	priv := filepath.Join(dir, "priv.pub")
	writeFile(t, priv, append(pubPEM(t, k), privPEM(t, k)...))
	for name, tc := range map[string]struct{ path, want string }{
		"missing":           {filepath.Join(dir, "nope"), "no such file"},
		"empty directory":   {empty, "holds no PEM PUBLIC KEY"},
		"private key in it": {priv, "key 2: not a PEM PUBLIC KEY"},
	} {
		_, err := grant.LoadPublicKeys(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, tc.want)
		}
		if _, err := grant.NewFileVerifier(tc.path, slog.Default()); err == nil {
			t.Errorf("%s: NewFileVerifier accepted it", name)
		}
	}
}

// TestLoadSigningKeysDirectory: the last key by name signs, and every
// public key is published beside the directory.
func TestLoadSigningKeysDirectory(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	dir := filepath.Join(t.TempDir(), "grant-keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := grant.LoadSigningKeys(dir); err == nil || !strings.Contains(err.Error(), "holds no *.key") {
		t.Errorf("empty directory: err = %v", err)
	}
	writeFile(t, filepath.Join(dir, "2026-01.key"), privPEM(t, k1))
	writeFile(t, filepath.Join(dir, "2026-12.key"), privPEM(t, k2))
	s, pubs, err := grant.LoadSigningKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.KeyID() != grant.KeyID(pubOf(k2)) {
		t.Errorf("signing key %s, want the last by name %s", s.KeyID(), grant.KeyID(pubOf(k2)))
	}
	if len(pubs) != 2 {
		t.Errorf("%d public keys, want 2", len(pubs))
	}
	v, err := grant.NewFileVerifier(dir+".pub", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	for name, k := range map[string]ed25519.PrivateKey{"1": k1, "2": k2} {
		if err := verifies(t, v, k); err != nil {
			t.Errorf("key %s from the published set: %v", name, err)
		}
	}
	writeFile(t, filepath.Join(dir, "2027.key"), []byte("not a key"))
	if _, _, err := grant.LoadSigningKeys(dir); err == nil || !strings.Contains(err.Error(), "2027.key") {
		t.Errorf("bad key file: err = %v, want one naming it", err)
	}

	// A single file is as before: made when missing, grant.key.pub beside it.
	file := filepath.Join(t.TempDir(), "grant.key")
	s, pubs, err = grant.LoadSigningKeys(file)
	if err != nil {
		t.Fatal(err)
	}
	got, err := grant.LoadPublicKeys(file + ".pub")
	if err != nil || len(got) != 1 || len(pubs) != 1 || grant.KeyID(got[0]) != s.KeyID() {
		t.Errorf("single file: published %v (%v), signer %s", got, err, s.KeyID())
	}
}
