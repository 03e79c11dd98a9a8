package dev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/test/gittest"
)

// TestMain lets the test binary be `airlock dev git-serve`, the real
// command: devGitStart starts its own executable with those arguments.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "dev" && os.Args[2] == "git-serve" {
		cmd := newDevGitServe(&cmdutil.Globals{})
		cmd.SetArgs(os.Args[3:])
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		if err := cmd.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, "airlock:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReservationHoldsPorts: a reserved port cannot be bound by anyone
// else until it is released, and then it can.
func TestReservationHoldsPorts(t *testing.T) {
	r, err := reserveAddresses([]string{"127.0.0.1", "127.0.0.1", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if len(r.addrs) != 3 || r.addrs[0] == r.addrs[1] || r.addrs[1] == r.addrs[2] || r.addrs[0] == r.addrs[2] {
		t.Fatalf("addresses %v, want three distinct", r.addrs)
	}
	for _, addr := range r.addrs {
		if l, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
			if l != nil {
				l.Close()
			}
			t.Fatalf("listen on held %s: %v, want address in use", addr, err)
		}
	}
	r.release(r.addrs[1])
	l, err := net.Listen("tcp", r.addrs[1])
	if err != nil {
		t.Fatalf("listen on released %s: %v", r.addrs[1], err)
	}
	l.Close()
	if l, err := net.Listen("tcp", r.addrs[2]); !errors.Is(err, syscall.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("listen on %s, still held: %v, want address in use", r.addrs[2], err)
	}
	r.close()
	for _, addr := range []string{r.addrs[0], r.addrs[2]} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s after close: %v", addr, err)
		}
		l.Close()
	}
}

// TestStartSaysItsPortWasTaken starts the real git server (the test binary
// as `airlock dev git-serve`) on a port another program holds: the start
// fails as a taken port, which dev up starts again for. A later start that
// fails for another reason is not called one, though the log still holds
// the earlier line; and on a port of its own the server starts.
func TestStartSaysItsPortWasTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	if _, err := pki.Init(pkiDir, devTrustDomain, nil); err != nil {
		t.Fatal(err)
	}
	src := gittest.Init(t, filepath.Join(dir, "src"))
	src.Write("README", "hello\n")
	src.Commit("first")
	repos := map[string]string{"demo": src.Dir}
	none, err := reserveAddresses(nil)
	if err != nil {
		t.Fatal(err)
	}

	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	git, err := devGitSetup(ctx, dir, pkiDir, other.Addr().String(), repos, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = devGitStart(ctx, dir, git.server, pkiDir, none)
	var se *startError
	if !errors.As(err, &se) || !se.portTaken || se.what != "the git server" || !strings.Contains(err.Error(), "exited during start-up") {
		t.Fatalf("start on a taken port: %#v (%v), want a start error with its port taken", err, err)
	}

	// A config the server refuses: it exits at start-up for that alone.
	if err := os.WriteFile(git.server.Config, []byte("version: 1\nnot_a_field: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = devGitStart(ctx, dir, git.server, pkiDir, none)
	if !errors.As(err, &se) || se.portTaken {
		t.Fatalf("start with a bad config: %#v (%v), want a start error with its port not taken", err, err)
	}
	if log, _ := os.ReadFile(git.server.Log); !strings.Contains(string(log), syscall.EADDRINUSE.Error()) {
		t.Fatalf("the log lost the first start's line, so the check above proves nothing:\n%s", log)
	}

	r, err := reserveAddresses([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if git, err = devGitSetup(ctx, dir, pkiDir, r.addrs[0], repos, io.Discard); err != nil {
		t.Fatal(err)
	}
	defer stopProcess(dir, devGitName, 5*time.Second)
	if err := devGitStart(ctx, dir, git.server, pkiDir, r); err != nil {
		t.Fatalf("start on its reserved port: %v", err)
	}
	if git.server.Status != "SERVING" {
		t.Errorf("status %q, want SERVING", git.server.Status)
	}
}

// TestStartRetrying: dev up starts again, after stopping what started,
// only for a process that lost its port, at most devStartAttempts times in
// all, and not once its time is up.
func TestStartRetrying(t *testing.T) {
	taken := &startError{msg: "publisher exited during start-up", what: "publisher", portTaken: true}
	other := &startError{msg: "publisher exited during start-up", what: "publisher"}
	bad := errors.New("config: bad")
	for _, tc := range []struct {
		name      string
		fails     []error
		ctxDone   bool
		wantErr   error
		wantStart int
	}{
		{"first start", nil, false, nil, 1},
		{"taken once", []error{taken}, false, nil, 2},
		{"taken every time", []error{taken, taken, taken, taken}, false, taken, devStartAttempts},
		{"another exit", []error{other, taken}, false, other, 1},
		{"not a start error", []error{bad, taken}, false, bad, 1},
		{"taken with the time up", []error{taken}, true, taken, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.ctxDone {
				cancel()
			}
			var starts, stops int
			var progress strings.Builder
			_, err := startRetrying(ctx, &progress, func(attempt int) (devStack, error) {
				starts++
				if attempt != starts {
					t.Errorf("start %d is told it is attempt %d", starts, attempt)
				}
				if starts <= len(tc.fails) {
					return devStack{}, tc.fails[starts-1]
				}
				return devStack{}, nil
			}, func() { stops++ })
			if err != tc.wantErr {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if starts != tc.wantStart {
				t.Errorf("%d starts, want %d", starts, tc.wantStart)
			}
			wantStops := starts
			if err == nil {
				wantStops--
			}
			if stops != wantStops {
				t.Errorf("%d stops, want %d (one after each failed start)", stops, wantStops)
			}
			if again := strings.Count(progress.String(), "starting the stack again on new ports"); again != starts-1 {
				t.Errorf("progress says %d restarts, want %d:\n%s", again, starts-1, progress.String())
			}
		})
	}
}

// TestAwaitStartSaysWhatItSawLast: out of time, the error says the last
// thing the process answered, not the cut-off attempt's deadline; an exit
// seen when the time is up is reported as the exit.
func TestAwaitStartSaysWhatItSawLast(t *testing.T) {
	s := devPaths(t.TempDir(), "authority")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	n := 0
	err := awaitStart(ctx, "authority", &s, make(chan error), func(actx context.Context) (bool, string) {
		if n++; n == 1 {
			return false, "NOT_SERVING"
		}
		<-actx.Done()
		return false, actx.Err().Error()
	})
	if err == nil || !strings.Contains(err.Error(), "authority was not ready in time (last: NOT_SERVING)") {
		t.Fatalf("err = %v, want it to say the last answer, NOT_SERVING", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	exited := make(chan error, 1)
	err = awaitStart(ctx, "authority", &s, exited, func(actx context.Context) (bool, string) {
		<-actx.Done()
		exited <- errors.New("exit status 1")
		return false, actx.Err().Error()
	})
	var se *startError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "authority exited during start-up (exit status 1)") {
		t.Fatalf("err = %v, want the exit", err)
	}
}
