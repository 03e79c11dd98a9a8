package cli

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func (f *fakeAuthority) sawCaller(ctx context.Context) string {
	id, _ := identity.FromPeer(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callers = append(f.callers, id.Principal())
	return id.Principal()
}

// sawCallers returns the identities of the fleet calls so far.
func (f *fakeAuthority) sawCallers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.callers)
}

// executor is a copy of the fleet's executor name, or the authority's
// NotFound.
func (f *fakeAuthority) executor(name string) (*authorityv1.Executor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.executors {
		if e.GetName() == name {
			return proto.Clone(e).(*authorityv1.Executor), nil
		}
	}
	return nil, errNoExecutor(name)
}

// errNoExecutor is the authority's answer (its store's words) naming no
// executor of the fleet.
func errNoExecutor(name string) error {
	return status.Errorf(codes.NotFound, "not found: no executor %q in the fleet", name)
}

func (f *fakeAuthority) ListExecutors(ctx context.Context, _ *authorityv1.ListExecutorsRequest) (*authorityv1.ListExecutorsResponse, error) {
	f.sawCaller(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	return &authorityv1.ListExecutorsResponse{Executors: slices.Clone(f.executors)}, f.err
}

func (f *fakeAuthority) GetExecutor(ctx context.Context, req *authorityv1.GetExecutorRequest) (*authorityv1.GetExecutorResponse, error) {
	f.sawCaller(ctx)
	e, err := f.executor(req.GetName())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	if len(f.placed) > 0 {
		e.Placed = f.placed[0]
		if len(f.placed) > 1 {
			f.placed = f.placed[1:]
		}
	}
	f.mu.Unlock()
	return &authorityv1.GetExecutorResponse{Executor: e, Jobs: f.executorJobs}, f.err
}

func (f *fakeAuthority) DrainExecutor(ctx context.Context, req *authorityv1.DrainExecutorRequest) (*authorityv1.DrainExecutorResponse, error) {
	who := f.sawCaller(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains = append(f.drains, req)
	for i, e := range f.executors {
		if e.GetName() != req.GetName() {
			continue
		}
		e = proto.Clone(e).(*authorityv1.Executor)
		e.Draining = req.GetDrain()
		if e.Draining {
			e.DrainedBy, e.DrainReason, e.DrainedAt = who, req.GetReason(), timestamppb.Now()
		}
		f.executors[i] = e
		return &authorityv1.DrainExecutorResponse{Executor: proto.Clone(e).(*authorityv1.Executor)}, f.err
	}
	return nil, errNoExecutor(req.GetName())
}

// testFleet is three executors: exec-a up with 3 jobs placed, exec-b
// drained, exec-c lost.
func testFleet() []*authorityv1.Executor {
	now := time.Now()
	capacity := &authorityv1.ExecutorCapacity{MemoryBytes: 4 << 30, MemoryFreeBytes: 1 << 30, CpuMillis: 4000, CpuFreeMillis: 1500,
		DiskBytes: 100 << 30, DiskFreeBytes: 10 << 30, Jobs: 8, JobsFree: 5}
	report := &authorityv1.ExecutorReport{Version: "1.2.3", StartedAt: timestamppb.New(now.Add(-time.Hour)),
		RuntimeClasses: []typesv1.RuntimeClass{typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC},
		Capacity:       capacity, NetworkPools: []string{"10.200.0.0/16"}, Runs: []string{"j1", "j2", "j3"}}
	warm := proto.Clone(report).(*authorityv1.ExecutorReport)
	warm.WarmPools = []*authorityv1.WarmPoolReport{
		{Tenant: "dev", RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, Uid: 1000, Gid: 1000, DiskBytes: 1 << 30, ShmBytes: 64 << 20,
			Ready: 2, Target: 2, Hits: 41, Misses: 3, RefillLast: durationpb.New(95 * time.Millisecond), RefillMedian: durationpb.New(92 * time.Millisecond)},
		{Tenant: "ops", RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, DiskBytes: 1 << 30, ShmBytes: 64 << 20, Target: 1, Misses: 1,
			LastError: "no loop device"},
	}
	return []*authorityv1.Executor{
		{Name: "exec-a", Id: "spiffe://test.airlock/service/executor/exec-a", Address: "10.0.0.2:7402", State: authorityv1.ExecutorState_EXECUTOR_STATE_UP,
			JoinedAt: timestamppb.New(now.Add(-2 * time.Hour)), LastSeen: timestamppb.New(now.Add(-90 * time.Second)), Report: warm, Placed: 3},
		{Name: "exec-b", Address: "10.0.0.3:7402", State: authorityv1.ExecutorState_EXECUTOR_STATE_UP, Draining: true, DrainedBy: "operator/admin",
			DrainReason: "kernel update", DrainedAt: timestamppb.New(now.Add(-time.Minute)), LastSeen: timestamppb.New(now), Report: report},
		{Name: "exec-c", Address: "10.0.0.4:7402", State: authorityv1.ExecutorState_EXECUTOR_STATE_LOST, LastSeen: timestamppb.New(now.Add(-3 * time.Hour))},
	}
}

// editConfig saves a copy of the client config at path as edit leaves it.
func editConfig(t *testing.T, path string, edit func(*clientconfig.Config)) string {
	t.Helper()
	cfg, err := clientconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	out := filepath.Join(t.TempDir(), "client.yaml")
	if err := cfg.Save(out); err != nil {
		t.Fatal(err)
	}
	return out
}

// asFiles is the client config at path naming client/dev's certificate
// files directly: not the dev stack's, so no operator is chosen for it.
func asFiles(t *testing.T, path string) string {
	return editConfig(t, path, func(c *clientconfig.Config) {
		cert, key := pki.Paths(c.PKIDir, identity.MustParse("spiffe://"+fakeTrustDomain+"/client/dev"))
		c.TLS = &config.TLS{CA: pki.CAPath(c.PKIDir), Cert: cert, Key: key}
	})
}

// TestExecutorList: the table shows each executor's state, address,
// classes, placed jobs, free capacity and the age of its last heartbeat;
// -o json is the authority's answer.
func TestExecutorList(t *testing.T) {
	f := &fakeAuthority{executors: testFleet()}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "executor", "list")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := [][]string{
		{"NAME", "STATE", "ADDRESS", "CLASSES", "PLACED", "FREE", "JOBS", "FREE", "MEMORY", "FREE", "CPU", "WARM", "POOL", "LAST", "SEEN"},
		{"exec-a", "up", "10.0.0.2:7402", "runc,runsc", "3", "5/8", "1.0GiB/4.0GiB", "1.5/4", "2/3", "ready,", "41/45", "hits", "1m", "ago"},
		{"exec-b", "draining", "10.0.0.3:7402", "runc,runsc", "0", "5/8", "1.0GiB/4.0GiB", "1.5/4", "-", "0s", "ago"},
		{"exec-c", "lost", "10.0.0.4:7402", "-", "0", "0/0", "0B/0B", "0/0", "-", "3h", "ago"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		if got := strings.Fields(lines[i]); !slices.Equal(got, w) {
			t.Errorf("line %d: %q, want %q", i, got, w)
		}
	}
	code, out, errOut = runCLI(t, cfg, nil, "executor", "list", "-o", "json")
	if code != 0 {
		t.Fatalf("json: exit %d: %s", code, errOut)
	}
	var got authorityv1.ListExecutorsResponse
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if !proto.Equal(&got, &authorityv1.ListExecutorsResponse{Executors: f.executors}) {
		t.Errorf("json is not the authority's answer:\n%s", out)
	}
}

// TestExecutorGet shows everything, the jobs placed, and whether the
// executor can be stopped: only when it is drained and nothing is placed.
func TestExecutorGet(t *testing.T) {
	f := &fakeAuthority{executors: testFleet(), executorJobs: []string{"j1", "j2", "j3"}}
	cfg := serveFake(t, f)
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"exec-a", []string{
			"executor   exec-a\n", "id         spiffe://test.airlock/service/executor/exec-a\n", "address    10.0.0.2:7402\n", "state      up\n",
			"(1m ago)\n", "version    1.2.3, started ", "classes    runc, runsc\n",
			"capacity   jobs 5 free of 8, memory 1.0GiB free of 4.0GiB, cpu 1.5 free of 4, disk 10.0GiB free of 100.0GiB\n",
			"networks   10.200.0.0/16\n", "runs       3 held, as it reported\n",
			"warm pool  tenant dev, runc as 1000:1000, disk 1.0GiB, /dev/shm 64.0MiB: 2 of 2 ready, 41 hits, 3 misses, made in 92ms (median; last 95ms)\n",
			"warm pool  tenant ops, runc as 0:0, disk 1.0GiB, /dev/shm 64.0MiB: 0 of 1 ready, 0 hits, 1 misses; its last refill failed: no loop device\n",
			"placed     3 jobs not ended\n  j1\n  j2\n  j3\n", "safe to stop: no, not draining (airlock executor drain exec-a)\n",
		}},
		{"exec-b", []string{"state      draining since ", ", by operator/admin: kernel update\n", "safe to stop: yes (keep its data directory: it holds finished jobs' bundles until they are published)\n"}},
		{"exec-c", []string{"state      lost\n", "version    -, started -\n", "classes    -\n"}},
	} {
		code, out, errOut := runCLI(t, cfg, nil, "executor", "get", tc.name)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.name, code, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("executor get %s lacks %q:\n%s", tc.name, w, out)
			}
		}
	}
	code, out, _ := runCLI(t, cfg, nil, "executor", "get", "exec-a", "-o", "json")
	var got authorityv1.GetExecutorResponse
	if err := protojson.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.GetExecutor().GetName() != "exec-a" || len(got.GetJobs()) != 3 {
		t.Errorf("json: exit %d, %v:\n%s", code, err, out)
	}
}

// TestExecutorNotFound: the authority's NotFound is shown as it said it.
func TestExecutorNotFound(t *testing.T) {
	cfg := serveFake(t, &fakeAuthority{executors: testFleet()})
	for _, args := range [][]string{{"get", "nope"}, {"drain", "nope"}, {"undrain", "nope"}, {"drain", "nope", "--wait"}} {
		code, out, errOut := runCLI(t, cfg, nil, append([]string{"executor"}, args...)...)
		if want := "airlock: not found: no executor \"nope\" in the fleet\n"; code != 1 || errOut != want || out != "" {
			t.Errorf("executor %v: exit %d, stdout %q, stderr %q; want exit 1, %q", args, code, out, errOut, want)
		}
	}
}

// TestExecutorActsAsOperator: the executor commands act as --as, else the
// config's identity when it is an operator, else the dev stack's
// operator/admin when the config's pki_dir holds it; any other identity
// is told to pass --as operator/NAME, and no call is made.
func TestExecutorActsAsOperator(t *testing.T) {
	f := &fakeAuthority{executors: testFleet()}
	devCfg := serveFake(t, f)
	opsCfg := editConfig(t, devCfg, func(c *clientconfig.Config) { c.Identity = "operator/ops" })
	filesCfg := asFiles(t, devCfg)
	for _, tc := range []struct {
		name string
		cfg  string
		as   []string
		want string // the caller; "" for a refusal
	}{
		{"dev stack", devCfg, nil, "operator/admin"},
		{"--as", devCfg, []string{"--as", "operator/ops"}, "operator/ops"},
		{"config's operator", opsCfg, nil, "operator/ops"},
		{"config's files", filesCfg, nil, ""},
		{"--as approver", devCfg, []string{"--as", "approver/alice"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.sawCallers())
			code, _, errOut := runCLI(t, tc.cfg, nil, append(tc.as, "executor", "list")...)
			calls := f.sawCallers()[before:]
			if tc.want == "" {
				if code != 2 || !strings.Contains(errOut, "the fleet needs an operator identity") || !strings.Contains(errOut, "pass --as operator/NAME") || len(calls) != 0 {
					t.Errorf("exit %d, calls %q, stderr %q; want exit 2, no call, the operator identity asked for", code, calls, errOut)
				}
				return
			}
			if code != 0 || !slices.Equal(calls, []string{tc.want}) {
				t.Errorf("exit %d (%s), callers %q; want %q", code, errOut, calls, tc.want)
			}
		})
	}
}

// TestExecutorDrain: drain sends the reason and says how much is still
// placed; --wait says each new count on stderr until nothing is placed,
// or gives up at --timeout; undrain ends the drain.
func TestExecutorDrain(t *testing.T) {
	defer func(p time.Duration) { drainPoll = p }(drainPoll)
	drainPoll = 5 * time.Millisecond
	f := &fakeAuthority{executors: testFleet(), placed: []int64{3, 3, 2, 2, 1, 0}}
	cfg := serveFake(t, f)

	code, out, errOut := runCLI(t, cfg, nil, "executor", "drain", "exec-a", "--reason", "kernel update")
	if want := "executor exec-a is draining: no new work is placed on it; 3 jobs still placed (drain --wait waits for them)\n"; code != 0 || out != want {
		t.Errorf("drain: exit %d, stdout %q (stderr %q), want %q", code, out, errOut, want)
	}
	if d := f.drains[0]; d.GetName() != "exec-a" || !d.GetDrain() || d.GetReason() != "kernel update" {
		t.Errorf("drain request %v", d)
	}

	code, out, errOut = runCLI(t, cfg, nil, "executor", "drain", "exec-a", "--wait")
	if code != 0 {
		t.Fatalf("drain --wait: exit %d: %s", code, errOut)
	}
	if want := "executor exec-a: 3 jobs still placed\nexecutor exec-a: 2 jobs still placed\nexecutor exec-a: 1 job still placed\n"; errOut != want {
		t.Errorf("drain --wait progress %q, want %q", errOut, want)
	}
	if want := "executor exec-a is drained: nothing placed on it; it can be stopped\n"; out != want {
		t.Errorf("drain --wait says %q, want %q", out, want)
	}

	f.placed = []int64{2}
	code, out, errOut = runCLI(t, cfg, nil, "executor", "drain", "exec-a", "--wait", "--timeout", "30ms")
	if want := "airlock: executor exec-a: 2 jobs still placed after 30ms; it stays draining\n"; code != 1 || out != "" || !strings.HasSuffix(errOut, want) {
		t.Errorf("drain --wait --timeout: exit %d, stdout %q, stderr %q; want exit 1 ending %q", code, out, errOut, want)
	}

	f.placed = []int64{0}
	code, out, _ = runCLI(t, cfg, nil, "executor", "drain", "exec-a", "--wait", "-o", "json")
	var got authorityv1.DrainExecutorResponse
	if err := protojson.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.GetExecutor().GetPlaced() != 0 || !got.GetExecutor().GetDraining() {
		t.Errorf("drain --wait -o json: exit %d, %v:\n%s", code, err, out)
	}

	code, out, _ = runCLI(t, cfg, nil, "executor", "undrain", "exec-b")
	if want := "executor exec-b: not draining; new work may be placed on it (up)\n"; code != 0 || out != want {
		t.Errorf("undrain: exit %d, %q, want %q", code, out, want)
	}
	if d := f.drains[len(f.drains)-1]; d.GetName() != "exec-b" || d.GetDrain() {
		t.Errorf("undrain request %v", d)
	}
	if code, _, errOut := runCLI(t, cfg, nil, "executor", "drain", "exec-a", "--timeout", "1s"); code != 2 || !strings.Contains(errOut, "--timeout goes with --wait") {
		t.Errorf("--timeout without --wait: exit %d, %q", code, errOut)
	}
}

// hostileFleet is one executor whose every text is s, with a job placed
// whose id is s.
func hostileFleet(s string) *fakeAuthority {
	return &fakeAuthority{
		executors: []*authorityv1.Executor{{Name: s, Id: s, Address: s, State: authorityv1.ExecutorState_EXECUTOR_STATE_UP,
			Draining: true, DrainedBy: s, DrainReason: s, Placed: 1,
			Report: &authorityv1.ExecutorReport{Version: s, NetworkPools: []string{s, s},
				WarmPools: []*authorityv1.WarmPoolReport{{Tenant: s, Target: 1, LastError: s}}}}},
		executorJobs: []string{s},
		placed:       []int64{1},
	}
}

// TestExecutorOutputEscapesEveryField: what an executor reports, and the
// names the authority gives, are shown escaped, in as many lines as
// benign text takes.
func TestExecutorOutputEscapesEveryField(t *testing.T) {
	hostileCfg, benignCfg := serveFake(t, hostileFleet(hostile)), serveFake(t, hostileFleet("ok"))
	for _, args := range [][]string{{"executor", "list"}, {"executor", "get"}, {"executor", "drain"}, {"executor", "undrain"}, {"status"}} {
		name := strings.Join(args, " ")
		t.Run(name, func(t *testing.T) {
			run := func(cfg, s string) (int, string, string) {
				if len(args) > 1 && args[1] != "list" {
					return runCLI(t, cfg, nil, append(args, s)...)
				}
				return runCLI(t, cfg, nil, args...)
			}
			code, out, errOut := run(hostileCfg, hostile)
			if code != 0 && name != "status" { // status: the fake has no publisher
				t.Fatalf("exit %d: %s", code, errOut)
			}
			checkShown(t, name, out)
			checkShown(t, name+" stderr", errOut)
			if !strings.Contains(out, hostileShown) {
				t.Errorf("output does not show the field escaped as %s:\n%s", hostileShown, out)
			}
			_, benign, _ := run(benignCfg, "ok")
			if got, want := strings.Count(out, "\n"), strings.Count(benign, "\n"); got != want {
				t.Errorf("%d lines, want %d as with benign text:\n%s\n%s", got, want, out, benign)
			}
		})
	}
}

// TestStatusFleet: status shows the fleet to an operator (the dev stack's,
// chosen for it), and to anyone else says in one line that it needs one,
// failing for that no more than it did; the executor it checks itself is
// the client config's, so labelled, and left out when the config names
// none.
func TestStatusFleet(t *testing.T) {
	f := &fakeAuthority{executors: testFleet()}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "status")
	// The fake serves no publisher: that alone fails the command.
	if code != 1 || errOut != "airlock: publisher is UNKNOWN\n" {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"authority  ", "\nfleet: 3 executors: 2 up, 1 lost; 1 draining\nNAME ", "\nexec-a ", "\nexec-b ", "\nexec-c "} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "executor (client config)") {
		t.Errorf("status checks an executor the client config does not name:\n%s", out)
	}

	code, out, errOut = runCLI(t, cfg, nil, "status", "-o", "json")
	var got struct {
		Services []serviceHealth
		Fleet    json.RawMessage
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 1 {
		t.Fatalf("json: exit %d, %v (%s):\n%s", code, err, errOut, out)
	}
	var fleet authorityv1.ListExecutorsResponse
	if err := protojson.Unmarshal(got.Fleet, &fleet); err != nil || len(fleet.GetExecutors()) != 3 || len(got.Services) != 2 {
		t.Errorf("json: %v, %d executors, %d services:\n%s", err, len(fleet.GetExecutors()), len(got.Services), out)
	}

	withExecutor := editConfig(t, asFiles(t, cfg), func(c *clientconfig.Config) { c.Executor = c.Authority })
	before := len(f.sawCallers())
	code, out, errOut = runCLI(t, withExecutor, nil, "status")
	if code != 1 || !strings.HasPrefix(errOut, "airlock: executor is UNREACHABLE") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"\nexecutor (client config)  ", "\nfleet: not shown: it needs an operator identity (--as operator/NAME), and this is client/dev\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("status as a client lacks %q:\n%s", want, out)
		}
	}
	if calls := f.sawCallers()[before:]; len(calls) != 0 {
		t.Errorf("status as a client called the fleet as %q", calls)
	}
}

// TestJobGetNamesItsExecutor: job get and session get say which executor
// the job is placed on, or that it is not placed yet.
func TestJobGetNamesItsExecutor(t *testing.T) {
	for _, tc := range []struct {
		job  *authorityv1.Job
		want string
	}{
		{&authorityv1.Job{JobId: "j1", State: authorityv1.JobState_JOB_STATE_RUNNING, Executor: "exec-a"}, "executor   exec-a\n"},
		{&authorityv1.Job{JobId: "j1", State: authorityv1.JobState_JOB_STATE_QUEUED}, "executor   not placed yet\n"},
		{&authorityv1.Job{JobId: "j1", State: authorityv1.JobState_JOB_STATE_CANCELLED}, "executor   never placed\n"},
	} {
		f := &fakeAuthority{job: tc.job, session: &authorityv1.GetSessionResponse{Session: tc.job}}
		cfg := serveFake(t, f)
		for _, cmd := range []string{"job", "session"} {
			code, out, errOut := runCLI(t, cfg, nil, cmd, "get", "j1")
			if code != 0 || !strings.Contains(out, tc.want) {
				t.Errorf("%s get (%s): exit %d (%s), lacks %q:\n%s", cmd, tc.job.GetState(), code, errOut, tc.want, out)
			}
		}
	}
}
