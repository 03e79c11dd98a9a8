package grant

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/pkg/pki"
)

// LoadPublicKeys reads a set of trusted Ed25519 public keys from path: a
// file holding one or more PEM "PUBLIC KEY" blocks, or a directory whose
// *.pub files each hold one or more. An empty set is an error: trusting
// no key is never what an operator meant.
func LoadPublicKeys(path string) ([]ed25519.PublicKey, error) {
	files, err := keyFiles(path, ".pub")
	if err != nil {
		return nil, fmt.Errorf("grant public keys: %w", err)
	}
	var keys []ed25519.PublicKey
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("grant public keys: %w", err)
		}
		ks, err := parsePublicKeys(data)
		if err != nil {
			return nil, fmt.Errorf("grant public keys: %s: %w", f, err)
		}
		keys = append(keys, ks...)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("grant public keys: %s holds no PEM PUBLIC KEY", path)
	}
	return keys, nil
}

// parsePublicKeys decodes every PEM block of data; each must be an Ed25519
// "PUBLIC KEY", so a stray private key or a truncated copy is refused
// rather than skipped.
func parsePublicKeys(data []byte) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			if strings.TrimSpace(string(data)) != "" {
				return nil, fmt.Errorf("key %d: not a PEM PUBLIC KEY", n)
			}
			return keys, nil
		}
		pub, err := pki.ParseEd25519Public(pem.EncodeToMemory(block))
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", n, err)
		}
		keys = append(keys, pub)
	}
}

// keyFiles is path itself when it is a file, else the files of the
// directory path whose names end in ext, sorted by name.
func keyFiles(path, ext string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ext) {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	sort.Strings(files)
	return files, nil
}

// fingerprint names the key set's present contents: each file's name and
// bytes, hashed. It reads rather than stats, since a key file rewritten in
// place within one clock tick keeps its size (every Ed25519 PEM is the same
// length) and its mtime; the files are a few hundred bytes each.
func fingerprint(path string) string {
	h := sha256.New()
	files, err := keyFiles(path, ".pub")
	if err != nil {
		fmt.Fprintf(h, "error %v\n", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		fmt.Fprintf(h, "%q %v %d\n", f, err, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// keyFile keeps a Verifier's keys in step with a file or directory.
type keyFile struct {
	path   string
	logger *slog.Logger

	mu   sync.Mutex
	seen string // fingerprint last read, good or bad
}

// NewFileVerifier trusts the keys LoadPublicKeys reads from path, and
// checks the files before each grant is verified, parsing them again when
// their contents changed: a key added is trusted, and a key removed is
// refused, from the next grant on, with no restart. Checking on each
// verification rather than polling on a timer costs one small read per
// file per grant (grants come once per job, exec or update, not per byte),
// needs no goroutine to stop, and leaves no window in which a removed key
// is still trusted.
// A set that cannot be read or is invalid keeps the last good set and
// logs an error, so a half-copied file never empties the trust set.
func NewFileVerifier(path string, logger *slog.Logger) (*Verifier, error) {
	seen := fingerprint(path)
	keys, err := LoadPublicKeys(path)
	if err != nil {
		return nil, err
	}
	v := NewVerifier(keys...)
	v.file = &keyFile{path: path, logger: logger, seen: seen}
	return v, nil
}

// refresh re-reads the key set when its files changed since last seen.
func (v *Verifier) refresh() {
	f := v.file
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := fingerprint(f.path)
	if now == f.seen {
		return
	}
	f.seen = now
	keys, err := LoadPublicKeys(f.path)
	if err != nil {
		f.logger.Error("grant public keys not re-read; the last good set is kept", "path", f.path, "err", err)
		return
	}
	v.SetKeys(keys...)
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = KeyID(k)
	}
	f.logger.Info("grant public keys re-read", "path", f.path, "key_ids", ids)
}

// LoadSigningKeys reads the authority's signing keys: path is one PKCS#8
// PEM Ed25519 key file (created when missing, as LoadOrCreateSigner does)
// or a directory of *.key files, of which the last by name signs (name
// them so the newest sorts last, say by date). It writes path + ".pub"
// holding every public key, signing or not, for operators to copy to the
// executors' trusted set; for a single file that is the usual grant.key.pub.
func LoadSigningKeys(path string) (*Signer, []ed25519.PublicKey, error) {
	fi, err := os.Stat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("grant key: %w", err)
	}
	if err != nil || !fi.IsDir() {
		s, err := LoadOrCreateSigner(path)
		if err != nil {
			return nil, nil, err
		}
		return s, []ed25519.PublicKey{s.PublicKey()}, nil
	}
	keys, err := signingKeyDir(path)
	if err != nil {
		return nil, nil, err
	}
	var pubs []ed25519.PublicKey
	var pemAll []byte
	for _, key := range keys {
		pub := key.Public().(ed25519.PublicKey)
		p, err := MarshalPublicKey(pub)
		if err != nil {
			return nil, nil, fmt.Errorf("grant key: %w", err)
		}
		pubs, pemAll = append(pubs, pub), append(pemAll, p...)
	}
	last := keys[len(keys)-1]
	if err := pki.WriteFileAtomic(path+".pub", pemAll, 0o644); err != nil {
		return nil, nil, fmt.Errorf("grant key: %w", err)
	}
	return NewSigner(last), pubs, nil
}

// signingKeyDir reads the *.key files of the directory path in signing
// order: the last signs.
func signingKeyDir(path string) ([]ed25519.PrivateKey, error) {
	files, err := keyFiles(path, ".key")
	if err != nil {
		return nil, fmt.Errorf("grant key: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("grant key: directory %s holds no *.key file", path)
	}
	keys := make([]ed25519.PrivateKey, 0, len(files))
	for _, f := range files {
		key, err := pki.LoadEd25519(f)
		if err != nil {
			return nil, fmt.Errorf("grant key: %w", err)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// CheckSigningKeyDir reads the signing keys of the directory path as
// LoadSigningKeys does, writing nothing (--check-config).
func CheckSigningKeyDir(path string) error {
	_, err := signingKeyDir(path)
	return err
}
