package runs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/airlockhq/airlock/test/gittest"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/provenance"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

// These tests run real jobs: they need root, cgroups v1, git and the runc
// binary (AIRLOCK_RUNC, default <module root>/bin/runc; build it with
// `tools/sandbox/build.sh bin`). A missing prerequisite fails them.

var testSeq atomic.Int64

// fakeAuthority serves one repository's tree and records reports. While
// gate is open (not closed), FetchSource waits, holding jobs in staging.
type fakeAuthority struct {
	hdr     stage.Header
	archive []byte
	gate    chan struct{}

	mu      sync.Mutex
	reports []Report
}

// FetchImageBlob: these tests run on the host template; a grant naming an
// image is refused before it would fetch.
func (a *fakeAuthority) FetchImageBlob(ctx context.Context, jobID, digest string, checkOnly bool) (images.Blob, io.ReadCloser, error) {
	return images.Blob{}, nil, fmt.Errorf("%w: the fake authority serves no images", errdefs.ErrUnavailable)
}

func (a *fakeAuthority) FetchSource(ctx context.Context, jobID string) (stage.Header, io.ReadCloser, error) {
	if a.gate != nil {
		select {
		case <-a.gate:
		case <-ctx.Done():
			return stage.Header{}, nil, ctx.Err()
		}
	}
	return a.hdr, io.NopCloser(bytes.NewReader(a.archive)), nil
}

func (a *fakeAuthority) ReportResult(ctx context.Context, r Report) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reports = append(a.reports, r)
	return nil
}

type harness struct {
	m      *Manager
	auth   *fakeAuthority
	commit string
	base   string // the harness's directories: sandbox, sources, runs
}

func runcPath(t *testing.T) string {
	if p := os.Getenv("AIRLOCK_RUNC"); p != "" {
		return p
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "bin", "runc")
}

// runscPath is runsc beside runc (AIRLOCK_RUNSC overrides it), or "" when
// there is none: the runsc class is then unavailable, and a test that
// needs it fails.
func runscPath(runc string) string {
	p := os.Getenv("AIRLOCK_RUNSC")
	if p == "" {
		p = filepath.Join(filepath.Dir(runc), "runsc")
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// newHarness builds a run manager over a real sandbox manager (runc only)
// and source cache, a fake authority and a throwaway grant key. gated
// holds every job in staging until the returned release is called.
func newHarness(t *testing.T, gated bool) (*harness, func()) {
	t.Helper()
	return newHarnessWith(t, gated, Capacity{})
}

// newHarnessWith is newHarness with a capacity, whose memory is also the
// sandbox's cgroup parent's limit, as the executor sets them.
func newHarnessWith(t *testing.T, gated bool, capacity Capacity) (*harness, func()) {
	t.Helper()
	return newHarnessMeter(t, gated, capacity, nil)
}

// newHarnessMeter is newHarnessWith whose manager records its metrics on
// mp; opts adjust the sandbox's config.
func newHarnessMeter(t *testing.T, gated bool, capacity Capacity, mp metric.MeterProvider, opts ...func(*sandbox.Config)) (*harness, func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the runs tests must run as root, not uid %d", os.Geteuid())
	}
	runc := runcPath(t)
	if _, err := os.Stat(runc); err != nil {
		t.Fatalf("runc binary: %v (run tools/sandbox/build.sh bin, or set AIRLOCK_RUNC)", err)
	}
	base := t.TempDir()
	repo := filepath.Join(base, "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	gittest.Run(t, repo, "init", "--quiet", "-b", "main")
	if err := os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gittest.Run(t, repo, "add", "--all")
	gittest.Run(t, repo, "commit", "--quiet", "-m", "base")
	auth := &fakeAuthority{
		hdr: stage.Header{
			Commit:   strings.TrimSpace(gittest.Run(t, repo, "rev-parse", "HEAD")),
			TreeHash: strings.TrimSpace(gittest.Run(t, repo, "rev-parse", "HEAD^{tree}")),
			// The authority sends the commit object for the job's .git.
			CommitObject: []byte(gittest.Run(t, repo, "cat-file", "commit", "HEAD")),
		},
		archive: []byte(gittest.Run(t, repo, "archive", "--format=tar", "HEAD")),
	}
	release := func() {}
	if gated {
		auth.gate = make(chan struct{})
		var once sync.Once
		release = func() { once.Do(func() { close(auth.gate) }) }
	}

	n := testSeq.Add(1)
	// Below the sandbox tests' uid ranges (from 2000000) and above the
	// executor default (1000000), so parallel test binaries never share one.
	uidBase := uint32(1100000 + ((os.Getpid()+int(n))%13)*65536)
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sbCfg := sandbox.Config{
		StateDir:            filepath.Join(base, "sandbox"),
		RuncPath:            runc,
		RunscPath:           runscPath(runc),
		UIDBase:             uidBase,
		CgroupParent:        fmt.Sprintf("/airlock-runs-test-%d-%d", os.Getpid(), n),
		MemoryLimit:         capacity.MemoryBytes,
		Logger:              logger,
		RunscSelfCheckCache: selfCheckCache,
	}
	for _, o := range opts {
		o(&sbCfg)
	}
	sb, err := sandbox.New(sbCfg)
	if err != nil {
		t.Fatal(err)
	}
	sources, err := stage.New(filepath.Join(base, "sources"), int(uidBase), int(uidBase))
	if err != nil {
		t.Fatal(err)
	}
	caches, err := cache.New(cache.Config{Dir: filepath.Join(base, "caches"), IDBase: uidBase, IDRange: sandbox.IDRange, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{
		Dir:       filepath.Join(base, "runs"),
		Sandbox:   sb,
		Sources:   sources,
		Caches:    caches,
		Authority: auth,
		Sign: func(string, string, provenance.Run) ([]byte, error) {
			return []byte(`{"test":"unsigned"}`), nil
		},
		Executor: "spiffe://test.example/service/executor",
		Capacity: capacity,
		Meter:    mp,
		Logger:   logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		release()
		m.Close()
		if err := sb.Close(); err != nil {
			t.Errorf("sandbox Close: %v", err)
		}
	})
	return &harness{m: m, auth: auth, commit: auth.hdr.Commit, base: base}, release
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

var baseLimits = sandbox.Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 64, DiskBytes: 32 << 20, Deadline: time.Minute}

// grantFor is generation 1 of a job running script.
func (h *harness) grantFor(script string) *Grant {
	return &Grant{
		JobID:             fmt.Sprintf("job-%d", testSeq.Add(1)),
		Tenant:            "acme",
		Requester:         "spiffe://test.example/client/alice",
		Repository:        "widgets",
		Commit:            h.commit,
		Command:           []string{"sh", "-c", script},
		Env:               map[string]string{"GREETING": "hi"},
		Limits:            baseLimits,
		NetworkGeneration: 1,
		Class:             sandbox.ClassRunc,
		Generation:        1,
		// The depth the fake authority serves, as a real one grants it.
		HistoryDepth: h.auth.hdr.HistoryDepth,
	}
}

// seal stands in for the authority signing g and package convert
// verifying it: it fills in what convert derives from the signed grant.
// Fixed holds the fields runs sees, as convert's hold every fixed field
// of the grant format; Signed is g as JSON, the digest's input.
func (h *harness) seal(t *testing.T, g *Grant) Grant {
	t.Helper()
	s := clone(g)
	s.Fixed, s.Digest, s.Signed = nil, "", nil
	for _, f := range []struct {
		name string
		v    any
	}{
		{"tenant", s.Tenant}, {"requester", s.Requester}, {"repository", s.Repository}, {"commit", s.Commit},
		{"command", s.Command}, {"env", s.Env}, {"runtime_class", s.Class}, {"git_history_depth", s.HistoryDepth},
	} {
		v, err := json.Marshal(f.v)
		if err != nil {
			t.Fatal(err)
		}
		s.Fixed = append(s.Fixed, Field{Name: f.name, Value: v})
	}
	body, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	s.Digest, s.Signed = "sha256:"+hex.EncodeToString(sum[:]), body
	return *s
}

// clone is a deep copy of g.
func clone(g *Grant) *Grant {
	data, err := json.Marshal(g)
	if err != nil {
		panic(err)
	}
	n := &Grant{}
	if err := json.Unmarshal(data, n); err != nil {
		panic(err)
	}
	return n
}

// next is g's successor: a copy with the next generation, changed by f.
func next(g *Grant, f func(g *Grant)) *Grant {
	n := clone(g)
	n.Generation++
	f(n)
	return n
}

// allowPolicy allows cidr on ports (every port when none).
func allowPolicy(cidr string, ports ...uint16) NetworkPolicy {
	return NetworkPolicy{Net: netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.MustParsePrefix(cidr), Ports: ports}}}}
}

func (h *harness) start(t *testing.T, g *Grant) {
	t.Helper()
	if _, created, err := h.m.Start(h.seal(t, g)); err != nil || !created {
		t.Fatalf("Start: created %v, %v", created, err)
	}
}

// waitRunning waits until the job runs and has printed want.
func (h *harness) waitRunning(t *testing.T, jobID, want string) {
	t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		run, err := h.m.Get(jobID)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := os.ReadFile(filepath.Join(h.m.runDir(jobID), "stdout.log"))
		if run.State == Running && strings.Contains(string(out), want) {
			return
		}
		if run.State.Terminal() || time.Now().After(end) {
			t.Fatalf("job %s did not print %q while running: state %s, result %+v, stdout %q", jobID, want, run.State, run.Result, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) waitEnd(t *testing.T, jobID string) Run {
	t.Helper()
	return h.waitEndWithin(t, jobID, 90*time.Second)
}

func (h *harness) waitEndWithin(t *testing.T, jobID string, d time.Duration) Run {
	t.Helper()
	end := time.Now().Add(d)
	for {
		run, err := h.m.Get(jobID)
		if err != nil {
			t.Fatal(err)
		}
		if run.State.Terminal() {
			t.Logf("job %s ended %s: %+v", jobID, run.State, run.Result)
			return run
		}
		if time.Now().After(end) {
			t.Fatalf("job %s did not end", jobID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReports waits until the fake authority has at least n reports and
// returns them: a run's report follows its ended record.
func (h *harness) waitReports(t *testing.T, n int) []Report {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		h.auth.mu.Lock()
		reports := append([]Report(nil), h.auth.reports...)
		h.auth.mu.Unlock()
		if len(reports) >= n {
			return reports
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reports, want %d", len(reports), n)
		}
	}
}

// signal sends the job's first process SIGUSR1, which a job started with
// stepHandler counts. The job must have printed ready: a namespace's init
// drops a signal it has no handler for.
func (h *harness) signal(t *testing.T, jobID string) {
	t.Helper()
	e := h.entry(jobID)
	e.updateMu.Lock()
	sb := e.sb
	e.updateMu.Unlock()
	if sb == nil {
		t.Fatalf("job %s has no sandbox", jobID)
	}
	if err := sb.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
}

// stepHandler counts the SIGUSR1s the job takes in $signals, then prints
// ready; awaitSignal(n) waits for the nth. A running job is stepped by a
// signal, never by a file the host writes into its mounts: a batch job
// under runsc caches what it knows of them and would never see the file.
const stepHandler = `signals=0; trap 'signals=$((signals+1))' USR1; echo ready; `

func awaitSignal(n int) string {
	return fmt.Sprintf(`while [ "$signals" -lt %d ]; do sleep 0.05; done; `, n)
}

// waitForSignal is a job's first line that waits for one signal.
var waitForSignal = stepHandler + awaitSignal(1)

// Every grant that may not replace the one in force is refused with the
// right code and a message naming what is wrong, and changes nothing.
func TestUpdateRefusals(t *testing.T) {
	h, _ := newHarness(t, false)
	g1 := h.grantFor(waitForSignal + "echo done")
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")
	before, _ := h.m.Get(g1.JobID)

	// A bad signature, an unknown key or an expired grant never gets here
	// (package convert refuses them; TestGrantRefusals there).
	unknown := next(g1, func(g *Grant) { g.JobID = "no-such-job" })
	lower := clone(g1)
	lower.Generation = 0
	sameGenDifferent := clone(g1)
	sameGenDifferent.Limits.Pids = 100

	for _, tc := range []struct {
		name string
		sg   Grant
		want error
		text string
	}{
		{"unknown job", h.seal(t, unknown), errdefs.ErrNotFound, "no-such-job"},
		{"lower generation", h.seal(t, lower), errdefs.ErrFailedPrecondition, "generation 0"},
		{"same generation, different", h.seal(t, sameGenDifferent), errdefs.ErrFailedPrecondition, "generation 1"},
		{"command", h.seal(t, next(g1, func(g *Grant) { g.Command = []string{"sh", "-c", "curl evil"} })), errdefs.ErrPermissionDenied, "field command"},
		{"env", h.seal(t, next(g1, func(g *Grant) { g.Env["EXTRA"] = "1" })), errdefs.ErrPermissionDenied, "field env"},
		{"tenant", h.seal(t, next(g1, func(g *Grant) { g.Tenant = "other" })), errdefs.ErrPermissionDenied, "field tenant"},
		{"requester", h.seal(t, next(g1, func(g *Grant) { g.Requester = "spiffe://test.example/client/mallory" })), errdefs.ErrPermissionDenied, "field requester"},
		{"repository", h.seal(t, next(g1, func(g *Grant) { g.Repository = "gadgets" })), errdefs.ErrPermissionDenied, "field repository"},
		{"commit", h.seal(t, next(g1, func(g *Grant) { g.Commit = strings.Repeat("a", 40) })), errdefs.ErrPermissionDenied, "field commit"},
		{"runtime class", h.seal(t, next(g1, func(g *Grant) { g.Class = sandbox.ClassRunsc })), errdefs.ErrPermissionDenied, "field runtime_class"},
		{"history depth", h.seal(t, next(g1, func(g *Grant) { g.HistoryDepth = 5 })), errdefs.ErrPermissionDenied, "field git_history_depth"},
		{"a job becoming a session", h.seal(t, next(g1, func(g *Grant) { g.Session = &SessionSpec{IdleTimeout: time.Minute} })), errdefs.ErrPermissionDenied, "cannot become a session"},
		{"disk", h.seal(t, next(g1, func(g *Grant) { g.Limits.DiskBytes *= 2 })), errdefs.ErrInvalidArgument, "limits.disk_bytes"},
		{"memory below the minimum", h.seal(t, next(g1, func(g *Grant) { g.Limits.MemoryBytes = 1 << 20 })), errdefs.ErrInvalidArgument, "limits.memory_bytes"},
		{"no deadline", h.seal(t, next(g1, func(g *Grant) { g.Limits.Deadline = 0 })), errdefs.ErrInvalidArgument, "limits.deadline"},
		{"allow without a network manager", h.seal(t, next(g1, func(g *Grant) {
			g.Network = allowPolicy("192.0.2.0/24")
			g.NetworkGeneration = 2
		})), errdefs.ErrFailedPrecondition, "only deny_all"},
		{"domains", h.seal(t, next(g1, func(g *Grant) {
			g.Network = domainsPolicy("example.com")
			g.NetworkGeneration = 2
		})), errdefs.ErrFailedPrecondition, "network_policy"},
		{"network generation lowered", h.seal(t, next(g1, func(g *Grant) { g.NetworkGeneration = 0 })), errdefs.ErrFailedPrecondition, "network_policy_generation 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.m.Update(context.Background(), tc.sg)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Update: %v; want %v naming %q", err, tc.want, tc.text)
			}
			t.Log(err)
		})
	}
	after, _ := h.m.Get(g1.JobID)
	if !bytes.Equal(after.SignedGrant, before.SignedGrant) {
		t.Fatal("a refused update changed the run's grant")
	}

	// The grant in force, sent again, is no change and no error.
	same, err := h.m.Update(context.Background(), h.seal(t, g1))
	if err != nil || !bytes.Equal(same.SignedGrant, before.SignedGrant) {
		t.Fatalf("Update with the grant in force: %v", err)
	}

	h.signal(t, g1.JobID)
	if run := h.waitEnd(t, g1.JobID); run.State != Finished || run.Result.ExitCode != 0 {
		t.Fatalf("run ended %s %+v", run.State, run.Result)
	}
	_, err = h.m.Update(context.Background(), h.seal(t, next(g1, func(g *Grant) { g.Limits.Pids = 100 })))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("Update of an ended job: %v", err)
	}
}

// A newer grant's limits reach the live sandbox: a job blocked at 16 pids
// forks all it wants under the 64 of generation 2, and the run, its record
// on disk, its watchers and its bundle carry the new grant.
func TestUpdateLiveLimits(t *testing.T) {
	h, _ := newHarness(t, false)
	g1 := h.grantFor(waitForSignal + `i=0
while [ $i -lt 24 ]; do sleep 60 & i=$((i+1)); done
echo "all spawned"`)
	g1.Limits.Pids = 16
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan Run, 16)
	go func() {
		_ = h.m.Watch(ctx, g1.JobID, WatchFrom{}, func(ev Event) error {
			if ev.Run != nil {
				events <- *ev.Run
			}
			return nil
		})
	}()
	if r := <-events; r.State != Running || r.Grant.Generation != 1 {
		t.Fatalf("first watch event: %s generation %d", r.State, r.Grant.Generation)
	}

	g2 := next(g1, func(g *Grant) { g.Limits.Pids = 64; g.Limits.MemoryBytes = 384 << 20 })
	sg2 := h.seal(t, g2)
	run, err := h.m.Update(context.Background(), sg2)
	if err != nil {
		t.Fatal(err)
	}
	if got := run.Grant; got.Generation != 2 || got.Limits.Pids != 64 {
		t.Fatalf("Update returned a run under %v", got)
	}
	select {
	case r := <-events:
		if r.Grant.Generation != 2 {
			t.Fatalf("watch event after the update has generation %d", r.Grant.Generation)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watchers were not told of the new grant")
	}
	rec, err := os.ReadFile(filepath.Join(h.m.runDir(g1.JobID), "run.json"))
	if err != nil || !bytes.Contains(rec, []byte(`"signed_grant"`)) {
		t.Fatalf("run.json: %v", err)
	}
	loaded, err := New(Config{Dir: h.m.cfg.Dir})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := loaded.Get(g1.JobID); r.Grant.Generation != 2 {
		t.Fatal("the run's record on disk does not hold generation 2")
	}
	// Sending it again changes nothing.
	if again, err := h.m.Update(context.Background(), sg2); err != nil || !bytes.Equal(again.SignedGrant, run.SignedGrant) {
		t.Fatalf("repeated Update: %v", err)
	}

	h.signal(t, g1.JobID)
	end := h.waitEnd(t, g1.JobID)
	out, _ := os.ReadFile(filepath.Join(h.m.runDir(g1.JobID), "stdout.log"))
	if end.State != Finished || end.Result.Reason != sandbox.ReasonExited || end.Result.ExitCode != 0 || !strings.Contains(string(out), "all spawned") {
		t.Fatalf("run ended %s %+v, stdout %q; want all 24 sleeps spawned under 64 pids", end.State, end.Result, out)
	}
	bundleTar, err := os.ReadFile(filepath.Join(h.m.runDir(g1.JobID), "bundle.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(bundleTar, sg2.Signed) {
		t.Error("the bundle does not carry the grant in force at the end")
	}
}

// A grant updated while its job stages is the one its sandbox is made
// from: a deadline lowered to 1s times out a job that sleeps.
func TestUpdateWhileStaging(t *testing.T) {
	h, release := newHarness(t, true)
	g1 := h.grantFor("echo started; exec sleep 300")
	h.start(t, g1)
	g2 := next(g1, func(g *Grant) { g.Limits.Deadline = time.Second })
	run, err := h.m.Update(context.Background(), h.seal(t, g2))
	if err != nil {
		t.Fatal(err)
	}
	if run.State != Staging {
		t.Fatalf("state %s, want staging", run.State)
	}
	release()
	end := h.waitEnd(t, g1.JobID)
	if end.Result.Reason != sandbox.ReasonTimeout || !strings.Contains(end.Result.Message, "deadline of 1s") {
		t.Fatalf("run ended %s %+v, want a timeout at the updated 1s", end.State, end.Result)
	}
}

// A lower deadline on a running job times it out, and the result names it.
func TestUpdateLowerDeadline(t *testing.T) {
	h, _ := newHarness(t, false)
	g1 := h.grantFor("echo started; exec sleep 300")
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "started")
	g2 := next(g1, func(g *Grant) { g.Limits.Deadline = time.Millisecond })
	if _, err := h.m.Update(context.Background(), h.seal(t, g2)); err != nil {
		t.Fatal(err)
	}
	end := h.waitEnd(t, g1.JobID)
	if end.Result.Reason != sandbox.ReasonTimeout || !strings.Contains(end.Result.Message, "deadline of 1ms") {
		t.Fatalf("run ended %s %+v, want a timeout at 1ms", end.State, end.Result)
	}
}
