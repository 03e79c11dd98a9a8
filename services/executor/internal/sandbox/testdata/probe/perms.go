package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// otherFile is another user's file, mode 0644, that the sandbox test puts
// in a named cache (whose files keep their owners).
const otherFile = "/tmp/perm-cache/other"

// perms runs permission probes as whoever the probe runs as and prints
// one "NAME RESULT" line each: RESULT is "ok" or the errno's name (EACCES),
// or for the status probes the value read. other is a uid (and gid) that
// is not the caller's, to set and chown to. The sandbox test's source
// holds /work/perm/mine, the job's own.
func perms(other int) {
	type probe struct {
		name string
		run  func() error
	}
	open := func(path string, flags int) error {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	var probes []probe
	// The caller's own files with the modes the probes need, in each
	// kind of place it can write: /tmp (the scratch), /work (the overlay)
	// and $HOME. chmod, not the umask, sets the mode.
	for _, base := range []struct{ name, dir string }{{"tmp", "/tmp"}, {"work", "/work"}, {"home", os.Getenv("HOME")}} {
		dir, err := os.MkdirTemp(base.dir, "perm-")
		if err != nil {
			fmt.Println("setup", name(err))
			os.Exit(1)
		}
		p := func(n string) string { return filepath.Join(dir, n) }
		must(os.Mkdir(p("mode0dir"), 0o700))
		must(os.WriteFile(p("mode0dir/f"), []byte("x"), 0o644))
		must(os.Chmod(p("mode0dir"), 0))
		must(os.WriteFile(p("mode0file"), []byte("x"), 0o644))
		must(os.Chmod(p("mode0file"), 0))
		must(os.WriteFile(p("readonly"), []byte("x"), 0o644))
		must(os.Chmod(p("readonly"), 0o444))
		must(os.WriteFile(p("own"), []byte("x"), 0o644))
		at := "@" + base.name
		probes = append(probes,
			probe{"read-mode0-dir" + at, func() error { return open(p("mode0dir"), unix.O_RDONLY|unix.O_DIRECTORY) }},
			probe{"search-mode0-dir" + at, func() error { var st unix.Stat_t; return unix.Stat(p("mode0dir/f"), &st) }},
			probe{"read-mode0-file" + at, func() error { return open(p("mode0file"), unix.O_RDONLY) }},
			probe{"write-readonly-file" + at, func() error { return open(p("readonly"), unix.O_WRONLY) }},
			probe{"chmod-own-file" + at, func() error { return unix.Chmod(p("own"), 0o600) }},
			probe{"chown-own-file" + at, func() error { return unix.Chown(p("own"), other, other) }},
		)
	}
	probes = append(probes, []probe{
		{"write-other-file", func() error { return open(otherFile, unix.O_WRONLY) }},
		{"chmod-other-file", func() error { return unix.Chmod(otherFile, 0o666) }},
		{"utime-other-file", func() error {
			return unix.UtimesNano(otherFile, []unix.Timespec{{Sec: 1}, {Sec: 1}})
		}},
		// Raw calls: Go's own set*id runs on every thread, and a probe
		// needs only the answer.
		{"setuid-other", func() error {
			return errno(unix.RawSyscall(unix.SYS_SETRESUID, uintptr(other), uintptr(other), uintptr(other)))
		}},
		{"setgid-other", func() error {
			return errno(unix.RawSyscall(unix.SYS_SETRESGID, uintptr(other), uintptr(other), uintptr(other)))
		}},
		{"setgroups", func() error { return unix.Setgroups([]int{other}) }},
		{"bind-port-80", func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Bind(fd, &unix.SockaddrInet4{Port: 80, Addr: [4]byte{127, 0, 0, 1}})
		}},
		{"create-in-root", func() error { return open("/perm-probe", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) }},
		{"write-etc-passwd", func() error { return open("/etc/passwd", unix.O_WRONLY) }},
		{"mkdir-in-home", func() error { return os.Mkdir("/home/perm-probe", 0o755) }},
		{"write-work-file", func() error { return open("/work/perm/mine", unix.O_WRONLY|unix.O_APPEND) }},
		{"chmod-work-file", func() error { return unix.Chmod("/work/perm/mine", 0o600) }},
		{"create-in-work", func() error { return open("/work/perm/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) }},
		{"create-in-out", func() error { return open("/out/perm-new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) }},
		{"create-in-HOME", func() error {
			return open(filepath.Join(os.Getenv("HOME"), "perm-new"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
		}},
	}...)
	for _, pr := range probes {
		fmt.Println(pr.name, name(pr.run()))
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "CapAmb":
			fmt.Println(k, strings.TrimSpace(v))
		}
	}
}

func must(err error) {
	if err != nil {
		fmt.Println("setup", name(err))
		os.Exit(1)
	}
}

func errno(_, _ uintptr, e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// name is "ok" for nil, else the errno's name.
func name(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if se, ok := err.(*os.SyscallError); ok {
		err = se.Err
	}
	if x, ok := err.(unix.Errno); ok {
		e = x
	} else {
		return "error:" + err.Error()
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("errno%d", int(e))
}
