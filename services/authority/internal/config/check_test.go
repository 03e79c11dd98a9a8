package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// --check-config on real files: a good config passes, creating and
// binding nothing (a missing grant key is said to be created, not made);
// each bad one fails naming its field.
func TestCheck(t *testing.T) {
	f := configtest.New(t, "authority")
	good := f.Common() + `fleet: {heartbeat_interval: 2s}
tenants:
  dev:
    clients: [client/dev]
    repositories: {demo: {url: /srv/git/demo.git}}
`
	if err := os.WriteFile(filepath.Join(f.Dir, "lost.key.pub"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Signing keys during a rotation: a directory of *.key files; one
	// with a bad key among them.
	key, err := os.ReadFile(filepath.Join(f.Dir, "grant.key"))
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range map[string]map[string][]byte{
		"grant-keys": {"1.key": key},
		"bad-keys":   {"1.key": key, "2.key": []byte("not a key")},
	} {
		if err := os.Mkdir(filepath.Join(f.Dir, dir), 0o700); err != nil {
			t.Fatal(err)
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(f.Dir, dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := append([]configtest.Case{
		{Name: "a directory of signing keys", Body: good + "grant_key: grant-keys\n", Summary: "1 tenants; data_dir"},
		{Name: "a bad key among the signing keys", Body: good + "grant_key: bad-keys\n", Field: "grant_key"},
		{Name: "good, keys to be made", Body: good, Summary: "fleet heartbeat 2s, lost after 30s, store sqlite, 1 tenants; data_dir " + f.Dir +
			"/data/authority will be created; grant_key " + f.Dir + "/data/authority/grant.key will be created"},
		{Name: "good, grant key there", Body: good + "grant_key: grant.key\n", Summary: "1 tenants; data_dir"},
		{Name: "grant key not PEM", Body: good + "grant_key: not-pem.crt\n", Field: "grant_key"},
		{Name: "grant key lost, its public key kept", Body: good + "grant_key: lost.key\n", Field: "grant_key"},
		{Name: "grant ttl out of range", Body: good + "grant_ttl: 1s\n", Field: "grant_ttl"},
		{Name: "tenant policy", Body: strings.Replace(good, "client/dev", "approver/dev", 1), Field: "tenants.dev.clients[0]"},
		{Name: "checkpoint file's directory missing", Body: good + "audit: {checkpoint_file: nowhere/cp.jsonl}\n", Field: "audit.checkpoint_file"},
	}, append(f.GoodCommon(good), f.BadCommon(good)...)...)
	f.Run(t, Check, cases)
}
