package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// --check-config on real files: a good config passes, creating and
// binding nothing and running no runtime; each bad one fails naming its
// field.
func TestCheck(t *testing.T) {
	f := configtest.New(t, "executor")
	// Stand-ins for the runtimes: a check must not run them, and one that
	// did would leave ran behind.
	for name, mode := range map[string]os.FileMode{"runc": 0o755, "runc-noexec": 0o644} {
		script := "#!/bin/sh\ntouch " + filepath.Join(f.Dir, "ran") + "\n"
		if err := os.WriteFile(filepath.Join(f.Dir, name), []byte(script), mode); err != nil {
			t.Fatal(err)
		}
	}
	good := f.Common() + "authority: {address: 127.0.0.1:7401, grant_public_key: grant.key.pub}\nsandbox: {runc: runc}\n"
	cases := append([]configtest.Case{
		{Name: "good", Body: good, Summary: "authority 127.0.0.1:7401, runc, cgroup parent /airlock/"},
		{Name: "runc not executable", Body: strings.Replace(good, "runc: runc", "runc: runc-noexec", 1), Field: "sandbox.runc"},
		{Name: "runsc missing", Body: strings.Replace(good, "runc: runc", "runc: runc, runsc: gone", 1), Field: "sandbox.runsc"},
		{Name: "grant public key not PEM", Body: strings.Replace(good, "grant.key.pub", "not-pem.crt", 1), Field: "authority.grant_public_key"},
		{Name: "uid base out of range", Body: strings.Replace(good, "runc: runc", "runc: runc, uid_base: 5", 1), Field: "sandbox.uid_base"},
	}, f.BadCommon(good)...)
	f.Run(t, Check, cases)
}
