package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
)

// selfCheckEnv, in a probe job's environment, makes the process's own
// binary (the executor, or a test binary), copied into that job, run
// selfCheckMain for the duration it holds instead of its main: package
// initialization runs before main.
const selfCheckEnv = "AIRLOCK_SANDBOX_SELFCHECK"

// selfCheckOutput starts the line a passing self-check prints; the runner
// requires it (see selfCheckVerdict).
const selfCheckOutput = "airlock-selfcheck ok"

// DefaultSelfCheck is how long the runsc self-check computes unless
// Config.RunscSelfCheck says otherwise. Under systrap on the issue 20 host
// it failed after 2 and 8 seconds of 10.
const DefaultSelfCheck = 10 * time.Second

func init() {
	if v, ok := os.LookupEnv(selfCheckEnv); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s=%q: %v\n", selfCheckEnv, v, err)
			os.Exit(2)
		}
		os.Exit(selfCheckMain(d, os.Stdout, os.Stderr))
	}
}

// selfCheck runs the process's own binary in a runsc job as selfCheckMain
// and says what went wrong, "" if nothing did; cached says a pass recorded
// by an earlier start stood in for the run. src is the probe's source
// directory, owned by the sandbox's root; version is runsc's (with its
// binary's digest).
//
// A pass under the ptrace platform is recorded in
// Config.RunscSelfCheckCache, in a file named by a key of everything the
// outcome depends on: runsc's binary, the platform, the check's length,
// the executor's own binary (the workload), the kernel and the CPU. An
// executor that starts again on the same machine with the same binaries
// skips the check, so it costs its length once, not at every start. A
// failure is never recorded, nor a pass under another platform: every
// start checks again.
func (m *Manager) selfCheck(ctx context.Context, src, version string) (why string, cached bool) {
	self, err := os.Executable()
	if err != nil {
		return fmt.Sprintf("find the executor's own binary: %v", err), false
	}
	key, err := m.selfCheckKey(self, version)
	if err != nil {
		return fmt.Sprintf("read what the self-check depends on: %v", err), false
	}
	// Only ptrace's pass is recorded: under another platform the check's
	// failures are matters of luck (systrap's came after 2 and 8 s of 10),
	// so one pass on an idle host says little of the next start.
	return passStamp{dir: m.cfg.RunscSelfCheckCache, key: key}.check(m.cfg.RunscPlatform == "ptrace", func() string {
		return m.runSelfCheck(ctx, src, self)
	}, m.log)
}

// passStamp is the record of a passed self-check: a file in dir named by
// key, holding key.
type passStamp struct{ dir, key string }

func (p passStamp) path() string {
	return filepath.Join(p.dir, "runsc-selfcheck-"+p.key+".passed")
}

// check says what run, the self-check, found wrong, "" if nothing; cached
// says the stamp stood in for it. Where cache is false the stamp is
// neither trusted nor written.
func (p passStamp) check(cache bool, run func() string, log *slog.Logger) (why string, cached bool) {
	if cache && p.passed() {
		return "", true
	}
	if why := run(); why != "" {
		return why, false
	}
	if !cache {
		return "", false
	}
	err := os.MkdirAll(p.dir, 0o700)
	if err == nil {
		err = atomicfile.Write(p.path(), []byte(p.key), 0o600, atomicfile.Durable)
	}
	if err != nil {
		log.Warn("sandbox: record the runsc self-check's pass", "error", err)
	}
	return "", false
}

// passed says the stamp records a pass. Its content is computable, so it
// is trusted only where no one but the executor's user could have written
// it: a directory (not a link) and a plain file (not a link, a FIFO or a
// device: opened without following a link or blocking) that user owns and
// no group or other may write, holding exactly the key.
func (p passStamp) passed() bool {
	euid := uint32(os.Geteuid())
	var dir unix.Stat_t
	if err := unix.Lstat(p.dir, &dir); err != nil ||
		dir.Mode&unix.S_IFMT != unix.S_IFDIR || dir.Uid != euid || dir.Mode&0o022 != 0 {
		return false
	}
	fd, err := unix.Open(p.path(), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), p.path())
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil ||
		st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != euid || st.Mode&0o022 != 0 || st.Size != int64(len(p.key)) {
		return false
	}
	got := make([]byte, len(p.key)+1)
	n, err := io.ReadFull(f, got)
	return errors.Is(err, io.ErrUnexpectedEOF) && string(got[:n]) == p.key
}

// selfCheckKey names everything a self-check's outcome depends on: see
// selfCheck.
func (m *Manager) selfCheckKey(self, version string) (string, error) {
	h := sha256.New()
	f, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "", err
	}
	cpu, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", err
	}
	// The first CPU's model, microcode and flags; the rest repeat them.
	var model []string
	for line := range strings.Lines(string(cpu)) {
		if strings.TrimSpace(line) == "" {
			break
		}
		for _, k := range []string{"vendor_id", "model name", "microcode", "flags"} {
			if strings.HasPrefix(line, k) {
				model = append(model, strings.TrimSpace(line))
			}
		}
	}
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s\x00%s %s %s\x00%s", version, m.cfg.RunscPlatform, m.cfg.RunscSelfCheck,
		unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Version[:]), unix.ByteSliceToString(uts.Machine[:]),
		strings.Join(model, "\n"))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runSelfCheck runs self, the process's own binary, in a runsc job as
// selfCheckMain and says what went wrong, "" if nothing did.
func (m *Manager) runSelfCheck(ctx context.Context, src, self string) string {
	dst := filepath.Join(src, "selfcheck")
	if err := copyExecutable(self, dst, int(m.cfg.UIDBase)); err != nil {
		return err.Error()
	}
	defer os.Remove(dst)
	limits := Limits{CPUMillis: 2000, MemoryBytes: 512 << 20, Pids: selfCheckPids(runtime.NumCPU()), DiskBytes: 16 << 20, Deadline: 2 * time.Minute}
	return m.probeJob(ctx, ClassRunsc, Spec{
		ID: "probe.runsc-selfcheck", Source: src, Command: []string{"./selfcheck"},
		Env: map[string]string{selfCheckEnv: m.cfg.RunscSelfCheck.String()}, Limits: limits,
	}, selfCheckVerdict)
}

// selfCheckProcs is the self-check's GOMAXPROCS on a machine of ncpu CPUs:
// more than the CPUs, so threads are switched and migrated, but at most 64,
// so a large host's check stays within its pids limit.
func selfCheckProcs(ncpu int) int { return min(max(4, 2*ncpu), 64) }

// selfCheckPids is the self-check job's pids limit on a machine of ncpu
// CPUs: room for its Go runtime's threads (GOMAXPROCS running, more in
// system calls and sleeps) with plenty to spare.
func selfCheckPids(ncpu int) int64 { return int64(4*selfCheckProcs(ncpu) + 64) }

// selfCheckVerdict says what is wrong with the self-check job's stdout, ""
// if it is the one line of a pass, "airlock-selfcheck ok rounds=N" with N
// above zero: a job that exits 0 having run nothing has not passed.
func selfCheckVerdict(stdout string) string {
	rounds, ok := strings.CutPrefix(strings.TrimSpace(stdout), selfCheckOutput+" rounds=")
	if n, err := strconv.ParseInt(rounds, 10, 64); !ok || err != nil || n <= 0 {
		return fmt.Sprintf("the self-check printed %q, want %q with a count above zero", stdout, selfCheckOutput+" rounds=N")
	}
	return ""
}

// copyExecutable copies the file src to dst, mode 0755, owned by uid.
func copyExecutable(src, dst string, uid int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chown(dst, uid, uid)
}

// selfCheckMain is the self-check's workload: for d, more goroutines than
// CPUs (so the sandbox's threads are switched and migrated) each do what
// the Go compiler that crashed under runsc did in bulk, and check every
// result: allocate and walk trees of small pointerful objects (the garbage
// collector, vectorized on CPUs with AVX-512), recurse deeply with
// checked frames (stack growth copies them), hash strings into maps
// (AES-NI hashing in the XMM registers), copy blocks (memmove's SSE and AVX
// loops), make system calls and sleep (the platform's trap and switch
// paths), and, where the CPU has AVX-512, load every vector register, make
// a system call and read them back, while a timer signal interrupts them
// all. Any wrong result exits 3; a corrupted runtime crashes on its own.
func selfCheckMain(d time.Duration, stdout, stderr io.Writer) int {
	runtime.GOMAXPROCS(selfCheckProcs(runtime.NumCPU()))
	// A timer signal every 200µs, handled, interrupts the workers all the
	// while: each delivery saves and restores a thread's whole state.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGALRM)
	defer signal.Stop(sigs)
	tick := unix.NsecToTimeval((200 * time.Microsecond).Nanoseconds())
	if _, err := unix.Setitimer(unix.ItimerReal, unix.Itimerval{Interval: tick, Value: tick}); err != nil {
		fmt.Fprintf(stderr, "self-check: setitimer: %v\n", err)
		return 2
	}
	defer func() { _, _ = unix.Setitimer(unix.ItimerReal, unix.Itimerval{}) }()
	end := time.Now().Add(d)
	var rounds atomic.Int64
	var failed atomic.Pointer[string]
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failed.CompareAndSwap(nil, &msg)
	}
	var wg sync.WaitGroup
	for w := range 2 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := 0; time.Now().Before(end) && failed.Load() == nil; i++ {
				checkRound(w, i, fail)
				rounds.Add(1)
			}
		})
	}
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		fmt.Fprintf(stderr, "self-check: %s\n", *msg)
		return 3
	}
	fmt.Fprintf(stdout, "%s rounds=%d\n", selfCheckOutput, rounds.Load())
	return 0
}

// checkRound is one round of the self-check for worker w.
func checkRound(w, i int, fail func(string, ...any)) {
	type node struct {
		l, r *node
		v    uint64
	}
	var build func(depth int, v uint64) *node
	build = func(depth int, v uint64) *node {
		if depth == 0 {
			return &node{v: v}
		}
		return &node{l: build(depth-1, 2*v), r: build(depth-1, 2*v+1), v: v}
	}
	var sum func(n *node) uint64
	sum = func(n *node) uint64 {
		if n == nil {
			return 0
		}
		return n.v + sum(n.l) + sum(n.r)
	}
	depth, root := 6+(w+i)%5, uint64(w+1)
	tree := build(depth, root)

	if got := deepFrames(150+i%100, uint64(i)); got != deepFramesWant(150+i%100, uint64(i)) {
		fail("deep recursion returned %#x, want %#x", got, deepFramesWant(150+i%100, uint64(i)))
	}

	m := map[string]int{}
	for k := range 256 {
		m["key-"+strconv.Itoa(w)+"-"+strconv.Itoa(k)] = k
	}
	for k := range 256 {
		if v, ok := m["key-"+strconv.Itoa(w)+"-"+strconv.Itoa(k)]; !ok || v != k {
			fail("map lookup of key %d gave %d, %v", k, v, ok)
		}
	}

	var a, b [1024]byte
	for k := range a {
		a[k] = byte(k*7 + i)
	}
	for _, n := range []int{16, 33, 64, 100, 256, 1000, 1024} {
		copy(b[:n], a[:n])
		for k := range n {
			if b[k] != a[k] {
				fail("copy of %d bytes: byte %d is %#x, want %#x", n, k, b[k], a[k])
				return
			}
		}
	}

	for k := range 64 {
		seed := uint64(w)<<48 ^ uint64(i*64+k)*0x9e3779b97f4a7c15
		if why := checkVectorRegisters(seed); why != "" {
			fail("worker %d: %s", w, why)
			return
		}
	}
	if i%4 == 0 {
		os.Getpid()
		time.Sleep(time.Microsecond)
	}
	// Every level holds 2^k nodes numbered from root<<k.
	var want uint64
	for k := range depth + 1 {
		first, count := root<<k, uint64(1)<<k
		want += count*first + count*(count-1)/2
	}
	if got := sum(tree); got != want {
		fail("tree of depth %d sums to %d, want %d", depth, got, want)
	}
}

// deepFrames recurses n levels, each frame holding an array it checks after
// the call below it returns: a stack copied wrongly on growth shows here.
func deepFrames(n int, seed uint64) uint64 {
	var frame [8]uint64
	for k := range frame {
		frame[k] = seed*31 + uint64(k)
	}
	var below uint64
	if n > 0 {
		below = deepFrames(n-1, seed+1)
	}
	for k := range frame {
		if frame[k] != seed*31+uint64(k) {
			return 0
		}
	}
	return below ^ frame[7]
}

// deepFramesWant is what deepFrames(n, seed) returns when nothing is
// corrupted.
func deepFramesWant(n int, seed uint64) uint64 {
	var x uint64
	for k := n; k >= 0; k-- {
		x ^= (seed+uint64(k))*31 + 7
	}
	return x
}
