package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/services/executor/internal/vm/client"
	"github.com/airlockhq/airlock/services/executor/internal/vm/kernel"
	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
	"github.com/airlockhq/airlock/services/executor/internal/vm/qemu"
	"github.com/airlockhq/airlock/services/executor/internal/vm/vmspec"
)

// Bounds of a run's phases: a TCG boot takes 5-8 s on an idle machine.
const (
	helloTimeout     = 120 * time.Second
	configureTimeout = 180 * time.Second // with docker: dockerd's start, up to 120 s under emulation
	startTimeout     = 60 * time.Second
	shutdownGrace    = 10 * time.Second
	maxConsoleLog    = 1 << 20
)

// appendLine is the guest kernel's command line. panic=-1 with QEMU's
// -no-reboot: a panic ends QEMU, which the run reports. The guest has
// cgroup v2 only: the agent holds the pids limit in a v2 cgroup.
const appendLine = "console=ttyS0 quiet loglevel=3 panic=-1 oops=panic mitigations=off systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"

// result is B/vm-result.json.
type result = vmspec.Result

func cmdRun(g globals, args []string, log *logger) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	bundle := fs.String("bundle", ".", "the OCI bundle")
	pidFile := fs.String("pid-file", "", "written with QEMU's pid once the job runs")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	p, err := readBundle(*bundle)
	if err != nil {
		return err
	}
	qpath, apath, k, err := machineParts(g)
	if err != nil {
		return err
	}
	st, err := newState(g.root, id)
	if err != nil {
		return err
	}
	r := &runner{g: g, plan: p, state: st, log: log, rec: record{CLI: procOf(os.Getpid()), Netns: p.netns}}
	code, err := r.run(qpath, apath, k, *bundle, *pidFile)
	r.cleanup()
	if err != nil {
		return err
	}
	return &exitCode{code: code}
}

// machineParts are QEMU, the agent and the kernel the global flags name.
func machineParts(g globals) (qpath, apath string, k kernel.Kernel, err error) {
	if qpath, err = qemuPath(g); err != nil {
		return
	}
	if apath, err = agentPath(g); err != nil {
		return
	}
	k, err = loadKernel(g)
	return
}

// loadKernel is --kernel's kernel, or the newest cached one.
func loadKernel(g globals) (kernel.Kernel, error) {
	if g.kernel != "" {
		return kernel.Load(g.kernel)
	}
	k, err := kernel.Find(kernel.Base())
	if err != nil {
		return k, fmt.Errorf("%w (run `airlock-vm kernel fetch`)", err)
	}
	return k, nil
}

// runner is one run: the machine and everything it made.
type runner struct {
	g     globals
	plan  plan
	state stateDir
	log   *logger
	rec   record
	m     *qemu.Machine
	c     *client.Client
	ln    net.Listener

	mu  sync.Mutex
	job *client.Process
}

func (r *runner) run(qpath, apath string, k kernel.Kernel, bundle, pidFile string) (int, error) {
	if err := r.state.save(r.rec); err != nil {
		return 0, err
	}
	if r.plan.cgroupsPath != "" {
		dirs, err := qemu.CgroupDirs(r.plan.cgroupsPath)
		if err != nil {
			return 0, err
		}
		r.rec.Cgroups = dirs
		if err := r.state.save(r.rec); err != nil {
			return 0, err
		}
		if err := qemu.JoinCgroup(dirs); err != nil {
			return 0, err
		}
	}
	initrd, err := cachedInitramfs(r.g.root, apath, k)
	if err != nil {
		return 0, err
	}
	if r.plan.disk != "" {
		if err := makeDisk(r.plan.disk, r.plan.diskBytes, r.plan.uidBase); err != nil {
			return 0, err
		}
	}
	conTheirs, conMine, err := socketPair()
	if err != nil {
		return 0, err
	}
	agTheirs, agMine, err := socketPair()
	if err != nil {
		conTheirs.Close()
		conMine.Close()
		return 0, err
	}
	qlog, err := os.OpenFile(r.state.path(qemuLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer qlog.Close()
	// QEMU's own messages are bounded as the console is: a guest that
	// keeps a device failing must not fill the executor's disk.
	qerr := &tailBuffer{max: 4096, w: &limitWriter{w: qlog, left: maxConsoleLog}}
	bios := ""
	if _, err := os.Stat(qemu.QbootROM); err == nil {
		bios = qemu.QbootROM
	}
	r.m, err = qemu.Start(qemu.Launch{
		Path: qpath,
		Config: qemu.Config{
			Accel: r.g.accel, CPUs: r.plan.cpus, MemoryBytes: r.plan.memoryBytes, BIOS: bios,
			Kernel: k.Vmlinux, Initrd: initrd, Append: appendLine,
			Shares: r.plan.shares, Disk: r.plan.disk,
		},
		UIDBase: r.plan.uidBase, Netns: r.plan.netns,
		Agent: agTheirs, Console: conTheirs, Stderr: qerr,
	})
	conTheirs.Close()
	agTheirs.Close()
	if err != nil {
		conMine.Close()
		agMine.Close()
		return 0, err
	}
	r.rec.QEMU = procOf(r.m.Pid)
	if err := r.state.save(r.rec); err != nil {
		return 0, err
	}
	console := &tailBuffer{max: 8192}
	go copyConsole(conMine, r.state.path(consoleLog), console)
	r.c = client.New(agMine)
	// The connection ends when QEMU does; then the client fails every wait.
	go func() {
		<-r.m.Done()
		r.c.Close()
	}()
	// fail reports a failure of the machine with what QEMU and the console
	// said last; QEMU is ended first so that all it wrote is in.
	fail := func(what string, err error) (int, error) {
		select {
		case <-r.m.Done():
		case <-time.After(time.Second):
			r.m.Kill()
			<-r.m.Done()
		}
		return 0, fmt.Errorf("%s: %v (qemu: %v, %s; console: %s)", what, err, r.m.Err(), qerr.String(), console.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	hello, err := r.c.Hello(ctx)
	cancel()
	if err != nil {
		return fail("the guest agent did not start", err)
	}
	cfg := r.plan.config
	if r.plan.netns != "" && r.m.Net.MAC != "" {
		ni := r.m.Net
		cfg.Network = &proto.Network{MAC: ni.MAC, MTU: ni.MTU, Addresses: ni.Addresses,
			Gateway4: ni.Gateway4, Gateway6: ni.Gateway6, GatewayMAC: ni.GatewayMAC}
	}
	ctx, cancel = context.WithTimeout(context.Background(), configureTimeout)
	err = r.c.Configure(ctx, cfg)
	cancel()
	if err != nil {
		return fail("configure the guest", err)
	}
	if err := r.listen(); err != nil {
		return 0, err
	}
	ctx, cancel = context.WithTimeout(context.Background(), startTimeout)
	job, err := r.c.Start(ctx, r.plan.process, os.Stdout, os.Stderr)
	cancel()
	if err != nil {
		var ee *client.ExecError
		if errors.As(err, &ee) {
			return 0, &exitCode{code: execCode(ee.Code), err: errors.New(ee.Message)}
		}
		return fail("start the job", err)
	}
	r.mu.Lock()
	r.job = job
	r.mu.Unlock()
	if pidFile != "" {
		if err := atomicfile.Write(pidFile, []byte(strconv.Itoa(r.m.Pid)), 0o644, atomicfile.Fast); err != nil {
			return 0, fmt.Errorf("pid file: %w", err)
		}
	}
	stopSignals := r.forwardSignals(job)
	defer stopSignals()
	exit, err := job.Wait(context.Background())
	if err != nil {
		return fail("the machine ended before the job", err)
	}
	res := result{ExitCode: exit.Code, OOMKills: exit.OOMKills, GuestKernel: clip(hello.Kernel, maxGuestKernel)}
	b, _ := json.Marshal(res)
	if err := atomicfile.Write(bundle+"/"+vmspec.ResultFile, b, 0o644, atomicfile.Fast); err != nil {
		return 0, fmt.Errorf("vm-result.json: %w", err)
	}
	return exit.Code, nil
}

// maxGuestKernel bounds the guest's kernel name in vm-result.json: the
// guest says it, and the guest is not trusted.
const maxGuestKernel = 256

// clip is s cut to at most n bytes, with invalid UTF-8 replaced.
func clip(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// execCode is the exit status of a failed execve, as runc's: 127 for a
// missing file, 126 for anything else.
func execCode(code int) int {
	if code == exitNotFound {
		return exitNotFound
	}
	return exitNoExec
}

// forwardSignals passes the signals a runtime forwards to its job.
func (r *runner) forwardSignals(job *client.Process) func() {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := job.Signal(ctx, s.(syscall.Signal)); err != nil {
					r.log.warnf("forward %v to the job: %v", s, err)
				}
				cancel()
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// cleanup ends the machine (asking the guest first), and removes the
// state: a run's state lives as long as the run, as runc's does.
func (r *runner) cleanup() {
	if r.ln != nil {
		r.ln.Close()
	}
	if r.m != nil {
		if r.c != nil {
			r.c.Shutdown()
		}
		select {
		case <-r.m.Done():
		case <-time.After(shutdownGrace):
			r.m.Kill()
			<-r.m.Done()
		}
	}
	if err := os.RemoveAll(string(r.state)); err != nil {
		r.log.warnf("remove state: %v", err)
	}
}

func socketPair() (theirs, mine *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "qemu-end"), os.NewFile(uintptr(fds[1]), "cli-end"), nil
}

// copyConsole keeps the guest console's first maxConsoleLog bytes in
// path (the rest is read and dropped, so the guest never blocks on it),
// and its last bytes in tail for error messages.
func copyConsole(src *os.File, path string, tail *tailBuffer) {
	defer src.Close()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		io.Copy(tail, src)
		return
	}
	defer f.Close()
	tail.w = &limitWriter{w: f, left: maxConsoleLog}
	io.Copy(tail, src)
}

// limitWriter writes the first left bytes and drops the rest.
type limitWriter struct {
	w    io.Writer
	left int
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if n := min(len(b), l.left); n > 0 {
		l.w.Write(b[:n])
		l.left -= n
	}
	return len(b), nil
}

// tailBuffer keeps the last max bytes written (and passes all to w).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
	w   io.Writer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil {
		t.w.Write(p)
	}
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strconv.Quote(string(t.b))
}

// makeDisk creates the guest's disk image, sparse, with an ext4 file
// system, when it is missing (a kept session's is reused as it is), and
// gives it to the unprivileged QEMU.
func makeDisk(path string, size int64, uidBase uint32) error {
	st, err := os.Lstat(path)
	switch {
	case err == nil && !st.Mode().IsRegular():
		return fmt.Errorf("disk %s: not a regular file", path)
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("disk: %w", err)
		}
		// Allocated now, not sparse: the image lies on the job's scratch
		// beside /work and /out, and a sparse one would meet a full
		// scratch as I/O errors inside the guest; allocated, the guest's
		// own ext4 fills first and says ENOSPC, and a scratch without
		// room for it fails here, saying so.
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
		if errors.Is(err, unix.ENOSPC) {
			err = fmt.Errorf("the job's scratch has no room for a guest disk of %d bytes: %w", size, err)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			var out []byte
			out, err = exec.Command("mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=1", path).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("mkfs.ext4: %v: %s", err, out)
			}
		}
		if err != nil {
			os.Remove(path)
			return fmt.Errorf("disk %s: %w", path, err)
		}
	default:
		return fmt.Errorf("disk: %w", err)
	}
	if err := os.Lchown(path, int(uidBase), int(uidBase)); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	return nil
}
