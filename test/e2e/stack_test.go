//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// trustDomain is the one `airlock dev up` uses.
const trustDomain = "airlock.local"

// commandTimeout bounds every command a test runs, so a hung binary fails
// the test instead of stalling it.
const commandTimeout = 60 * time.Second

// stopTimeout is how long a service may take to exit after SIGTERM. Its
// graceful stop has nothing in flight to wait for.
const stopTimeout = 5 * time.Second

// devService is one entry of `airlock dev up|down -o json`.
type devService struct {
	Name    string `json:"service"`
	Address string `json:"address"`
	PID     int    `json:"pid"`
	Config  string `json:"config"`
	Log     string `json:"log"`
	DataDir string `json:"data_dir"`
	Status  string `json:"status"`
}

// devReport is the whole output of `airlock dev up|down -o json`.
type devReport struct {
	Dir          string       `json:"dir"`
	ClientConfig string       `json:"client_config"`
	Services     []devService `json:"services"`
	// Git is the stack's git server, and Repositories the URL of each
	// repository it serves, when dev up was given --repo.
	Git          *devService       `json:"git"`
	Repositories map[string]string `json:"repositories"`
}

// byName indexes the report's services and fails on a duplicate or a
// missing one, so later lookups cannot silently get a zero entry.
func (r devReport) byName(t testing.TB) map[string]devService {
	t.Helper()
	out := map[string]devService{}
	for _, s := range r.Services {
		if _, dup := out[s.Name]; dup {
			t.Fatalf("service %q listed twice: %+v", s.Name, r.Services)
		}
		out[s.Name] = s
	}
	for _, name := range identity.ServiceNames() {
		if _, ok := out[name]; !ok {
			t.Fatalf("service %q missing from %+v", name, r.Services)
		}
	}
	if len(out) != len(identity.ServiceNames()) {
		t.Fatalf("got services %+v, want exactly %v", r.Services, identity.ServiceNames())
	}
	return out
}

// stack is a running `airlock dev up` stack.
type stack struct {
	dir          string
	pkiDir       string
	clientConfig string
	services     map[string]devService
	git          *devService
	repos        map[string]string
	// procs holds, by pid, each service a test started (startService):
	// this process waits for those itself.
	procs map[int]*serviceProc
}

// startStack runs `airlock dev up` in a fresh directory and registers `dev
// down` (and the reaping of every service) as cleanup, whatever happens.
// startStack runs dev up with any extra arguments (e.g. --repo NAME=PATH).
func startStack(t testing.TB, args ...string) *stack {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "stack")
	var started []proc
	t.Cleanup(func() { stopStack(t, dir, started) })

	up := []string{"dev", "up", "--dir", dir, "--bin-dir", binDir, "-o", "json"}
	if os.Getenv("AIRLOCK_CGROUP2VM") != "" {
		// make test-cgroup2's machine emulates its CPU: the first
		// executor's runsc self-check alone can take longer than dev
		// up's default 30s there.
		up = append(up, "--timeout", "2m")
	}
	res := runCommand(t, nil, bin("airlock"), append(up, args...)...)
	var rep devReport
	jsonErr := json.Unmarshal([]byte(res.stdout), &rep)
	for _, s := range rep.Services {
		started = append(started, proc{pid: s.PID, start: procStart(s.PID)})
	}
	if rep.Git != nil {
		started = append(started, proc{pid: rep.Git.PID, start: procStart(rep.Git.PID)})
	}
	if res.code != 0 || jsonErr != nil {
		t.Fatalf("airlock dev up: exit %d, json: %v\nstdout:\n%s\nstderr:\n%s", res.code, jsonErr, res.stdout, res.stderr)
	}
	s := &stack{dir: rep.Dir, pkiDir: filepath.Join(rep.Dir, "pki"), clientConfig: rep.ClientConfig, services: rep.byName(t), git: rep.Git, repos: rep.Repositories}
	if s.dir != dir {
		t.Fatalf("dev up reports dir %q, want %q", s.dir, dir)
	}
	if want := filepath.Join(dir, "client.yaml"); s.clientConfig != want {
		t.Fatalf("dev up reports client_config %q, want %q", s.clientConfig, want)
	}
	for name, svc := range s.services {
		if svc.Status != "SERVING" || svc.PID <= 0 || svc.Address == "" {
			t.Fatalf("dev up: %s is %+v, want SERVING with a pid and an address", name, svc)
		}
	}
	for _, p := range started {
		if _, err := strconv.ParseUint(p.start, 10, 64); err != nil {
			t.Fatalf("dev up: pid %d has no readable start time (%q): not a live process", p.pid, p.start)
		}
	}
	return s
}

// stopStack runs `airlock dev down` and reaps the stack's services that
// the test has not reaped itself, so no test leaves a process or a zombie
// behind.
func stopStack(t testing.TB, dir string, procs []proc) {
	t.Helper()
	res := runCommand(t, nil, bin("airlock"), "dev", "down", "--dir", dir, "-o", "json")
	if res.code != 0 {
		t.Errorf("cleanup: airlock dev down: exit %d\n%s", res.code, res.stderr)
	}
	for _, p := range procs {
		// A pid already reaped may since belong to another test's process.
		if p.pid <= 0 || p.start == "" || procStart(p.pid) != p.start {
			continue
		}
		if _, err := reap(p.pid, stopTimeout); err != nil && !errors.Is(err, unix.ECHILD) {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// proc names one process: its pid and its start time, which together are
// never reused.
type proc struct {
	pid   int
	start string
}

// source returns the TLS source of a dev identity such as "client/dev".
func (s *stack) source(t testing.TB, as string) *tlsconfig.Source {
	t.Helper()
	id, err := identity.Parse("spiffe://" + trustDomain + "/" + as)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := pki.Paths(s.pkiDir, id)
	src, err := tlsconfig.NewFileSource(pki.CAPath(s.pkiDir), cert, key)
	if err != nil {
		t.Fatalf("identity %s: %v", as, err)
	}
	return src
}

// dial connects to service over mTLS as the dev identity as (KIND/NAME),
// pinning the service's SPIFFE ID, exactly as Airlock's own clients do.
func (s *stack) dial(t testing.TB, as, service string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return s.dialWith(t, s.source(t, as), service, opts...)
}

func (s *stack) dialWith(t testing.TB, src *tlsconfig.Source, service string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	svc, ok := s.services[service]
	if !ok {
		t.Fatalf("no service %q in the stack", service)
	}
	cc, err := grpcclient.Dial(svc.Address, src, identity.Service(trustDomain, service), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// env is the environment for CLI commands that act on this stack.
func (s *stack) env() []string { return []string{clientconfig.EnvVar + "=" + s.clientConfig} }

// result is what a finished command left behind.
type result struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration
}

// runCommand runs a binary to completion with extra environment variables.
// A command that cannot start or outlives commandTimeout fails the test.
func runCommand(t testing.TB, env []string, name string, args ...string) result {
	t.Helper()
	return runCommandWithin(t, commandTimeout, env, name, args...)
}

// runCommandWithin is runCommand bounded by timeout instead: for a command
// that waits on an emulated virtual machine.
func runCommandWithin(t testing.TB, timeout time.Duration, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s %s: did not finish within %v\nstderr:\n%s", filepath.Base(name), strings.Join(args, " "), timeout, res.stderr)
	case errors.As(err, &exitErr):
		res.code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
	return res
}

// reap waits up to timeout for pid, a child of this process (directly or
// by inheritance as subreaper), to exit, and reaps it. An error wrapping
// unix.ECHILD means pid is not (or no longer) our child.
func reap(pid int, timeout time.Duration) (unix.WaitStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return ws, fmt.Errorf("wait for pid %d: %w", pid, err)
		case got == pid:
			return ws, nil
		}
		if time.Now().After(deadline) {
			return ws, fmt.Errorf("pid %d (%s) still running %v after it was told to stop", pid, procState(pid), timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reapClean reaps pid and fails the test unless it exited by itself with
// status 0, which for an Airlock service means a clean, graceful stop.
func reapClean(t testing.TB, pid int, what string) {
	t.Helper()
	ws, err := reap(pid, stopTimeout)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("%s (pid %d): exited=%v status=%d signaled=%v signal=%v, want a clean exit 0",
			what, pid, ws.Exited(), ws.ExitStatus(), ws.Signaled(), ws.Signal())
	}
	if st := procState(pid); st != "" {
		t.Errorf("%s (pid %d): still in the process table after being reaped (state %s)", what, pid, st)
	}
}

// procState returns the one-letter state of pid ("R", "S", "Z", ...) or ""
// if there is no such process.
func procState(pid int) string { return procStat(pid, 3) }

// procStart returns the start time of pid, in clock ticks after boot, or
// "" if there is no such process. A zombie keeps it until reaped.
func procStart(pid int) string { return procStat(pid, 22) }

// procStat returns field n (numbered from 1, as in proc(5)) of
// /proc/PID/stat, for n >= 3, or "" if there is no such process.
func procStat(pid, n int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The fields from the state on follow the parenthesised command name,
	// which may hold spaces.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return "?"
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) <= n-3 {
		return "?"
	}
	return fields[n-3]
}

// logLines returns the JSON lines of a service log, failing on any line
// that is not JSON: a panic or a stray print would show up that way.
func logLines(t testing.TB, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for i, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s line %d is not a JSON log record (%v): %q", path, i+1, err, line)
		}
		out = append(out, m)
	}
	return out
}

// checkStoppedLog fails unless the last line of a service log is its clean
// "stopped" record, with no error.
func checkStoppedLog(t testing.TB, service, path string) {
	t.Helper()
	lines := logLines(t, path)
	last := lines[len(lines)-1]
	if last["msg"] != "stopped" || last["service"] != service || last["level"] != "INFO" {
		t.Errorf("%s: last log line is %v, want an INFO \"stopped\" record of %s", path, last, service)
	}
	if v, ok := last["error"]; !ok || v != nil {
		t.Errorf("%s: last log line has error=%v (present %v), want error=null", path, v, ok)
	}
}

// countMsg counts the log records with the given msg.
func countMsg(lines []map[string]any, msg string) int {
	n := 0
	for _, l := range lines {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}
