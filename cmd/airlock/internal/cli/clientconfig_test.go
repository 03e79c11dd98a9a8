package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClientConfigTrustDomainError checks that a bad trust_domain in the
// client config is reported with the field, the value and why, each once.
func TestClientConfigTrustDomainError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.yaml")
	body := "version: 1\ntrust_domain: A_B\npki_dir: .\nidentity: client/dev\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, path, nil, "job", "list")
	want := "airlock: client config " + path + `: trust_domain: invalid trust domain "A_B": has character 'A', want only a-z 0-9 . - _` + "\n"
	if code != 1 || errOut != want {
		t.Errorf("exit %d, stderr\n%s\nwant exit 1,\n%s", code, errOut, want)
	}
}
