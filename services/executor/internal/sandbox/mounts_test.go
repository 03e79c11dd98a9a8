package sandbox

import (
	"context"
	"strings"
	"testing"
)

// TestMountsNameNoHostPath: what a job reads of its mounts (/proc/mounts,
// /proc/self/mountinfo) names no host directory of the executor: not its
// state directory (the job's scratch, upper layer) nor the retained source.
func TestMountsNameNoHostPath(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"README": "hello\n"})
	for _, v := range testVariants(t, e) {
		t.Run(v.name, func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: v.class, src: src, cmd: []string{"/bin/sh", "-c", "cat /proc/mounts /proc/self/mountinfo; grep -c . /proc/mounts"}, claimed: v.claimed})
			if r.res.ExitCode != 0 || !strings.Contains(r.stdout, "/work") {
				t.Fatalf("the job could not read its mounts: %+v %s", r.res, r.stderr)
			}
			for _, host := range []string{e.base, e.cfg.StateDir, src} {
				if strings.Contains(r.stdout, host) {
					t.Errorf("the job's mounts name the host path %s:\n%s", host, r.stdout)
				}
			}
		})
	}
}
