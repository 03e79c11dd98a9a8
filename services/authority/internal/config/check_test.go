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
	good := f.Common() + `executor: {address: 127.0.0.1:7402}
tenants:
  dev:
    clients: [client/dev]
    repositories: {demo: {url: /srv/git/demo.git}}
`
	if err := os.WriteFile(filepath.Join(f.Dir, "lost.key.pub"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := append([]configtest.Case{
		{Name: "good, keys to be made", Body: good, Summary: "executor 127.0.0.1:7402, store sqlite, 1 tenants; data_dir " + f.Dir +
			"/data/authority will be created; grant_key " + f.Dir + "/data/authority/grant.key will be created"},
		{Name: "good, grant key there", Body: good + "grant_key: grant.key\n", Summary: "1 tenants; data_dir"},
		{Name: "grant key not PEM", Body: good + "grant_key: not-pem.crt\n", Field: "grant_key"},
		{Name: "grant key lost, its public key kept", Body: good + "grant_key: lost.key\n", Field: "grant_key"},
		{Name: "grant ttl out of range", Body: good + "grant_ttl: 1s\n", Field: "grant_ttl"},
		{Name: "tenant policy", Body: strings.Replace(good, "client/dev", "approver/dev", 1), Field: "tenants.dev.clients[0]"},
		{Name: "checkpoint file's directory missing", Body: good + "audit: {checkpoint_file: nowhere/cp.jsonl}\n", Field: "audit.checkpoint_file"},
	}, f.BadCommon(good)...)
	f.Run(t, Check, cases)
}
