package storetest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// crashEnv carries the child's database target; its presence is what makes
// a re-run test binary the crash test's child.
const crashEnv = "AIRLOCK_STORETEST_CRASH_TARGET"

// crashJob is the job the child's audited updates change.
const crashJob = "crash-job"

// CrashTest configures Crash.
type CrashTest struct {
	// Name is the top-level test function that calls Crash: the child is
	// the test binary re-run with -test.run=^Name$, and that function must
	// call CrashChild before anything else.
	Name string
	// Open opens a store on target.
	Open func(ctx context.Context, target string) (store.Store, error)
	// Target is the database the parent opens; ChildTarget, if set, is
	// the same database as the child should name it (say, a PostgreSQL
	// DSN with an application_name Settle can find).
	Target, ChildTarget string
	// Iterations is how many children are killed.
	Iterations int
	// MaxDelay bounds the random time between the child's first reported
	// commit and its SIGKILL.
	MaxDelay time.Duration
	// Settle, if set, runs after each kill and before the log is read,
	// until the database has let go of the dead child's session.
	Settle func(t *testing.T)
}

// Crash runs a child process that appends audit events and makes audited
// job updates, alternately, in a tight loop, reporting each commit on a
// pipe, and SIGKILLs it at a random moment; Iterations times. After each
// kill it reopens the store and checks that the chain verifies from the
// genesis hash; that the log holds exactly the entries the child reported
// committed, or one more (committed, killed before it could say so), so no
// committed entry is lost; and that each audited update and its event were
// kept together: the job's version counts its update events and its
// message is what the last one recorded.
func Crash(t *testing.T, c CrashTest) {
	if os.Getenv(crashEnv) != "" {
		t.Fatal("the crash test's child got past CrashChild")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(ctx(t), c.Target)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, NewJob("dev", crashJob, 0))
	s.Close()

	childTarget := c.ChildTarget
	if childTarget == "" {
		childTarget = c.Target
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	have, lostRaces := 0, 0
	for i := range c.Iterations {
		reported, err := runAndKill(exe, c.Name, childTarget, time.Duration(rng.Int64N(int64(c.MaxDelay)+1)))
		if err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		if c.Settle != nil {
			c.Settle(t)
		}
		n, err := checkAfterCrash(t, c, have, reported)
		if err != nil {
			t.Fatalf("after kill %d (child reported %d commits, log held %d before): %v", i, len(reported), have, err)
		}
		if n == have+len(reported)+1 {
			lostRaces++
		}
		have = n
	}
	t.Logf("%d kills, %d entries; %d times the child was killed between a commit and its report", c.Iterations, have, lostRaces)
}

// runAndKill starts the child, waits for its first commit, lets it run for
// delay, kills it and returns the commits it reported.
func runAndKill(exe, name, target string, delay time.Duration) ([]string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+target)
	cmd.ExtraFiles = []*os.File{w}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	w.Close()
	lines := make(chan string, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var reported []string
	select {
	case l, ok := <-lines:
		if !ok {
			cmd.Wait()
			return nil, fmt.Errorf("child ended before its first commit: %s", stderr.String())
		}
		reported = append(reported, l)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("child made no commit in 30s: %s", stderr.String())
	}
	time.Sleep(delay)
	if err := cmd.Process.Kill(); err != nil {
		return nil, err
	}
	cmd.Wait()
	// The pipe's only writer is dead: read what it said to the end.
	for l := range lines {
		reported = append(reported, l)
	}
	return reported, nil
}

func checkAfterCrash(t *testing.T, c CrashTest, have int, reported []string) (int, error) {
	s, err := c.Open(ctx(t), c.Target)
	if err != nil {
		return 0, fmt.Errorf("reopen: %w", err)
	}
	defer s.Close()
	events := VerifyAudit(t, s)
	n := len(events)
	if n != have+len(reported) && n != have+len(reported)+1 {
		return n, fmt.Errorf("log holds %d entries, want %d or %d", n, have+len(reported), have+len(reported)+1)
	}
	job, err := s.GetJob(ctx(t), crashJob)
	if err != nil {
		return n, err
	}
	for _, l := range reported {
		kind, v, _ := strings.Cut(l, " ")
		num, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return n, fmt.Errorf("child said %q", l)
		}
		switch {
		case kind == "a" && (num > int64(n) || events[num-1].Kind != "crash.append"):
			return n, fmt.Errorf("committed entry %d is missing", num)
		case kind == "u" && num > job.Version:
			return n, fmt.Errorf("committed job version %d is missing (have %d)", num, job.Version)
		}
	}
	var updates []audit.Event
	for _, e := range events {
		if e.Kind == "crash.update" {
			updates = append(updates, e)
		}
	}
	if int64(len(updates)) != job.Version-1 {
		return n, fmt.Errorf("job at version %d but %d update events: a job change and its event were split", job.Version, len(updates))
	}
	if len(updates) > 0 && job.Message != updates[len(updates)-1].Reason {
		return n, fmt.Errorf("job message %q, last update event %q", job.Message, updates[len(updates)-1].Reason)
	}
	return n, nil
}

// CrashChild returns at once unless this process is the child of a crash
// test, which it then is: it appends and updates until killed, saying on
// file descriptor 3 what has committed, and never returns. The test
// function named in CrashTest.Name calls it first, before it sets up
// anything a child should not (say, a database of its own).
func CrashChild(open func(ctx context.Context, target string) (store.Store, error)) {
	target := os.Getenv(crashEnv)
	if target == "" {
		return
	}
	ctx := context.Background()
	out := os.NewFile(3, "committed")
	s, err := open(ctx, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	// Bounded, in case the parent dies without killing the child (a write
	// to the closed pipe also ends it).
	deadline := time.Now().Add(time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		var line string
		if i%2 == 0 {
			e, err := s.AppendAudit(ctx, audit.Event{Kind: "crash.append", Reason: strconv.Itoa(i)})
			if err != nil {
				fmt.Fprintln(os.Stderr, "append:", err)
				os.Exit(3)
			}
			line = fmt.Sprintf("a %d\n", e.Sequence)
		} else {
			j, err := s.UpdateJobAudited(ctx, crashJob, func(j *store.Job) (audit.Event, error) {
				j.Message = strconv.Itoa(i)
				return audit.Event{Kind: "crash.update", Reason: j.Message}, nil
			})
			if err != nil {
				fmt.Fprintln(os.Stderr, "update:", err)
				os.Exit(3)
			}
			line = fmt.Sprintf("u %d\n", j.Version)
		}
		if _, err := io.WriteString(out, line); err != nil {
			os.Exit(0)
		}
	}
	os.Exit(0)
}
