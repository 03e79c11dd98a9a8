package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"sort"
	"strings"
)

// mount is one line of /proc/self/mountinfo.
type mount struct {
	id, parent   int
	root         string // the path inside the source filesystem that is mounted
	point        string
	optional     []string
	fstype       string
	source       string
	superOptions string
}

// readMounts parses the calling thread's mountinfo (not /proc/self's,
// which is the main thread's: for a moment, MountInto's thread may be the
// main one, in a sandbox's mount namespace). It is read afresh every
// time: mounts change under us as jobs come and go.
func readMounts() ([]mount, error) {
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// id parent major:minor root point options [optional...] - fstype source superopts
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 7 || sep < 0 || len(f) < sep+3 {
			return nil, fmt.Errorf("mountinfo: malformed line %q", sc.Text())
		}
		var m mount
		fmt.Sscan(f[0], &m.id)
		fmt.Sscan(f[1], &m.parent)
		m.root = unescapeMount(f[3])
		m.point = unescapeMount(f[4])
		m.optional = f[6:sep]
		m.fstype = f[sep+1]
		m.source = unescapeMount(f[sep+2])
		if len(f) > sep+3 {
			m.superOptions = f[sep+3]
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeMount undoes the kernel's octal escaping of space, tab, newline
// and backslash in mountinfo fields.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// mountsUnder returns the mount points strictly below dir, deepest first, so
// they can be unmounted in order.
func mountsUnder(dir string) ([]string, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for _, m := range ms {
		if strings.HasPrefix(m.point, prefix) {
			out = append(out, m.point)
		}
	}
	// A mount stacked on another at the same point comes later in
	// mountinfo; reversing first keeps it ahead after the stable sort.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i], "/") > strings.Count(out[j], "/")
	})
	return out, nil
}

// mountOf returns the mount that holds path (the longest mount point that
// is path or an ancestor of it).
func mountOf(path string) (mount, bool, error) {
	ms, err := readMounts()
	if err != nil {
		return mount{}, false, err
	}
	var best mount
	found := false
	for _, m := range ms {
		if m.point == path || m.point == "/" || strings.HasPrefix(path, strings.TrimSuffix(m.point, "/")+"/") {
			if !found || len(m.point) >= len(best.point) {
				best, found = m, true
			}
		}
	}
	return best, found, nil
}
