package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// What a batch job wrote is on the host once its Run returns, even when
// the job was killed mid-run with its files still open and a file still
// mapped: nothing waits in a runtime's cache for a close or an exit that
// never comes. Under runsc a batch job's mounts are cached as gVisor's
// own (runscBatchFlags), so this is what says the cache writes through.
// Each class runs it; the patch and /out of a job killed at its deadline
// are made from exactly these files.
func TestWritesOutliveAKill(t *testing.T) {
	e := newEnv(t)
	script := `set -e
head -c 4194304 /dev/zero | tr '\0' 'w' > /work/big
echo more >> /work/a.txt
mkdir /work/d && echo in > /work/d/f && mv /work/d/f /work/d/g
rm /work/gone.txt
ln -s a.txt /work/link
chmod 600 /work/a.txt
echo out > /out/o
exec 3>/work/open && printf 'held open' >&3
exec python3 -c '
import mmap, sys, time
f = open("/work/mapped", "w+b")
f.truncate(8192)
m = mmap.mmap(f.fileno(), 8192)
m[4096:4102] = b"mapped"
print("wrote", flush=True)
time.sleep(300)
'
`
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			var out, errb syncBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sb, err := e.m.Create(ctx, Spec{ID: fmt.Sprintf("writes-%d", testSeq.Add(1)), Class: c,
				Source:  e.source(t, map[string]string{"a.txt": "one\n", "gone.txt": "bye\n"}),
				Command: []string{"sh", "-c", script}, Limits: defaultLimits, Stdout: &out, Stderr: &errb})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sb.Destroy(); err != nil {
					t.Errorf("Destroy: %v", err)
				}
			})
			done := make(chan Result, 1)
			go func() {
				res, err := sb.Run(ctx)
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				done <- res
			}()
			waitFor(t, "the job to print wrote", slowdown*30*time.Second, func() bool {
				return strings.Contains(out.String(), "wrote") || strings.Contains(errb.String(), "rror")
			})
			cancel()
			var res Result
			select {
			case res = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the job did not end")
			}
			if res.Reason != ReasonCancelled {
				t.Fatalf("ended %s (%s); stdout %q stderr %q", res.Reason, res.Message, out.String(), errb.String())
			}

			w := sb.WorkDir()
			if b, err := os.ReadFile(filepath.Join(w, "big")); err != nil || len(b) != 4<<20 || bytes.Count(b, []byte("w")) != 4<<20 {
				t.Errorf("/work/big: %d bytes, %d of them the job's, %v; want 4 MiB", len(b), bytes.Count(b, []byte("w")), err)
			}
			for name, want := range map[string]string{"a.txt": "one\nmore\n", "d/g": "in\n", "open": "held open"} {
				if b, err := os.ReadFile(filepath.Join(w, name)); err != nil || string(b) != want {
					t.Errorf("/work/%s = %q, %v; want %q", name, b, err, want)
				}
			}
			if b, err := os.ReadFile(filepath.Join(sb.OutDir(), "o")); err != nil || string(b) != "out\n" {
				t.Errorf("/out/o = %q, %v", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(w, "mapped")); err != nil || len(b) != 8192 || string(b[4096:4102]) != "mapped" {
				t.Errorf("/work/mapped: %d bytes, %v; the job's store through its mapping is not there", len(b), err)
			}
			for _, gone := range []string{"d/f", "gone.txt"} {
				if _, err := os.Lstat(filepath.Join(w, gone)); !os.IsNotExist(err) {
					t.Errorf("/work/%s is still there: %v", gone, err)
				}
			}
			if l, err := os.Readlink(filepath.Join(w, "link")); err != nil || l != "a.txt" {
				t.Errorf("/work/link -> %q, %v", l, err)
			}
			if fi, err := os.Stat(filepath.Join(w, "a.txt")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("/work/a.txt mode %v, %v; want 0600", fi.Mode(), err)
			}
		})
	}
}
