package kernel

import "strings"

// CompareVersions orders two Debian package versions as dpkg does
// ([epoch:]upstream[-revision], '~' before everything, letters before
// other characters): <0, 0 or >0.
func CompareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if c := compareNum(ea, eb); c != 0 {
		return c
	}
	if c := compareFragment(ua, ub); c != 0 {
		return c
	}
	return compareFragment(ra, rb)
}

func splitVersion(v string) (epoch, upstream, revision string) {
	if i := strings.IndexByte(v, ':'); i >= 0 {
		epoch, v = v[:i], v[i+1:]
	}
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		v, revision = v[:i], v[i+1:]
	}
	return epoch, v, revision
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// order is dpkg's weight of one non-digit character.
func order(c byte) int {
	switch {
	case c == '~':
		return -1
	case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		return int(c)
	case c == 0:
		return 0
	}
	return int(c) + 256
}

func compareFragment(a, b string) int {
	for a != "" || b != "" {
		for (a != "" && !isDigit(a[0])) || (b != "" && !isDigit(b[0])) {
			var ca, cb byte
			if a != "" && !isDigit(a[0]) {
				ca = a[0]
			}
			if b != "" && !isDigit(b[0]) {
				cb = b[0]
			}
			if oa, ob := order(ca), order(cb); oa != ob {
				return oa - ob
			}
			if ca != 0 {
				a = a[1:]
			}
			if cb != 0 {
				b = b[1:]
			}
		}
		var na, nb string
		na, a = digits(a)
		nb, b = digits(b)
		if c := compareNum(na, nb); c != 0 {
			return c
		}
	}
	return 0
}

func digits(s string) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

// compareNum compares two digit strings of any length numerically.
func compareNum(a, b string) int {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}
