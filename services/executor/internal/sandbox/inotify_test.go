package sandbox

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// linuxInotify is what Linux's inotify reports for each of the probe's
// operations on a watched directory (inotify(7)), and so what runc jobs
// see: a job's processes are the host kernel's.
var linuxInotify = map[string]string{
	"create":    "CLOSE_WRITE,CREATE,MODIFY,OPEN",
	"overwrite": "CLOSE_WRITE,MODIFY,OPEN",
	"append":    "CLOSE_WRITE,MODIFY,OPEN",
	"read":      "ACCESS,CLOSE_NOWRITE,OPEN",
	"chmod":     "ATTRIB",
	"chtimes":   "ATTRIB",
	"truncate":  "MODIFY",
	"rename":    "MOVED_FROM,MOVED_TO",
	"remove":    "DELETE",
	// The watch on the file replaced sees its link count drop, which
	// fsnotify reports as CHMOD, before it goes.
	"rename-over": "MOVED_FROM,MOVED_TO,self:ATTRIB,self:DELETE_SELF,self:IGNORED",
	"overflow":    "true",
}

// runscInotify is where gVisor's inotify, which the sentry implements
// itself, differs from Linux's (docs/jobs.md, "What each runtime class runs"): a
// change here is a change users see, and the docs must follow.
var runscInotify = map[string]string{
	// No ATTRIB for the replaced file's link count: fsnotify's tests
	// that expect a CHMOD when a file is saved over another miss it.
	"rename-over": "MOVED_FROM,MOVED_TO,self:DELETE_SELF,self:IGNORED",
	// gVisor's inotify queue has no max_queued_events bound (the job's
	// memory limit is the bound), so IN_Q_OVERFLOW never comes: a test
	// that fills the queue and waits for the overflow waits forever.
	"overflow": "false",
}

// Jobs that watch files (fsnotify's suite, file watchers in test runners)
// get Linux's inotify events under runc, and under runsc Linux's but for
// the differences runscInotify names.
func TestInotifyUnderEachClass(t *testing.T) {
	e := newEnv(t)
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			lim := defaultLimits
			lim.Deadline = 2 * time.Minute
			r := e.run(t, context.Background(), job{class: c, src: e.source(t, nil), limits: &lim,
				cmd: []string{"sh", "-c", "mkdir /tmp/watched && exec /work/probe inotify /tmp/watched"}})
			wantExit(t, r, 0)
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				name, events, _ := strings.Cut(line, ": ")
				if name == "overflow" {
					events, _, _ = strings.Cut(events, " ")
				}
				got[name] = events
			}
			want := maps.Clone(linuxInotify)
			if c == ClassRunsc {
				maps.Copy(want, runscInotify)
			}
			for _, name := range slices.Sorted(maps.Keys(want)) {
				if got[name] != want[name] {
					t.Errorf("%s: %s reports %q, want %q", c, name, got[name], want[name])
				}
			}
		})
	}
}
