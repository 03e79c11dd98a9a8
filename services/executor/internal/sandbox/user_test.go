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
// perms) as root and as agent under runc and runsc: each probe must give
// the same answer under both runtimes, and the answer a user without
// capabilities gets from Linux. The sandbox's root has no capabilities, so
// it cannot read its own mode-0 directory or file, set another uid or gid,
// chown, write another user's file or bind a port below 1024; agent
// cannot become root. Neither gains a capability or loses no_new_privs.
func TestUserPermissionParity(t *testing.T) {
	e := newEnv(t)
	classes := testClasses(t, e)
	const otherOwner = 2000 // owns /work/perm/other (uid 2000 to root's job; unmapped, so nobody, to agent's)
	common := map[string]string{
		"read-mode0-dir":      "EACCES",
		"search-mode0-dir":    "EACCES",
		"read-mode0-file":     "EACCES",
		"write-readonly-file": "EACCES",
		"write-other-file":    "EACCES",
		"chmod-other-file":    "EPERM",
		"chown-own-file":      "EPERM",
		"utime-other-file":    "EPERM",
		"setuid-other":        "EPERM",
		"setgid-other":        "EPERM",
		"setgroups":           "EPERM",
		"bind-port-80":        "EACCES",
		"create-in-root":      "EROFS",
		"write-etc-passwd":    "EROFS",
		"write-work-file":     "ok",
		"create-in-work":      "ok",
		"create-in-out":       "ok",
		"create-in-HOME":      "ok",
		"NoNewPrivs":          "1",
		"CapEff":              "0000000000000000",
		"CapPrm":              "0000000000000000",
		"CapBnd":              "0000000000000000",
		"CapAmb":              "0000000000000000",
	}
	for _, tc := range []struct {
		user  runspec.User
		other int
		extra map[string]string
	}{
		// root's /home is the template's read-only directory.
		{runspec.Root, otherOwner, map[string]string{"mkdir-in-home": "EROFS"}},
		// agent's /home is root's: agent may not write it.
		{runspec.Agent, 0, map[string]string{"mkdir-in-home": "EACCES"}},
	} {
		want := map[string]string{}
		for k, v := range common {
			want[k] = v
		}
		for k, v := range tc.extra {
			want[k] = v
		}
		results := map[Class]map[string]string{}
		for _, c := range classes {
			src := e.source(t, map[string]string{"perm/other": "theirs\n", "perm/mine": "mine\n"})
			other := filepath.Join(src, "perm", "other")
			if err := os.Chown(other, int(e.cfg.UIDBase)+otherOwner, int(e.cfg.UIDBase)+otherOwner); err != nil {
				t.Fatal(err)
			}
			r := e.run(t, context.Background(), job{class: c, src: src, cmd: []string{"/work/probe", "perms", fmt.Sprint(tc.other)}, user: tc.user})
			wantExit(t, r, 0)
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				k, v, _ := strings.Cut(line, " ")
				got[k] = v
			}
			results[c] = got
			for k, w := range want {
				if got[k] != w {
					t.Errorf("%s as %s: %s = %q, want %q", c, tc.user.Name(), k, got[k], w)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s as %s: %d results, want %d: %v", c, tc.user.Name(), len(got), len(want), got)
			}
		}
		if len(classes) == 2 {
			for k := range want {
				if a, b := results[ClassRunc][k], results[ClassRunsc][k]; a != b {
					t.Errorf("as %s: %s is %s under runc, %s under runsc", tc.user.Name(), k, a, b)
				}
			}
		}
	}
}
