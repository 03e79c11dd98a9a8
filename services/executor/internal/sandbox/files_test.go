package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

func fileDigest(t *testing.T, p string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// TestFilesBoundary attacks the files API from the job's side: the job
// plants symlinks to host paths, symlinks that climb out, a FIFO and a
// link to /proc, and the API is asked for host paths directly. Nothing
// outside /work and /out is read or written; uploads are atomic, owned by
// the sandbox's root, and bounded by the disk limit.
func TestFilesBoundary(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"README": "hello\n"})
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			sb, _ := e.session(t, c, src)
			ctx := context.Background()
			plant := `set -e
ln -s /etc/shadow /work/abs
ln -s ../../../../../../../../etc/passwd /work/up
ln -s /proc/self/root /work/procroot
mkdir /work/d /out/o
ln -s /etc /work/etcdir
ln -s ../README /work/d/rel
mkfifo /work/fifo
echo result > /out/o/r.txt`
			if r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", plant}}); r.res.ExitCode != 0 {
				t.Fatalf("plant: %+v %s", r.res, r.stderr)
			}
			shadow, passwd := fileDigest(t, "/etc/shadow"), fileDigest(t, "/etc/passwd")

			read := func(p string) (string, error) {
				f, _, err := sb.OpenFile(p)
				if err != nil {
					return "", err
				}
				defer f.Close()
				b, err := io.ReadAll(f)
				return string(b), err
			}
			for _, p := range []string{"/etc/shadow", "/proc/self/environ", "/work/../etc/shadow", "../../etc/passwd", "/work/abs",
				"/work/up", "/work/procroot/etc/shadow", "/work/etcdir/shadow", "/workx", "/work/fifo", "/work/d", "/"} {
				start := time.Now()
				got, err := read(p)
				// gVisor keeps a FIFO inside its own kernel: the host's
				// view of /work has none.
				fifoGone := c == ClassRunsc && p == "/work/fifo" && errors.Is(err, errdefs.ErrNotFound)
				if err == nil {
					t.Errorf("read %s: allowed (%d bytes)", p, len(got))
				} else if !errors.Is(err, errdefs.ErrPermissionDenied) && !errors.Is(err, errdefs.ErrInvalidArgument) && !fifoGone {
					t.Errorf("read %s: %v, want permission denied or invalid argument", p, err)
				}
				if time.Since(start) > 2*time.Second {
					t.Errorf("read %s took %s", p, time.Since(start))
				}
			}
			if got, err := read("/work/d/rel"); err != nil || got != "hello\n" {
				t.Errorf("a relative symlink that stays inside: %q %v", got, err)
			}
			if got, err := read("/out/o/r.txt"); err != nil || got != "result\n" {
				t.Errorf("read /out: %q %v", got, err)
			}

			// Writes: through a symlinked directory to the host, refused;
			// over a planted symlink, the symlink is replaced, not followed.
			if _, err := sb.WriteFile("/work/etcdir/evil", strings.NewReader("x"), 0o644, 1<<20); err == nil {
				t.Error("write through a symlink to the host's /etc: allowed")
			}
			if _, err := os.Stat("/etc/evil"); err == nil {
				t.Fatal("the write reached the host's /etc")
			}
			if _, err := sb.WriteFile("/work/abs", strings.NewReader("replaced\n"), 0o600, 1<<20); err != nil {
				t.Fatalf("write over a planted symlink: %v", err)
			}
			if _, err := sb.WriteFile("/etc/passwd", strings.NewReader("x"), 0o644, 1<<20); !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Errorf("write /etc/passwd: %v", err)
			}
			if fileDigest(t, "/etc/shadow") != shadow || fileDigest(t, "/etc/passwd") != passwd {
				t.Fatal("a host file changed")
			}
			if n, err := sb.WriteFile("/work/d/new.txt", strings.NewReader("uploaded\n"), 0o640, 1<<20); err != nil || n != 9 {
				t.Fatalf("upload: %d %v", n, err)
			}
			r := runExec(t, ctx, sb, ExecSpec{Argv: []string{"sh", "-c", "cat /work/d/new.txt /work/abs; stat -c '%u %a %F' /work/d/new.txt /work/abs"}})
			if r.stdout != "uploaded\nreplaced\n0 640 regular file\n0 600 regular file\n" {
				t.Fatalf("the job's view of the uploads: %q", r.stdout)
			}

			// Past the disk limit: refused, nothing partial left.
			big := bytes.NewReader(make([]byte, defaultLimits.DiskBytes+(1<<20)))
			if _, err := sb.WriteFile("/work/big.bin", big, 0o644, 1<<30); !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("upload past the disk limit: %v", err)
			}
			if _, err := sb.WriteFile("/work/d/new.txt", bytes.NewReader(make([]byte, 2<<20)), 0o644, 1<<20); !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("upload past the request's limit: %v", err)
			}
			list, cut, err := sb.ListFiles("/work", true, 1000)
			if err != nil || cut {
				t.Fatalf("list: %v %v", err, cut)
			}
			kinds := map[string]string{}
			for _, f := range list {
				kinds[f.Path] = f.Type + " " + f.Target
				if strings.Contains(f.Path, ".airlock-upload") || f.Path == "/work/big.bin" {
					t.Errorf("a refused upload left %s", f.Path)
				}
			}
			for p, want := range map[string]string{"/work/README": "file ", "/work/up": "symlink ../../../../../../../../etc/passwd",
				"/work/d/new.txt": "file ", "/work/abs": "file ", "/work/fifo": "other ", "/work/d": "dir "} {
				if kinds[p] != want && (p != "/work/fifo" || c == ClassRunc) {
					t.Errorf("list %s: %q, want %q", p, kinds[p], want)
				}
			}
			if got, err := read("/work/d/new.txt"); err != nil || got != "uploaded\n" {
				t.Errorf("a refused upload changed the file it would replace: %q %v", got, err)
			}
			if _, _, err := sb.ListFiles("/work/etcdir", true, 10); err == nil {
				t.Error("listing through a symlink to the host's /etc: allowed")
			}
		})
	}
}

// TestFilesRefusalsNameTheField: what the files API refuses because of the
// path it was given is InvalidArgument naming the field and the reason,
// never an internal error: a name or a path too long for the kernel, a path
// that is not UTF-8, and a FIFO the job planted.
func TestFilesRefusalsNameTheField(t *testing.T) {
	e := newEnv(t)
	src := e.source(t, map[string]string{"README": "hello\n"})
	sb, _ := e.session(t, ClassRunc, src)
	if r := runExec(t, context.Background(), sb, ExecSpec{Argv: []string{"mkfifo", "/out/f"}}); r.res.ExitCode != 0 {
		t.Fatalf("mkfifo: %+v %s", r.res, r.stderr)
	}
	longName := "/work/" + strings.Repeat("n", 300)
	longPath := "/out" + strings.Repeat("/e", 3000)
	for _, tc := range []struct{ path, want string }{
		{longName, "name too long"},
		{longPath, "name too long"},
		{"/work/\xff\xfe", "not valid UTF-8"},
		{"/out/f", `path "/out/f": is a FIFO, not a regular file`},
	} {
		_, _, rerr := sb.OpenFile(tc.path)
		_, werr := sb.WriteFile(tc.path, strings.NewReader("x"), 0o644, 1<<20)
		for op, err := range map[string]error{"read": rerr, "write": werr} {
			if tc.path == "/out/f" && op == "write" {
				continue // an upload replaces a FIFO as it would a file
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(strings.TrimPrefix(err.Error(), errdefs.ErrInvalidArgument.Error()+": "), "path ") {
				t.Errorf("%s %.40q: %v; want invalid argument naming path: %s", op, tc.path, err, tc.want)
			}
		}
	}
}
