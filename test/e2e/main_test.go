//go:build linux

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// binDir holds the binaries TestMain builds: airlock, authority, executor,
// publisher and grpc-health-probe.
var binDir string

// bin returns the path of one of the binaries TestMain built.
func bin(name string) string { return filepath.Join(binDir, name) }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "airlock-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	// Binaries built beforehand (AIRLOCK_E2E_BIN_DIR: the four, runc, runsc
	// and grpc-health-probe) spare the builds where they are slow: make
	// test-cgroup2's emulated VM.
	if pre := os.Getenv("AIRLOCK_E2E_BIN_DIR"); pre != "" {
		binDir = pre
		for _, name := range []string{"airlock", "authority", "executor", "publisher", "grpc-health-probe", "runc"} {
			if _, err := os.Stat(filepath.Join(pre, name)); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: AIRLOCK_E2E_BIN_DIR:", err)
				return 1
			}
		}
	} else if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// `airlock dev up` starts each service in its own session and exits, so
	// the services are orphans. Made a subreaper, this process inherits
	// them instead of init (which, in some containers, never reaps), and
	// can both reap them and read their exit status.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cannot become a child subreaper:", err)
		return 1
	}
	return m.Run()
}

// build compiles the four Airlock binaries and grpc-health-probe (pinned by
// tools/go.mod) into dir, from the module root.
func build(dir string) error {
	gomod, err := goOutput("", "env", "GOMOD")
	if err != nil {
		return err
	}
	if gomod == "" || gomod == os.DevNull {
		return fmt.Errorf("go env GOMOD: not inside the airlock module")
	}
	root := filepath.Dir(gomod)
	if _, err := goOutput(root, "build", "-o", dir+string(filepath.Separator),
		"./cmd/airlock", "./services/authority/cmd/authority", "./services/executor/cmd/executor", "./services/publisher/cmd/publisher"); err != nil {
		return err
	}
	if _, err := goOutput(root, "build", "-modfile=tools/go.mod", "-o", dir+string(filepath.Separator),
		"github.com/grpc-ecosystem/grpc-health-probe"); err != nil {
		return err
	}
	// The runtimes are built by tools/sandbox/build.sh into the module's
	// bin/ (it skips work when they are up to date) and linked in beside
	// the services, where dev up looks for them.
	runtimes := filepath.Join(root, "bin")
	script := exec.Command("bash", filepath.Join(root, "tools", "sandbox", "build.sh"), runtimes)
	script.Stdout, script.Stderr = os.Stderr, os.Stderr
	if err := script.Run(); err != nil {
		return fmt.Errorf("tools/sandbox/build.sh: %w", err)
	}
	for _, name := range []string{"runc", "runsc"} {
		if _, err := os.Stat(filepath.Join(runtimes, name)); err == nil {
			if err := os.Symlink(filepath.Join(runtimes, name), filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	for _, name := range []string{"airlock", "authority", "executor", "publisher", "grpc-health-probe", "runc"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	return nil
}

func goOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}
