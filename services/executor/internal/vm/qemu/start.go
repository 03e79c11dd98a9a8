package qemu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// IDRange is the size of the user namespace's id mapping: guest (and 9p
// file) ids 0..65535 are host ids UIDBase..UIDBase+65535.
const IDRange = 65536

// Launch is one QEMU start.
type Launch struct {
	// Path is qemu-system-x86_64.
	Path string
	// Config is the machine, without its file descriptors: Start opens
	// and numbers them (Kernel, Initrd and Disk are paths the CLI opens
	// as root, and QEMU reopens through /proc/self/fd: their directories
	// need not be searchable by the unprivileged QEMU).
	Config Config
	// UIDBase is the host uid and gid QEMU runs as (uid 0 of its user
	// namespace).
	UIDBase uint32
	// Netns is the job's network namespace, "" for a machine without a
	// NIC (QEMU then stays in the caller's, with no device in it).
	Netns string
	// Agent and Console are QEMU's ends of the agent's and the console's
	// socket pairs.
	Agent, Console *os.File
	// Stderr receives QEMU's own messages.
	Stderr io.Writer
}

// Machine is a running QEMU.
type Machine struct {
	Pid  int
	done chan struct{}
	err  error
	// Net is eth0's configuration the guest takes (zero without a netns).
	Net NetInfo
	// netns is kept to disconnect the tap from eth0 when QEMU has gone.
	netns string
}

// Done is closed when QEMU has exited; Err then says how.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Err is QEMU's exit (nil for status 0) once Done is closed.
func (m *Machine) Err() error { <-m.done; return m.err }

// Kill ends QEMU at once.
func (m *Machine) Kill() { unix.Kill(m.Pid, unix.SIGKILL) }

// Start starts QEMU unprivileged: in a new user namespace mapping
// 0..IDRange-1 to UIDBase.., as its uid 0 (so it holds no power over the
// host's files but what "other" grants, and the 9p server's passthrough
// writes land as the job's ids would under runc); in a new mount
// namespace; in the job's network namespace, where a tap joined to eth0 is
// its NIC; killed if the calling thread's process dies (PR_SET_PDEATHSIG).
func Start(l Launch) (*Machine, error) {
	m := &Machine{done: make(chan struct{}), netns: l.Netns}
	if l.Netns != "" {
		// QEMU runs in the job's namespace either way; only one with eth0
		// gives the guest a NIC.
		ni, err := ReadNet(l.Netns)
		switch {
		case errors.Is(err, ErrNoEth):
		case err != nil:
			return nil, err
		default:
			m.Net = ni
			l.Config.MAC = ni.MAC
		}
	}
	var files []*os.File
	defer func() {
		for _, f := range files[min(2, len(files)):] {
			f.Close()
		}
	}()
	files = append(files, l.Console, l.Agent)
	l.Config.ConsoleFD, l.Config.AgentFD = 3, 4
	for _, p := range []*string{&l.Config.Kernel, &l.Config.Initrd, &l.Config.Disk} {
		if *p == "" {
			continue
		}
		flag := os.O_RDONLY
		if p == &l.Config.Disk {
			flag = os.O_RDWR
		}
		f, err := os.OpenFile(*p, flag|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
		files = append(files, f)
		*p = fmt.Sprintf("/proc/self/fd/%d", 2+len(files))
	}
	for i := range l.Config.Shares {
		s := &l.Config.Shares[i]
		f, err := os.OpenFile(s.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("qemu: share %s: %w", s.Tag, err)
		}
		files = append(files, f)
		s.Path = fmt.Sprintf("/proc/self/fd/%d", 2+len(files))
	}

	type started struct {
		pid int
		err error
	}
	startc := make(chan started, 1)
	go func() {
		// This thread enters the job's namespace and is never unlocked:
		// it ends with the goroutine, after QEMU (whose parent-death
		// signal is tied to this thread) has been reaped.
		runtime.LockOSThread()
		defer close(m.done)
		cmd, err := m.startLocked(l, files)
		if err != nil {
			startc <- started{err: err}
			m.err = err
			return
		}
		startc <- started{pid: cmd.Process.Pid}
		m.err = cmd.Wait()
		if m.netns != "" {
			Disconnect(m.netns)
		}
	}()
	s := <-startc
	if s.err != nil {
		return nil, s.err
	}
	m.Pid = s.pid
	return m, nil
}

func (m *Machine) startLocked(l Launch, files []*os.File) (*exec.Cmd, error) {
	if l.Netns != "" {
		ns, err := netns.GetFromPath(l.Netns)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", l.Netns, err)
		}
		err = netns.Set(ns)
		ns.Close()
		if err != nil {
			return nil, fmt.Errorf("enter network namespace %s: %w", l.Netns, err)
		}
	}
	if l.Netns != "" && m.Net.MAC != "" {
		tap, err := openTap()
		if err != nil {
			return nil, err
		}
		defer tap.Close()
		if err := connectTap(l.Netns); err != nil {
			// What connectTap made before it failed would redirect the
			// job's eth0 to nothing, and stop the next boot in the
			// namespace.
			Disconnect(l.Netns)
			return nil, err
		}
		files = append(files, tap)
		l.Config.TapFD = 2 + len(files)
	}
	args, err := Args(l.Config)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(l.Path, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdout = l.Stderr
	cmd.Stderr = l.Stderr
	cmd.ExtraFiles = files
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(l.UIDBase), Size: IDRange}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A PID namespace of its own too: every VM job's QEMU runs as the
		// same host uid (uid_base), and one that a guest took over must
		// not see, or signal, any other process on the host.
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID,
		UidMappings:                ids,
		GidMappings:                ids,
		GidMappingsEnableSetgroups: true,
		// Uid and gid 0 of the new namespace, no supplementary groups:
		// none of the host's root's ids is left.
		Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		if m.netns != "" {
			Disconnect(m.netns)
		}
		return nil, fmt.Errorf("start %s: %w", l.Path, err)
	}
	return cmd, nil
}

func socketPairFDs() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
}
