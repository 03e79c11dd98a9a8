package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// IdleCommand is what a session's sandbox runs as its own process, the
// init of its pid namespace: nothing, until the sandbox is stopped, while
// it reaps every orphan an exec leaves (bash's wait reaps any child, and
// orphans become init's children). It ignores every signal a job could
// send it, and the kernel drops SIGKILL and SIGSTOP sent to an init from
// inside its namespace: a session ends only from outside.
var IdleCommand = []string{"bash", "-c", "trap '' HUP INT QUIT TERM USR1 USR2 PIPE ALRM; while :; do sleep 3600 & wait $!; done"}

// imageIdleCommand is IdleCommand on an image, which need not have bash:
// the same loop in /bin/sh (dash, busybox and bash as sh all reap any child
// in wait), needing sleep, which every distribution image has.
var imageIdleCommand = []string{"/bin/sh", "-c", IdleCommand[2]}

// isSession reports whether the spec is a session's: one that runs
// IdleCommand, with execs and file uploads while it runs.
func (s Spec) isSession() bool { return slices.Equal(s.Command, IdleCommand) }

// How long an exec's process group has, after SIGTERM, before SIGKILL;
// and how long a started sandbox has to come up before an Exec gives up.
const (
	DefaultExecKillGrace = 10 * time.Second
	execStartWait        = 30 * time.Second
	vmStartWait          = 4 * time.Minute
)

// ExecSpec is one command run inside a running sandbox, beside its own
// process: a session's exec.
type ExecSpec struct {
	// Argv is the command; argv[0] is resolved through PATH inside.
	Argv []string
	// Env is added to the sandbox's environment (Spec.Env over the
	// defaults), overriding what it names.
	Env map[string]string
	// Cwd is the absolute working directory inside; empty is /work.
	Cwd string
	// Stdin is the command's standard input; nil is /dev/null.
	Stdin io.Reader
	// Stdout and Stderr receive its output. Nil discards.
	Stdout, Stderr io.Writer
	// Timeout, if positive, bounds its wall time: past it, its whole
	// process group is killed (ReasonTimeout). The sandbox lives on.
	Timeout time.Duration
	// KillGrace is how long the process group has after SIGTERM, when ctx
	// is cancelled, before SIGKILL. Zero is DefaultExecKillGrace.
	KillGrace time.Duration

	// exited, if set, is called as soon as the command's own process has
	// ended, before its output is drained (a claimed job's main exec:
	// Run then ends the rest of the job, which may hold the output open).
	exited func()
}

// ExecResult is how an exec ended.
type ExecResult struct {
	// Reason is ReasonExited, ReasonTimeout, ReasonOOM, ReasonCancelled
	// (ctx, or the sandbox stopping under it) or ReasonSandboxError.
	Reason Reason
	// ExitCode is the command's exit status when Reason is ReasonExited,
	// else -1; a command killed by signal N exits 128+N.
	ExitCode int
	WallTime time.Duration
	// CPUTime is what the whole sandbox used while the exec ran: execs
	// running at once share it.
	CPUTime time.Duration
	Message string
}

func (x *ExecSpec) validate() error {
	if err := CheckCommand("exec.argv", "exec.env", x.Argv, x.Env); err != nil {
		return err
	}
	if x.Cwd != "" && (!path.IsAbs(x.Cwd) || path.Clean(x.Cwd) != x.Cwd || strings.IndexByte(x.Cwd, 0) >= 0) {
		return invalid("exec.cwd %q: must be a clean absolute path", x.Cwd)
	}
	if x.Timeout < 0 || x.KillGrace < 0 {
		return invalid("exec.timeout and exec.kill_grace must not be negative")
	}
	return nil
}

// Exec runs x inside the running sandbox, with the sandbox's user,
// capabilities (none), seccomp filter, limits and network, and waits for
// it. The command is the leader of a process group of its own: its
// timeout, or cancelling ctx (SIGTERM, then SIGKILL after KillGrace),
// stops that whole group and nothing else of the sandbox. A process that
// leaves the group (setsid) is stopped only when the sandbox is. Processes
// it leaves running when it exits are not stopped; their output, after a
// short grace, is no longer collected.
//
// Exec waits, up to a bound, for a sandbox whose Run has just begun to be
// up. The error is non-nil only when the exec could not be run at all:
// bad input, a sandbox not running, or the runtime failing.
func (s *Sandbox) Exec(ctx context.Context, x ExecSpec) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	if err := x.validate(); err != nil {
		return res, err
	}
	if x.KillGrace == 0 {
		x.KillGrace = DefaultExecKillGrace
	}
	proc, err := s.waitUp(ctx)
	if err != nil {
		return res, err
	}
	proc.Args = x.Argv
	if s.rt.class == ClassRunc {
		// runc copies a command's output through pipes of its own and
		// returns only once every holder has closed them, so a process
		// left running in the background would hold the exec open. The
		// command gets ours instead, as fds 3 and 4 (--preserve-fds),
		// put in place of its stdout and stderr before it starts; runc's
		// pipes are then held by nothing and it returns as the command
		// exits.
		proc.Args = append([]string{"/bin/sh", "-c", `exec 1>&3 2>&4 3>&- 4>&-; exec "$@"`, "airlock-exec"}, x.Argv...)
	}
	env := maps.Clone(s.spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, x.Env)
	path, imageEnv := s.envBase()
	proc.Env = jobEnv(path, imageEnv, s.spec.User, env)
	proc.Cwd = x.Cwd
	if proc.Cwd == "" {
		proc.Cwd = "/work"
	}
	if s.useExecd() {
		if r, handled, err := s.execViaHelper(ctx, x, res, proc); handled {
			return r, err
		}
	}
	n := s.execSeq.Add(1)
	procFile := filepath.Join(s.dir, fmt.Sprintf("exec-%d.json", n))
	pidFile := filepath.Join(s.dir, fmt.Sprintf("exec-%d.pid", n))
	logPath := filepath.Join(s.dir, fmt.Sprintf("exec-%d.log", n))
	defer os.Remove(procFile)
	defer os.Remove(pidFile)
	defer os.Remove(logPath)
	data, err := json.Marshal(proc)
	if err != nil {
		return res, err
	}
	if err := os.WriteFile(procFile, data, 0o600); err != nil {
		return res, err
	}
	return s.exec(ctx, x, res, procFile, pidFile, logPath)
}

// waitUp waits for the sandbox's own process to be running and returns a
// copy of its process spec, the template of every exec's.
func (s *Sandbox) waitUp(ctx context.Context) (*specs.Process, error) {
	wait := execStartWait
	if s.spec.Class == ClassVM {
		// A machine boots first (seconds under KVM, tens of them under a
		// loaded emulator), and with docker starts dockerd.
		wait = vmStartWait
	}
	deadline := time.Now().Add(wait)
	// Polled often at first: a container is up within tens of
	// milliseconds, and a session's first exec waits on it.
	for poll := time.Millisecond; ; poll = min(2*poll, 20*time.Millisecond) {
		s.mu.Lock()
		state, ending := s.state, s.ending
		s.mu.Unlock()
		if state > stateRunning || ending {
			return nil, fmt.Errorf("%w: sandbox %s is not running", errdefs.ErrFailedPrecondition, s.spec.ID)
		}
		if _, err := os.Stat(s.pidFile); err == nil && state == stateRunning {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox %s: not up %s after it was started", s.spec.ID, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll):
		}
	}
	s.execOnce.Do(func() {
		data, err := os.ReadFile(filepath.Join(s.bundle, "config.json"))
		if err != nil {
			s.execErr = err
			return
		}
		var cfg specs.Spec
		if err := json.Unmarshal(data, &cfg); err != nil || cfg.Process == nil {
			s.execErr = fmt.Errorf("sandbox %s: read the bundle's process: %v", s.spec.ID, err)
			return
		}
		s.execProc, s.execErr = json.Marshal(cfg.Process)
	})
	if s.execErr != nil {
		return nil, s.execErr
	}
	// A fresh copy for each exec to change.
	var p specs.Process
	if err := json.Unmarshal(s.execProc, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (s *Sandbox) exec(ctx context.Context, x ExecSpec, res ExecResult, procFile, pidFile, logPath string) (ExecResult, error) {
	pipes, err := newOutputPipes()
	if err != nil {
		return res, err
	}
	args := s.rt.global(logPath)
	args = append(args, "exec", "--process", procFile, "--pid-file", pidFile)
	internalPid := ""
	if s.rt.class == ClassRunc {
		args = append(args, "--preserve-fds", "2")
	}
	if s.rt.class != ClassRunc {
		// runsc and airlock-vm name the exec's process by its pid inside.
		internalPid = pidFile + ".internal"
		defer os.Remove(internalPid)
		args = append(args, "--internal-pid-file", internalPid)
	}
	args = append(args, s.name)
	cmd := exec.Command(s.rt.path, args...)
	cmd.Env = runtimeEnv
	cmd.Dir = s.dir
	// Stdin through a pipe we feed ourselves: os/exec would copy a reader
	// in a goroutine that Wait waits for, so a process inside that holds
	// stdin open without reading it (runsc hands the pipe to the sandbox)
	// would hold the exec open past its end and its timeout.
	var stdinW *os.File
	if x.Stdin != nil {
		r, w, err := os.Pipe()
		if err != nil {
			pipes.started(false)
			return res, err
		}
		defer r.Close()
		cmd.Stdin, stdinW = r, w
	}
	if s.rt.class == ClassRunc {
		cmd.ExtraFiles = []*os.File{pipes.outW, pipes.errW}
	} else {
		cmd.Stdout, cmd.Stderr = pipes.outW, pipes.errW
	}
	// The runtime process leads a group of its own, so a terminal's
	// signals to the executor do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cpu0, oom0 := s.m.cg.cpuTime(s.cgRel), s.oomKills()
	start := time.Now()
	err = cmd.Start()
	pipes.started(err == nil)
	if err != nil {
		if stdinW != nil {
			stdinW.Close()
		}
		return res, fmt.Errorf("start %s exec: %w", s.rt.class, err)
	}
	if stdinW != nil {
		go func() {
			_, _ = io.Copy(stdinW, x.Stdin)
			stdinW.Close()
		}()
		// Once the runtime has exited, a write still blocked on the pipe
		// fails (EPIPE) when its last reader is gone; closing ours below
		// (deferred) takes care of the runtime's copy.
	}
	pipes.copy(x.Stdout, x.Stderr)
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()

	// Both runtimes start the command as the leader of a new session and
	// process group; signalling that group reaches exactly the exec's
	// processes. runc names its host pid, runsc its pid inside gVisor.
	group := func(sig syscall.Signal) {
		if s.rt.class == ClassRunc {
			if pid := readPid(pidFile); pid > 0 {
				_ = syscall.Kill(-pid, sig)
			} else {
				// Not started yet: the runtime process itself.
				_ = cmd.Process.Signal(sig)
			}
			return
		}
		pid := readPid(internalPid)
		if pid <= 0 {
			_ = cmd.Process.Signal(sig)
			return
		}
		if err := s.rt.kill(s.name, pid, sig); err != nil {
			s.m.log.Warn("sandbox: signal an exec's process group", "job_id", s.spec.ID, "error", err)
		}
	}
	stopped, werr := superviseExec(ctx, x, start, waitErr, group, func() { _ = cmd.Process.Kill() })
	wall := time.Since(start)
	ending := s.isEnding()
	if x.exited != nil {
		x.exited()
	}
	pipes.drain(outputDrainGrace) // a process the exec left running may hold it open
	cpu1, oom1 := s.m.cg.cpuTime(s.cgRel), s.oomKills()
	res.WallTime, res.CPUTime = wall, max(0, cpu1-cpu0)
	code := exitCode(werr)
	execCode, execMsg, execFailed := execFailure(s.rt.class, logErrors(logPath))
	_, started := os.Stat(pidFile)
	if s.execStopped(&res, x, stopped, ending, oom1 > oom0, code) {
		return res, nil
	}
	switch {
	case execFailed:
		res.Reason, res.ExitCode, res.Message = ReasonExited, execCode, "the command could not be executed: "+execMsg
	case started != nil || code < 0:
		msg := strings.Join(logErrors(logPath), "; ")
		if werr != nil {
			msg = strings.TrimPrefix(msg+"; "+werr.Error(), "; ")
		}
		return res, fmt.Errorf("%s exec did not run the command (exit %d): %s", s.rt.class, code, msg)
	default:
		res.Reason, res.ExitCode = ReasonExited, code
		res.Message = fmt.Sprintf("exited with status %d", code)
	}
	return res, nil
}

// superviseExec waits for waitC, the end of an exec started at start,
// while enforcing x's timeout and ctx: past the timeout, the exec's
// process group gets SIGKILL (then again every 200 ms); on ctx's end,
// SIGTERM, then SIGKILL after the grace period. kill, once the group's
// kill has not ended it well past both, kills what waitC waits for. It
// returns why the exec was stopped ("" if it was not) and waitC's value.
func superviseExec(ctx context.Context, x ExecSpec, start time.Time, waitC <-chan error, group func(syscall.Signal), kill func()) (Reason, error) {
	var timeoutC <-chan time.Time
	if x.Timeout > 0 {
		t := time.NewTimer(x.Timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	var (
		stopped     Reason
		graceC      <-chan time.Time
		sweepC      <-chan time.Time
		werr        error
		escalated   bool
		sweepTicker *time.Ticker
	)
	defer func() {
		if sweepTicker != nil {
			sweepTicker.Stop()
		}
	}()
	sweep := func() {
		group(syscall.SIGKILL)
		if sweepTicker == nil {
			sweepTicker = time.NewTicker(200 * time.Millisecond)
			sweepC = sweepTicker.C
		}
	}
	done := ctx.Done()
wait:
	for {
		select {
		case werr = <-waitC:
			break wait
		case <-timeoutC:
			timeoutC = nil
			if stopped == "" {
				stopped = ReasonTimeout
			}
			sweep()
		case <-done:
			done = nil
			if stopped == "" {
				stopped = ReasonCancelled
			}
			group(syscall.SIGTERM)
			graceC = time.After(x.KillGrace)
		case <-graceC:
			graceC = nil
			sweep()
		case <-sweepC:
			group(syscall.SIGKILL)
			if !escalated && time.Since(start) > x.Timeout+x.KillGrace+runtimeExitGrace {
				// The runtime outlived the group's kill: kill it too.
				escalated = true
				kill()
			}
		}
	}
	return stopped, werr
}

// execStopped fills res, and reports true, when an exec's end is not its
// command's own: stopped (its timeout, or cancelled), the sandbox ending
// under it (ending, read as the command's process ended: not after its
// output's drain, which a claimed job's end may overlap), or an OOM kill
// (oomKilled: the cgroup counted one while it ran, and the command died
// of SIGKILL, code).
func (s *Sandbox) execStopped(res *ExecResult, x ExecSpec, stopped Reason, ending, oomKilled bool, code int) bool {
	switch {
	case stopped == ReasonTimeout:
		res.Reason = ReasonTimeout
		res.Message = fmt.Sprintf("the exec's timeout of %s passed; its process group was killed", x.Timeout)
	case stopped == ReasonCancelled:
		res.Reason = ReasonCancelled
		res.Message = "its process group was sent SIGTERM, then SIGKILL after the grace period"
	case ending:
		res.Reason = ReasonCancelled
		res.Message = "the sandbox stopped while the exec ran"
	case oomKilled && code == 128+int(syscall.SIGKILL):
		res.Reason = ReasonOOM
		res.Message = fmt.Sprintf("the memory limit of %d bytes was reached and the kernel's OOM killer killed a process of the exec", s.limits().MemoryBytes)
	default:
		return false
	}
	return true
}

// readPid reads a pid file; 0 if there is none yet.
func readPid(p string) int {
	if p == "" {
		return 0
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	return n
}

// oomKills counts the OOM kills in the job's cgroup and below.
func (s *Sandbox) oomKills() int64 { return s.m.cg.oomKills(s.cgRel) }

// CheckDir reports whether p, as the job sees it, is a directory under
// /work or /out, resolved as the files API resolves paths.
func (s *Sandbox) CheckDir(field, p string) error {
	root, rel, err := s.splitPath(field, p)
	if err != nil {
		return err
	}
	f, err := openBeneath(field, p, root, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}
