// Command airlock-vm is the VM runtime class's OCI-runtime-like CLI: the
// executor's sandbox package drives it as it drives runsc (run, exec, kill,
// delete --force, --version), on the same OCI bundle, and it runs the job
// in a per-job QEMU machine whose init is the guest agent (airlock-guest).
// The sandbox package is its only caller; the contract between them is the
// command set below, the bundle's dev.airlock.vm.* annotations and
// B/vm-result.json.
//
//	airlock-vm [--root DIR] [--log FILE --log-format json] [--kernel DIR]
//	           [--qemu PATH] [--accel kvm|tcg] [--agent PATH] COMMAND ...
//	  run --bundle B --pid-file P ID
//	  exec --process F --pid-file P --internal-pid-file IP ID
//	  kill [--pgid N] ID SIG
//	  delete --force ID
//	  kernel fetch
//	airlock-vm [global flags] --version
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// Exit statuses of the runtime's own failures and of a failed execve
// (runc's and a shell's).
const (
	exitRuntime  = 128
	exitNotFound = 127
	exitNoExec   = 126
)

// globals are the flags before the command.
type globals struct {
	root, logPath, logFormat string
	kernel, qemu, accel      string
	agent                    string
	version                  bool
}

// exitCode is an error that ends the CLI with a given status; a nil err
// exits silently, a non-nil one is logged first.
type exitCode struct {
	code int
	err  error
}

func (e *exitCode) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	var g globals
	fs := flag.NewFlagSet("airlock-vm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.root, "root", "/run/airlock-vm", "state root: a container's state is in ROOT/ID")
	fs.StringVar(&g.logPath, "log", "", "append errors to this file as JSON lines")
	fs.StringVar(&g.logFormat, "log-format", "json", "the log's format (json)")
	fs.StringVar(&g.kernel, "kernel", "", "a cached kernel directory (package vm/kernel); default: the newest cached")
	fs.StringVar(&g.qemu, "qemu", "", "qemu-system-x86_64 (default: found in PATH)")
	fs.StringVar(&g.accel, "accel", "kvm", "kvm, or tcg (emulation)")
	fs.StringVar(&g.agent, "agent", "", "the guest agent binary (default: airlock-guest beside this executable)")
	fs.BoolVar(&g.version, "version", false, "print the versions of this CLI, QEMU, the kernel and the agent")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := &logger{path: g.logPath, stderr: stderr}
	if g.version {
		return log.exit(printVersion(g, stdout))
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "airlock-vm: want a command: run, exec, kill, delete, kernel fetch")
		return 2
	}
	var err error
	switch cmd, cargs := rest[0], rest[1:]; cmd {
	case "run":
		err = cmdRun(g, cargs, log)
	case "exec":
		err = cmdExec(g, cargs)
	case "kill":
		err = cmdKill(g, cargs)
	case "delete":
		err = cmdDelete(g, cargs)
	case "kernel":
		err = cmdKernel(cargs, stdout)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	return log.exit(err)
}

// logger writes runc-style JSON lines to --log (or stderr without one).
type logger struct {
	path   string
	stderr io.Writer
}

func (l *logger) write(level, msg string) {
	line, _ := json.Marshal(struct {
		Level string `json:"level"`
		Msg   string `json:"msg"`
		Time  string `json:"time"`
	}{level, msg, time.Now().UTC().Format(time.RFC3339Nano)})
	line = append(line, '\n')
	if l.path == "" {
		l.stderr.Write(line)
		return
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintf(l.stderr, "airlock-vm: %s (and the log %s: %v)\n", msg, l.path, err)
		return
	}
	defer f.Close()
	f.Write(line)
}

func (l *logger) errorf(format string, a ...any) { l.write("error", fmt.Sprintf(format, a...)) }
func (l *logger) warnf(format string, a ...any)  { l.write("warning", fmt.Sprintf(format, a...)) }

// exit logs err (if any) and returns the exit status it stands for.
func (l *logger) exit(err error) int {
	if err == nil {
		return 0
	}
	var ec *exitCode
	if errors.As(err, &ec) {
		if ec.err != nil {
			l.write("error", ec.err.Error())
		}
		return ec.code
	}
	l.write("error", err.Error())
	return exitRuntime
}

// idRe is what a container ID may be: it names a directory under --root.
var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func checkID(id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("container id %q: want 1-128 of [A-Za-z0-9_.-], not starting with a punctuation mark", id)
	}
	return nil
}

// oneID parses a command's flags and its single ID argument.
func oneID(fs *flag.FlagSet, args []string) (string, error) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return "", fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() != 1 {
		return "", fmt.Errorf("%s: want one container id, got %q", fs.Name(), fs.Args())
	}
	return fs.Arg(0), checkID(fs.Arg(0))
}

// qemuPath is --qemu or qemu-system-x86_64 from PATH.
func qemuPath(g globals) (string, error) {
	if g.qemu != "" {
		return g.qemu, nil
	}
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("qemu: %w (install qemu-system-x86 or give --qemu)", err)
	}
	return p, nil
}

// agentPath is --agent or airlock-guest beside this executable.
func agentPath(g globals) (string, error) {
	if g.agent != "" {
		return g.agent, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	return filepath.Join(filepath.Dir(self), "airlock-guest"), nil
}
