// Command probe is built by the sandbox tests (static, CGO_ENABLED=0) and
// run inside sandboxes to try to cross their boundary. Each attempt prints
// "denied: <error>" and exits 0 when the sandbox stops it, or prints
// "ALLOWED" and exits 1 when it gets through.
package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe cat PATH...|ls DIR...|env|write PATH TEXT|writeall|idle|keyctl|ptrace|mount|clone-userns|chroot|dial ADDR|loopback|balloon MIB [hold]|errno NR...|inotify DIR|perms OTHER_UID|tamper PID")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "tamper":
		pid, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if !tamper(pid) {
			os.Exit(1)
		}
	case "keyctl":
		// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=1)
		_, _, e1 := unix.Syscall(unix.SYS_KEYCTL, 0, ^uintptr(2), 1)
		typ, _ := unix.BytePtrFromString("user")
		desc, _ := unix.BytePtrFromString("airlock-probe")
		// add_key("user", "airlock-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING)
		_, _, e2 := unix.Syscall6(unix.SYS_ADD_KEY, uintptr(unsafe.Pointer(typ)), uintptr(unsafe.Pointer(desc)),
			uintptr(unsafe.Pointer(typ)), 1, ^uintptr(1), 0)
		verdict(e1 != 0 && e2 != 0, fmt.Sprintf("keyctl: %v; add_key: %v", errnoStr(e1), errnoStr(e2)))
	case "ptrace":
		err1 := unix.PtraceAttach(1)
		_, _, e2 := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
		verdict(err1 != nil && e2 != 0, fmt.Sprintf("attach 1: %v; traceme: %v", err1, errnoStr(e2)))
	case "mount":
		_ = os.MkdirAll("/tmp/probe-mnt", 0o755)
		err := unix.Mount("tmpfs", "/tmp/probe-mnt", "tmpfs", 0, "")
		verdict(err != nil, fmt.Sprintf("mount tmpfs: %v", err))
	case "clone-userns":
		// A fork with namespace flags, as unshare(1) or a nested
		// container runtime would do it (a multi-threaded Go process
		// cannot unshare a user namespace itself).
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
		err := cmd.Run()
		verdict(err != nil, fmt.Sprintf("clone(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWNET): %v", err))
	case "chroot":
		err := unix.Chroot("/tmp")
		verdict(err != nil, fmt.Sprintf("chroot: %v", err))
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[2], 3*time.Second)
		if err == nil {
			c.Close()
		}
		verdict(err != nil, fmt.Sprintf("dial %s: %v", os.Args[2], err))
	case "loopback":
		// Not a boundary: loopback must work, for tests that serve on it.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("loopback failed:", err)
			os.Exit(1)
		}
		go func() {
			if c, err := ln.Accept(); err == nil {
				fmt.Fprintln(c, "pong")
				c.Close()
			}
		}()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		if err != nil {
			fmt.Println("loopback failed:", err)
			os.Exit(1)
		}
		buf := make([]byte, 16)
		n, _ := c.Read(buf)
		fmt.Printf("loopback ok: %s", buf[:n])
	case "balloon":
		mib, _ := strconv.Atoi(os.Args[2])
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
			if i%16 == 0 {
				fmt.Println("allocated MiB", i)
			}
		}
		// balloon MIB hold: keep it until SIGUSR1 comes (the test's
		// Sandbox.Signal; the probe is the job's init, which gets only
		// the signals it asks for).
		hold := len(os.Args) > 3 && os.Args[3] == "hold"
		usr1 := make(chan os.Signal, 1)
		if hold {
			signal.Notify(usr1, syscall.SIGUSR1)
		}
		fmt.Println("allocated all", len(keep))
		if hold {
			<-usr1
			fmt.Println("held", len(keep))
		}
	case "perms":
		// perms OTHER_UID: the permission probes of perms.go.
		other, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "perms: not a uid:", os.Args[2])
			os.Exit(2)
		}
		perms(other)
	case "errno":
		// errno NR...: each system call by number with every argument
		// zero, printed as "NR=ERRNO" (0 when it succeeded). Only for
		// calls the filter is expected to stop before the kernel runs
		// them, and for harmless ones (getpid) as controls.
		for _, a := range os.Args[2:] {
			nr, err := strconv.Atoi(a)
			if err != nil {
				fmt.Fprintln(os.Stderr, "errno: not a syscall number:", a)
				os.Exit(2)
			}
			_, _, e := unix.RawSyscall6(uintptr(nr), 0, 0, 0, 0, 0, 0)
			fmt.Printf("%d=%d\n", nr, int(e))
		}
	case "inotify":
		// Not a boundary: what inotify reports, as fsnotify's users
		// see it, printed so the runtimes' differences can be compared.
		inotifyProbe(os.Args[2])
	case "cat", "ls", "env", "write", "writeall", "idle":
		// What a job on an image sees of its root (image.go).
		imageProbe(os.Args[1], os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "unknown probe", os.Args[1])
		os.Exit(2)
	}
}

func errnoStr(e syscall.Errno) string {
	if e == 0 {
		return "success"
	}
	return e.Error()
}

func verdict(denied bool, detail string) {
	if denied {
		fmt.Println("denied:", detail)
		return
	}
	fmt.Println("ALLOWED:", detail)
	os.Exit(1)
}
