package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/airlockhq/airlock/pkg/identity"
)

const (
	dirPerm  fs.FileMode = 0o700
	keyPerm  fs.FileMode = 0o600
	certPerm fs.FileMode = 0o644
)

// Paths returns where the certificate and key of id live under dir. Names
// are safe as path elements because identity forbids '/' and a leading '.'.
func Paths(dir string, id identity.ID) (certFile, keyFile string) {
	base := filepath.Join(dir, string(id.Kind), id.Name)
	return base + ".crt", base + ".key"
}

// WriteKeyPair writes kp to its Paths under dir, creating the kind directory
// if needed.
//
// The key is written before the certificate. A reader polling the files
// (pkg/tlsconfig.Source) may therefore briefly see the new key with the old
// certificate; that pair does not match, so the reader refuses it and keeps
// serving its previous pair until the certificate lands. The other order
// would be no worse for such a reader, but key-first means a crash between
// the two writes leaves a mismatch that every loader rejects loudly, rather
// than a new certificate whose key is lost.
func WriteKeyPair(dir string, kp *KeyPair) error {
	certFile, keyFile := Paths(dir, kp.ID)
	if err := os.MkdirAll(filepath.Dir(certFile), dirPerm); err != nil {
		return fmt.Errorf("pki: write %s: %w", kp.ID, err)
	}
	if err := WriteFileAtomic(keyFile, kp.KeyPEM, keyPerm); err != nil {
		return fmt.Errorf("pki: write %s: %w", kp.ID, err)
	}
	if err := WriteFileAtomic(certFile, kp.CertPEM, certPerm); err != nil {
		return fmt.Errorf("pki: write %s: %w", kp.ID, err)
	}
	return nil
}

// Init creates a new CA under dir for trustDomain, then issues and writes
// certificates for the three services and for each caller. It refuses, with
// an error wrapping ErrCAExists, if dir already holds a CA key: a second Init
// would invalidate every certificate already handed out.
//
// All callers are checked before anything is written, so a bad caller
// leaves dir untouched. A failure after the CA is saved (a full disk, say)
// leaves a partial directory that Init will not reuse; remove it and retry.
func Init(dir, trustDomain string, callers []identity.ID) (*CA, error) {
	if _, err := os.Stat(CAKeyPath(dir)); err == nil {
		return nil, fmt.Errorf("%w: %s; refusing to initialize over an existing CA", ErrCAExists, CAKeyPath(dir))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pki: init: %w", err)
	}
	if err := identity.ValidateTrustDomain(trustDomain); err != nil {
		return nil, fmt.Errorf("pki: init: %w", err)
	}
	ids := make([]identity.ID, 0, 3+len(callers))
	for _, name := range identity.ServiceNames() {
		ids = append(ids, identity.Service(trustDomain, name))
	}
	for _, c := range callers {
		if _, err := identity.New(c.TrustDomain, c.Kind, c.Name); err != nil {
			return nil, fmt.Errorf("pki: init: caller: %w", err)
		}
		if c.TrustDomain != trustDomain {
			return nil, fmt.Errorf("pki: init: caller %s: trust domain %q does not match %q", c, c.TrustDomain, trustDomain)
		}
		// A caller listed twice, or a service listed as a caller, would
		// otherwise be issued twice and the first pair silently replaced.
		if !slices.Contains(ids, c) {
			ids = append(ids, c)
		}
	}

	ca, err := NewCA(trustDomain, 0)
	if err != nil {
		return nil, err
	}
	if err := ca.Save(dir); err != nil {
		return nil, err
	}
	for _, id := range ids {
		kp, err := ca.Issue(id, IssueOptions{})
		if err != nil {
			return nil, err
		}
		if err := WriteKeyPair(dir, kp); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// IssueInto loads the CA under dir, issues a certificate for id and writes
// it beside the others, replacing any previous pair for id. This is rotation
// and onboarding of a new caller.
func IssueInto(dir string, id identity.ID, opts IssueOptions) (*KeyPair, error) {
	ca, err := LoadCA(dir)
	if err != nil {
		return nil, err
	}
	kp, err := ca.Issue(id, opts)
	if err != nil {
		return nil, err
	}
	if err := WriteKeyPair(dir, kp); err != nil {
		return nil, err
	}
	return kp, nil
}

// WriteFileAtomic replaces path with data so that a reader, or the file
// system after a crash, sees either the old contents or the new, never a
// mix: it writes a temporary file in the same directory, syncs it, renames
// it over path and syncs the directory. perm is applied exactly, regardless
// of umask.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// writeFileExclusive is WriteFileAtomic that fails with fs.ErrExist instead
// of replacing an existing file. A hard link, unlike rename, refuses to
// replace its target, which closes the gap between checking and writing.
func writeFileExclusive(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func writeTemp(path string, data []byte, perm os.FileMode) (tmpName string, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// The leading dot keeps readers that glob for *.crt or *.key from
	// picking up a half-written file.
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return "", err
	}
	if _, err := f.Write(data); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// syncDir makes a rename in dir durable; without it a crash can forget the
// rename even though the file's data was synced.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
