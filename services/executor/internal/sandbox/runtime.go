package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// runtimeEnv is the runtime process's whole environment. Nothing of the
// executor's own environment reaches it (the job's comes from the bundle),
// and variables such as XDG_RUNTIME_DIR would change how runc behaves.
var runtimeEnv = []string{"PATH=" + DefaultPath}

// runscFSFlags are the filesystem flags every runsc command gets.
//
// --overlay2=none: the root is read-only and shared by every job; runsc
// must not put a writable layer (or its backing file) over it. runsc
// ignores a root overlay for a read-only root anyway, so root:memory and
// root:self measure the same as none; an overlay over every mount
// (all:...) would keep /work's and /out's writes inside the sandbox,
// where no patch or bundle could see them. docs/performance.md has the
// measurements of these and of --directfs and --file-access-mounts.
var runscFSFlags = []string{"--overlay2=none"}

// runscBatchFlags are added when runsc starts a job that is not a session.
//
// --file-access-mounts=exclusive: gVisor caches what it learns of the
// job's mounts (/work, /out, /tmp, /root, caches) instead of checking
// every cached name and attribute against the host again on each use:
// about 30% off a C build; a small-file tree's untar, walk and grep
// within noise (docs/performance.md). It is right only while nothing but
// the job changes those mounts, which holds for a batch job: the host
// writes its mounts before it starts and reads them after it ends. A
// session's /work and /out take uploads from the host while it runs
// (Sandbox.WriteFile), which a cached view misses (a file the host wrote
// over the job's symlink still showed as the symlink), so sessions keep
// "shared". Writes still reach the host as they are made (gVisor writes
// through the host file it holds), so a job killed at its deadline loses
// nothing it wrote (TestWritesOutliveAKill).
var runscBatchFlags = []string{"--file-access-mounts=exclusive"}

// runtimeBin is one OCI runtime binary with its own state root.
type runtimeBin struct {
	class Class
	path  string
	root  string
	// platform is gVisor's platform (runsc only; see runscPlatforms).
	platform string
	// fsFlags and batchFlags are runsc's filesystem flags (runsc only):
	// runscFSFlags and runscBatchFlags but in the benchmarks that compare
	// gVisor's options.
	fsFlags, batchFlags []string

	// vmFlags are airlock-vm's own global flags (VM only: vmFlags);
	// unavailable, if set, says why the class cannot run here (VM only:
	// vmAccel), and emulated that it runs under TCG.
	vmFlags     []string
	unavailable string
	emulated    bool

	mu      sync.Mutex
	version string // cached once read successfully
}

// global are the flags before the subcommand.
func (r *runtimeBin) global(logPath string) []string {
	args := []string{"--root", r.root}
	if logPath != "" {
		args = append(args, "--log", logPath, "--log-format", "json")
	}
	args = append(args, r.vmFlags...)
	if r.class == ClassRunsc {
		args = append(args,
			// Apply the bundle's seccomp filter to the job inside the
			// sandbox; runsc otherwise ignores it.
			"--oci-seccomp",
		)
		args = append(args, r.fsFlags...)
		args = append(args,
			// A new empty network namespace per gofer, gone with it; the
			// default pins one shared namespace under --root, which would
			// outlive every job.
			"--gofer-network-namespace=new",
		)
	}
	return args
}

// runCmd starts the job; session says whether it is a session's sandbox
// (see runscBatchFlags).
func (r *runtimeBin) runCmd(bundle, id, logPath, pidFile string, session bool) *exec.Cmd {
	args := r.global(logPath)
	if r.class == ClassRunsc {
		// The platform is the sandbox's, chosen when it starts; runsc's
		// other commands (exec, kill, delete) are not given it, nor the
		// batch flags, which also act only when the sandbox starts.
		args = append(args, "--platform="+r.platform, runscNetwork(bundle))
		if !session {
			args = append(args, r.batchFlags...)
		}
	}
	args = append(args, "run", "--bundle", bundle, "--pid-file", pidFile, id)
	cmd := exec.Command(r.path, args...)
	cmd.Env = runtimeEnv
	cmd.Dir = bundle
	return cmd
}

// runscNetwork chooses gVisor's network for the bundle's job. Without a
// network namespace to join: "none", loopback only, inside gVisor's own
// network stack. With one (package netpolicy's): "sandbox", where runsc
// starts the sandbox in that namespace and copies its interfaces,
// addresses and routes into gVisor's network stack, once, at start; the
// packets then leave through the namespace's own interfaces, so the
// host's rules for them apply. An interface added to the namespace later
// is never seen (see netpolicy.FixedInterfaces). The bundle's spec is
// what says, so the flag always matches what runsc will join.
func runscNetwork(bundle string) string {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		// runsc fails on the bundle itself, with its own message.
		return "--network=none"
	}
	var spec struct {
		Linux *struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	}
	if json.Unmarshal(data, &spec) == nil && spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == "network" && ns.Path != "" {
				return "--network=sandbox"
			}
		}
	}
	return "--network=none"
}

// hasState reports whether the runtime still keeps state for id.
func (r *runtimeBin) hasState(id string) bool {
	if _, err := os.Stat(filepath.Join(r.root, id)); err == nil {
		return true
	}
	// runsc keeps "<container>_sandbox:<sandbox>.state" files.
	m, _ := filepath.Glob(filepath.Join(r.root, id+"_sandbox:*"))
	return len(m) > 0
}

// forceDelete asks the runtime to kill and forget id.
func (r *runtimeBin) forceDelete(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.path, append(r.global(""), "delete", "--force", id)...)
	cmd.Env = runtimeEnv
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s delete --force %s: %v: %s", r.class, id, err, bytes.TrimSpace(out))
	}
	return nil
}

// kill sends sig to the container's first process, or with pgid > 0 to
// that process group (runsc names it by its pid inside gVisor).
func (r *runtimeBin) kill(id string, pgid int, sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := append(r.global(""), "kill")
	if pgid > 0 {
		args = append(args, "--pgid", strconv.Itoa(pgid))
	}
	cmd := exec.CommandContext(ctx, r.path, append(args, id, strconv.Itoa(int(sig)))...)
	cmd.Env = runtimeEnv
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s kill %s %d: %v: %s", r.class, id, sig, err, bytes.TrimSpace(out))
	}
	return nil
}

// getVersion runs the binary's --version and adds the binary's SHA-256,
// so a result names exactly which build ran it. A success is cached; a
// failure is not, and no caller's cancellation is ever cached as one.
func (r *runtimeBin) getVersion(ctx context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.version != "" {
		return r.version, nil
	}
	v, err := r.readVersion(context.WithoutCancel(ctx))
	if err != nil {
		return "", err
	}
	r.version = v
	return v, nil
}

func (r *runtimeBin) readVersion(ctx context.Context) (string, error) {
	if r.path == "" {
		return "", fmt.Errorf("no %s binary is configured", r.class)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// airlock-vm's version names the kernel and accelerator its flags
	// choose.
	cmd := exec.CommandContext(ctx, r.path, append(slices.Clone(r.vmFlags), "--version")...)
	cmd.Env = runtimeEnv
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v", r.path, err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "", fmt.Errorf("%s --version printed nothing", r.path)
	}
	f, err := os.Open(r.path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	lines = append(lines, "sha256:"+hex.EncodeToString(h.Sum(nil)))
	if r.class == ClassRunsc {
		// The platform changes how the job's threads run as much as the
		// binary does, so a result names it too.
		lines = append(lines, "platform="+r.platform)
	}
	return strings.Join(lines, "; "), nil
}

// logErrors returns the error messages in a runtime's JSON log.
func logErrors(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(line, &e) == nil && (e.Level == "error" || e.Level == "fatal") && e.Msg != "" {
			out = append(out, e.Msg)
		}
	}
	return out
}

// execFailure recognizes the runtime's report that the job's argv[0] could
// not be executed: that is the job's failure (exit 127 or 126, as a shell
// would say), not the sandbox's.
func execFailure(class Class, msgs []string) (code int, msg string, ok bool) {
	for _, m := range msgs {
		// airlock-vm reports an exec failure as a message of its own,
		// starting "exec: "; anywhere else such words are some other
		// program's (a guest daemon's log in a failure's message).
		if class == ClassVM && !strings.HasPrefix(m, "exec: ") {
			continue
		}
		// runsc resolves argv[0] itself before starting the job.
		if i := strings.Index(m, "error finding executable"); i >= 0 {
			return 127, m[i:], true
		}
		i := strings.Index(m, "exec: ")
		if i < 0 {
			i = strings.Index(m, "exec ")
		}
		if i < 0 {
			continue
		}
		tail := m[i:]
		switch {
		case strings.Contains(tail, "executable file not found"), strings.Contains(tail, "no such file or directory"):
			return 127, tail, true
		case strings.Contains(tail, "permission denied"), strings.Contains(tail, "exec format error"), strings.Contains(tail, "is a directory"):
			return 126, tail, true
		}
	}
	return 0, "", false
}
