package runspec

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// What a named cache may be: its name and where a job sees it. The
// authority checks a tenant's policy with these, the executor every grant.

// CacheRoots are the directories a cache's path must lie below: the
// sandbox's writable scratch directories (root's home /root, the other
// users' homes below /home, and /tmp), where the runtime can make a mount
// point. The rest of the root file system is read-only, /work and /out are
// the job's result, and /proc, /sys, /dev, /etc and /usr are the system's.
var CacheRoots = []string{"/home", "/root", "/tmp"}

// CheckCacheUser checks that a job running as u can have a cache at p
// (CheckCachePath's already): below /tmp, or below u's own home, the one
// home the sandbox gives it a writable place for (/root for root,
// /home/NAME for another user). Any other home is part of the shared,
// read-only template, where a mount point cannot be made (under runsc
// its gofer would make it in the template every job shares).
func CheckCacheUser(p string, u User) error {
	if strings.HasPrefix(p, "/tmp/") {
		return nil
	}
	if home := u.Home(); !strings.HasPrefix(p, home+"/") {
		return fmt.Errorf("%q: lies outside the home of the job's user %s (uid %d), %s, and /tmp", p, u.Name(), u.UID, home)
	}
	return nil
}

// Bounds on named caches.
const (
	// MaxCaches bounds the caches one job mounts.
	MaxCaches = 8
	// MaxCacheBytes bounds one cache's max_size.
	MaxCacheBytes = 1 << 40
	// MinCacheBytes is the least max_size: one entry.
	MinCacheBytes = 4096
)

var cacheName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckCacheName checks a cache's name: 1 to 63 of lower-case letters,
// digits, '.', '-' and '_', starting with a letter or digit.
func CheckCacheName(n string) error {
	if !cacheName.MatchString(n) {
		return fmt.Errorf("%q: want 1 to 63 of lower-case letters, digits, '.', '-' and '_', starting with a letter or digit", n)
	}
	return nil
}

// CheckCachePath checks where a job sees a named cache: a clean absolute
// path strictly below one of CacheRoots, without a character overlay mount
// options cannot carry.
func CheckCachePath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return fmt.Errorf("%q: must be a clean absolute path", p)
	}
	if strings.ContainsAny(p, ",:\\\n\x00") || len(p) > 4096 {
		return fmt.Errorf("%q: must not contain ',', ':', '\\', a newline or NUL, and be at most 4096 bytes", p)
	}
	for _, r := range CacheRoots {
		if strings.HasPrefix(p, r+"/") {
			return nil
		}
	}
	return fmt.Errorf("%q: must lie below %s: the rest of the sandbox's root is read-only or the system's, and /work and /out are the job's result", p, strings.Join(CacheRoots, " or "))
}

// CacheSizeReason says what is wrong with a cache's max size, "" if
// nothing.
func CacheSizeReason(n int64) string {
	if n < MinCacheBytes || n > MaxCacheBytes {
		return fmt.Sprintf("%d: must be between %d (4KiB) and %d (1TiB)", n, MinCacheBytes, MaxCacheBytes)
	}
	return ""
}

// CachePathsOverlap reports whether a and b are the same path or one lies
// below the other: two caches cannot be mounted so.
func CachePathsOverlap(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}
