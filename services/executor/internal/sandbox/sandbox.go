package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

type sandboxState int

const (
	stateCreated sandboxState = iota
	stateRunning
	stateFinished
	stateDestroyed
)

// How long to wait, after killing a job's processes, for the runtime to
// notice and exit before killing the runtime process itself; and for the
// output pipes to drain once every writer is gone.
const (
	runtimeExitGrace = 5 * time.Second
	outputDrainGrace = 2 * time.Second
	killWait         = 5 * time.Second
)

// Sandbox is one job's prepared sandbox.
type Sandbox struct {
	m    *Manager
	spec Spec
	// name names everything of the sandbox on the host: its directory,
	// cgroup, runtime container and image root. It is spec.ID, but for a
	// pooled sandbox (warm.go), whose name was chosen before any job
	// claimed it and whose spec.ID is the claiming job's from then on.
	name           string
	rt             *runtimeBin
	runtimeVersion string

	dir, bundle, logPath, pidFile, workDir string
	cgRel                                  string
	scr                                    *scratch
	// bundleIn is what the bundle's config.json was written from.
	bundleIn bundleInputs
	oomFD    int // eventfd of OOM notifications, -1 if none
	// rootDir is the mount point of a job on an image's root (image.go),
	// below Manager.rootsDir; "" for a job on the host template.
	rootDir string

	// stop asks a running Run to kill the job (Destroy does).
	stop chan struct{}

	// A pooled sandbox (warm.go) was made before any job, by Warm, and is
	// running its idle init with no Run watching it until a job claims
	// it: warm is its runtime, which Run takes over; claimed is set once
	// Claim has made it the job's.
	pooled, claimed, claiming bool
	warm                      *started
	// runOwned is set while a Run owns the sandbox (Destroy then stops
	// that Run and waits for it).
	runOwned bool

	mu      sync.Mutex
	state   sandboxState
	runDone chan struct{}
	// ending is set once Run has begun to stop the job or seen it end:
	// from then on its limits are what the result reports, and no longer
	// change.
	ending bool
	// deadlineChanged wakes a running Run to re-arm its deadline from
	// spec.Limits (UpdateLimits).
	deadlineChanged chan struct{}

	// firstStart is when Run first started the job: the deadline counts
	// from it, across Restart.
	firstStart time.Time

	// Exec's: a sequence for its files, and the bundle's process spec,
	// read once, the template of every exec's.
	execSeq  atomic.Int64
	execOnce sync.Once
	execProc []byte // the bundle's process spec, as JSON
	execErr  error
	// execdMu guards execd, the session's exec helper (execd.go).
	execdMu sync.Mutex
	execd   *execdConn
	// execdFails counts the helper's failed starts in a row under the
	// sandbox init execdFailInit (one run).
	execdFails, execdFailInit int
}

// WorkDir is the host path of the job's merged /work, readable after Run
// until Destroy.
func (s *Sandbox) WorkDir() string { return s.workDir }

// UpperDir is the host path of the overlay's upper layer under /work:
// exactly what the job changed (new and modified files, whiteouts for
// deletions, opaque directories), readable after Run until Destroy.
func (s *Sandbox) UpperDir() string { return filepath.Join(s.scr.point, scratchUpper) }

// OutDir is the host path of the job's /out, readable after Run until
// Destroy.
func (s *Sandbox) OutDir() string { return filepath.Join(s.dir, "scratch", scratchOut) }

// JobText rewrites text meant for the job's caller (an error's message)
// so it names no host path: each of the job's directories becomes the path
// the job sees (/work, /out, /tmp, $HOME), and anything else under the
// executor's state directory "<executor>", so a message such as "open
// /var/lib/.../scratch/out/e/e: file name too long" reads "open /out/e/e:
// ...". The host paths go to the executor's log, not to callers.
func (s *Sandbox) JobText(text string) string {
	sp := s.scr.point
	return strings.NewReplacer(
		s.UpperDir(), "/work", s.workDir, "/work", s.OutDir(), "/out", filepath.Join(sp, scratchOut), "/out",
		filepath.Join(sp, scratchTmp), "/tmp", filepath.Join(sp, scratchHome), s.spec.User.Home(),
		s.m.cfg.StateDir, "<executor>",
	).Replace(text)
}

// BaseResult is the Result of a sandbox that has not run: its runtime,
// versions and no exit status.
func (s *Sandbox) BaseResult() Result {
	return Result{
		ExitCode:        -1,
		Class:           s.spec.Class,
		RuntimeVersion:  s.runtimeVersion,
		TemplateVersion: s.templateVersion(),
	}
}

// templateVersion is what the job's root filesystem is: the image's digest
// for a job on an image, else the host template's.
func (s *Sandbox) templateVersion() string {
	if s.spec.Image != nil {
		return s.spec.Image.Digest
	}
	return s.m.tmpl.version
}

// envBase is what jobEnv builds the job's environment on: the operator's
// PATH for a job on the host template, the image's Env for one on an
// image.
func (s *Sandbox) envBase() (path string, image []string) {
	if s.spec.Image != nil {
		return "", s.spec.Image.Env
	}
	return s.m.cfg.Path, nil
}

// Run runs the job to its end and returns how it ended. Cancelling ctx
// cancels the job (ReasonCancelled); Limits.Deadline times it out
// (ReasonTimeout). Either way, and whenever the job ends, every process it
// started is killed. The error is non-nil only when the sandbox machinery
// failed, and then Result.Reason is ReasonSandboxError.
func (s *Sandbox) Run(ctx context.Context) (Result, error) {
	res := s.BaseResult()
	s.mu.Lock()
	var up *started
	switch {
	case s.state == stateCreated && !s.pooled:
		s.state = stateRunning
		s.runDone = make(chan struct{})
		s.deadlineChanged = make(chan struct{}, 1)
	case s.state == stateCreated && s.claimed:
		// A claimed sandbox run again (Restart).
		s.state = stateRunning
		s.runDone = make(chan struct{})
	case s.state == stateRunning && s.warm != nil && s.claimed && !s.runOwned:
		// A claimed sandbox's first Run: its runtime is up already, and
		// this Run takes it over.
		up, s.warm = s.warm, nil
	default:
		s.mu.Unlock()
		res.Reason = ReasonSandboxError
		res.Message = "Run may be called once, on a sandbox not yet destroyed (a pooled one once claimed)"
		return res, fmt.Errorf("%w: sandbox %s: %s", errdefs.ErrFailedPrecondition, s.spec.ID, res.Message)
	}
	s.runOwned = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.state, s.runOwned = stateFinished, false
		close(s.runDone)
		s.mu.Unlock()
	}()
	res, err := s.run(ctx, res, up)
	if err != nil {
		res.Reason = ReasonSandboxError
		res.ExitCode = -1
		res.Message = err.Error()
		s.m.log.Error("sandbox run failed", "job_id", s.spec.ID, "class", s.spec.Class, "error", err)
	}
	return res, err
}

// started is a runtime process running a sandbox's init.
type started struct {
	cmd   *exec.Cmd
	pipes *outputPipes
	// done is closed once the runtime has exited, with err its wait's.
	done chan struct{}
	err  error
}

// start starts the runtime on the bundle, its output copied to stdout and
// stderr.
func (s *Sandbox) start(stdout, stderr io.Writer) (*started, error) {
	pipes, err := newOutputPipes()
	if err != nil {
		return nil, err
	}
	cmd := s.rt.runCmd(s.bundle, s.name, s.logPath, s.pidFile, s.spec.isSession())
	// The runtime hands its own stdio to the job: stdin is /dev/null, and
	// the write ends of the pipes go straight to the job's processes.
	cmd.Stdout, cmd.Stderr = pipes.outW, pipes.errW
	// Its own process group, so a terminal's signals to the executor do
	// not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	pipes.started(err == nil)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.rt.class, err)
	}
	// The runtime inherits the executor's low OOM score, and so would
	// what it forks that never takes the spec's: runsc's gofer, and the
	// sentry's stub processes, which map the job's memory. It is raised
	// at once, while the runtime (a Go program) is still starting up;
	// should it have forked already, runsc still raises the sentry,
	// whose death ends the whole sandbox.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), []byte(strconv.Itoa(jobOOMScoreAdj)), 0); err != nil {
		s.m.log.Warn("sandbox: raise the runtime's oom_score_adj", "job_id", s.spec.ID, "error", err)
	}
	pipes.copy(stdout, stderr)
	st := &started{cmd: cmd, pipes: pipes, done: make(chan struct{})}
	go func() { st.err = cmd.Wait(); close(st.done) }()
	return st, nil
}

// run runs the sandbox; up, if set, is its runtime already started (a
// claimed pooled sandbox's).
func (s *Sandbox) run(ctx context.Context, res Result, up *started) (Result, error) {
	if ctx.Err() != nil && up == nil {
		// (A claimed sandbox's init is up: the wait below stops it.)
		res.Reason = ReasonCancelled
		res.Message = "no process of the job had started"
		return res, nil
	}
	start := time.Now()
	// The deadline counts from the first Run: a restarted sandbox
	// (Restart) has what is left of it.
	s.mu.Lock()
	if s.firstStart.IsZero() {
		s.firstStart = start
	}
	first := s.firstStart
	s.mu.Unlock()
	if up == nil {
		var err error
		if up, err = s.start(s.spec.Stdout, s.spec.Stderr); err != nil {
			return res, err
		}
	}
	cmd, pipes := up.cmd, up.pipes
	// A claimed batch job's command is not the container's init (that is
	// the pooled sandbox's idle one) but its main exec, through the exec
	// helper: its end is the job's, which ends the rest of the job as an
	// init's end would.
	var mainC chan mainExec
	var mainExited <-chan struct{}
	if s.claimed && !s.spec.isSession() {
		mainC = make(chan mainExec, 1)
		mainCtx, cancelMain := context.WithCancel(context.Background())
		defer cancelMain()
		// The command's own end comes before its output is drained: the
		// loop below then ends the rest of the job, which may hold the
		// output open, at once.
		exited := make(chan struct{})
		mainExited = exited
		go func() {
			r, err := s.Exec(mainCtx, ExecSpec{Argv: s.spec.Command, Stdout: s.spec.Stdout, Stderr: s.spec.Stderr,
				exited: func() { close(exited) }})
			mainC <- mainExec{res: r, err: err}
		}()
	}
	if s.spec.isSession() {
		// The session's exec helper starts as soon as the sandbox is up,
		// so its first exec is as fast as the others (an exec that finds
		// none, because it failed or a job killed it, starts one itself);
		// then the session is ready. A claimed sandbox's is up already.
		go s.prestart(ctx)
	}

	deadline := time.NewTimer(untilDeadline(first, time.Now(), s.limits().Deadline))
	defer deadline.Stop()
	var stopped Reason
	// Once stopping, the cgroup is swept again on every tick: a kill that
	// lands while the runtime is still setting the container up can miss
	// the job's first process. A runtime that has not exited after the
	// grace period is killed itself.
	var sweep *time.Ticker
	var sweepC, escalate <-chan time.Time
	defer func() {
		if sweep != nil {
			sweep.Stop()
		}
	}()
	var werr error
	// main is a claimed batch job's main exec, once it has ended;
	// lingering its runtime, when Run ended before it had exited.
	// cmdEnded: a claimed batch job's command has ended; a deadline or a
	// cancel that comes while its output drains still kills what is left,
	// but the job's status stays the command's own.
	var main *mainExec
	var lingering *started
	cmdEnded := false
	kill := func(r Reason) {
		if stopped == "" && r != "" && !cmdEnded {
			stopped = r
		}
		s.markEnding()
		if err := s.m.cg.kill(s.cgRel, killWait); err != nil {
			s.m.log.Error("sandbox: kill job processes", "job_id", s.spec.ID, "error", err)
		}
		if sweep == nil {
			sweep = time.NewTicker(100 * time.Millisecond)
			sweepC = sweep.C
			escalate = time.After(runtimeExitGrace)
		}
	}
	// Where the kernel keeps no peak of memory or tasks (cgroup v2 before
	// 5.19 and 6.13), they are sampled.
	var peaks peakSampler
	var sampleC <-chan time.Time
	if s.m.cg.sampling() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		sampleC = t.C
	}
	// Each stop source fires once; a closed ctx.Done must not spin.
	done, stop := ctx.Done(), s.stop
wait:
	for {
		select {
		case <-up.done:
			werr = up.err
			break wait
		case <-mainExited:
			// Every kill of the cgroup is made from this loop, one at a
			// time: two at once race over its freezer (cgroup v1), and
			// one of them waits out the freeze for nothing.
			// (The sandbox is not marked ending yet: the exec reports the
			// command's own status.)
			mainExited, cmdEnded = nil, true
			_ = s.m.cg.kill(s.cgRel, killWait)
		case m := <-mainC:
			// Its command has ended. When mainExited came first, the
			// kill below is a second one, in this goroutine, so it races
			// nothing; it finds the cgroup empty and returns at once when
			// the first emptied it, and tries again when that one failed.
			mainC, mainExited, main, cmdEnded = nil, nil, &m, true
			s.markEnding()
			if s.m.cg.kill(s.cgRel, killWait) == nil {
				// Nothing of the job is left: the runtime's own exit (its
				// cleanup after its init) is not waited for here, but by
				// Destroy, before the sandbox's state is removed.
				lingering = up
				break wait
			}
			kill("")
		case <-deadline.C:
			// The timer may have fired just as UpdateLimits extended the
			// deadline (select picks either at random): only the deadline
			// in force now counts.
			if left := untilDeadline(first, time.Now(), s.limits().Deadline); left > 0 {
				deadline.Reset(left)
				continue
			}
			kill(ReasonTimeout)
		case <-s.deadlineChanged:
			// Counted from the start: a deadline already past fires now.
			deadline.Reset(untilDeadline(first, time.Now(), s.limits().Deadline))
		case <-done:
			done = nil
			kill(ReasonCancelled)
		case <-stop:
			stop = nil
			kill(ReasonCancelled)
		case <-sampleC:
			peaks.sample(s.m.cg.current(s.cgRel))
		case <-sweepC:
			_ = s.m.cg.kill(s.cgRel, killWait)
		case <-escalate:
			s.m.log.Warn("sandbox: the runtime outlived its job; killing it", "job_id", s.spec.ID, "class", s.spec.Class)
			_ = cmd.Process.Kill()
			escalate = nil
		}
	}
	mainLost := false
	if mainC != nil {
		// The runtime ended first (the main exec's end kills the rest of
		// the job, the idle init with it): its status comes once its
		// output is drained. Should the init have ended by itself (a
		// kill from outside), the rest of the job ends with it, as a
		// container's does.
		s.markEnding()
		_ = s.m.cg.kill(s.cgRel, killWait)
		select {
		case m := <-mainC:
			main = &m
		case <-time.After(outputDrainGrace + killWait):
			mainLost = true
		}
	}
	wall := time.Since(start)
	s.markEnding()
	s.closeExecd()
	lim := s.limits()

	// Whatever ended the runtime, nothing of the job may outlive Run.
	var errs []error
	if err := s.m.cg.kill(s.cgRel, killWait); err != nil {
		errs = append(errs, err)
	}
	if lingering != nil {
		// Destroy waits for it, deletes its state and drains its output
		// (its init's, which printed nothing of the job's).
		s.mu.Lock()
		s.warm = lingering
		s.mu.Unlock()
	} else if s.rt.hasState(s.name) {
		if err := s.rt.forceDelete(s.name); err != nil {
			errs = append(errs, err)
		}
	}
	if lingering == nil && !pipes.drain(outputDrainGrace) {
		// Some process outside the cgroup holds a write end; the job's
		// output is complete as far as it matters.
		s.m.log.Warn("sandbox: output pipes still open after the job ended", "job_id", s.spec.ID)
	}

	st := s.m.cg.stats(s.cgRel)
	st.peakMemory, st.peakPids = max(st.peakMemory, peaks.memory), max(st.peakPids, peaks.pids)
	res.Usage = Usage{
		CPUTime:         st.cpu,
		WallTime:        wall,
		PeakMemoryBytes: st.peakMemory,
		DiskBytes:       s.scr.jobBytes(),
		PeakPids:        st.peakPids,
	}
	code := exitCode(werr)
	if main != nil {
		// The job's status is its main exec's, not the idle init's.
		code = main.code()
	}
	// Under runsc the cgroup's tasks are gVisor's: at their bound the
	// sandbox fails, whatever the job was doing (see cgroupLimitsOf).
	hostPidsHit := s.rt.class == ClassRunsc && (st.pidsMaxHit > 0 || st.peakPids >= cgroupLimitsOf(ClassRunsc, lim).Pids)
	_, started := os.Stat(s.pidFile)
	msgs := logErrors(s.logPath)
	execCode, execMsg, execFailed := execFailure(s.rt.class, msgs)
	switch {
	case stopped == ReasonTimeout:
		res.Reason = ReasonTimeout
		res.Message = fmt.Sprintf("the deadline of %s passed; every process of the job was killed", lim.Deadline)
	case stopped == ReasonCancelled:
		res.Reason = ReasonCancelled
		res.Message = "every process of the job was killed"
	case oomEvents(s.oomFD) > 0 || st.oomKills > 0 || s.vmGuestOOM():
		res.Reason = ReasonOOM
		res.Message = fmt.Sprintf("the memory limit of %d bytes was reached and the kernel's OOM killer killed a process of the job", lim.MemoryBytes)
	case execFailed:
		res.Reason, res.ExitCode, res.Message = ReasonExited, execCode, "the command could not be executed: "+execMsg
	case mainLost:
		errs = append(errs, errors.New("the job's command ended, but its status could not be read in time"))
	case main != nil && main.err != nil:
		errs = append(errs, fmt.Errorf("the job's command: %w", main.err))
	case main != nil && main.res.Reason == ReasonSandboxError:
		errs = append(errs, fmt.Errorf("the job's command: %s", main.res.Message))
	case main != nil && main.res.Reason == ReasonExited && strings.HasPrefix(main.res.Message, "the command could not be executed"):
		res.Reason, res.ExitCode, res.Message = ReasonExited, code, main.res.Message
	case started != nil:
		// The runtime never started the job's process.
		if code < 0 && werr != nil {
			msgs = append(msgs, werr.Error())
		}
		errs = append(errs, fmt.Errorf("%s did not start the job (exit %d): %s", s.rt.class, code, strings.Join(msgs, "; ")))
	case sentryDiedAtHostPids(hostPidsHit, code):
		errs = append(errs, fmt.Errorf("runsc ended with status %d: %s", code, strings.Join(append([]string{runscHostPidsHit(lim)}, msgs...), "; ")))
	case s.rt.class != ClassRunc && code == runscFailureExit && len(msgs) > 0:
		// runsc and airlock-vm both exit 128 on their own failures.
		errs = append(errs, fmt.Errorf("%s failed: %s", s.rt.class, strings.Join(msgs, "; ")))
	case s.scr.full():
		res.Reason = ReasonDiskFull
		res.Message = fmt.Sprintf("the job filled its disk limit of %d bytes and exited with status %d", lim.DiskBytes, code)
	case code < 0:
		errs = append(errs, fmt.Errorf("%s: %v", s.rt.class, werr))
	default:
		res.Reason, res.ExitCode = ReasonExited, code
		res.Message = fmt.Sprintf("exited with status %d", code)
		switch {
		case hostPidsHit:
			res.Message += "; " + runscHostPidsHit(lim)
		case st.pidsMaxHit > 0:
			res.Message += fmt.Sprintf("; %d fork(s) failed at the pids limit of %d", st.pidsMaxHit, lim.Pids)
		}
	}
	return res, errors.Join(errs...)
}

// mainExec is how a claimed batch job's main exec ended.
type mainExec struct {
	res ExecResult
	err error
}

// code is the job's exit status from its main exec: its own, or -1 when
// it did not end by itself.
func (m mainExec) code() int {
	if m.err != nil || m.res.Reason != ReasonExited {
		return -1
	}
	return m.res.ExitCode
}

// untilDeadline is how long a job started at start may still run at now
// under deadline d; zero or less means it is over.
func untilDeadline(start, now time.Time, d time.Duration) time.Duration {
	return start.Add(d).Sub(now)
}

// runscFailureExit is how runsc exits on its own errors.
const runscFailureExit = 128

// sentryPanicExit is runsc's status when gVisor's sentry dies of a Go
// panic, as it does when it cannot start a host task.
const sentryPanicExit = 2

// sentryDiedAtHostPids says that a runsc job's status code is not the
// job's but its sentry's, dead at the host-task bound: the bound was
// reached (hit) and runsc exited as a panicking sentry does. A job that
// met the bound and then exited with a status of its own gets that status.
func sentryDiedAtHostPids(hit bool, code int) bool {
	return hit && code == sentryPanicExit
}

// exitCode is the runtime's exit status, which is the job's: runc and runsc
// exit with the container process's status, or 128+N when it died of
// signal N. -1 means the status is unknown.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// Restart makes a sandbox whose Run has returned ready to Run again, as a
// fresh sandbox on the same /work and /out: what the job changed in /work
// and wrote to /out stays; /tmp and $HOME are emptied; no process
// survived the end of Run. The deadline still counts from the first Run.
func (s *Sandbox) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateFinished {
		return fmt.Errorf("%w: sandbox %s: Restart needs a sandbox whose Run has returned", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	if s.claimed && !s.spec.isSession() {
		// Its bundle's process is the job's command, which ran as the
		// main exec: run again, it would run as init too.
		return fmt.Errorf("%w: sandbox %s: a claimed batch job's sandbox is not restarted", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	if s.rt.hasState(s.name) {
		if err := s.rt.forceDelete(s.name); err != nil {
			return err
		}
	}
	for _, d := range []string{scratchTmp, scratchHome} {
		if err := emptyDir(filepath.Join(s.scr.point, d)); err != nil {
			return fmt.Errorf("sandbox %s: restart: empty %s: %w", s.spec.ID, d, err)
		}
	}
	for _, p := range []string{s.pidFile, s.logPath, filepath.Join(s.bundle, vmResultFile)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	s.state, s.ending = stateCreated, false
	return nil
}

// Signal sends sig to the job's first process through the runtime. That
// process is its PID namespace's init: a signal it has no handler for is
// dropped, by the kernel and by gVisor alike, so only a job that asks for
// a signal gets it. Tests use it to step a running job without writing
// its mounts, which a batch job under runsc does not see while it runs
// (runscBatchFlags).
func (s *Sandbox) Signal(sig syscall.Signal) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.rt.kill(s.name, 0, sig)
}

// Destroy kills anything of the job still running, then unmounts and
// removes its scratch, overlay, cgroups, runtime state and directories.
// It is idempotent; after it returns nil nothing of the sandbox is left.
func (s *Sandbox) Destroy() error { return s.destroy(false) }

// DestroyKeeping is Destroy, but keeps the job's scratch (its /work
// changes, /out, /tmp and $HOME) for a Create with Spec.Kept by the next
// executor process, when the executor stops with a session in it. Only an
// ext4 scratch can be kept: a tmpfs one is gone with its mount.
func (s *Sandbox) DestroyKeeping() error {
	if s.scr == nil || s.scr.kind != scratchExt4 {
		if err := s.destroy(false); err != nil {
			return err
		}
		return fmt.Errorf("%w: sandbox %s: a %s scratch cannot be kept", errdefs.ErrFailedPrecondition, s.spec.ID, scratchTmpfs)
	}
	return s.destroy(true)
}

func (s *Sandbox) destroy(keep bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateDestroyed {
		return nil
	}
	if s.state == stateRunning && s.runOwned {
		select {
		case s.stop <- struct{}{}:
		default:
		}
		done := s.runDone
		s.mu.Unlock()
		<-done
		s.mu.Lock()
		if s.state == stateDestroyed {
			return nil
		}
	}
	if w := s.warm; w != nil {
		// A pooled sandbox no Run owns: its processes are killed and its
		// runtime waited for (not under the lock) before its state is
		// deleted.
		s.warm, s.ending = nil, true
		s.mu.Unlock()
		if err := s.m.cg.kill(s.cgRel, killWait); err != nil {
			s.m.log.Warn("sandbox: kill a pooled sandbox's processes", "name", s.name, "error", err)
		}
		select {
		case <-w.done:
		case <-time.After(runtimeExitGrace):
			_ = w.cmd.Process.Kill()
			<-w.done
		}
		w.pipes.drain(outputDrainGrace)
		s.mu.Lock()
		if s.state == stateDestroyed {
			return nil
		}
	}
	if err := s.teardown(keep); err != nil {
		return fmt.Errorf("sandbox %s: destroy: %w", s.spec.ID, err)
	}
	s.state = stateDestroyed
	s.m.forget(s.name)
	return nil
}

// teardown removes whatever of the sandbox exists; each step tolerates
// what an earlier, partial create or teardown never made or already
// removed. With keep, the scratch image is moved to the kept directory
// once it is unmounted and detached, and not removed.
func (s *Sandbox) teardown(keep bool) error {
	var errs []error
	s.closeExecd()
	if err := s.m.cg.kill(s.cgRel, killWait); err != nil {
		errs = append(errs, err)
	}
	if s.rt.hasState(s.name) {
		if err := s.rt.forceDelete(s.name); err != nil {
			errs = append(errs, err)
		}
	}
	if s.oomFD >= 0 {
		unix.Close(s.oomFD)
		s.oomFD = -1
	}
	if s.rootDir != "" {
		if err := removeRoot(s.rootDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountAll(s.dir); err != nil {
		errs = append(errs, err)
	} else if err := s.scr.waitDetached(2 * time.Second); err != nil {
		errs = append(errs, err)
	} else if keep {
		if err := keepScratch(s.dir, s.m.keptDir, s.spec.ID); err != nil {
			errs = append(errs, fmt.Errorf("keep scratch: %w", err))
		}
	}
	if err := s.m.cg.remove(s.cgRel); err != nil {
		errs = append(errs, err)
	}
	if err := removeJobDir(s.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// peakSampler keeps the highest memory and task counts sampled.
type peakSampler struct{ memory, pids int64 }

func (p *peakSampler) sample(memory, pids int64) {
	p.memory, p.pids = max(p.memory, memory), max(p.pids, pids)
}
