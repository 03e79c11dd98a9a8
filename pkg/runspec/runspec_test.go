package runspec_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/runspec"
)

func TestCheckLimits(t *testing.T) {
	ok := runspec.Limits{CPUMillis: 100, MemoryBytes: 256 << 20, Pids: 128, DiskBytes: 64 << 20, Deadline: time.Minute}
	for _, c := range []string{runspec.ClassRunc, runspec.ClassRunsc, runspec.ClassVM} {
		if err := runspec.CheckLimits(c, ok); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
	// The runsc maximum is runsc's alone.
	for c, pids := range map[string]int64{runspec.ClassRunsc: runspec.MaxRunscPids, runspec.ClassRunc: 1 << 20} {
		l := ok
		l.Pids = pids
		if err := runspec.CheckLimits(c, l); err != nil {
			t.Errorf("%s, pids %d: %v", c, pids, err)
		}
	}
	for _, tc := range []struct {
		class string
		edit  func(*runspec.Limits)
		field string
	}{
		{"runc", func(l *runspec.Limits) { l.MemoryBytes = 1 }, "memory_bytes"},
		{"runc", func(l *runspec.Limits) { l.Pids = 1 }, "pids"},
		{"runc", func(l *runspec.Limits) { l.DiskBytes = 1 }, "disk_bytes"},
		{"runc", func(l *runspec.Limits) { l.CPUMillis = 1 }, "cpu_millis"},
		{"runc", func(l *runspec.Limits) { l.Deadline = 0 }, "deadline"},
		{"runsc", func(l *runspec.Limits) { l.MemoryBytes = 32 << 20 }, "memory_bytes"},
		{"runsc", func(l *runspec.Limits) { l.Pids = 32 }, "pids"},
		{"runsc", func(l *runspec.Limits) { l.Pids = runspec.MaxRunscPids + 1 }, "pids"},
		{"runsc", func(l *runspec.Limits) { l.Pids = 1 << 40 }, "pids"},
		{"vm", func(l *runspec.Limits) { l.MemoryBytes = runspec.MinVMMemoryBytes - 1 }, "memory_bytes"},
		{"vm", func(l *runspec.Limits) { l.Pids = runspec.MinPids - 1 }, "pids"},
		{"vm", func(l *runspec.Limits) { l.DiskBytes = 1 }, "disk_bytes"},
		{"kata", func(*runspec.Limits) {}, "runtime_class"},
	} {
		l := ok
		tc.edit(&l)
		var fe *runspec.FieldError
		if err := runspec.CheckLimits(tc.class, l); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s %+v: %v, want a %s error", tc.class, l, err, tc.field)
		}
	}
}

func TestCheckWith(t *testing.T) {
	gib := runspec.Limits{CPUMillis: 100, MemoryBytes: runspec.MinDockerMemoryBytes, Pids: 128, DiskBytes: 64 << 20, Deadline: time.Minute}
	small := gib
	small.MemoryBytes = runspec.MinDockerMemoryBytes - 1
	for _, tc := range []struct {
		class string
		with  []string
		l     runspec.Limits
	}{
		{runspec.ClassRunc, nil, small},
		{runspec.ClassRunsc, []string{}, small},
		{runspec.ClassVM, nil, small},
		{runspec.ClassVM, []string{"docker"}, gib},
	} {
		if err := runspec.CheckWith(tc.class, tc.with, tc.l); err != nil {
			t.Errorf("%s %q: %v", tc.class, tc.with, err)
		}
	}
	for _, tc := range []struct {
		class        string
		with         []string
		l            runspec.Limits
		field, cause string
	}{
		{runspec.ClassRunc, []string{"docker"}, gib, "with", "only in the vm runtime class"},
		{runspec.ClassRunsc, []string{"docker"}, gib, "with", "its own kernel and cgroups"},
		{runspec.ClassVM, []string{"docker"}, small, "memory_bytes", "at least 1073741824 with docker"},
		{runspec.ClassVM, []string{"podman"}, gib, "with[0]", `"podman" is not "docker"`},
		{runspec.ClassVM, []string{"docker", ""}, gib, "with[1]", `"" is not`},
		{runspec.ClassVM, []string{"docker", "docker"}, gib, "with[1]", "twice"},
	} {
		var fe *runspec.FieldError
		err := runspec.CheckWith(tc.class, tc.with, tc.l)
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.cause) {
			t.Errorf("%s %q: %v, want a %s error saying %q", tc.class, tc.with, err, tc.field, tc.cause)
		}
	}
	if !runspec.HasDocker([]string{"docker"}) || runspec.HasDocker(nil) {
		t.Error("HasDocker is wrong")
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32", "0.0.0.0/0"} {
		if err := runspec.CheckPrefix(netip.MustParsePrefix(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for s, want := range map[string]string{
		"10.0.0.1/8":                 "write 10.0.0.0/8",
		"::ffff:169.254.169.254/128": "IPv4-mapped",
	} {
		if err := runspec.CheckPrefix(netip.MustParsePrefix(s)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", s, err, want)
		}
	}
	if err := runspec.CheckPrefix(netip.Prefix{}); err == nil {
		t.Error("the zero prefix passed")
	}
}
