package config

import (
	"strings"
	"testing"
)

// sandbox.path is the jobs' PATH: clean absolute directories, nothing that
// searches the current directory, bounded; a bad one is named by field and
// says why.
func TestSandboxPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want string // "" means valid
	}{
		{"", ""},
		{"/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ""},
		{"/opt/my tools/bin:/usr/bin", ""},
		{":/usr/bin", "entry 1 is empty"},
		{"/usr/bin:", "entry 2 is empty"},
		{"/usr/bin::/bin", "entry 2 is empty"},
		{"/usr/bin:.", `entry 2 "."`},
		{"bin:/usr/bin", `entry 1 "bin"`},
		{"/usr/bin/../../work", "clean absolute directory"},
		{"/usr/bin/", "clean absolute directory"},
		{"/usr//bin", "clean absolute directory"},
		{"/usr/bin\n/x", "control character"},
		{"/" + strings.Repeat("a", 4096), "at most 4096"},
	} {
		c := &Config{Sandbox: Sandbox{Path: tc.path}}
		got, bad := fieldErrors(c.ValidatePeers())["sandbox.path"]
		switch {
		case tc.want == "" && bad:
			t.Errorf("sandbox.path %q refused: %s", tc.path, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("sandbox.path %q: error %q, want one saying %q", tc.path, got, tc.want)
		}
	}
}
