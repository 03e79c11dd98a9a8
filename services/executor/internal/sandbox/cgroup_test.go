package sandbox

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeMounts builds mount table entries: point fstype superOptions [root].
func fakeMounts(lines ...string) []mount {
	var out []mount
	for _, l := range lines {
		f := strings.Fields(l)
		m := mount{point: f[0], fstype: f[1], superOptions: f[2], root: "/"}
		if len(f) > 3 {
			m.root = f[3]
		}
		out = append(out, m)
	}
	return out
}

// fakeFiles answers reads of the files named, and ENOENT for the rest.
func fakeFiles(files map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
}

var v1Hierarchies = []string{
	"/sys/fs/cgroup/cpu cgroup rw,cpu",
	"/sys/fs/cgroup/cpuacct cgroup rw,cpuacct",
	"/sys/fs/cgroup/memory cgroup rw,memory",
	"/sys/fs/cgroup/freezer cgroup rw,freezer",
	"/sys/fs/cgroup/pids cgroup rw,pids",
	"/sys/fs/cgroup/systemd cgroup rw,name=systemd",
}

// The driver is chosen from the mount table alone: v1 where the v1
// hierarchies are mounted (beside an empty cgroup2 or not), v2 where
// /sys/fs/cgroup is the unified hierarchy; what is missing is named with
// how to get it.
func TestChooseCgroups(t *testing.T) {
	hybrid := append(slices.Clone(v1Hierarchies), "/sys/fs/cgroup/unified cgroup2 rw", "/sys/fs/cgroup/blkio cgroup rw,blkio")
	unified := []string{"/sys/fs/cgroup cgroup2 rw,nsdelegate,memory_recursiveprot"}
	for _, tc := range []struct {
		name    string
		mounts  []string
		self    string
		files   map[string]string
		mode    string
		base    string
		ctls    []string
		wantErr []string
	}{
		{name: "v1 only", mounts: v1Hierarchies, self: "4:memory:/user.slice\n1:cpu:/\n",
			mode: "v1", ctls: []string{"memory", "pids", "cpu", "cpuacct", "freezer"}},
		{name: "hybrid", mounts: hybrid, self: "4:memory:/\n0::/init.scope\n",
			mode: "v1", ctls: []string{"memory", "pids", "cpu", "cpuacct", "freezer", "blkio"}},
		{name: "v1 missing pids", mounts: slices.DeleteFunc(slices.Clone(v1Hierarchies), func(s string) bool { return strings.Contains(s, "pids") }),
			wantErr: []string{"no v1 hierarchy with the pids controller is mounted"}},
		{name: "v2 in a systemd unit", mounts: unified, self: "0::/system.slice/airlock-executor.service\n",
			files: map[string]string{"/sys/fs/cgroup/system.slice/airlock-executor.service/cgroup.controllers": "cpuset cpu io memory pids\n"},
			mode:  "v2", base: "/system.slice/airlock-executor.service", ctls: []string{"memory", "pids", "cpu", "io"}},
		{name: "v2 restarted from its own leaf", mounts: unified, self: "0::/system.slice/x.service/supervisor\n",
			files: map[string]string{"/sys/fs/cgroup/system.slice/x.service/cgroup.controllers": "cpu memory pids\n"},
			mode:  "v2", base: "/system.slice/x.service", ctls: []string{"memory", "pids", "cpu"}},
		{name: "v2 at the root", mounts: unified, self: "0::/\n",
			files: map[string]string{"/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids\n"},
			mode:  "v2", base: "/", ctls: []string{"memory", "pids", "cpu", "io"}},
		{name: "v2 mounted from below its root", mounts: []string{"/sys/fs/cgroup cgroup2 rw /kubepods/pod1"}, self: "0::/kubepods/pod1/ctr\n",
			files: map[string]string{"/sys/fs/cgroup/ctr/cgroup.controllers": "cpu memory pids\n"},
			mode:  "v2", base: "/ctr", ctls: []string{"memory", "pids", "cpu"}},
		{name: "v2 without memory", mounts: unified, self: "0::/system.slice/airlock-executor.service\n",
			files:   map[string]string{"/sys/fs/cgroup/system.slice/airlock-executor.service/cgroup.controllers": "cpu pids\n"},
			wantErr: []string{"the memory controller is not available", "/system.slice/airlock-executor.service", "it has: cpu pids", "Delegate=yes", "+memory to cgroup.subtree_control"}},
		{name: "v2 with none delegated", mounts: unified, self: "0::/user.slice/session-1.scope\n",
			files:   map[string]string{"/sys/fs/cgroup/user.slice/session-1.scope/cgroup.controllers": "\n"},
			wantErr: []string{"the memory controller is not available", "it has: none", "Delegate=yes"}},
		{name: "v2 with local memory events", mounts: []string{"/sys/fs/cgroup cgroup2 rw,nsdelegate,memory_localevents"}, self: "0::/\n",
			files:   map[string]string{"/sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n"},
			wantErr: []string{"memory_localevents", "remount it without"}},
		{name: "v2 with no v2 line", mounts: unified, self: "4:memory:/\n",
			wantErr: []string{"names no v2 cgroup"}},
		{name: "v2 outside the mount", mounts: []string{"/sys/fs/cgroup cgroup2 rw /kubepods/pod1"}, self: "0::/other\n",
			wantErr: []string{"outside the cgroup v2 hierarchy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := chooseCgroups(cgroupHost{mounts: fakeMounts(tc.mounts...), self: tc.self, readFile: fakeFiles(tc.files)})
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("chose %s, want an error", d.mode())
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.mode() != tc.mode || !slices.Equal(d.controllers(), tc.ctls) {
				t.Errorf("chose %s with %v, want %s with %v", d.mode(), d.controllers(), tc.mode, tc.ctls)
			}
			if v2, ok := d.(*cgroupsV2); ok {
				if v2.base != tc.base {
					t.Errorf("v2 subtree %s, want %s", v2.base, tc.base)
				}
				if want := filepath.Join(tc.base, "airlock"); d.parentPath("/airlock") != want {
					t.Errorf("parent %s, want %s", d.parentPath("/airlock"), want)
				}
			} else if d.parentPath("/airlock") != "/airlock" {
				t.Errorf("v1 parent %s, want /airlock", d.parentPath("/airlock"))
			}
		})
	}
}
