//go:build linux

package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/test/pgtest"

	// The SQLite driver, registered as "sqlite", to read the publisher's store.
	_ "modernc.org/sqlite"
)

// Sizes of the publisher crash test, for each store: how many approved
// results the pipelines publish, how many pipelines publish at once, how
// many times the publisher is killed while they do, the window after a
// restart in which a random kill lands, and how long an aimed kill waits
// for the log line it follows.
const (
	publishCrashResults  = 36
	publishCrashInFlight = 4
	publishCrashKills    = 110
	publishCrashMaxDelay = 150 * time.Millisecond
	publishCrashAimWait  = 300 * time.Millisecond
	// publishCrashDrain bounds how long the pipelines may take to finish
	// once the kills stop: a publisher that resumes its work at its start
	// needs seconds.
	publishCrashDrain = 30 * time.Second
)

// The publisher's log messages the test aims kills at and counts.
const (
	msgAccepted  = "deployment accepted"
	msgConsumed  = "approval consumed"
	msgPushed    = "commit pushed"
	msgSucceeded = "deployment succeeded"
	msgLanded    = "the approval's commit is already on the branch"
	msgRefused   = "publish refused"
	msgPaused    = "publish paused; it is retried"
)

// The publisher's steps, in order, as its log and its deployments name them.
var publishSteps = []string{"accepted", "verified", "validated", "prepared", "consumed", "leased", "pushed", "revoked"}

// reapOrphans waits for and reaps the processes left in the process
// groups of killed services (named by their leaders' pids): children
// they started, reparented to this process, the subreaper. It returns
// how many it reaped.
func reapOrphans(t *testing.T, groups map[int]bool) int {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	reaped := 0
	for deadline := time.Now().Add(stopTimeout); ; time.Sleep(20 * time.Millisecond) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		var running []string
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || procStat(pid, 4) != self {
				continue
			}
			if pgrp, _ := strconv.Atoi(procStat(pid, 5)); !groups[pgrp] {
				continue
			}
			if procState(pid) != "Z" {
				running = append(running, e.Name())
				continue
			}
			if _, err := reap(pid, stopTimeout); err != nil {
				t.Errorf("reap a process left by a killed publisher: %v", err)
				continue
			}
			reaped++
		}
		if len(running) == 0 {
			return reaped
		}
		if time.Now().After(deadline) {
			t.Errorf("processes %v left by killed publishers still run %v after the last kill", running, stopTimeout)
			return reaped
		}
	}
}

// lockHolders describes the processes with path open, for a failure
// message.
func lockHolders(path string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); target == path {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				out = append(out, fmt.Sprintf("pid %d (state %s, parent %s, group %s): %q",
					pid, procState(pid), procStat(pid, 4), procStat(pid, 5), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
			}
		}
	}
	return out
}

// waitUnlocked waits until no process has the data directory's lock file
// open and returns the processes it saw holding it: a child the killed
// publisher was starting holds a copy of the descriptor until its exec
// closes it, and a publisher started meanwhile finds the directory in use.
func waitUnlocked(t *testing.T, lock string) []string {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(stopTimeout); ; time.Sleep(time.Millisecond) {
		holders := lockHolders(lock)
		if len(holders) == 0 {
			return seen
		}
		for _, h := range holders {
			if !slices.Contains(seen, h) {
				seen = append(seen, h)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still held %v after the publisher was killed: %v", lock, stopTimeout, holders)
		}
	}
}

// startPublisher starts the publisher again (startService) and returns
// once it answers an RPC from as, with the processes waitUnlocked saw
// holding its data directory before the start.
func startPublisher(t *testing.T, s *stack, as *tlsconfig.Source) (*serviceProc, []string) {
	t.Helper()
	heldBy := waitUnlocked(t, filepath.Join(s.services["publisher"].DataDir, ".lock"))
	p := startService(t, s, "publisher", 5*time.Millisecond, func() error {
		cc := publisherDial(t, s, as)
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := publisherv1.NewPublisherServiceClient(cc).ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{PageSize: 1})
		return err
	})
	return p, heldBy
}

// publisherDial opens a connection to the publisher that retries its
// connection quickly, as crashDial does for the authority.
func publisherDial(t *testing.T, s *stack, src *tlsconfig.Source) *grpc.ClientConn {
	t.Helper()
	return s.dialWith(t, src, "publisher", grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 50 * time.Millisecond},
		MinConnectTimeout: time.Second,
	}))
}

// usePostgres points the publisher's config at dsn: the dev stack writes
// no store section, so the SQLite default applies until this adds one.
func usePostgres(t *testing.T, s *stack, dsn string) {
	t.Helper()
	path := s.services["publisher"].Config
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(data, []byte("store:")) || bytes.Contains(data, []byte("\nstore:")) {
		t.Fatalf("%s already has a store section:\n%s", path, data)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	// A JSON string is a YAML double-quoted scalar.
	quoted, err := json.Marshal(dsn)
	if err != nil {
		t.Fatal(err)
	}
	data = fmt.Appendf(data, "store:\n  driver: postgres\n  dsn: %s\n", quoted)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// logTail reads the records a service appends to its log from an offset on.
type logTail struct {
	f    *os.File
	off  int64
	part []byte
}

func newLogTail(t *testing.T, path string, off int64) *logTail {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return &logTail{f: f, off: off}
}

func (l *logTail) close() { l.f.Close() }

// msgs returns the msg of each whole line appended since the last call.
func (l *logTail) msgs() []string {
	buf := make([]byte, 64<<10)
	var out []string
	for {
		n, _ := l.f.ReadAt(buf, l.off)
		if n == 0 {
			return out
		}
		l.off += int64(n)
		l.part = append(l.part, buf[:n]...)
		for {
			i := bytes.IndexByte(l.part, '\n')
			if i < 0 {
				break
			}
			var rec struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal(l.part[:i], &rec) == nil {
				out = append(out, rec.Msg)
			}
			l.part = l.part[i+1:]
		}
	}
}

// waitFor polls the log until a record with msg appears or d passes, and
// reports whether it appeared.
func (l *logTail) waitFor(msg string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Microsecond) {
		if slices.Contains(l.msgs(), msg) {
			return true
		}
	}
	return false
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// storeRow is a deployment as the publisher's store holds it.
type storeRow struct {
	id, state, step, owner, message string
	claimedUntil                    time.Time
}

// ownerPID is the pid in a claim's owner (HOST/PID/RANDOM), or 0.
func (r storeRow) ownerPID() int {
	parts := strings.Split(r.owner, "/")
	if len(parts) != 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[1])
	return pid
}

// publisherStore opens the publisher's store for reading, behind its back:
// the SQLite file in its data directory, or db, the PostgreSQL schema.
func publisherStore(t *testing.T, s *stack, db *sql.DB) *sql.DB {
	t.Helper()
	if db != nil {
		return db
	}
	db, err := sql.Open("sqlite", filepath.Join(s.services["publisher"].DataDir, "publisher.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// storeRows reads every deployment from the store.
func storeRows(t *testing.T, db *sql.DB) []storeRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT id, state, step, owner, message, claimed_until FROM deployments ORDER BY created_at, id")
	if err != nil {
		t.Fatalf("read the publisher's store: %v", err)
	}
	defer rows.Close()
	var out []storeRow
	for rows.Next() {
		var r storeRow
		var until int64
		if err := rows.Scan(&r.id, &r.state, &r.step, &r.owner, &r.message, &until); err != nil {
			t.Fatalf("read the publisher's store: %v", err)
		}
		if until != 0 {
			r.claimedUntil = time.UnixMicro(until).UTC()
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read the publisher's store: %v", err)
	}
	return out
}

// pipeline is one pipeline publishing one approval: it retries Publish
// with the same idempotency key until the deployment succeeds or fails.
type pipeline struct {
	approval *authorityv1.Approval
	key      string
	done     chan struct{}

	mu       sync.Mutex
	attempts int
	cut      int // attempts that ended with the publisher gone (or the call's deadline)
	waiting  int // attempts answered "in progress, paused for a retry"
	early    int // attempts answered in progress at once, with no error
	odd      []string
	ids      map[string]bool // deployment ids the publisher answered with
	final    *publisherv1.Deployment
	failed   error
}

// unfinished counts the pipelines whose deployment has not ended.
func unfinished(pipes []*pipeline) int {
	n := 0
	for _, p := range pipes {
		select {
		case <-p.done:
		default:
			n++
		}
	}
	return n
}

// run publishes until the deployment ends or ctx does.
func (p *pipeline) run(ctx context.Context, c publisherv1.PublisherServiceClient) {
	defer close(p.done)
	req := &publisherv1.PublishRequest{
		ApprovalId: p.approval.GetApprovalId(), JobId: p.approval.GetJobId(), BundleDigest: p.approval.GetBundleDigest(),
		Target: &typesv1.PublishTarget{Repository: "sample", Branch: "main"}, IdempotencyKey: p.key,
	}
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.Publish(actx, req)
		cancel()
		p.mu.Lock()
		p.attempts++
		var d *publisherv1.Deployment
		if err == nil {
			d = resp.GetDeployment()
		} else {
			for _, detail := range status.Convert(err).Details() {
				if dd, ok := detail.(*publisherv1.Deployment); ok {
					d = dd
				}
			}
		}
		if d != nil {
			p.ids[d.GetDeploymentId()] = true
		}
		code := status.Code(err)
		switch {
		case err == nil && d.GetState() == publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED:
			p.final = d
			p.mu.Unlock()
			return
		case err == nil:
			// Still in progress, and said so without an error: the call
			// ended before a run did, or no run took it up.
			p.early++
		case code == codes.FailedPrecondition && d != nil:
			p.final, p.failed = d, err
			p.mu.Unlock()
			return
		case code == codes.Unavailable && d != nil:
			p.waiting++
		case code == codes.Unavailable, code == codes.DeadlineExceeded, code == codes.Canceled:
			p.cut++
		default:
			p.odd = append(p.odd, err.Error())
		}
		p.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

// publishKill is one SIGKILL of the publisher: where its log stood then,
// and what the kill waited for.
type publishKill struct {
	logOff int64
	aim    string // the log message it followed ("" for a random delay)
	hit    bool   // whether that message came before the wait ran out
	idle   bool   // every pipeline started so far had finished
	group  bool   // the publisher's git died with it
	// running are the steps the deployments the killed publisher had
	// claimed were recorded at (from its store); stale counts the
	// unfinished deployments an earlier, dead, publisher still had
	// claimed.
	running []string
	stale   int
}

func (k publishKill) String() string {
	what := "a kill of the publisher alone"
	if k.group {
		what = "a kill of the publisher and its git"
	}
	switch {
	case k.aim == "":
		return what + " at a random moment"
	case k.hit:
		return fmt.Sprintf("%s right after %q", what, k.aim)
	default:
		return fmt.Sprintf("%s %v after the restart, %q not logged by then", what, publishCrashAimWait, k.aim)
	}
}

// TestPublisherKilledAnywherePublishesOnce prepares approved results, each
// changing its own file of the served sample repository, and has one
// pipeline per approval retry Publish (as pipeline/deploy, with a stable
// idempotency key) until its deployment ends, while the real publisher is
// SIGKILLed again and again, a random moment after each restart or right
// after it logs a step, alone or with the git it runs, and started again
// from the same config; after each kill the test reads the publisher's
// store to tell at which step each running deployment died. The
// pipelines join as others finish, a few in flight at once, so that kills
// keep landing in work and deployments race each other for the branch
// (each but the first re-applies on a tip that moved). It runs once on
// the publisher's SQLite store and once on PostgreSQL. Afterwards every
// approval landed exactly one commit and nothing else did, every approval
// was consumed exactly once, no lease is left active, every deployment
// succeeded, and the audit chain verifies.
func TestPublisherKilledAnywherePublishesOnce(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { publisherCrashScenario(t, "", nil) })
	t.Run("postgres", func(t *testing.T) {
		// Before the stack, so the schema is dropped after the publisher stops.
		dsn, db := pgtest.Schema(t)
		publisherCrashScenario(t, dsn, db)
	})
}

// publisherCrashScenario runs the test on a stack of its own, with the
// publisher's store on PostgreSQL at dsn (db: the same schema, for the
// test's reads), or on SQLite when dsn is empty.
func publisherCrashScenario(t *testing.T, dsn string, pgdb *sql.DB) {
	began := time.Now()
	repo, base := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	aliceSrc, pipeSrc := s.source(t, "approver/alice"), s.source(t, "pipeline/deploy")
	bare := filepath.Join(s.dir, "git", "data", "sample.git")
	wantDriver := "sqlite"
	if dsn != "" {
		wantDriver = "postgres"
	}

	// N jobs, each writing a file of its own, each asking to publish to
	// sample:main; one approver approves each.
	fileOf := map[string]string{} // job id -> the file its result adds
	for i := 0; i < publishCrashResults; i++ {
		name := fmt.Sprintf("result-%02d.txt", i)
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--publish-to", "sample:main",
			"--idempotency-key", "publish-crash-"+strconv.Itoa(i), "--", "sh", "-c", "printf '%s\\n' "+name+" > "+name)
		if res.code != 0 {
			t.Fatalf("job submit %d: exit %d\n%s%s", i, res.code, res.stdout, res.stderr)
		}
		fileOf[strings.TrimSpace(res.stdout)] = name
	}
	aliceCC := crashDial(t, s, aliceSrc)
	alice := authorityv1.NewAuthorityServiceClient(aliceCC)
	var approvals []*authorityv1.Approval
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		approvals = listApprovals(t, alice)
		if len(approvals) == publishCrashResults {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("after 60s, %d approvals of %d jobs are open", len(approvals), publishCrashResults)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	for _, a := range approvals {
		if _, ok := fileOf[a.GetJobId()]; !ok || a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING ||
			a.GetTarget().GetRepository() != "sample" || a.GetTarget().GetBranch() != "main" {
			t.Fatalf("approval %v: want a pending request of one of the submitted jobs for sample:main", a)
		}
		if _, err := alice.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: a.GetApprovalId(),
			BundleDigest: a.GetBundleDigest(), Decision: authorityv1.Decision_DECISION_APPROVE, Comment: "publisher crash test"}); err != nil {
			t.Fatalf("approve %s: %v", a.GetApprovalId(), err)
		}
	}
	cancel()
	t.Logf("prepared %d approved results in %v", len(approvals), time.Since(began).Round(time.Millisecond))

	// The publisher from now on is the test's, started from the config
	// (pointed at PostgreSQL first, when that is the store under test).
	if dsn != "" {
		usePostgres(t, s, dsn)
	}
	log := s.services["publisher"].Log
	groups := map[int]bool{s.services["publisher"].PID: true}
	killService(t, s, s.proc("publisher"), true)
	scenarioStart := fileSize(t, log)
	cur, _ := startPublisher(t, s, pipeSrc)
	db := publisherStore(t, s, pgdb)
	var lockWaits [][]string      // who held the data directory before a restart
	claims := map[string]string{} // deployment id -> its claim at the last kill

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("kill delays and aims drawn with seed %d", seed)
	pipeCC := publisherDial(t, s, pipeSrc)
	pubClient := publisherv1.NewPublisherServiceClient(pipeCC)
	pipeCtx, stopPipelines := context.WithCancel(context.Background())
	defer stopPipelines()
	pipes := make([]*pipeline, len(approvals))
	for i, a := range approvals {
		pipes[i] = &pipeline{approval: a, key: "pipeline:" + a.GetApprovalId(), done: make(chan struct{}), ids: map[string]bool{}}
	}
	var kills []publishKill
	lifeStart := scenarioStart
	loopStart := time.Now()
	started := 0
	for k := 0; k < publishCrashKills && !t.Failed(); k++ {
		// Pipelines join as others finish, a few at a time, so that the
		// kills keep landing in work and deployments race for the branch.
		joined := false
		for started < len(pipes) && unfinished(pipes[:started]) < publishCrashInFlight {
			go pipes[started].run(pipeCtx, pubClient)
			started++
			joined = true
		}
		kill := publishKill{}
		switch {
		case joined:
			kill.aim = msgAccepted
		case rng.Intn(2) == 0:
			kill.aim = []string{msgConsumed, msgPushed, msgSucceeded}[rng.Intn(3)]
		}
		tail := newLogTail(t, log, lifeStart)
		if kill.aim == "" {
			time.Sleep(time.Duration(rng.Int63n(int64(publishCrashMaxDelay) + 1)))
		} else if kill.hit = tail.waitFor(kill.aim, publishCrashAimWait); kill.hit {
			// Up to a couple of milliseconds later: either side of the
			// record that follows the line.
			time.Sleep(time.Duration(rng.Int63n(int64(2 * time.Millisecond))))
		}
		tail.close()
		kill.idle = unfinished(pipes[:started]) == 0
		kill.group = rng.Intn(2) == 0
		groups[cur.pid] = true
		killService(t, s, cur, kill.group)
		kill.logOff = fileSize(t, log)
		// A claim taken or renewed since the last kill is the killed
		// publisher's; one unchanged since is a dead one's, still holding.
		now := time.Now()
		claimsNow := map[string]string{}
		for _, r := range storeRows(t, db) {
			if r.state != "in_progress" || r.owner == "" {
				continue
			}
			claim := r.owner + "@" + r.claimedUntil.String()
			claimsNow[r.id] = claim
			switch {
			case claims[r.id] != claim:
				kill.running = append(kill.running, r.step)
			case now.Before(r.claimedUntil):
				kill.stale++
			}
		}
		claims = claimsNow
		kills = append(kills, kill)
		lifeStart = kill.logOff
		var heldBy []string
		cur, heldBy = startPublisher(t, s, pipeSrc)
		if len(heldBy) > 0 {
			lockWaits = append(lockWaits, heldBy)
		}
	}
	for ; started < len(pipes); started++ {
		go pipes[started].run(pipeCtx, pubClient)
	}
	killTime := time.Since(loopStart)
	drainStart := time.Now()
	drainCtx, drainCancel := context.WithTimeout(context.Background(), publishCrashDrain)
	for _, p := range pipes {
		select {
		case <-p.done:
		case <-drainCtx.Done():
		}
	}
	drainCancel()
	stuck := unfinished(pipes)
	stopPipelines()
	for _, p := range pipes {
		<-p.done
	}
	drainTime := time.Since(drainStart)
	orphans := reapOrphans(t, groups)
	locks, _ := filepath.Glob(filepath.Join(s.services["publisher"].DataDir, "work", "repos", "*", "*.lock"))
	refLocks, _ := filepath.Glob(filepath.Join(s.services["publisher"].DataDir, "work", "repos", "*", "refs", "*", "*", "*.lock"))
	if locks = append(locks, refLocks...); len(locks) > 0 {
		t.Logf("%s: lock files a killed git left in the publisher's scratch repository: %v", wantDriver, locks)
	}

	if stuck > 0 {
		// Why: where the store has each unfinished deployment, and whose
		// claim holds it.
		for _, r := range storeRows(t, db) {
			if r.state != "in_progress" {
				continue
			}
			holder := "unclaimed"
			if r.owner != "" {
				whose := ""
				switch pid := r.ownerPID(); {
				case pid == cur.pid:
					whose = " (the running publisher)"
				case pid != 0:
					whose = fmt.Sprintf(" (pid %d, a killed publisher)", pid)
				}
				holder = fmt.Sprintf("claimed by %s%s until %s", r.owner, whose, r.claimedUntil.Format(time.RFC3339))
			}
			t.Errorf("deployment %s is still in progress %v after the last kill, at step %s, %s; message %q",
				r.id, publishCrashDrain, r.step, holder, r.message)
		}
	}

	checkPublishedOnce(t, s, pipes, fileOf, base, bare, alice, pubClient)
	report := publishCrashLog(t, log, scenarioStart, kills, wantDriver)
	attempts, cut, waiting, early := 0, 0, 0, 0
	for _, p := range pipes {
		attempts, cut, waiting, early = attempts+p.attempts, cut+p.cut, waiting+p.waiting, early+p.early
	}
	idle, group, stale, aimed, hits := 0, 0, 0, map[string]int{}, map[string]int{}
	running := map[string]int{}
	for _, k := range kills {
		if k.idle {
			idle++
		}
		if k.group {
			group++
		}
		if len(k.running) == 0 {
			running["none"]++
		}
		for _, st := range k.running {
			running[st]++
		}
		stale += k.stale
		if k.aim != "" {
			aimed[k.aim]++
			if k.hit {
				hits[k.aim]++
			}
		}
	}
	var aims []string
	for _, m := range []string{msgAccepted, msgConsumed, msgPushed, msgSucceeded} {
		aims = append(aims, fmt.Sprintf("%q %d (%d seen)", m, aimed[m], hits[m]))
	}
	t.Logf("%s: %d kills in %v, then %v to finish (whole run %v); %d with its git, %d with every started pipeline done; aimed after %s, the rest at random; %d git processes outlived a kill",
		wantDriver, len(kills), killTime.Round(time.Millisecond), drainTime.Round(time.Millisecond), time.Since(began).Round(time.Millisecond),
		group, idle, strings.Join(aims, ", "), orphans)
	var bySteps []string
	for _, st := range append([]string{"none"}, publishSteps...) {
		bySteps = append(bySteps, fmt.Sprintf("%s %d", st, running[st]))
	}
	t.Logf("%s: deployments the killed publisher was running, by the step its store had recorded, over all kills (none: kills that found it running nothing): %s; deployments still claimed by an earlier, dead, publisher, over all kills: %d",
		wantDriver, strings.Join(bySteps, ", "), stale)
	t.Logf("%s: %d Publish calls: %d cut by a kill or their deadline, %d answered paused, %d answered in progress at once",
		wantDriver, attempts, cut, waiting, early)
	if len(lockWaits) > 0 {
		t.Logf("%s: %d restarts waited for the data directory's lock, held by %v", wantDriver, len(lockWaits), lockWaits)
	}
	for _, line := range report {
		t.Logf("%s: %s", wantDriver, line)
	}
}

// checkPublishedOnce checks what the pipelines, the served branch, the
// publisher and the authority say once the pipelines are done.
func checkPublishedOnce(t *testing.T, s *stack, pipes []*pipeline, fileOf map[string]string, base, bare string,
	alice authorityv1.AuthorityServiceClient, pub publisherv1.PublisherServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The pipelines: each got its deployment to SUCCEEDED, always the same
	// one, and saw no answer but those a crash explains.
	byApproval := map[string]*pipeline{}
	for _, p := range pipes {
		id := p.approval.GetApprovalId()
		byApproval[id] = p
		switch {
		case p.failed != nil:
			t.Errorf("approval %s: the deployment failed: %v", id, p.failed)
		case p.final == nil:
			t.Errorf("approval %s: no deployment ended within %v of the last kill (%d attempts; deployments %v)", id, publishCrashDrain, p.attempts, p.ids)
		}
		if len(p.ids) > 1 {
			t.Errorf("approval %s: one idempotency key answered with %d deployments: %v", id, len(p.ids), p.ids)
		}
		for _, o := range p.odd {
			t.Errorf("approval %s: Publish answered %s", id, o)
		}
	}

	// The branch: exactly one commit per approval on top of the base, each
	// the one its deployment reports, and every result's file on main.
	if out := strings.TrimSpace(git(t, bare, "rev-list", "--count", base+"..main")); out != strconv.Itoa(len(pipes)) {
		t.Errorf("main has %s commits on top of the base %s, want %d", out, base, len(pipes))
	}
	if out := strings.TrimSpace(git(t, bare, "rev-list", "--merges", "--count", base+"..main")); out != "0" {
		t.Errorf("main has %s merge commits on top of the base, want none", out)
	}
	landed := map[string][]string{} // approval id -> commits naming it
	for _, line := range strings.Split(strings.TrimSpace(git(t, bare, "log", "--format=%H %(trailers:key=Airlock-Approval,valueonly,separator=%x2C)", base+"..main")), "\n") {
		commit, trailers, _ := strings.Cut(line, " ")
		if trailers == "" {
			t.Errorf("commit %s on main carries no Airlock-Approval trailer", commit)
		}
		for _, id := range strings.Split(trailers, ",") {
			if id = strings.TrimSpace(id); id != "" {
				landed[id] = append(landed[id], commit)
			}
		}
	}
	for id, commits := range landed {
		p, ok := byApproval[id]
		switch {
		case !ok:
			t.Errorf("commits %v on main name approval %s, which the test did not publish", commits, id)
		case len(commits) != 1:
			t.Errorf("approval %s landed %d commits on main: %v", id, len(commits), commits)
		case p.final != nil && p.final.GetCommit() != commits[0]:
			t.Errorf("approval %s landed commit %s, but its deployment reports %s", id, commits[0], p.final.GetCommit())
		}
	}
	for id, p := range byApproval {
		if len(landed[id]) == 0 {
			t.Errorf("approval %s landed no commit on main", id)
		}
		name := fileOf[p.approval.GetJobId()]
		if got, err := exec.Command("git", "-C", bare, "show", "main:"+name).CombinedOutput(); err != nil || string(got) != name+"\n" {
			t.Errorf("main:%s is %q (%v), want %q", name, got, err, name+"\n")
		}
	}

	// The publisher: one deployment per approval, SUCCEEDED, every step
	// recorded.
	seen := map[string]int{}
	for token := ""; ; {
		resp, err := pub.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatalf("list deployments: %v", err)
		}
		for _, d := range resp.GetDeployments() {
			seen[d.GetApprovalId()]++
			var steps []string
			for _, st := range d.GetSteps() {
				steps = append(steps, st.GetStep())
			}
			if d.GetState() != publisherv1.DeploymentState_DEPLOYMENT_STATE_SUCCEEDED || !slices.Equal(steps, publishSteps) {
				t.Errorf("deployment %s of approval %s is %v after steps %v (%s); want SUCCEEDED after %v",
					d.GetDeploymentId(), d.GetApprovalId(), d.GetState(), steps, d.GetMessage(), publishSteps)
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for id := range byApproval {
		if seen[id] != 1 {
			t.Errorf("approval %s has %d deployments, want 1", id, seen[id])
		}
	}
	if len(seen) != len(byApproval) {
		t.Errorf("the publisher lists deployments for %d approvals, want %d", len(seen), len(byApproval))
	}

	// The authority: every approval consumed, with exactly one allowed
	// approval.consumed event; no lease active; the audit chain verifies.
	for _, a := range listApprovals(t, alice) {
		if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_CONSUMED {
			t.Errorf("approval %s is %v, want CONSUMED", a.GetApprovalId(), a.GetState())
		}
	}
	allowed, denied := map[string]int{}, 0
	for token := ""; ; {
		resp, err := alice.ListAuditEvents(ctx, &authorityv1.ListAuditEventsRequest{Kind: "approval.consumed", PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("list audit events: %v", err)
		}
		for _, e := range resp.GetEvents() {
			if e.GetOutcome() == authorityv1.AuditOutcome_AUDIT_OUTCOME_ALLOWED {
				allowed[e.GetSubject()]++
			} else {
				denied++
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for id := range byApproval {
		if allowed[id] != 1 {
			t.Errorf("approval %s has %d allowed approval.consumed events, want exactly 1", id, allowed[id])
		}
	}
	if len(allowed) != len(byApproval) {
		t.Errorf("allowed approval.consumed events name %d approvals, want %d", len(allowed), len(byApproval))
	}
	if denied > 0 {
		t.Logf("%d refused consumes are on the audit log (a consume after one whose answer a kill lost)", denied)
	}
	resp, err := alice.ListLeases(ctx, &authorityv1.ListLeasesRequest{PageSize: 500})
	if err != nil {
		t.Fatalf("list leases: %v", err)
	}
	for _, l := range resp.GetLeases() {
		t.Errorf("lease %s (%v, job %s, held by %s, issued %v) is still active", l.GetLeaseId(), l.GetPurpose(), l.GetJobId(), l.GetHolder(), l.GetIssuedAt().AsTime())
	}
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 {
		t.Errorf("audit verify: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// publishCrashLog reads the publisher's log from scenarioStart, one life
// per kill, checks each life opened the store under test and refused
// nothing, and returns what it says about where the kills landed.
func publishCrashLog(t *testing.T, path string, scenarioStart int64, kills []publishKill, driver string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type record struct {
		Msg, Driver, Deployment, Error string
		AfterStep                      string `json:"after_step"`
		Level                          string
	}
	bounds := []int64{scenarioStart}
	for _, k := range kills {
		bounds = append(bounds, k.logOff)
	}
	lives := make([][]record, len(kills)+1)
	life := 0
	for off := scenarioStart; off < int64(len(data)); {
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			t.Errorf("%s: the log ends in a partial line %q", path, data[off:])
			break
		}
		line := data[off : off+int64(end)]
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Errorf("%s: not a JSON log record (%v): %q", path, err, line)
		}
		for life+1 < len(bounds) && off >= bounds[life+1] {
			life++
		}
		lives[life] = append(lives[life], r)
		off += int64(end) + 1
	}

	after := func(life int) string {
		if life == 0 {
			return "the test's first start"
		}
		return kills[life-1].String()
	}
	lastLogged := map[string]int{}
	var pauses []string
	consumedLogged, pushedLogged := map[string]int{}, map[string]int{}
	landed, paused, problems := 0, 0, 0
	for i, recs := range lives {
		opened := false
		last := "no step"
		for _, r := range recs {
			switch r.Msg {
			case "store opened":
				opened = true
				if r.Driver != driver {
					t.Errorf("publisher life %d (after %s) opened a %s store, want %s", i, after(i), r.Driver, driver)
				}
			case msgAccepted, msgSucceeded:
				last = r.Msg
			case msgConsumed:
				last = r.Msg
				consumedLogged[r.Deployment]++
			case msgPushed:
				last = r.Msg
				pushedLogged[r.Deployment]++
			case msgLanded:
				last = r.Msg
				landed++
			case msgPaused:
				paused++
				if why := r.AfterStep + ": " + r.Error; !slices.Contains(pauses, why) && len(pauses) < 5 {
					pauses = append(pauses, why)
				}
			case msgRefused:
				t.Errorf("publisher life %d (after %s): %s: deployment %s, after step %s: %s", i, after(i), r.Msg, r.Deployment, r.AfterStep, r.Error)
			}
			if r.Level == "ERROR" {
				problems++
				t.Errorf("publisher life %d (after %s) logged an error: %s: %s", i, after(i), r.Msg, r.Error)
			}
		}
		if len(recs) > 0 && !opened {
			t.Errorf("publisher life %d (after %s) never logged \"store opened\"", i, after(i))
		}
		if i < len(kills) {
			lastLogged[last]++
		}
	}
	var byLast []string
	for _, m := range []string{"no step", msgAccepted, msgConsumed, msgPushed, msgLanded, msgSucceeded} {
		byLast = append(byLast, fmt.Sprintf("%q %d", m, lastLogged[m]))
	}
	again := func(m map[string]int) int {
		n := 0
		for _, c := range m {
			n += c - 1
		}
		return n
	}
	out := []string{
		"kills by the last step the killed publisher logged: " + strings.Join(byLast, ", "),
		fmt.Sprintf("approval consumed logged again %d times (a kill between the consume and its record), commit pushed again %d times, "+
			"a commit found already on the branch %d times (a kill between the push and its record); %d pauses, %d errors",
			again(consumedLogged), again(pushedLogged), landed, paused, problems),
	}
	for _, p := range pauses {
		out = append(out, "paused after "+p)
	}
	return out
}
