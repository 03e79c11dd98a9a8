package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/executor/internal/vm/kernel"
	"github.com/airlockhq/airlock/services/executor/internal/vm/qemu"
)

// maxProcessJSON bounds exec's --process file.
const maxProcessJSON = 4 << 20

func cmdExec(g globals, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	procFile := fs.String("process", "", "an OCI process JSON file")
	pidFile := fs.String("pid-file", "", "written with this CLI's pid once the command runs")
	ipidFile := fs.String("internal-pid-file", "", "written with the command's guest pid (its pgid)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	data, err := readSmall(*procFile, maxProcessJSON)
	if err != nil {
		return fmt.Errorf("exec --process: %w", err)
	}
	var sp specs.Process
	if err := json.Unmarshal(data, &sp); err != nil {
		return fmt.Errorf("exec --process: %w", err)
	}
	p, err := processOf(&sp)
	if err != nil {
		return err
	}
	c, br, rep, err := call(g, id, ctlRequest{Op: "exec", Process: &p}, os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	if *ipidFile != "" {
		if err := atomicfile.Write(*ipidFile, []byte(strconv.Itoa(rep.Pid)), 0o644, atomicfile.Fast); err != nil {
			return fmt.Errorf("internal pid file: %w", err)
		}
	}
	if *pidFile != "" {
		if err := atomicfile.Write(*pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644, atomicfile.Fast); err != nil {
			return fmt.Errorf("pid file: %w", err)
		}
	}
	// Signals to this CLI go to the command's process group, as runc
	// forwards them to its exec.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT)
	defer signal.Stop(sigc)
	go func() {
		for s := range sigc {
			b, _ := json.Marshal(ctlRequest{Op: "kill", Signal: int(s.(unix.Signal))})
			c.Write(append(b, '\n'))
		}
	}()
	rep, err = readReply(br)
	if err != nil {
		return err
	}
	if rep.Error != "" || rep.Exit == nil {
		return fmt.Errorf("exec: %s", rep.Error)
	}
	return &exitCode{code: rep.Exit.Code}
}

func cmdKill(g globals, args []string) error {
	fs := flag.NewFlagSet("kill", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pgid := fs.Int("pgid", 0, "signal this process group in the guest instead of the job")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("kill: want ID and SIGNAL, got %q", fs.Args())
	}
	id := fs.Arg(0)
	if err := checkID(id); err != nil {
		return err
	}
	sig, err := parseSignal(fs.Arg(1))
	if err != nil {
		return err
	}
	if *pgid < 0 {
		return fmt.Errorf("kill --pgid %d: negative", *pgid)
	}
	c, _, _, err := call(g, id, ctlRequest{Op: "kill", Pgid: *pgid, Signal: int(sig)})
	var down *notRunning
	if errors.As(err, &down) && sig == unix.SIGKILL && *pgid == 0 {
		// The run is gone or not up: SIGKILL of the job still ends the
		// machine, as runc's kill of a container's init ends it.
		if r, lerr := stateDir(g.root + "/" + id).load(); lerr == nil {
			return killWait(5*time.Second, r.QEMU)
		}
	}
	if err != nil {
		return err
	}
	return c.Close()
}

// parseSignal reads a signal as runc does: a number, KILL or SIGKILL.
func parseSignal(s string) (unix.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %d: out of range", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("signal %q: unknown", s)
}

func cmdDelete(g globals, args []string) error {
	fs := flag.NewFlagSet("delete", flag.ContinueOnError)
	fs.Bool("force", false, "kill the machine if it runs")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	st := stateDir(g.root + "/" + id)
	if _, err := os.Stat(string(st)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	r, err := st.load()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// QEMU first, so the run sees its machine end, then the run itself.
	if err := killWait(5*time.Second, r.QEMU, r.CLI); err != nil {
		errs = append(errs, err)
	}
	if r.Netns != "" {
		if err := qemu.Disconnect(r.Netns); err != nil {
			errs = append(errs, err)
		}
	}
	if len(r.Cgroups) > 0 {
		if err := qemu.RemoveCgroup(r.Cgroups); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(string(st)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func cmdKernel(args []string, stdout io.Writer) error {
	if len(args) != 1 || args[0] != "fetch" {
		return fmt.Errorf("kernel: want `kernel fetch`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, err := kernel.Fetch(ctx, kernel.Base())
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, k.Dir)
	return nil
}

// printVersion prints the --version lines; every part must be found.
func printVersion(g globals, w io.Writer) error {
	qpath, apath, k, err := machineParts(g)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, qpath, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", qpath, err)
	}
	qv, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	sum, err := fileDigest(apath)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	accel := "accel kvm"
	switch g.accel {
	case "tcg":
		accel = "accel tcg (emulated)"
	case "kvm":
	default:
		return fmt.Errorf("--accel %q: want kvm or tcg", g.accel)
	}
	fmt.Fprintf(w, "airlock-vm %s\nqemu %s\nkernel %s\nagent %s\n%s\n", version.String(), qv, k, sum, accel)
	return nil
}
