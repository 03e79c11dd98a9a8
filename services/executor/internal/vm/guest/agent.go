//go:build linux

// Package guest is the agent that is the VM's PID 1: it loads the
// initramfs's modules, reaches the host over the virtio-serial port, builds
// the job's read-only root from the host's 9p shares, and runs the job's
// processes as the host asks (package vm/proto). Only cmd/airlock-guest
// imports it. Every frame from the host is checked; a protocol error or the
// host going away powers the machine off.
package guest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

type agent struct {
	port   *os.File
	w      *proto.Writer
	reaper *reaper
	jobCg  int // fd of the job processes' cgroup, -1 without one
	// docker says dockerd answers on dockerSocket: every process gets
	// DOCKER_HOST naming it unless its environment names another.
	docker bool

	// dockerd, once started: stopped first at power-off, so its disk is clean.
	dockerdPid    int
	dockerdExited <-chan syscall.WaitStatus

	mu    sync.Mutex
	procs map[uint32]*process
}

// Main runs the agent as PID 1; it never returns.
func Main() {
	if os.Getpid() != 1 {
		// It mounts over / and powers off: never on a host by mistake.
		fmt.Fprintln(os.Stderr, "airlock-guest: not PID 1: this is a VM's init, not a command")
		os.Exit(2)
	}
	a := &agent{jobCg: -1, procs: map[uint32]*process{}}
	err := a.run()
	fmt.Fprintf(os.Stderr, "airlock-guest: %v\n", err)
	a.powerOff()
}

func console(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "airlock-guest: "+format+"\n", args...)
}

func (a *agent) run() error {
	if err := earlyMounts(); err != nil {
		return err
	}
	if c, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		os.Stderr = c
		unix.Dup2(int(c.Fd()), 2)
	}
	// The OOM killer must pick a job's process, never the agent; the
	// child resets the score before it drops its capabilities.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		return fmt.Errorf("oom_score_adj: %w", err)
	}
	a.reaper = newReaper()
	if err := loadModules(); err != nil {
		return err
	}
	port, err := openPort(10 * time.Second)
	if err != nil {
		return err
	}
	a.port = port
	a.w = proto.NewWriter(port)
	var uts unix.Utsname
	unix.Uname(&uts)
	kernel := unix.ByteSliceToString(uts.Release[:]) + " " + unix.ByteSliceToString(uts.Version[:])
	if err := a.w.WriteJSON(proto.ControlStream, proto.TypeHello, proto.Hello{Version: version.String(), Kernel: kernel}); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	r := proto.NewReader(port)
	if err := a.configure(r); err != nil {
		return err
	}
	return a.serve(r)
}

// configure takes File frames then the Config, sets the machine up and answers.
func (a *agent) configure(r *proto.Reader) error {
	files := map[string][]byte{}
	total := 0
	for {
		f, err := r.Read()
		if err != nil {
			return fmt.Errorf("read config: %w", err)
		}
		switch {
		case f.Stream == proto.ControlStream && f.Type == proto.TypeFile:
			p, _, data, err := proto.DecodeFileChunk(f.Payload)
			if err != nil {
				return err
			}
			if _, ok := files[p]; !ok && len(files) >= proto.MaxFiles {
				return fmt.Errorf("%w: more than %d config files", proto.ErrProtocol, proto.MaxFiles)
			}
			if total += len(data); len(files[p])+len(data) > proto.MaxFileSize {
				return fmt.Errorf("%w: config file %s over %d bytes", proto.ErrProtocol, p, proto.MaxFileSize)
			}
			files[p] = append(files[p], data...)
		case f.Stream == proto.ControlStream && f.Type == proto.TypeConfig:
			var cfg proto.Config
			if err := proto.Decode(f, &cfg); err != nil {
				return err
			}
			err := cfg.Validate()
			if err == nil {
				for _, file := range cfg.Files {
					if len(files[file.Path]) != file.Size {
						err = fmt.Errorf("config file %s: %d bytes arrived, %d announced", file.Path, len(files[file.Path]), file.Size)
						break
					}
				}
			}
			if err == nil {
				err = a.setup(&cfg, files)
			}
			if err != nil {
				a.w.WriteJSON(proto.ControlStream, proto.TypeError, proto.Error{Message: err.Error()})
				return err
			}
			return a.w.Write(proto.ControlStream, proto.TypeReady, nil)
		case f.Stream == proto.ControlStream && f.Type == proto.TypeShutdown:
			return errors.New("shutdown before config")
		default:
			return fmt.Errorf("%w: %s on stream %d before config", proto.ErrProtocol, f.Type, f.Stream)
		}
	}
}

func (a *agent) setup(cfg *proto.Config, files map[string][]byte) error {
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	if err := setupNetwork(cfg.Network); err != nil {
		return err
	}
	if err := a.buildRoot(cfg, files); err != nil {
		return err
	}
	if err := switchRoot(); err != nil {
		return err
	}
	if err := a.setupCgroups(cfg.PidsLimit); err != nil {
		return err
	}
	if cfg.Docker {
		if err := a.startDocker(cfg.DockerUID, cfg.DockerGID); err != nil {
			return err
		}
		a.docker = true
	}
	return nil
}

// serve handles the host's frames until Shutdown or the host goes away.
func (a *agent) serve(r *proto.Reader) error {
	for {
		f, err := r.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the host closed the connection")
			}
			return fmt.Errorf("read from the host: %w", err)
		}
		if err := a.handle(f); err != nil {
			return err
		}
	}
}

func (a *agent) handle(f proto.Frame) error {
	if f.Stream == proto.ControlStream {
		switch f.Type {
		case proto.TypeSignal:
			var s proto.Signal
			if err := proto.Decode(f, &s); err != nil {
				return err
			}
			if err := signalProcess(s); err != nil {
				return a.w.WriteJSON(proto.ControlStream, proto.TypeError, proto.Error{Message: err.Error()})
			}
			return a.w.Write(proto.ControlStream, proto.TypeReady, nil)
		case proto.TypeShutdown:
			return errors.New("shutdown")
		}
		return fmt.Errorf("%w: %s on the control stream", proto.ErrProtocol, f.Type)
	}
	a.mu.Lock()
	p := a.procs[f.Stream]
	a.mu.Unlock()
	switch {
	case f.Type == proto.TypeStart && p == nil:
		var spec proto.Process
		if err := proto.Decode(f, &spec); err != nil {
			return err
		}
		a.start(f.Stream, spec)
		return nil
	case p == nil:
		// A stream that ended: its stdin frames may still be on the way.
		if f.Type == proto.TypeStdin || f.Type == proto.TypeStdinClose {
			return nil
		}
	case f.Type == proto.TypeStdin:
		return p.queueStdin(f.Payload)
	case f.Type == proto.TypeStdinClose:
		p.closeStdin()
		return nil
	}
	return fmt.Errorf("%w: %s on stream %d", proto.ErrProtocol, f.Type, f.Stream)
}

func signalProcess(s proto.Signal) error {
	if s.Pid == 0 || s.Pid == 1 || s.Pid == -1 || s.Pid < -(1<<22) || s.Pid > 1<<22 || s.Signal < 0 || s.Signal > 64 {
		return fmt.Errorf("signal %d to %d: not a job's process or group", s.Signal, s.Pid)
	}
	if err := unix.Kill(s.Pid, syscall.Signal(s.Signal)); err != nil {
		return fmt.Errorf("signal %d to %d: %w", s.Signal, s.Pid, err)
	}
	return nil
}

// dockerdStop bounds dockerd's clean shutdown at power-off.
const dockerdStop = 10 * time.Second

// powerOff ends the machine: dockerd is asked to stop, everything else
// killed, the disk synced.
func (a *agent) powerOff() {
	if a.dockerdPid > 0 {
		unix.Kill(a.dockerdPid, unix.SIGTERM)
		select {
		case <-a.dockerdExited:
		case <-time.After(dockerdStop):
		}
	}
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	for {
		time.Sleep(time.Hour) // PID 1 must not exit: the kernel would panic
	}
}

// readOOMKills counts the OOM kills of the job's processes.
func readOOMKills() uint64 {
	// The job's own cgroup counts the OOM kills of its processes only:
	// not those of dockerd's containers at their own limits
	// (cgroupDocker), nor of the agent. Where the memory controller is
	// missing, the machine's count is all there is.
	path, key := filepath.Join(cgroupJob, "memory.events"), "oom_kill %d"
	b, err := os.ReadFile(path)
	if err != nil {
		b, _ = os.ReadFile("/proc/vmstat")
	}
	for _, l := range strings.Split(string(b), "\n") {
		var n uint64
		if _, err := fmt.Sscanf(l, key, &n); err == nil {
			return n
		}
	}
	return 0
}
