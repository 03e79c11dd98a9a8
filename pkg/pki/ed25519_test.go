package pki_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/pki"
)

func TestLoadOrCreateEd25519(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "k.key")
	k1, err := pki.LoadOrCreateEd25519(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	pub, err := pki.LoadEd25519Public(path + ".pub")
	if err != nil || !pub.Equal(k1.Public()) {
		t.Fatalf("public key beside it: %v", err)
	}
	k2, err := pki.LoadOrCreateEd25519(path)
	if err != nil || !k2.Equal(k1) {
		t.Fatalf("loaded again: %v", err)
	}
	// The private key lost, the public one kept: no silent new key.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateEd25519(path); err == nil || !strings.Contains(err.Error(), "restore the private key") {
		t.Fatalf("a lost private key was replaced: %v", err)
	}
	if data, _ := os.ReadFile(path + ".pub"); !strings.Contains(string(data), "PUBLIC KEY") {
		t.Error("the old public key was overwritten")
	}
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateEd25519(path); err == nil || !strings.Contains(err.Error(), "not a PEM PRIVATE KEY") {
		t.Errorf("a bad key file: %v", err)
	}
}
