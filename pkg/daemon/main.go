package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/version"
)

// Flags are the command-line flags every service binary takes. Flags given
// override the config file.
type Flags struct {
	Config   string
	Listen   string
	DataDir  string
	LogLevel string
	// CheckConfig checks the config and exits, starting nothing.
	CheckConfig bool
}

// ServiceFlag is a string flag of one service's own, beyond those every
// service takes: the executor's --advertise. The service reads Value once
// Main has parsed the flags (in check or run).
type ServiceFlag struct {
	Name, Usage string
	Value       *string
}

// Check is a service's --check-config: its config package's Check, which
// loads path as a start would and reads every file it names (config.Check),
// returning the summary line or every problem.
type Check func(path string, override func(*config.Server)) (string, []error)

// Apply overrides s with the flags that were set.
func (f *Flags) Apply(s *config.Server) {
	if f.Listen != "" {
		s.Listen = f.Listen
	}
	if f.DataDir != "" {
		s.DataDir = f.DataDir
	}
	if f.LogLevel != "" {
		s.Log.Level = f.LogLevel
	}
}

// Main is the whole of a service's main: it parses flags, runs run under a
// context cancelled by SIGINT or SIGTERM, and exits 0 on a clean stop, 1 on
// failure and 2 on bad usage. With --check-config it runs check instead and
// exits 0 with the ok line on stdout, or 2 with one problem a line on stderr.
// own are the service's own flags.
func Main(name string, check Check, run func(ctx context.Context, f *Flags) error, own ...ServiceFlag) {
	os.Exit(main(name, os.Args[1:], os.Stdout, os.Stderr, check, run, own...))
}

func main(name string, args []string, stdout, stderr io.Writer, check Check, run func(ctx context.Context, f *Flags) error, own ...ServiceFlag) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f Flags
	var showVersion bool
	fs.StringVar(&f.Config, "config", "", "path to the "+name+" config file (required)")
	fs.StringVar(&f.Listen, "listen", "", "override the config's listen address (host:port)")
	fs.StringVar(&f.DataDir, "data-dir", "", "override the config's data directory")
	fs.StringVar(&f.LogLevel, "log-level", "", "override the config's log level (debug, info, warn, error)")
	fs.BoolVar(&showVersion, "version", false, "print the version and exit")
	for _, o := range own {
		fs.StringVar(o.Value, o.Name, "", o.Usage)
	}
	fs.BoolVar(&f.CheckConfig, "check-config", false, "check the config and every file it names as a start would, bind and write nothing, and exit (0 good, 2 not)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s --config FILE [flags]\n\nThe Airlock %s service.\n\nFlags:\n", name, name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if showVersion {
		fmt.Fprintf(stderr, "airlock %s %s\n", name, version.String())
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	if f.Config == "" {
		fmt.Fprintf(stderr, "%s: --config is required\n", name)
		return 2
	}
	if f.CheckConfig {
		return checkConfig(name, &f, stdout, stderr, check)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if dir := os.Getenv(CPUProfileDirEnv); dir != "" {
		end, err := startCPUProfile(filepath.Join(dir, name+".pprof"))
		if err != nil {
			fmt.Fprintf(stderr, "%s: %s: %v\n", name, CPUProfileDirEnv, err)
			return 1
		}
		defer end()
	}
	if err := run(ctx, &f); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// CPUProfileDirEnv names a directory where a service writes a CPU profile
// of its whole run (DIR/NAME.pprof, for go tool pprof) when it stops: for
// performance work on a running stack (docs/performance.md).
const CPUProfileDirEnv = "AIRLOCK_CPU_PROFILE_DIR"

// startCPUProfile profiles into a new file of its own in path's directory
// (O_EXCL: nothing planted there, a symlink included, is opened or
// truncated) and renames it to path when the returned function stops it.
func startCPUProfile(path string) (func(), error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err == nil {
			_ = os.Rename(f.Name(), path)
		}
	}, nil
}

func checkConfig(name string, f *Flags, stdout, stderr io.Writer, check Check) int {
	summary, problems := check(f.Config, f.Apply)
	if len(problems) > 0 {
		for _, err := range problems {
			fmt.Fprintf(stderr, "%s: config %s: %v\n", name, f.Config, err)
		}
		return 2
	}
	fmt.Fprintf(stdout, "ok: %s config %s\n%s\n", name, f.Config, summary)
	return 0
}
