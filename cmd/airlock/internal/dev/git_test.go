package dev

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadGitServe(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"s.read": "read-token-0123456789\n", "s.deploy": "deploy-token-0123456789\n", "two.lines": "a\nb\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const good = "version: 1\nlisten: 127.0.0.1:0\ntls: {cert: s.crt, key: s.key}\nroot: repos\n" +
		"repositories:\n  s: {read_credential: s.read, push_credential: s.deploy}\n"
	load := func(body string) (*gitServeFile, error) {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(body, "s.", dir+"/s.")), 0o600); err != nil {
			t.Fatal(err)
		}
		f, repos, err := loadGitServe(path)
		if err == nil && (len(repos) != 1 || repos[0].ReadTokens[0] != "read-token-0123456789" || repos[0].PushTokens[0] != "deploy-token-0123456789") {
			t.Errorf("repositories = %+v", repos)
		}
		return f, err
	}
	f, err := load(good)
	if err != nil {
		t.Fatalf("good config: %v", err)
	}
	if !filepath.IsAbs(f.Root) || f.SpoolDir == "" || f.Log.Format != "json" {
		t.Errorf("paths and defaults not filled in: %+v", f)
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"not loopback", strings.Replace(good, "127.0.0.1:0", "0.0.0.0:0", 1), "listen: \"0.0.0.0:0\": the dev git server listens on a loopback address only"},
		{"a host name", strings.Replace(good, "127.0.0.1:0", "localhost:0", 1), "loopback address only"},
		{"unknown field", good + "anonymous: true\n", "anonymous (line 7): unknown field"},
		{"no version", strings.Replace(good, "version: 1\n", "", 1), "version: required"},
		{"missing token file", strings.Replace(good, "s.deploy", "s.gone", 1), "repositories.s.push_credential:"},
		{"token of two lines", strings.Replace(good, "s.read", "two.lines", 1), "repositories.s.read_credential:"},
		{"no repositories", strings.SplitAfter(good, "root: repos\n")[0], "repositories: at least one is required"},
		{"no root", strings.Replace(good, "root: repos\n", "", 1), "root: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.ReplaceAll(tc.body, "two.lines", dir+"/two.lines")
			_, err := load(body)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load: %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "token-0123456789") {
				t.Errorf("the error holds a token: %v", err)
			}
		})
	}
}
