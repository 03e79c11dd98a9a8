package contentcheck

import (
	"strings"
	"testing"
)

// The environment check is the gitleaks rules and the shapes beyond them:
// each of these is caught by one and not the other, so neither half can
// be dropped unnoticed.
func TestCredentialValue(t *testing.T) {
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v, shape, want string
	}{
		{"dapi0123456789abcdef0123456789abcdef", "", "a secret of the kind databricks-api-token"},
		{"shpat_0123456789abcdef0123456789abcdef", "", "a secret of the kind shopify-access-token"},
		{"sk-abcdefghijklmnopqrstuvwx", "an API secret key", "an API secret key"},
		{"https://user:hunter2@example.com/repo.git", "a URL with a password", "a URL with a password"},
		{"prefix -----BEGIN CERTIFICATE-----", "a PEM block", "a PEM block"},
		{"https://proxy.golang.org,direct", "", ""},
	} {
		if got := credentialShape(tc.v); got != tc.shape {
			t.Errorf("credentialShape(%q) = %q, want %q", tc.v, got, tc.shape)
		}
		got, err := c.CredentialValue(t.Context(), tc.v)
		if err != nil || got != tc.want {
			t.Errorf("CredentialValue(%q) = %q, %v; want %q", tc.v, got, err, tc.want)
		}
		if strings.Contains(got, tc.v) {
			t.Errorf("the answer quotes the value: %q", got)
		}
	}
}
