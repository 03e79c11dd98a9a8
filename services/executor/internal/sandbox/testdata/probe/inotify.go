package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inotifyNames are the event bits a scenario reports, by inotify(7) name.
var inotifyNames = []struct {
	bit  uint32
	name string
}{
	{unix.IN_ACCESS, "ACCESS"}, {unix.IN_ATTRIB, "ATTRIB"}, {unix.IN_CLOSE_WRITE, "CLOSE_WRITE"},
	{unix.IN_CLOSE_NOWRITE, "CLOSE_NOWRITE"}, {unix.IN_CREATE, "CREATE"}, {unix.IN_DELETE, "DELETE"},
	{unix.IN_MODIFY, "MODIFY"}, {unix.IN_MOVED_FROM, "MOVED_FROM"}, {unix.IN_MOVED_TO, "MOVED_TO"},
	{unix.IN_OPEN, "OPEN"}, {unix.IN_Q_OVERFLOW, "Q_OVERFLOW"}, {unix.IN_DELETE_SELF, "DELETE_SELF"},
	{unix.IN_IGNORED, "IGNORED"},
}

// inotifyProbe watches dir and prints, for each file operation fsnotify's
// tests make, the events it raised ("overwrite: CLOSE_WRITE,MODIFY,OPEN"),
// then whether a queue filled past max_queued_events overflows.
func inotifyProbe(dir string) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		fmt.Println("inotify_init1:", err)
		os.Exit(1)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_ALL_EVENTS); err != nil {
		fmt.Println("inotify_add_watch:", err)
		os.Exit(1)
	}
	f := filepath.Join(dir, "f")
	must := func(err error) {
		if err != nil {
			fmt.Println("operation failed:", err)
			os.Exit(1)
		}
	}
	for _, sc := range []struct {
		name string
		op   func()
	}{
		{"create", func() { must(os.WriteFile(f, []byte("a"), 0o644)) }},
		{"overwrite", func() { must(os.WriteFile(f, []byte("b"), 0o644)) }},
		{"append", func() {
			w, err := os.OpenFile(f, os.O_WRONLY|os.O_APPEND, 0)
			must(err)
			_, err = w.WriteString("c")
			must(err)
			must(w.Close())
		}},
		{"read", func() { _, err := os.ReadFile(f); must(err) }},
		{"chmod", func() { must(os.Chmod(f, 0o600)) }},
		{"chtimes", func() { must(os.Chtimes(f, time.Unix(1, 0), time.Unix(1, 0))) }},
		{"truncate", func() { must(os.Truncate(f, 0)) }},
		{"rename", func() { must(os.Rename(f, f+"2")) }},
		{"remove", func() { must(os.Remove(f + "2")) }},
		// A file renamed over a watched one, as editors and atomic
		// writers save: the watch on the replaced file ("self:") sees
		// its link count drop (ATTRIB, fsnotify's CHMOD) and its end.
		{"rename-over", func() {
			must(os.WriteFile(f, []byte("old"), 0o644))
			must(os.WriteFile(f+".new", []byte("new"), 0o644))
			drainInotify(fd, 50*time.Millisecond)
			self, err := unix.InotifyAddWatch(fd, f, unix.IN_ALL_EVENTS)
			must(err)
			selfWatch = self
			must(os.Rename(f+".new", f))
		}},
	} {
		sc.op()
		fmt.Printf("%s: %s\n", sc.name, strings.Join(drainInotify(fd, 100*time.Millisecond), ","))
	}
	selfWatch = 0
	// The overflow: more distinct events than the queue holds, unread.
	// Renames, two events each, make no inodes (a small scratch disk has
	// few).
	limit := 16384
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			limit = n
		}
	}
	must(os.WriteFile(f, nil, 0o644))
	drainInotify(fd, 50*time.Millisecond)
	cur := f
	for i := 0; i < limit/2+100; i++ {
		next := fmt.Sprintf("%s.%d", f, i)
		must(os.Rename(cur, next))
		cur = next
	}
	ev := drainInotify(fd, 200*time.Millisecond)
	fmt.Printf("overflow: %v (max_queued_events %d)\n", slices.Contains(ev, "Q_OVERFLOW"), limit)
}

// selfWatch is the watch descriptor whose events drainInotify reports
// as "self:NAME" (0: none; watch descriptors start at 1, and an
// overflow has -1); the rest are the directory's.
var selfWatch = 0

// drainInotify reads fd until it has been quiet for quiet and returns the
// names of the event bits seen, sorted and once each.
func drainInotify(fd int, quiet time.Duration) []string {
	seen := map[string]bool{}
	buf := make([]byte, 64<<10)
	last := time.Now()
	for time.Since(last) < quiet {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			fmt.Println("read inotify:", err)
			os.Exit(1)
		}
		last = time.Now()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			prefix := ""
			if int(ev.Wd) == selfWatch {
				prefix = "self:"
			}
			for _, nm := range inotifyNames {
				if ev.Mask&nm.bit != 0 {
					seen[prefix+nm.name] = true
				}
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
