package sandbox

import (
	"context"
	"strings"
	"testing"
)

// TestConfiguredPath: a job, under each class, starts with the PATH the
// operator configured (Config.Path), so a toolchain the host keeps outside
// the default directories, the Go in the host's /usr, runs by name; a job
// that sets its own PATH keeps it; without the setting, `go` is not found.
func TestConfiguredPath(t *testing.T) {
	goroot := hostGo(t, "env", "GOROOT")
	if !strings.HasPrefix(goroot, "/usr/") || strings.HasPrefix(goroot+"/", "/usr/bin/") {
		t.Fatalf("the host's Go toolchain is at %s: this test wants it under /usr, outside the default PATH", goroot)
	}
	path := goroot + "/bin:" + DefaultPath
	e := newEnv(t, func(c *Config) { c.Path = path })
	script := `echo "$PATH"; command -v go; go version | cut -d' ' -f1-2`
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", script}})
			wantExit(t, r, 0)
			if want := path + "\n" + goroot + "/bin/go\ngo version\n"; r.stdout != want {
				t.Errorf("stdout %q, want %q", r.stdout, want)
			}
			r = e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", `echo "$PATH"`}, env: map[string]string{"PATH": "/bin"}})
			wantExit(t, r, 0)
			if r.stdout != "/bin\n" {
				t.Errorf("a job's own PATH: stdout %q, want %q", r.stdout, "/bin\n")
			}
		})
	}
	plain := newEnv(t)
	r := plain.run(t, context.Background(), job{src: plain.source(t, nil), cmd: []string{"go", "version"}})
	wantExit(t, r, 127)
}
