//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// statusReport is the output of `airlock status -o json`.
type statusReport struct {
	Services []struct {
		Service string `json:"service"`
		Address string `json:"address"`
		Status  string `json:"status"`
		Error   string `json:"error"`
		Cgroups *struct {
			Mode        string   `json:"mode"`
			Controllers []string `json:"controllers"`
		} `json:"cgroups"`
	} `json:"services"`
}

// hostCgroupMode is "v2" where /sys/fs/cgroup is the unified hierarchy.
func hostCgroupMode(*testing.T) string {
	if cgroupV2() {
		return "v2"
	}
	return "v1"
}

func TestDevUpDown(t *testing.T) {
	t.Parallel()
	s := startStack(t)

	seen := map[int]string{}
	for _, name := range identity.ServiceNames() {
		svc := s.services[name]
		if other, dup := seen[svc.PID]; dup {
			t.Fatalf("%s and %s share pid %d; want three separate processes", name, other, svc.PID)
		}
		seen[svc.PID] = name
		checkServiceProcess(t, s, svc)
	}

	t.Run("status reports SERVING", func(t *testing.T) {
		res := runCommand(t, s.env(), bin("airlock"), "status", "-o", "json")
		if res.code != 0 {
			t.Fatalf("airlock status: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		report := parseStatus(t, res.stdout)
		for _, h := range report.Services {
			want := s.services[h.Service]
			if h.Status != "SERVING" || h.Error != "" || h.Address != want.Address {
				t.Errorf("status of %s: %+v, want SERVING at %s with no error", h.Service, h, want.Address)
			}
			// The executor says how it uses cgroups.
			if h.Service != identity.ServiceExecutor {
				continue
			}
			if h.Cgroups == nil || h.Cgroups.Mode != hostCgroupMode(t) {
				t.Errorf("executor cgroups %+v, want mode %s", h.Cgroups, hostCgroupMode(t))
			} else {
				for _, ctl := range []string{"memory", "pids", "cpu"} {
					if !slices.Contains(h.Cgroups.Controllers, ctl) {
						t.Errorf("executor cgroup controllers %v lack %s", h.Cgroups.Controllers, ctl)
					}
				}
			}
		}
		text := runCommand(t, s.env(), bin("airlock"), "status")
		if want := "executor cgroup " + hostCgroupMode(t); !strings.Contains(text.stdout, want) {
			t.Errorf("airlock status does not say %q:\n%s", want, text.stdout)
		}
	})

	t.Run("second up refused while running", func(t *testing.T) {
		caBefore, err := os.ReadFile(pki.CAPath(s.pkiDir))
		if err != nil {
			t.Fatal(err)
		}
		res := runCommand(t, nil, bin("airlock"), "dev", "up", "--dir", s.dir, "--bin-dir", binDir, "-o", "json")
		if res.code != 1 {
			t.Errorf("second dev up: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		auth := s.services[identity.ServiceAuthority]
		wantMsg := fmt.Sprintf("authority is already running in %s (pid %d); run `airlock dev down --dir %s` first", s.dir, auth.PID, s.dir)
		if !strings.Contains(res.stderr, wantMsg) {
			t.Errorf("second dev up: stderr %q, want it to contain %q", res.stderr, wantMsg)
		}
		if strings.TrimSpace(res.stdout) != "" {
			t.Errorf("second dev up printed a result although it failed: %q", res.stdout)
		}
		// The refusal must come before anything is touched: a fresh PKI
		// would strand the running services' peers.
		caAfter, err := os.ReadFile(pki.CAPath(s.pkiDir))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(caBefore, caAfter) {
			t.Error("second dev up replaced the running stack's CA")
		}
		for _, name := range identity.ServiceNames() {
			checkServiceProcess(t, s, s.services[name])
		}
	})

	t.Run("down stops each gracefully", func(t *testing.T) {
		res := runCommand(t, nil, bin("airlock"), "dev", "down", "--dir", s.dir, "-o", "json")
		if res.code != 0 {
			t.Fatalf("dev down: exit %d\nstderr:\n%s", res.code, res.stderr)
		}
		var down devReport
		if err := json.Unmarshal([]byte(res.stdout), &down); err != nil {
			t.Fatalf("dev down: %v\n%s", err, res.stdout)
		}
		got := down.byName(t)
		for _, name := range identity.ServiceNames() {
			want := s.services[name]
			if got[name].Status != "stopped" || got[name].PID != want.PID {
				t.Errorf("dev down: %s is %+v, want status \"stopped\" for pid %d", name, got[name], want.PID)
			}
			reapClean(t, want.PID, name)
			checkStoppedLog(t, name, want.Log)
			if _, err := os.Stat(filepath.Join(s.dir, name, name+".pid")); !os.IsNotExist(err) {
				t.Errorf("%s: pid file still there after dev down (stat: %v)", name, err)
			}
		}
	})

	t.Run("status fails when stopped", func(t *testing.T) {
		res := runCommand(t, s.env(), bin("airlock"), "status", "-o", "json", "--timeout", "2s")
		if res.code != 1 {
			t.Errorf("airlock status after down: exit %d, want 1\nstderr:\n%s", res.code, res.stderr)
		}
		if want := "airlock: authority is UNREACHABLE"; !strings.Contains(res.stderr, want) {
			t.Errorf("airlock status after down: stderr %q, want it to contain %q", res.stderr, want)
		}
		for _, h := range parseStatus(t, res.stdout).Services {
			if h.Status != "UNREACHABLE" || !strings.Contains(h.Error, "connection refused") {
				t.Errorf("status of %s after down: %+v, want UNREACHABLE with connection refused", h.Service, h)
			}
		}
	})
}

func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	for _, victim := range identity.ServiceNames() {
		t.Run(victim, func(t *testing.T) {
			t.Parallel()
			s := startStack(t)
			svc := s.services[victim]

			start := time.Now()
			if err := syscall.Kill(svc.PID, syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM %s (pid %d): %v", victim, svc.PID, err)
			}
			reapClean(t, svc.PID, victim)
			if took := time.Since(start); took > stopTimeout {
				t.Errorf("%s took %v to stop after SIGTERM, want under %v", victim, took, stopTimeout)
			}
			checkStoppedLog(t, victim, svc.Log)
			if n := countMsg(logLines(t, svc.Log), "stopped"); n != 1 {
				t.Errorf("%s logged \"stopped\" %d times, want once", victim, n)
			}

			// The rest of the stack must not have gone down with it.
			for _, name := range identity.ServiceNames() {
				if name != victim {
					checkServiceProcess(t, s, s.services[name])
				}
			}

			res := runCommand(t, nil, bin("airlock"), "dev", "down", "--dir", s.dir, "-o", "json")
			if res.code != 0 {
				t.Fatalf("dev down: exit %d\nstderr:\n%s", res.code, res.stderr)
			}
			var down devReport
			if err := json.Unmarshal([]byte(res.stdout), &down); err != nil {
				t.Fatalf("dev down: %v\n%s", err, res.stdout)
			}
			for name, got := range down.byName(t) {
				want := "stopped"
				if name == victim {
					want = "not running"
				}
				if got.Status != want {
					t.Errorf("dev down: %s is %q, want %q", name, got.Status, want)
				}
				if name != victim {
					reapClean(t, s.services[name].PID, name)
					checkStoppedLog(t, name, s.services[name].Log)
				}
			}
		})
	}
}

// checkServiceProcess fails unless svc is a live process of its own: the
// service's binary, run with its config, alive (not a zombie), in its own
// session, and recorded in its pid file.
func checkServiceProcess(t *testing.T, s *stack, svc devService) {
	t.Helper()
	pid := svc.PID
	if pid == os.Getpid() {
		t.Fatalf("%s has the test's own pid", svc.Name)
	}
	if st := procState(pid); st == "" || st == "Z" || st == "X" {
		t.Fatalf("%s (pid %d): state %q, want a live process", svc.Name, pid, st)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatalf("%s (pid %d): %v", svc.Name, pid, err)
	}
	if exe != bin(svc.Name) {
		t.Errorf("%s (pid %d) runs %s, want %s", svc.Name, pid, exe, bin(svc.Name))
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if want := []string{bin(svc.Name), "--config", svc.Config}; !slices.Equal(args, want) {
		t.Errorf("%s (pid %d): command line %q, want %q", svc.Name, pid, args, want)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("%s (pid %d): session %d (%v), want its own session", svc.Name, pid, sid, err)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, svc.Name, svc.Name+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := strconv.Atoi(strings.TrimSpace(string(data))); err != nil || got != pid {
		t.Errorf("%s: pid file holds %q, want %d", svc.Name, data, pid)
	}
}

// parseStatus parses `airlock status -o json` and checks it covers the
// three services exactly once each.
func parseStatus(t *testing.T, stdout string) statusReport {
	t.Helper()
	var r statusReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("airlock status: %v\n%s", err, stdout)
	}
	var names []string
	for _, h := range r.Services {
		names = append(names, h.Service)
	}
	if !slices.Equal(names, identity.ServiceNames()) {
		t.Fatalf("airlock status lists %v, want %v", names, identity.ServiceNames())
	}
	return r
}

// dev up --sandbox-path sets the PATH every job starts with (a Go kept in
// /usr/local/go runs by name); a PATH that would search /work is refused
// before anything is made.
func TestDevUpSandboxPath(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "stack")
	res := runCommand(t, nil, bin("airlock"), "dev", "up", "--dir", dir, "--bin-dir", binDir, "--sandbox-path", "/usr/local/go/bin::/usr/bin")
	if res.code != 2 || !strings.Contains(res.stderr, "--sandbox-path: entry 2 is empty") {
		t.Fatalf("dev up with an empty PATH entry: exit %d, want 2 naming the flag\nstderr:\n%s", res.code, res.stderr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a refused dev up made %s (%v)", dir, err)
	}

	repo, _ := sampleRepo(t)
	const path = "/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin"
	s := startStack(t, "--repo", "sample="+repo, "--sandbox-path", path)
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "--", "sh", "-c", `echo "PATH=$PATH"; command -v go`)
	if res.code != 0 || !strings.Contains(res.stdout, "PATH="+path+"\n") || !strings.Contains(res.stdout, "/usr/local/go/bin/go") {
		t.Fatalf("job: exit %d, want PATH=%s and go found in /usr/local/go/bin\nstdout:\n%s\nstderr:\n%s", res.code, path, res.stdout, res.stderr)
	}
}
