package sandbox

import (
	"context"
	"strings"
	"testing"
)

// From inside, under each class and the runsc filesystem flags in force
// (runscFSFlags, or AIRLOCK_TEST_RUNSC_FS's): the shared root takes no
// write at all. An overlay over it (gVisor's --overlay2=root:…) would
// take them into memory or a file beside the template, outside the job's
// disk limit, and let one job's files reach the next job's view of it.
func TestRootStaysReadOnly(t *testing.T) {
	e := newEnv(t)
	script := `for p in /evil /usr/bin/evil /etc/evil /var/evil; do
  if echo x > "$p" 2>/dev/null; then echo "wrote $p"; fi
done
if mkdir /evil-dir 2>/dev/null; then echo "made /evil-dir"; fi
if dd if=/dev/zero of=/big bs=1M count=32 2>/dev/null; then echo "wrote /big"; fi
if chmod 777 /usr/bin 2>/dev/null; then echo "chmod /usr/bin"; fi
echo done`
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), cmd: []string{"sh", "-c", script}})
			wantExit(t, r, 0)
			if r.stdout != "done\n" {
				t.Errorf("the root took writes:\n%s", strings.TrimSuffix(r.stdout, "done\n"))
			}
		})
	}
}
