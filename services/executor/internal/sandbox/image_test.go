package sandbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/runspec"
)

const testImageDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// node is one entry of a test layer, as an unpacker leaves it: a file
// (content, mode 0644, or 0755 for "exec"), a dir, a symlink (content is
// its target), an overlayfs whiteout (a 0:0 character device), an opaque
// directory (trusted.overlay.opaque=y) or a FIFO.
type node struct{ path, kind, content string }

// buildLayer makes dir a layer of nodes, owned by uid (the sandbox's root,
// as a store unpacking for this executor would leave it).
func buildLayer(t testing.TB, dir string, uid int, nodes ...node) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		p := filepath.Join(dir, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch n.kind {
		case "file":
			err = os.WriteFile(p, []byte(n.content), 0o644)
		case "exec":
			err = os.WriteFile(p, []byte(n.content), 0o755)
		case "dir":
			err = os.MkdirAll(p, 0o755)
		case "symlink":
			err = os.Symlink(n.content, p)
		case "whiteout":
			err = unix.Mknod(p, unix.S_IFCHR|0o000, 0)
		case "opaque":
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0)
			}
		case "fifo":
			err = unix.Mkfifo(p, 0o644)
		default:
			err = fmt.Errorf("unknown kind %q", n.kind)
		}
		if err != nil {
			t.Fatalf("layer %s: %s: %v", dir, n.path, err)
		}
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

const (
	imagePasswd = "root:x:0:0:root:/root:/bin/probe\ndaemon:x:1:1:daemon:/usr/sbin:/bin/probe\nimgsvc:x:901:901::/srv:/bin/probe\n"
	imageGroup  = "root:x:0:\ndaemon:x:1:\nimgsvc:x:901:\n"
	imageOS     = "ID=airlock-test\nVERSION_ID=2\n"
)

// testImage is a two-layer image whose only program is the static probe
// (/bin/probe): no /usr/bin, no libraries, nothing of the host's. The
// upper layer replaces a file, whites one out, makes a directory opaque
// and replaces /etc/os-release.
func testImage(t testing.TB, e *env) *ImageRoot {
	t.Helper()
	probe, err := os.ReadFile(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(e.base, "image-")
	if err != nil {
		t.Fatal(err)
	}
	lower, upper := filepath.Join(dir, "lower"), filepath.Join(dir, "upper")
	uid := int(e.cfg.UIDBase)
	buildLayer(t, lower, uid,
		node{"bin/probe", "exec", string(probe)},
		node{"etc/os-release", "file", "ID=airlock-test\nVERSION_ID=1\n"},
		node{"etc/passwd", "file", imagePasswd},
		node{"etc/group", "file", imageGroup},
		node{"usr/share/image.txt", "file", "image"},
		node{"over.txt", "file", "lower"},
		node{"gone.txt", "file", "lower"},
		node{"keep.txt", "file", "lower-keep"},
		node{"opq/a", "file", "a"},
		node{"opq/b", "file", "b"},
	)
	buildLayer(t, upper, uid,
		node{"etc/os-release", "file", imageOS},
		node{"over.txt", "file", "upper"},
		node{"gone.txt", "whiteout", ""},
		node{"opq", "opaque", ""},
		node{"opq/c", "file", "c"},
	)
	return &ImageRoot{Digest: testImageDigest, Layers: []string{lower, upper},
		Env: []string{"PATH=/bin:/opt/image/bin", "IMAGE_VAR=from-image", "JOB_WINS=image", "TERM=xterm", "SSL_CERT_FILE=/image/ca.pem", "HOME=/image-home"}}
}

// runImage runs argv on im in class as user.
func (e *env) runImage(t *testing.T, class Class, im *ImageRoot, user runspec.User, env map[string]string, argv ...string) ran {
	t.Helper()
	var out, errb syncBuffer
	id := fmt.Sprintf("img-%d", testSeq.Add(1))
	sb, err := e.m.Create(context.Background(), Spec{ID: id, Class: class, Source: e.source(t, nil), Command: argv, Env: env,
		Limits: defaultLimits, User: user, Image: im, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	res, err := sb.Run(context.Background())
	r := ran{sb: sb, res: res, err: err, stdout: out.String(), stderr: errb.String()}
	t.Logf("%s %v: reason=%s exit=%d msg=%q\nstdout: %s\nstderr: %s", class, argv, res.Reason, res.ExitCode, res.Message, trunc(r.stdout), trunc(r.stderr))
	return r
}

func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("no line %q in the output", w)
		}
	}
}

// A job on a two-layer image sees the layers merged as overlayfs merges
// them, the image's /etc/os-release, Airlock's hostname, resolver and
// trust store, and nothing of the host's programs; its Result names the
// image's digest.
func TestImageRoot(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	ca, err := os.ReadFile(filepath.Join(e.m.tmpl.dir, caBundlePath))
	if err != nil {
		t.Fatal(err)
	}
	caLine := "/" + caBundlePath + ": " + strings.ReplaceAll(string(ca), "\n", `\n`)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.runImage(t, c, im, runspec.Root, nil, "/bin/probe", "cat", "/over.txt", "/gone.txt", "/keep.txt", "/etc/os-release",
				"/etc/hostname", "/etc/resolv.conf", "/etc/passwd", "/"+caBundlePath, "/etc/ssl/cert.pem", "/usr/bin/true", "/lib64/ld-linux-x86-64.so.2")
			wantExit(t, r, 0)
			wantLines(t, r.stdout,
				"/over.txt: upper", "/gone.txt: absent", "/keep.txt: lower-keep",
				`/etc/os-release: ID=airlock-test\nVERSION_ID=2\n`,
				`/etc/hostname: airlock\n`, "/etc/resolv.conf: ",
				"/etc/passwd: "+strings.ReplaceAll(imagePasswd, "\n", `\n`),
				caLine, strings.Replace(caLine, "/"+caBundlePath, "/etc/ssl/cert.pem", 1),
				"/usr/bin/true: absent", "/lib64/ld-linux-x86-64.so.2: absent")
			if r.res.TemplateVersion != testImageDigest {
				t.Errorf("TemplateVersion %q, want the image's digest %s", r.res.TemplateVersion, testImageDigest)
			}
			r = e.runImage(t, c, im, runspec.Root, nil, "/bin/probe", "ls", "/opq", "/usr", "/bin", "/etc")
			wantExit(t, r, 0)
			if c == ClassRunc {
				// The root as the job sees it mounted: read-only, nosuid,
				// nodev, its layers named by links that say nothing of the
				// host (gVisor shows mounts of its own).
				r := e.runImage(t, c, im, runspec.Root, nil, "/bin/probe", "cat", "/proc/self/mounts")
				wantExit(t, r, 0)
				var root string
				for _, m := range strings.Split(strings.TrimPrefix(r.stdout, "/proc/self/mounts: "), `\n`) {
					if strings.HasPrefix(m, "overlay / overlay ") {
						root = m
					}
				}
				opts := strings.Split(strings.Fields(root + " x x x")[3], ",")
				for _, o := range []string{"ro", "nosuid", "nodev", "lowerdir=0:1:2", "redirect_dir=nofollow"} {
					if !slices.Contains(opts, o) {
						t.Errorf("the root's mount %q lacks %s", root, o)
					}
				}
			}
			// /etc: the image's and Airlock's, merged.
			wantLines(t, r.stdout, "/opq: c", "/usr: share", "/bin: probe", "/etc: group hostname hosts os-release passwd pki resolv.conf ssl")
		})
	}
}

// The image's Env reaches the job, under the variables Airlock's sandbox
// needs (TERM, the trust store's, the user's), and the job's own Env wins
// over both.
func TestImageEnv(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.runImage(t, c, im, runspec.Root, map[string]string{"JOB_WINS": "job", "JOB_VAR": "1"}, "/bin/probe", "env")
			wantExit(t, r, 0)
			wantLines(t, r.stdout, "PATH=/bin:/opt/image/bin", "IMAGE_VAR=from-image", "JOB_WINS=job", "JOB_VAR=1",
				"TERM=dumb", "SSL_CERT_FILE=/"+caBundlePath, "HOME=/root", "USER=root")
		})
	}
}

func TestImageEnvDefaults(t *testing.T) {
	get := func(env []string, k string) string {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return strings.TrimPrefix(kv, k+"=")
			}
		}
		return "<unset>"
	}
	for _, tc := range []struct {
		name     string
		path     string
		image    []string
		wantPath string
	}{
		{"image without PATH", "", []string{"A=1"}, DefaultPath},
		{"image with PATH", "", []string{"PATH=/x/bin"}, "/x/bin"},
		{"host template", "/op/bin", nil, "/op/bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := jobEnv(tc.path, tc.image, runspec.Agent, nil)
			if got := get(env, "PATH"); got != tc.wantPath {
				t.Errorf("PATH %q, want %q", got, tc.wantPath)
			}
			if got := get(env, "HOME"); got != "/home/agent" {
				t.Errorf("HOME %q", got)
			}
		})
	}
}

// layerState records everything of a layer an unpacker made: names,
// types, modes, owners, sizes, times of change and content.
func layerState(t testing.TB, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			desc := fmt.Sprintf("mode=%o uid=%d gid=%d size=%d mtime=%d.%d ctime=%d.%d rdev=%d", st.Mode, st.Uid, st.Gid, st.Size,
				st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Rdev)
			switch {
			case d.Type().IsRegular():
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				desc += fmt.Sprintf(" sha256=%x", sha256.Sum256(b))
			case d.Type()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				desc += " -> " + target
			}
			buf := make([]byte, 256)
			if n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf); err == nil {
				desc += " opaque=" + string(buf[:n])
			}
			out[p] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// The root is read-only: a job that tries to create, append to, chmod,
// rename and remove everything it can reach outside its own mounts
// changes nothing, as root and as another user, and the image's layers
// and Airlock's layer are as they were, to the ctime.
func TestImageRootReadOnly(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	dirs := append(slices.Clone(im.Layers), e.m.imageTop.dir)
	before := layerState(t, dirs...)
	for _, c := range testClasses(t, e) {
		for _, u := range []runspec.User{runspec.Root, runspec.Agent} {
			t.Run(fmt.Sprintf("%s/%s", c, u.Name()), func(t *testing.T) {
				r := e.runImage(t, c, im, u, nil, "/bin/probe", "writeall")
				wantExit(t, r, 0)
				if r.stdout != "done\n" {
					t.Errorf("the job changed its root:\n%s", strings.TrimSuffix(r.stdout, "done\n"))
				}
			})
		}
	}
	after := layerState(t, dirs...)
	for p, b := range before {
		if after[p] != b {
			t.Errorf("%s changed: %s, was %s", p, after[p], b)
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared: %s", p, a)
		}
	}
}

// A job of a user the image does not name sees the image's users and
// groups with its own added; one the image names sees the image's files
// as they are.
func TestImageUser(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	esc := func(s string) string { return strings.ReplaceAll(s, "\n", `\n`) }
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			r := e.runImage(t, c, im, runspec.Agent, nil, "/bin/probe", "cat", "/etc/passwd", "/etc/group", "/etc/os-release", "/etc/hostname")
			wantExit(t, r, 0)
			wantLines(t, r.stdout,
				"/etc/passwd: "+esc(imagePasswd+"agent:x:1000:1000::/home/agent:/bin/sh\n"),
				"/etc/group: "+esc(imageGroup+"agent:x:1000:\n"),
				"/etc/os-release: "+esc(imageOS), `/etc/hostname: airlock\n`)
			r = e.runImage(t, c, im, runspec.User{UID: 901, GID: 901}, nil, "/bin/probe", "cat", "/etc/passwd", "/etc/group")
			wantExit(t, r, 0)
			wantLines(t, r.stdout, "/etc/passwd: "+esc(imagePasswd), "/etc/group: "+esc(imageGroup))
		})
	}
}

// The image's /etc/passwd is read inside the image: a symlink out of it
// reaches nothing of the host's (it dangles, as it would in the job), and a FIFO or a huge file is refused,
// naming the image, before anything runs.
func TestImageUserFilesHostile(t *testing.T) {
	e := newEnv(t)
	secret := filepath.Join(e.base, "host-passwd")
	if err := os.WriteFile(secret, []byte("hostsecret:x:5:5::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	im := testImage(t, e)
	link := filepath.Join(e.base, "layer-link")
	buildLayer(t, link, int(e.cfg.UIDBase), node{"etc/passwd", "symlink", "../../../../../../../.." + secret})
	r := e.runImage(t, ClassRunc, &ImageRoot{Digest: im.Digest, Layers: append(slices.Clone(im.Layers), link)}, runspec.Agent, nil, "/bin/probe", "cat", "/etc/passwd")
	wantExit(t, r, 0)
	if strings.Contains(r.stdout, "hostsecret") {
		t.Fatalf("the image's passwd link reached the host's file:\n%s", r.stdout)
	}
	// The link leads nowhere inside the image: the job's passwd is its
	// user's line alone.
	wantLines(t, r.stdout, `/etc/passwd: agent:x:1000:1000::/home/agent:/bin/sh\n`)
	fifo := filepath.Join(e.base, "layer-fifo")
	buildLayer(t, fifo, int(e.cfg.UIDBase), node{"etc/passwd", "fifo", ""})
	big := filepath.Join(e.base, "layer-big")
	buildLayer(t, big, int(e.cfg.UIDBase), node{"etc/group", "file", strings.Repeat("g:x:7:\n", maxImageUserFile/7+1)})
	for _, tc := range []struct{ layer, want string }{
		{fifo, "spec.image: the image's /etc/passwd: not a regular file"},
		{big, "spec.image: the image's /etc/group: larger than"},
	} {
		_, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("hostile-%d", testSeq.Add(1)), Class: ClassRunc, Source: e.source(t, nil),
			Command: []string{"/bin/probe"}, Limits: defaultLimits, User: runspec.Agent, Image: &ImageRoot{Digest: im.Digest, Layers: append(slices.Clone(im.Layers), tc.layer)}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create: %v, want an invalid argument saying %q", err, tc.want)
		}
	}
}

func isMountPoint(t testing.TB, p string) bool {
	t.Helper()
	m, ok, err := mountOf(p)
	if err != nil {
		t.Fatal(err)
	}
	return ok && m.point == p
}

// A job's root is unmounted and its mount point removed by Destroy, and by
// Recover after the executor died with the job running.
func TestImageRootRemoved(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	for _, c := range testClasses(t, e) {
		t.Run(string(c)+"/destroy", func(t *testing.T) {
			r := e.runImage(t, c, im, runspec.Root, nil, "/bin/probe", "cat", "/keep.txt")
			wantExit(t, r, 0)
			root := r.sb.rootDir
			if root == "" || !isMountPoint(t, root) {
				t.Fatalf("the job's root %q is not mounted after Run", root)
			}
			if err := r.sb.Destroy(); err != nil {
				t.Fatal(err)
			}
			if isMountPoint(t, root) {
				t.Fatalf("%s still mounted after Destroy", root)
			}
			if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%s left after Destroy: %v", root, err)
			}
		})
		t.Run(string(c)+"/recover", func(t *testing.T) {
			e := newEnv(t)
			im := testImage(t, e)
			id := "crashed-image-" + string(c)
			crashHelper(t, e, c, e.source(t, nil), id, im.Layers...)
			root := filepath.Join(e.m.rootsDir, id)
			if !isMountPoint(t, root) {
				t.Fatalf("the crashed job's root %s is not mounted, so this test proves nothing", root)
			}
			m, err := New(e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Recover(context.Background(), nil)
			if err != nil || !slices.Equal(got, []string{id}) {
				t.Fatalf("Recover = %v, %v; want [%s]", got, err, id)
			}
			if isMountPoint(t, root) {
				t.Fatalf("%s still mounted after Recover", root)
			}
			if ents, _ := os.ReadDir(e.m.rootsDir); len(ents) > 0 {
				t.Fatalf("left in %s after Recover: %v", e.m.rootsDir, ents)
			}
			e.assertClean(t)
		})
	}
	if _, err := os.Stat(e.m.rootsDir); err != nil {
		t.Fatalf("roots dir: %v", err)
	}
}

// The most layers an image may have mount, one more is refused naming the
// count, and every other malformed image is refused naming its field.
func TestImageRefused(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	var many []string
	for i := range MaxImageLayers + 1 {
		d := filepath.Join(e.base, "many", fmt.Sprint(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		many = append(many, d)
	}
	// The bottom of the largest image holds the probe.
	fits := append([]string{im.Layers[0]}, many[:MaxImageLayers-1]...)
	r := e.runImage(t, ClassRunc, &ImageRoot{Digest: im.Digest, Layers: fits}, runspec.Root, nil, "/bin/probe", "cat", "/keep.txt")
	wantExit(t, r, 0)
	wantLines(t, r.stdout, "/keep.txt: lower-keep")

	file := filepath.Join(e.base, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		im   ImageRoot
		want string
	}{
		{"too many layers", ImageRoot{Digest: im.Digest, Layers: many}, fmt.Sprintf("spec.image.layers: the image has %d layers; at most %d fit", MaxImageLayers+1, MaxImageLayers)},
		{"no layers", ImageRoot{Digest: im.Digest}, "spec.image.layers: an image needs at least one layer"},
		{"bad digest", ImageRoot{Digest: "sha256:ABC", Layers: im.Layers}, `spec.image.digest "sha256:ABC"`},
		{"relative layer", ImageRoot{Digest: im.Digest, Layers: []string{"layer"}}, "spec.image.layers[0]"},
		{"missing layer", ImageRoot{Digest: im.Digest, Layers: []string{im.Layers[0], filepath.Join(e.base, "nope")}}, "spec.image.layers[1]"},
		{"file layer", ImageRoot{Digest: im.Digest, Layers: []string{im.Layers[0], im.Layers[1], file}}, "spec.image.layers[2]"},
		{"layer twice", ImageRoot{Digest: im.Digest, Layers: []string{im.Layers[0], im.Layers[0]}}, "spec.image.layers[1]"},
		{"env without =", ImageRoot{Digest: im.Digest, Layers: im.Layers, Env: []string{"A=1", "B"}}, "spec.image.env[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.Create(context.Background(), Spec{ID: fmt.Sprintf("refused-%d", testSeq.Add(1)), Class: ClassRunc, Source: e.source(t, nil),
				Command: []string{"/bin/probe"}, Limits: defaultLimits, Image: &tc.im})
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create: %v, want an invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// A session on an image kept across an executor restart (DestroyKeeping,
// Recover's keep, Create with Kept) comes back on the same image with its
// /out; nothing of the first root is left in between.
func TestImageKept(t *testing.T) {
	e := newEnv(t)
	im := testImage(t, e)
	id := "kept-image"
	spec := Spec{ID: id, Class: ClassRunc, Source: e.source(t, nil), Limits: defaultLimits, Image: im,
		Command: []string{"/bin/probe", "write", "/out/r.txt", "result"}}
	sb, err := e.m.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Run(context.Background()); err != nil || res.ExitCode != 0 {
		t.Fatalf("first run: %+v, %v", res, err)
	}
	if err := sb.DestroyKeeping(); err != nil {
		t.Fatalf("DestroyKeeping: %v", err)
	}
	if ents, _ := os.ReadDir(e.m.rootsDir); len(ents) > 0 {
		t.Fatalf("left in %s after DestroyKeeping: %v", e.m.rootsDir, ents)
	}
	m2, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Recover(context.Background(), func(got string) bool { return got == id }); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	spec.Kept, spec.Stdout = true, &out
	spec.Command = []string{"/bin/probe", "cat", "/out/r.txt", "/over.txt"}
	sb2, err := m2.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create on the kept scratch: %v", err)
	}
	res, err := sb2.Run(context.Background())
	if err != nil || res.ExitCode != 0 || res.TemplateVersion != im.Digest {
		t.Fatalf("second run: %+v, %v", res, err)
	}
	wantLines(t, out.String(), "/out/r.txt: result", "/over.txt: upper")
	if err := sb2.Destroy(); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t)
}
