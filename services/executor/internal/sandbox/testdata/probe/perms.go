package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// perms runs permission probes as whoever the probe runs as and prints
// one "NAME RESULT" line each: RESULT is "ok" or the errno's name (EACCES),
// or for the status probes the value read. other is a uid (and gid) that
// is not the caller's. The sandbox test's source holds /work/perm/other,
// owned by other, mode 0644, and /work/perm/mine, the job's own.
func perms(other int) {
	dir, err := os.MkdirTemp("/tmp", "perm-")
	if err != nil {
		fmt.Println("setup", name(err))
		os.Exit(1)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	// Files of the caller's own, with the modes the probes need. chmod,
	// not the umask, sets the mode.
	must(os.Mkdir(p("mode0dir"), 0o700))
	must(os.WriteFile(p("mode0dir/f"), []byte("x"), 0o644))
	must(os.Chmod(p("mode0dir"), 0))
	must(os.WriteFile(p("mode0file"), []byte("x"), 0o644))
	must(os.Chmod(p("mode0file"), 0))
	must(os.WriteFile(p("readonly"), []byte("x"), 0o644))
	must(os.Chmod(p("readonly"), 0o444))
	must(os.WriteFile(p("own"), []byte("x"), 0o644))

	open := func(path string, flags int) error {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	probes := []struct {
		name string
		run  func() error
	}{
		{"read-mode0-dir", func() error { return open(p("mode0dir"), unix.O_RDONLY|unix.O_DIRECTORY) }},
		{"search-mode0-dir", func() error { var st unix.Stat_t; return unix.Stat(p("mode0dir/f"), &st) }},
		{"read-mode0-file", func() error { return open(p("mode0file"), unix.O_RDONLY) }},
		{"write-readonly-file", func() error { return open(p("readonly"), unix.O_WRONLY) }},
		{"write-other-file", func() error { return open("/work/perm/other", unix.O_WRONLY) }},
		{"chmod-other-file", func() error { return unix.Chmod("/work/perm/other", 0o666) }},
		{"chown-own-file", func() error { return unix.Chown(p("own"), other, other) }},
		{"utime-other-file", func() error {
			return unix.UtimesNano("/work/perm/other", []unix.Timespec{{Sec: 1}, {Sec: 1}})
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
		{"create-in-work", func() error { return open("/work/perm/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) }},
		{"create-in-out", func() error { return open("/out/perm-new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL) }},
		{"create-in-HOME", func() error {
			return open(filepath.Join(os.Getenv("HOME"), "perm-new"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
		}},
	}
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
