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
	// A trusted set during a grant-key rotation: a directory of *.pub
	// files, one of them the fixture's key.
	pub, err := os.ReadFile(filepath.Join(f.Dir, "grant.key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(f.Dir, "grant-keys")
	if err := os.Mkdir(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "1.pub"), pub, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := append([]configtest.Case{
		{Name: "good", Body: good, Summary: "authority 127.0.0.1:7401, runc, cgroup parent /airlock/"},
		{Name: "runc not executable", Body: strings.Replace(good, "runc: runc", "runc: runc-noexec", 1), Field: "sandbox.runc"},
		{Name: "runsc missing", Body: strings.Replace(good, "runc: runc", "runc: runc, runsc: gone", 1), Field: "sandbox.runsc"},
		{Name: "a directory of trusted keys", Body: strings.Replace(good, "grant.key.pub", "grant-keys", 1), Summary: "authority 127.0.0.1:7401"},
		{Name: "grant public key not PEM", Body: strings.Replace(good, "grant.key.pub", "not-pem.crt", 1), Field: "authority.grant_public_key"},
		{Name: "an extra CA", Body: strings.Replace(good, "runc: runc", "runc: runc, extra_cas: [pki/ca.crt]", 1), Summary: "authority 127.0.0.1:7401"},
		{Name: "a CA bundle that is a private key", Body: strings.Replace(good, "runc: runc", "runc: runc, ca_bundle: pki/ca.key", 1), Field: "sandbox.ca_bundle"},
		{Name: "an extra CA missing", Body: strings.Replace(good, "runc: runc", "runc: runc, extra_cas: [pki/ca.crt, gone.pem]", 1), Field: "sandbox.extra_cas[1]"},
		{Name: "the vm class under emulation", Body: strings.Replace(good, "runc: runc", "runc: runc, vm: {runtime: runc, emulation: true}", 1), Summary: "runc, vm (emulation allowed)"},
		{Name: "vm runtime missing", Body: strings.Replace(good, "runc: runc", "runc: runc, vm: {runtime: gone}", 1), Field: "sandbox.vm.runtime"},
		{Name: "vm runtime not executable", Body: strings.Replace(good, "runc: runc", "runc: runc, vm: {runtime: runc-noexec}", 1), Field: "sandbox.vm.runtime"},
		{Name: "vm kernel missing", Body: strings.Replace(good, "runc: runc", "runc: runc, vm: {runtime: runc, kernel: gone}", 1), Field: "sandbox.vm.kernel"},
		{Name: "vm field unknown", Body: strings.Replace(good, "runc: runc", "runc: runc, vm: {runtime: runc, emulate: true}", 1), Field: "sandbox.vm.emulate"},
		{Name: "uid base out of range", Body: strings.Replace(good, "runc: runc", "runc: runc, uid_base: 5", 1), Field: "sandbox.uid_base"},
	}, append(f.GoodCommon(good), f.BadCommon(good)...)...)
	f.Run(t, Check, cases)
}
