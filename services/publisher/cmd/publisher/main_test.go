package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/config/configtest"
)

// The built binary's --check-config: exit 0 and the ok line for a good
// config, exit 2 and one line per problem for a bad one, nothing written
// either way.
func TestCheckConfigFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "publisher")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f := configtest.New(t, "publisher")
	good := f.Common() + "authority: {address: 127.0.0.1:7401, grant_public_key: grant.key.pub}\n"
	bad := good + "executor: {address: 127.0.0.1:7402}\nscan: {decode_depth: 99}\n"
	for _, tc := range []struct {
		name, body string
		code       int
		stdout     []string
		stderr     []string
	}{
		{name: "good", body: good, code: 0, stdout: []string{"ok: publisher config CONFIG", "listen " + f.Listen + ", trust domain airlock.test, data dir DIR/data/publisher, authority 127.0.0.1:7401, store sqlite; data_dir DIR/data/publisher will be created"}},
		{name: "two problems", body: bad, code: 2, stderr: []string{
			"publisher: config CONFIG: executor: no longer used: each bundle is fetched from the executor the authority says the job ran on; remove it",
			"publisher: config CONFIG: scan.decode_depth: 99: must be between 1 and 8",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(f.Dir, "publisher.yaml")
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			before := configtest.Tree(t, f.Dir)
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, "--check-config", "--config", path)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			lines := func(s string) []string {
				s = strings.ReplaceAll(strings.ReplaceAll(s, path, "CONFIG"), f.Dir, "DIR")
				if s == "" {
					return nil
				}
				return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
			}
			if code != tc.code || !reflect.DeepEqual(lines(stdout.String()), tc.stdout) || !reflect.DeepEqual(lines(stderr.String()), tc.stderr) {
				t.Errorf("exit %d, stdout\n%s\nstderr\n%s\nwant exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
			if after := configtest.Tree(t, f.Dir); !reflect.DeepEqual(before, after) {
				t.Errorf("the check changed %s:\nbefore %v\nafter  %v", f.Dir, before, after)
			}
		})
	}
}
