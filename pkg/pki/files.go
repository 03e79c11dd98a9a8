package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/airlockhq/airlock/pkg/atomicfile"
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
	if id.Instance != "" {
		// An executor of a fleet: service/executor/NAME.crt, beside the
		// single executor's service/executor.crt.
		base = filepath.Join(base, id.Instance)
	}
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
	if kp.ID == (identity.ID{}) {
		return errors.New("pki: write: the pair names no identity (a host certificate goes through WriteHostPair)")
	}
	certFile, keyFile := Paths(dir, kp.ID)
	if err := writePair(certFile, keyFile, kp); err != nil {
		return fmt.Errorf("pki: write %s: %w", kp.ID, err)
	}
	return nil
}

// WriteHostPair writes a pair from IssueHost to the given files, key
// first as WriteKeyPair does, creating their directories if needed. A host
// certificate lives with the server it is for, outside the identity layout.
func WriteHostPair(certFile, keyFile string, kp *KeyPair) error {
	if err := writePair(certFile, keyFile, kp); err != nil {
		return fmt.Errorf("pki: write host certificate: %w", err)
	}
	return nil
}

func writePair(certFile, keyFile string, kp *KeyPair) error {
	for _, d := range []string{filepath.Dir(certFile), filepath.Dir(keyFile)} {
		if err := os.MkdirAll(d, dirPerm); err != nil {
			return err
		}
	}
	if err := WriteFileAtomic(keyFile, kp.KeyPEM, keyPerm); err != nil {
		return err
	}
	return WriteFileAtomic(certFile, kp.CertPEM, certPerm)
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
// mix (a durable atomicfile.Write). perm is applied exactly, regardless of
// umask.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return atomicfile.Write(path, data, perm, atomicfile.Durable)
}
