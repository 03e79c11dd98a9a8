package dev

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// --credential-broker and --credential-approval become the dev tenant's
// credentials block, every host within its egress domains; bad flags are
// refused naming the flag.
func TestCredentialBrokers(t *testing.T) {
	token := filepath.Join(t.TempDir(), "gh.token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := parseCredentialBrokers([]string{"github:API.github.com:" + token, "npm:*.npmjs.org,registry.npmjs.org:" + token}, []string{"github"})
	if err != nil {
		t.Fatal(err)
	}
	block, domains := credentialPolicy(creds, []string{"proxy.golang.org", "registry.npmjs.org"})
	gh := block["github"].(map[string]any)
	if !slices.Equal(gh["hosts"].([]string), []string{"api.github.com"}) || gh["approval"] != "required" ||
		gh["source"].(map[string]any)["file"] != token {
		t.Errorf("github = %v", gh)
	}
	if _, ok := block["npm"].(map[string]any)["approval"]; ok {
		t.Errorf("npm = %v, want no approval", block["npm"])
	}
	if want := []string{"proxy.golang.org", "registry.npmjs.org", "api.github.com", "*.npmjs.org"}; !slices.Equal(domains, want) {
		t.Errorf("domains = %v, want %v", domains, want)
	}
	for _, tc := range []struct {
		brokers, approvals []string
		want               string
	}{
		{[]string{"github:api.github.com"}, nil, "want NAME:HOST[,HOST...]:FILE"},
		{[]string{"github:not a host:" + token}, nil, "--credential-broker github"},
		{[]string{"github:api.github.com:/nonexistent/file"}, nil, "not a readable regular file"},
		{[]string{"github:api.github.com:" + token, "github:x.github.com:" + token}, nil, "named twice"},
		{[]string{"github:api.github.com:" + token}, []string{"npm"}, "--credential-approval npm"},
	} {
		if _, err := parseCredentialBrokers(tc.brokers, tc.approvals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %q: %v, want %q", tc.brokers, tc.approvals, err, tc.want)
		}
	}
}
