package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/pkg/runspec"
)

// TestJobUser: a job run as agent, or as a user of no name, is that user
// (id, whoami, $HOME, $USER) and owns /work, /out and its home, under
// both runtimes; what it changes in /work is copied up owned by it, and
// the upper layer the export reads holds only what it wrote, never the
// untouched source; the source itself is not changed.
func TestJobUser(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		for _, tc := range []struct {
			user                    runspec.User
			name, group, home, stat string
		}{
			{runspec.Agent, "agent", "agent", "/home/agent", "agent:agent"},
			{runspec.User{UID: 2000, GID: 3000}, "user2000", "group3000", "/home/user2000", "user2000:group3000"},
		} {
			t.Run(fmt.Sprintf("%s/%s", c, tc.name), func(t *testing.T) {
				src := e.source(t, map[string]string{"hello.txt": "hello\n", "sub/data.txt": "1\n", "untouched/a.txt": "a\n"})
				before := treeDigest(t, src)
				script := `set -e
id -u; id -g; id -un; id -gn; whoami
echo "$HOME $USER $LOGNAME"
stat -c '%U:%G %a %n' /work /work/hello.txt /work/untouched/a.txt /out "$HOME"
echo world >> hello.txt
mkdir newdir && echo y > newdir/f
rm sub/data.txt
echo built > /out/a
echo h > "$HOME/h"
echo new > ~/.cache/go-build/new && echo other > ~/.cache/other
stat -c '%U:%G' ~/.cache ~/.cache/go-build
cat ~/.cache/go-build/old
cd && pwd`
				// A cache in the home: the directories down to it are the
				// user's, as is the cache's root.
				lower := e.source(t, map[string]string{"old": "old\n"})
				caches := []CacheMount{{Path: tc.home + "/.cache/go-build", Lower: lower}}
				r := e.run(t, context.Background(), job{class: c, src: src, cmd: []string{"sh", "-c", script}, user: tc.user, caches: caches})
				wantExit(t, r, 0)
				want := fmt.Sprintf("%d\n%d\n%s\n%s\n%s\n%s %s %s\n", tc.user.UID, tc.user.GID, tc.name, tc.group, tc.name, tc.home, tc.name, tc.name) +
					fmt.Sprintf("%s 755 /work\n%s 644 /work/hello.txt\n%s 644 /work/untouched/a.txt\n%s 755 /out\n%s 700 %s\n",
						tc.stat, tc.stat, tc.stat, tc.stat, tc.stat, tc.home) +
					fmt.Sprintf("%s\n%s\nold\n%s\n", tc.stat, tc.stat, tc.home)
				if r.stdout != want {
					t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
				}
				// On the host: the upper layer holds the job's writes alone,
				// owned by its host ids.
				uid, gid := e.cfg.UIDBase+tc.user.UID, e.cfg.UIDBase+tc.user.GID
				var upper []string
				up := r.sb.UpperDir()
				err := filepath.WalkDir(up, func(p string, d fs.DirEntry, err error) error {
					if err != nil || p == up {
						return err
					}
					rel, _ := filepath.Rel(up, p)
					upper = append(upper, rel)
					info, err := d.Info()
					if err != nil {
						return err
					}
					st := info.Sys().(*syscall.Stat_t)
					if d.Type()&fs.ModeCharDevice == 0 && (st.Uid != uid || st.Gid != gid) {
						t.Errorf("upper %s owned by %d:%d, want %d:%d", rel, st.Uid, st.Gid, uid, gid)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				sort.Strings(upper)
				if got, want := strings.Join(upper, " "), "hello.txt newdir newdir/f sub sub/data.txt"; got != want {
					t.Errorf("upper layer holds %q, want %q (the job's writes alone)", got, want)
				}
				if got := readFile(t, filepath.Join(r.sb.OutDir(), "a")); got != "built\n" {
					t.Errorf("/out/a = %q", got)
				}
				if after := treeDigest(t, src); after != before {
					t.Error("the source tree changed")
				}
				st, err := os.Stat(filepath.Join(src, "hello.txt"))
				if err != nil || st.Sys().(*syscall.Stat_t).Uid != e.cfg.UIDBase {
					t.Errorf("source hello.txt: %v, owner changed", err)
				}
			})
		}
	}
}

// TestUserPermissionParity runs the same permission probes (testdata/probe
// perms) as root and as agent under runc and runsc. Each probe must be
// allowed or refused alike under both runtimes, and give the answer a user
// without capabilities gets from Linux, with the same errno but where a
// difference is written down below. The sandbox's root has no
// capabilities, so it cannot read or search its own mode-0 directory, read
// its own mode-0 file, write its read-only one, chown, set another uid or
// gid, or touch another user's file; agent cannot become root. Neither
// gains a capability or loses no_new_privs. Both may bind a port below
// 1024: in the job's own network namespace it guards nothing, and gVisor's
// netstack has no privileged ports, so runc's namespace allows it too.
func TestUserPermissionParity(t *testing.T) {
	e := newEnv(t)
	classes := testClasses(t, e)
	// otherOwner owns /tmp/perm-cache/other, a cache's file: caches keep
	// their files' owners, so it is uid 2000 to either job.
	const otherOwner = 2000
	want := map[string]string{
		"write-other-file": "EACCES",
		"chmod-other-file": "EPERM",
		"utime-other-file": "EPERM",
		"setuid-other":     "EPERM",
		"setgid-other":     "EPERM",
		"setgroups":        "EPERM",
		"bind-port-80":     "ok",
		"write-etc-passwd": "EACCES",
		"mkdir-in-home":    "EROFS", // /home is read-only: the template's, or root's bind over it
		"write-work-file":  "ok",
		"chmod-work-file":  "ok",
		"create-in-work":   "ok",
		"create-in-out":    "ok",
		"create-in-HOME":   "ok",
		"NoNewPrivs":       "1",
		"CapEff":           "0000000000000000",
		"CapPrm":           "0000000000000000",
		"CapBnd":           "0000000000000000",
		"CapAmb":           "0000000000000000",
	}
	for _, at := range []string{"@tmp", "@work", "@home"} {
		want["read-mode0-dir"+at] = "EACCES"
		want["search-mode0-dir"+at] = "EACCES"
		want["read-mode0-file"+at] = "EACCES"
		want["write-readonly-file"+at] = "EACCES"
		want["chmod-own-file"+at] = "ok"
		want["chown-own-file"+at] = "EPERM"
	}
	// Refused under both, with another errno: on a read-only root Linux
	// says EROFS before it checks the directory's permission; gVisor
	// checks permission first.
	errnoDiffers := map[string]map[Class]string{
		"create-in-root": {ClassRunc: "EROFS", ClassRunsc: "EACCES"},
	}
	for _, tc := range []struct {
		user  runspec.User
		other int // the uid setuid, setgid and chown try
	}{
		{runspec.Root, otherOwner},
		{runspec.Agent, 0},
	} {
		results := map[Class]map[string]string{}
		// Each class as the job itself; runc also as a session's exec,
		// through its exec helper.
		runs := []struct {
			c       Class
			viaExec bool
		}{{ClassRunc, true}}
		for _, c := range classes {
			runs = append(runs, struct {
				c       Class
				viaExec bool
			}{c, false})
		}
		for _, run := range runs {
			c := run.c
			src := e.source(t, map[string]string{"perm/mine": "mine\n"})
			lower := t.TempDir()
			other := filepath.Join(lower, "other")
			if err := os.WriteFile(other, []byte("theirs\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{lower, other} {
				id := int(e.cfg.UIDBase)
				if p == other {
					id += otherOwner
				}
				if err := os.Chown(p, id, id); err != nil {
					t.Fatal(err)
				}
			}
			r := e.run(t, context.Background(), job{class: c, src: src, cmd: []string{"/work/probe", "perms", fmt.Sprint(tc.other)}, user: tc.user,
				caches: []CacheMount{{Path: "/tmp/perm-cache", Lower: lower}}, viaExec: run.viaExec})
			wantExit(t, r, 0)
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				k, v, _ := strings.Cut(line, " ")
				got[k] = v
			}
			if !run.viaExec {
				results[c] = got
			}
			for k, w := range want {
				if got[k] != w {
					t.Errorf("%s (exec %t) as %s: %s = %q, want %q", c, run.viaExec, tc.user.Name(), k, got[k], w)
				}
			}
			for k, w := range errnoDiffers {
				if got[k] != w[c] {
					t.Errorf("%s as %s: %s = %q, want %q", c, tc.user.Name(), k, got[k], w[c])
				}
			}
			if len(got) != len(want)+len(errnoDiffers) {
				t.Errorf("%s as %s: %d results, want %d: %v", c, tc.user.Name(), len(got), len(want)+len(errnoDiffers), got)
			}
		}
		if len(classes) < 2 {
			continue
		}
		for k := range results[ClassRunc] {
			a, b := results[ClassRunc][k], results[ClassRunsc][k]
			if _, documented := errnoDiffers[k]; documented {
				a, b = allowed(a), allowed(b)
			}
			if a != b {
				t.Errorf("as %s: %s is %s under runc, %s under runsc", tc.user.Name(), k, a, b)
			}
		}
	}
}

// allowed is a probe's result as allowed or refused.
func allowed(result string) string {
	if result == "ok" {
		return "allowed"
	}
	return "refused"
}

// A tenant may ask for any uid and gid: the namespaces kept for idmapped
// mounts stay at most maxIdmaps however many pairs come, and every bind
// still maps the source's owner to the job's user.
func TestIdmapCacheIsBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("idmapped mounts need root")
	}
	const base = 3_800_000
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "f"), base, base); err != nil {
		t.Fatal(err)
	}
	fds := func() int { ents, _ := os.ReadDir("/proc/self/fd"); return len(ents) }
	var c idmapCache
	defer c.close()
	before := fds()
	for i := range uint32(3 * maxIdmaps) {
		u := runspec.User{UID: 1000 + i, GID: 2000 + i}
		dst := t.TempDir()
		if err := c.bind(base, u, src, dst); err != nil {
			t.Fatalf("bind as %v: %v", u, err)
		}
		var st syscall.Stat_t
		err := syscall.Stat(filepath.Join(dst, "f"), &st)
		if uerr := syscall.Unmount(dst, syscall.MNT_DETACH); uerr != nil {
			t.Fatal(uerr)
		}
		if err != nil || st.Uid != base+u.UID || st.Gid != base+u.GID {
			t.Fatalf("as %v the source's file is owned by %d:%d (%v), want %d:%d", u, st.Uid, st.Gid, err, base+u.UID, base+u.GID)
		}
	}
	if n := len(c.nss); n > maxIdmaps {
		t.Fatalf("%d namespaces kept, want at most %d", n, maxIdmaps)
	}
	if grown := fds() - before; grown > maxIdmaps {
		t.Fatalf("the executor holds %d more files after %d users, want at most %d", grown, 3*maxIdmaps, maxIdmaps)
	}
}
