//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/delegate"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/nettest"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/test/pgtest"
)

// The fleet's timing: executors heartbeat every second; a replica calls
// one lost after lostAfter without one. An executor's config names one
// authority address, so it heartbeats to one replica: while that replica
// is down the other hears nothing from it and, after lostAfter, ends its
// jobs executor_lost (in production the address would be a load balancer's
// in front of the replicas). Here every executor heartbeats to replica b,
// and a is the one killed.
const (
	fleetHeartbeat  = time.Second
	fleetLostAfter  = 5 * time.Second
	fleetFenceAfter = 4 * time.Second
	// fleetClaimTTL is how long a killed replica's claims on jobs last
	// before the other replica takes them (the jobs package's ClaimTTL).
	fleetClaimTTL = 15 * time.Second
	// fleetExecutorPort is where each executor listens, on its own host.
	fleetExecutorPort = "7443"
	// fleetHeldTenant is a second tenant, allowed one running job at a
	// time: its other jobs are placed on an executor at submission but
	// wait at the authority's gate, never handed over.
	fleetHeldTenant = "held"
)

// fleetProc is one process of the fleet: an authority replica (on this
// host) or an executor (on a host of its own, a network namespace).
type fleetProc struct {
	name    string // "a", "b", or the executor's fleet name
	argv    []string
	config  string
	log     string
	dataDir string
	// addr is where the others reach it: for a replica the loopback
	// address of its port, for an executor its host's address.
	addr string
	host *nettest.Host // executors only
	// cgroupParent is where an executor makes its jobs' cgroups.
	cgroupParent string
	proc         *serviceProc
}

// fleet is a stack (dev up's PKI, git server, publisher and tenant) whose
// authority and executor are replaced by two replicas on PostgreSQL and
// three executors, each on its own host.
type fleet struct {
	*stack
	// t is TestFleet's: the fleet's processes live as long as it.
	t *testing.T
	// db is the replicas' PostgreSQL schema.
	db        *sql.DB
	replicas  map[string]*fleetProc
	executors map[string]*fleetProc
	// operator is operator/admin's client of replica a, the one the CLI's
	// config names, as `airlock executor` would be (a replica places on a
	// read of the fleet up to 500ms old, so for that long a drain through
	// one replica is not seen by another's placements); dev is
	// client/dev's of b.
	operator, dev authorityv1.AuthorityServiceClient
}

// TestFleet runs a fleet on one machine — two authority replicas on one
// PostgreSQL, three executors each in its own network namespace as its
// own host (e1 runs runc only; e2 and e3 runc and runsc; e3 at most two
// jobs) — and checks placement, no double dispatch while a replica is
// killed, an executor killed mid-run, a drain, and a grant for one
// executor refused by another.
func TestFleet(t *testing.T) {
	f := startFleet(t)
	t.Run("placement by class and capacity", f.testPlacement)
	t.Run("no job twice while a replica is killed", f.testReplicaKilled)
	t.Run("executor killed mid-run", f.testExecutorLost)
	t.Run("drain then stop", f.testDrain)
	t.Run("grant for another executor", f.testGrantForAnother)
}

// startFleet builds the fleet and registers its teardown.
func startFleet(t *testing.T) *fleet {
	t.Helper()
	dsn, db := pgtest.Schema(t)
	self := map[int]bool{}
	var f *fleet
	t.Cleanup(func() {
		reapStrays(t, self, func(pid int, cmdline string) bool { return f != nil && f.owns(pid, cmdline) })
	})
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	for _, p := range s.services {
		self[p.PID] = true
	}
	f = &fleet{stack: s, t: t, db: db, replicas: map[string]*fleetProc{}, executors: map[string]*fleetProc{}}
	t.Cleanup(func() { f.checkHostClean(t) })

	// dev up's authority and executor make way for the fleet's.
	for _, name := range []string{identity.ServiceAuthority, identity.ServiceExecutor} {
		pid := s.services[name].PID
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		reapClean(t, pid, "dev up's "+name)
	}
	for _, id := range []string{"client/" + fleetHeldTenant, "service/executor/e1", "service/executor/e2", "service/executor/e3"} {
		if res := s.airlock(t, "pki", "issue", "--dir", s.pkiDir, "--id", id); res.code != 0 {
			t.Fatalf("pki issue %s: exit %d\n%s", id, res.code, res.stderr)
		}
	}

	// Replica a keeps dev up's port, so the CLI's config reaches it; both
	// listen on every address, so each executor reaches them through the
	// host's end of its own link.
	_, portA, _ := net.SplitHostPort(s.services[identity.ServiceAuthority].Address)
	portB := freePort(t)
	for name, port := range map[string]string{"a": portA, "b": portB} {
		f.replicas[name] = f.replicaConfig(t, name, port, dsn)
	}
	for _, name := range []string{"a", "b"} {
		f.startReplica(t, name)
	}
	f.operator = authorityv1.NewAuthorityServiceClient(f.dialReplica(t, "a", "operator/admin"))
	f.dev = authorityv1.NewAuthorityServiceClient(f.dialReplica(t, "b", "client/dev"))

	// Every executor heartbeats to replica b; a places on what b heard,
	// through the store.
	base := nettest.Subnet(netip.MustParsePrefix("198.19.0.0/16"), 28, os.Getpid()%4096)
	for i, name := range []string{"e1", "e2", "e3"} {
		host := nettest.Start(t, nettest.Config{
			Name:   fmt.Sprintf("fl%d%s", os.Getpid()%100000, name),
			Prefix: nettest.Subnet(base, 30, i),
		})
		_, port, _ := net.SplitHostPort(f.replicas["b"].addr)
		f.executors[name] = f.executorConfig(t, name, host, net.JoinHostPort(host.HostIP.String(), port))
	}
	for _, name := range []string{"e1", "e2", "e3"} {
		f.startExecutor(t, name)
	}
	return f
}

// replicaConfig writes authority replica name's config: dev up's, on
// PostgreSQL, with its own data directory and the fleet's timing.
func (f *fleet) replicaConfig(t *testing.T, name, port, dsn string) *fleetProc {
	t.Helper()
	dir := filepath.Join(f.dir, "fleet", "authority-"+name)
	p := &fleetProc{name: name, config: filepath.Join(dir, "config.yaml"), log: filepath.Join(dir, "authority.log"),
		dataDir: filepath.Join(dir, "data"), addr: net.JoinHostPort("127.0.0.1", port)}
	p.argv = []string{bin(identity.ServiceAuthority), "--config", p.config}
	c := readYAMLMap(t, f.services[identity.ServiceAuthority].Config)
	c["listen"] = net.JoinHostPort("0.0.0.0", port)
	c["data_dir"] = p.dataDir
	c["replica"] = name
	c["fleet"] = map[string]any{"heartbeat_interval": fleetHeartbeat.String(), "lost_after": fleetLostAfter.String()}
	c["store"] = map[string]any{"driver": "postgres", "dsn": dsn}
	tenants := c["tenants"].(map[string]any)
	held := map[string]any{}
	for k, v := range tenants["dev"].(map[string]any) {
		held[k] = v
	}
	held["clients"] = []string{"client/" + fleetHeldTenant}
	held["quota"] = map[string]any{"running_jobs": 1}
	tenants[fleetHeldTenant] = held
	writeYAMLFile(t, p.config, c)
	return p
}

// executorConfig writes executor name's config: dev up's, with its own
// identity, data directory and address on host, heartbeating to
// authority; e1 without runsc, e3 with room for two jobs.
func (f *fleet) executorConfig(t *testing.T, name string, host *nettest.Host, authority string) *fleetProc {
	t.Helper()
	dir := filepath.Join(f.dir, "fleet", name)
	p := &fleetProc{name: name, config: filepath.Join(dir, "config.yaml"), log: filepath.Join(dir, "executor.log"),
		dataDir: filepath.Join(dir, "data"), addr: net.JoinHostPort(host.IP.String(), fleetExecutorPort), host: host}
	sum := sha256.Sum256([]byte(p.dataDir))
	p.argv = append(delegate.ReadHost().Prefix("airlock-fleet-"+hex.EncodeToString(sum[:6])),
		bin(identity.ServiceExecutor), "--config", p.config)
	c := readYAMLMap(t, f.services[identity.ServiceExecutor].Config)
	c["listen"] = p.addr
	c["data_dir"] = p.dataDir
	tls := c["tls"].(map[string]any)
	tls["cert"] = filepath.Join(f.pkiDir, "service", "executor", name+".crt")
	tls["key"] = filepath.Join(f.pkiDir, "service", "executor", name+".key")
	c["authority"].(map[string]any)["address"] = authority
	c["fleet"] = map[string]any{"fence_after": fleetFenceAfter.String()}
	if name == "e1" {
		sandbox := c["sandbox"].(map[string]any)
		delete(sandbox, "runsc")
		delete(sandbox, "runsc_self_check_cache")
	}
	if name == "e3" {
		c["capacity"] = map[string]any{"jobs": 2}
	}
	writeYAMLFile(t, p.config, c)
	return p
}

func readYAMLMap(t testing.TB, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func writeYAMLFile(t testing.TB, path string, v any) {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a TCP port free on every address right now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// dialReplica connects to replica name as the dev identity as, retrying
// quickly while it restarts.
func (f *fleet) dialReplica(t *testing.T, name, as string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpcclient.Dial(f.replicas[name].addr, f.source(t, as), identity.Service(trustDomain, identity.ServiceAuthority),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// startReplica starts authority replica name and returns once it answers.
func (f *fleet) startReplica(t *testing.T, name string) {
	t.Helper()
	r := f.replicas[name]
	r.proc = startProcess(t, f.t, "authority-"+name, r.argv, r.log, nil)
	client := authorityv1.NewAuthorityServiceClient(f.dialReplica(t, name, "operator/admin"))
	r.proc.waitReady(t, r.dataDir, r.log, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := client.ListExecutors(ctx, &authorityv1.ListExecutorsRequest{})
		return err
	})
}

// startExecutor starts executor name on its host and returns once the
// fleet has it up.
func (f *fleet) startExecutor(t *testing.T, name string) {
	t.Helper()
	e := f.executors[name]
	// Before the start: the executor's own clock reading comes after.
	start := time.Now()
	e.proc = startProcess(t, f.t, name, e.argv, e.log, e.host.Do)
	defer func() { e.cgroupParent = f.cgroupParent(name) }()
	e.proc.waitReady(t, e.dataDir, e.log, 100*time.Millisecond, func() error {
		// Up as this process reported itself: an executor stopped a
		// moment ago is still up on record until it is lost.
		x := f.executor(t, name)
		if x.GetState() != authorityv1.ExecutorState_EXECUTOR_STATE_UP || x.GetAddress() != e.addr ||
			x.GetReport().GetStartedAt().AsTime().Before(start) {
			return fmt.Errorf("executor %s is %v", name, x)
		}
		return nil
	})
	t.Logf("executor %s up %v after its start", name, time.Since(start).Round(time.Millisecond))
}

// executor is the fleet's record of executor name (nil if it has none).
// Going through GetExecutor is the one place to swap for `airlock
// executor get -o json`.
func (f *fleet) executor(t *testing.T, name string) *authorityv1.Executor {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := f.operator.GetExecutor(ctx, &authorityv1.GetExecutorRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		t.Fatalf("GetExecutor %s: %v", name, err)
	}
	return resp.GetExecutor()
}

// drain drains executor name (or ends its drain) as operator/admin: the
// one place to swap for `airlock executor drain|undrain`.
func (f *fleet) drain(t *testing.T, name string, on bool, why string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := f.operator.DrainExecutor(ctx, &authorityv1.DrainExecutorRequest{Name: name, Drain: on, Reason: why})
	if err != nil {
		t.Fatalf("DrainExecutor %s (%v): %v", name, on, err)
	}
	if resp.GetExecutor().GetDraining() != on {
		t.Fatalf("DrainExecutor %s (%v) answered %v", name, on, resp.GetExecutor())
	}
}

// only drains every executor but name, so what is submitted next is
// placed there, and returns what ends those drains.
func (f *fleet) only(t *testing.T, name string) func() {
	t.Helper()
	var others []string
	for other := range f.executors {
		if other != name {
			others = append(others, other)
			f.drain(t, other, true, "fleet test: place on "+name)
		}
	}
	return func() {
		t.Helper()
		for _, other := range others {
			f.drain(t, other, false, "")
		}
	}
}

// submit submits a job through the CLI (with args before the command, such
// as --runtime) and returns it.
func (f *fleet) submit(t *testing.T, key string, args ...string) *authorityv1.Job {
	t.Helper()
	res := f.airlock(t, append([]string{"job", "submit", "--repo", "sample", "--idempotency-key", key, "-o", "json"}, args...)...)
	if res.code != 0 {
		t.Fatalf("job submit %s: exit %d\n%s", key, res.code, res.stderr)
	}
	j := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), j); err != nil {
		t.Fatalf("job submit -o json: %v\n%s", err, res.stdout)
	}
	return j
}

// job reads job id through client (f.dev when nil).
func (f *fleet) job(t *testing.T, client authorityv1.AuthorityServiceClient, id string) *authorityv1.Job {
	t.Helper()
	if client == nil {
		client = f.dev
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("GetJob %s: %v", id, err)
	}
	return resp.GetJob()
}

// waitEnded waits up to d for each job to end and returns them.
func (f *fleet) waitEnded(t *testing.T, client authorityv1.AuthorityServiceClient, d time.Duration, ids ...string) []*authorityv1.Job {
	t.Helper()
	if client == nil {
		client = f.dev
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	out := make([]*authorityv1.Job, len(ids))
	for {
		left := 0
		for i, id := range ids {
			if out[i] != nil && jobEnded(out[i]) {
				continue
			}
			if resp, err := client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: id}); err == nil {
				out[i] = resp.GetJob()
			}
			if out[i] == nil || !jobEnded(out[i]) {
				left++
			}
		}
		if left == 0 {
			return out
		}
		select {
		case <-ctx.Done():
			// Every job left, as the store has it, to say where it stuck.
			for i, id := range ids {
				if out[i] == nil || !jobEnded(out[i]) {
					t.Errorf("job %s did not end within %v: %s", id, d, f.jobRow(id))
				}
			}
			t.FailNow()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// jobRow is job id's row in the store, for a failure's message.
func (f *fleet) jobRow(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var state, message, executor, claimedBy string
	var claimExpires, dispatched, created, grantExpires sql.NullInt64
	err := f.db.QueryRowContext(ctx, `SELECT state, message, executor, claimed_by, claim_expires_at, dispatched_at, created_at, grant_expires_at
		FROM jobs WHERE id = $1`, id).Scan(&state, &message, &executor, &claimedBy, &claimExpires, &dispatched, &created, &grantExpires)
	if err != nil {
		return "store: " + err.Error()
	}
	at := func(v sql.NullInt64) string {
		if !v.Valid || v.Int64 == 0 {
			return "-"
		}
		return time.UnixMicro(v.Int64).UTC().Format("15:04:05.000")
	}
	return fmt.Sprintf("state %s, message %q, executor %q, claimed by %q until %s, dispatched %s, created %s, grant until %s, now %s, runs on %v",
		state, message, executor, claimedBy, at(claimExpires), at(dispatched), at(created), at(grantExpires), time.Now().UTC().Format("15:04:05.000"), f.runsOf(id))
}

func jobEnded(j *authorityv1.Job) bool {
	switch j.GetState() {
	case authorityv1.JobState_JOB_STATE_FINISHED, authorityv1.JobState_JOB_STATE_FAILED, authorityv1.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

// checkFinished fails for each job that did not finish.
func checkFinished(t *testing.T, jobs ...*authorityv1.Job) {
	t.Helper()
	for _, j := range jobs {
		if j.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || j.GetResult().GetExitCode() != 0 {
			t.Errorf("job %s on %q ended %v (exit %d): %s", j.GetJobId(), j.GetExecutor(), j.GetState(), j.GetResult().GetExitCode(), j.GetMessage())
		}
	}
}

// runsOf says which executors have a run directory for job id.
func (f *fleet) runsOf(id string) []string {
	var on []string
	for name, e := range f.executors {
		if _, err := os.Stat(filepath.Join(e.dataDir, "runs", id)); err == nil {
			on = append(on, name)
		}
	}
	slices.Sort(on)
	return on
}

// cgroupParent is the cgroup under which executor name makes its jobs'
// (as executorCgroupParent for dev up's).
func (f *fleet) cgroupParent(name string) string {
	e := f.executors[name]
	sum := sha256.Sum256([]byte(e.dataDir))
	parent := "/airlock/" + hex.EncodeToString(sum[:6])
	if cgroupV2() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", e.proc.pid))
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if base, ok := strings.CutPrefix(line, "0::"); ok {
				return filepath.Join(strings.TrimSuffix(base, "/supervisor"), parent)
			}
		}
	}
	return parent
}

// testPlacement: runsc jobs never go to e1, which lacks runsc; e3 never
// runs more than its two; every executor gets work.
func (f *fleet) testPlacement(t *testing.T) {
	const runsc, runc = 6, 10
	parent := f.cgroupParent("e3")
	var most atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if k := int64(liveJobs(parent, "")); k > most.Load() {
				most.Store(k)
			}
		}
	}()
	ids := make([]string, runsc+runc)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			class := "runc"
			if i < runsc {
				class = "runsc"
			}
			ids[i] = f.submit(t, fmt.Sprintf("place-%d", i), "--runtime", class, "--", "sleep", "6").GetJobId()
		}()
	}
	wg.Wait()
	jobs := f.waitEnded(t, nil, 2*time.Minute, ids...)
	close(stop)
	<-watched
	checkFinished(t, jobs...)
	per := map[string]int{}
	for i, j := range jobs {
		per[j.GetExecutor()]++
		if i < runsc && (j.GetExecutor() == "e1" || j.GetResult().GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC) {
			t.Errorf("runsc job %s ran on %q as %v", j.GetJobId(), j.GetExecutor(), j.GetResult().GetRuntimeClass())
		}
		if on := f.runsOf(j.GetJobId()); len(on) != 1 || on[0] != j.GetExecutor() {
			t.Errorf("job %s placed on %q has runs on %v", j.GetJobId(), j.GetExecutor(), on)
		}
	}
	for name := range f.executors {
		if per[name] == 0 {
			t.Errorf("executor %s got none of %d jobs: %v", name, len(jobs), per)
		}
	}
	if c := f.executor(t, "e3").GetReport().GetCapacity(); c.GetJobs() != 2 {
		t.Errorf("e3 reports room for %d jobs, want its capacity.jobs, 2", c.GetJobs())
	}
	if m := most.Load(); m > 2 || m == 0 {
		t.Errorf("e3 (capacity.jobs 2) ran at most %d jobs at once, want 1 or 2", m)
	}
	t.Logf("jobs per executor %v; e3 ran at most %d at once", per, most.Load())
}

// placedOn finds the executor an audit reason names ("placed on executor
// NAME").
var placedOn = regexp.MustCompile(`placed on executor ([a-z0-9_.-]+)`)

// testReplicaKilled: 200 jobs submitted at once, half to each replica,
// while replica a is SIGKILLed and started again, each run once.
func (f *fleet) testReplicaKilled(t *testing.T) {
	const n, killAt = 200, 60
	clients := map[string]authorityv1.AuthorityServiceClient{
		"a": authorityv1.NewAuthorityServiceClient(f.dialReplica(t, "a", "client/dev")),
		"b": f.dev,
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ids := make([]string, n)
	var submitted atomic.Int64
	killed := make(chan struct{})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c := clients[[]string{"a", "b"}[i%2]]
			req := &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: fmt.Sprintf("crowd-%d", i),
				Spec: &authorityv1.JobSpec{Repository: "sample", Revision: "main", Command: []string{"sh", "-c", "echo $0", fmt.Sprint(i)}}}
			for attempt := 0; ; attempt++ {
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := c.SubmitJob(actx, req)
				acancel()
				if err == nil {
					ids[i] = resp.GetJob().GetJobId()
					break
				}
				if ctx.Err() != nil {
					t.Errorf("submit %d: %v (after %d attempts)", i, err, attempt+1)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			if submitted.Add(1) == killAt {
				close(killed)
			}
		}()
	}
	<-killed
	a := f.replicas["a"]
	killService(t, f.stack, a.proc, true)
	t0 := time.Now()
	// a stays down until b has taken every unfinished job a claimed.
	held := f.claimedBy(t, "a")
	if len(held) == 0 {
		t.Errorf("replica a held no unfinished job when it was killed: no takeover to see")
	}
	for deadline := time.Now().Add(fleetClaimTTL + 15*time.Second); len(f.claimedBy(t, "a")) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("jobs %v still claimed by the killed replica a %v after its kill", f.claimedBy(t, "a"), time.Since(t0))
		}
	}
	taken := 0
	for _, id := range held {
		if slices.Contains(f.claimedBy(t, "b"), id) {
			taken++
		}
	}
	t.Logf("replica a killed after %d submissions holding %d unfinished jobs; b took them within %v (%d still unfinished then)",
		killAt, len(held), time.Since(t0).Round(time.Millisecond), taken)
	f.startReplica(t, "a")
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	jobs := f.waitEnded(t, nil, 2*time.Minute, ids...)
	checkFinished(t, jobs...)
	per := map[string]int{}
	for _, j := range jobs {
		per[j.GetExecutor()]++
		if on := f.runsOf(j.GetJobId()); len(on) != 1 || on[0] != j.GetExecutor() {
			t.Errorf("job %s, placed on %q, has runs on %v: want exactly one, there", j.GetJobId(), j.GetExecutor(), on)
		}
	}
	t.Logf("jobs per executor: %v", per)

	// The log: each job granted once, and the last executor any entry
	// placed it on is the one it ran on.
	byJob := map[string]*authorityv1.Job{}
	for _, j := range jobs {
		byJob[j.GetJobId()] = j
	}
	granted, placed := map[string]int{}, map[string][]string{}
	whys := map[string]int{}
	for _, ev := range f.auditEvents(t) {
		if ev.GetKind() == "executor.lost" {
			t.Errorf("an executor was lost while replica a was down: %s %s", ev.GetSubject(), ev.GetReason())
		}
		if byJob[ev.GetJobId()] == nil || (ev.GetKind() != "job.granted" && ev.GetKind() != "job.placed") {
			continue
		}
		if ev.GetKind() == "job.granted" {
			granted[ev.GetJobId()]++
			if _, why, ok := strings.Cut(ev.GetReason(), "placed on no executor yet"); ok {
				why, _, _ = strings.Cut(why, ";")
				whys["unplaced at submission"+why]++
			}
		}
		if m := placedOn.FindStringSubmatch(ev.GetReason()); m != nil {
			placed[ev.GetJobId()] = append(placed[ev.GetJobId()], m[1])
			if ev.GetKind() == "job.placed" {
				why, _, _ := strings.Cut(ev.GetReason()[len(m[0]):], ";")
				whys["placed at dispatch"+strings.ReplaceAll(why, m[1], "X")]++
			}
		}
	}
	moved := 0
	for id, j := range byJob {
		if granted[id] != 1 {
			t.Errorf("job %s: %d job.granted entries, want 1", id, granted[id])
		}
		p := placed[id]
		if len(p) == 0 || p[len(p)-1] != j.GetExecutor() {
			t.Errorf("job %s ran on %q, the log places it on %v", id, j.GetExecutor(), p)
		}
		if len(p) > 1 {
			moved++
		}
	}
	t.Logf("%d jobs placed more than once before their dispatch, why: %v", moved, whys)
}

// claimedBy lists the unfinished jobs replica holds, from the store.
func (f *fleet) claimedBy(t *testing.T, replica string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rows, err := f.db.QueryContext(ctx, "SELECT id FROM jobs WHERE claimed_by = $1 AND state IN ('queued', 'staging', 'running')", replica)
	if err != nil {
		t.Fatalf("read the claims: %v", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// auditEvents reads the whole audit log as approver/alice, an auditor.
func (f *fleet) auditEvents(t *testing.T) []*authorityv1.AuditEvent {
	t.Helper()
	client := authorityv1.NewAuthorityServiceClient(f.dialReplica(t, "b", "approver/alice"))
	var out []*authorityv1.AuditEvent
	token := ""
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		resp, err := client.ListAuditEvents(ctx, &authorityv1.ListAuditEventsRequest{PageSize: 1000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("ListAuditEvents: %v", err)
		}
		out = append(out, resp.GetEvents()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}

// testExecutorLost: e2, killed with a job running, a session open and two
// jobs placed on it but held at the gate, is lost; the running job ends
// executor_lost, the held ones run elsewhere, the session waits suspended
// and runs again when e2 is back.
func (f *fleet) testExecutorLost(t *testing.T) {
	held := authorityv1.NewAuthorityServiceClient(f.dialReplica(t, "b", "client/"+fleetHeldTenant))
	heldArgs := []string{"--as", "client/" + fleetHeldTenant, "--tenant", fleetHeldTenant}
	undrain := f.only(t, "e2")
	long := f.submit(t, "lost-long", append(heldArgs, "--", "sleep", "600")...)
	var queued []*authorityv1.Job
	for i := range 2 {
		queued = append(queued, f.submit(t, fmt.Sprintf("lost-queued-%d", i), append(heldArgs, "--", "true")...))
	}
	res := f.airlock(t, "session", "create", "--repo", "sample", "--idle-timeout", "10m", "-o", "json")
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil {
		t.Fatalf("session create -o json: %v\n%s", err, res.stdout)
	}
	undrain()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	long = waitJob(ctx, t, held, long.GetJobId(), func(j *authorityv1.Job) bool { return j.GetState() == authorityv1.JobState_JOB_STATE_RUNNING })
	for _, j := range append([]*authorityv1.Job{long, sess}, queued...) {
		if j.GetExecutor() != "e2" {
			t.Fatalf("job %s is on %q, want e2", j.GetJobId(), j.GetExecutor())
		}
	}
	for _, q := range queued {
		if j := f.job(t, held, q.GetJobId()); j.GetState() != authorityv1.JobState_JOB_STATE_QUEUED {
			t.Fatalf("held job %s is %v (%s), want queued at the gate", j.GetJobId(), j.GetState(), j.GetMessage())
		}
	}
	exec := func(execID string, argv ...string) result {
		t.Helper()
		return f.airlock(t, append([]string{"session", "exec", sess.GetJobId(), "--exec-id", execID, "--"}, argv...)...)
	}
	if r := exec("before", "sh", "-c", "echo before > /work/mark"); r.code != 0 {
		t.Fatalf("exec before the kill: exit %d\n%s", r.code, r.stderr)
	}

	getSession := func() *authorityv1.GetSessionResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := f.dev.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: sess.GetJobId()})
		if err != nil {
			t.Fatalf("GetSession: %v", err)
		}
		return resp
	}
	e2 := f.executors["e2"]
	killService(t, f.stack, e2.proc, false)
	killedAt := time.Now()
	// Not yet lost, and not answering: the session is not said to be
	// suspended, nor to be not suspended.
	if g := getSession(); time.Since(killedAt)+fleetHeartbeat < fleetLostAfter && (g.GetSuspended() || !g.GetSuspensionUnknown()) {
		t.Errorf("session on an e2 just killed: suspended %v, unknown %v; want unknown", g.GetSuspended(), g.GetSuspensionUnknown())
	}
	lostCtx, lostCancel := context.WithTimeout(t.Context(), fleetLostAfter+30*time.Second)
	defer lostCancel()
	long = waitJob(lostCtx, t, held, long.GetJobId(), jobEnded)
	t.Logf("the running job ended %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	if long.GetState() != authorityv1.JobState_JOB_STATE_FAILED || long.GetResult().GetReason() != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_LOST ||
		!strings.HasPrefix(long.GetMessage(), "executor_lost: ") {
		t.Errorf("the job running on e2 ended %v, %v: %q; want FAILED, EXECUTOR_LOST, executor_lost: ...", long.GetState(), long.GetResult().GetReason(), long.GetMessage())
	}
	if x := f.executor(t, "e2"); x.GetState() != authorityv1.ExecutorState_EXECUTOR_STATE_LOST {
		t.Errorf("e2 is %v, want lost", x.GetState())
	}
	var lostEvents, jobLost int
	for _, ev := range f.auditEvents(t) {
		if ev.GetKind() == "executor.lost" && strings.HasSuffix(ev.GetSubject(), "e2") {
			lostEvents++
		}
		if ev.GetKind() == "job.executor_lost" && ev.GetJobId() == long.GetJobId() {
			jobLost++
		}
	}
	if lostEvents != 1 || jobLost != 1 {
		t.Errorf("the log has %d executor.lost entries for e2 and %d job.executor_lost for job %s, want 1 each", lostEvents, jobLost, long.GetJobId())
	}
	for _, j := range f.waitEnded(t, held, time.Minute, queued[0].GetJobId(), queued[1].GetJobId()) {
		checkFinished(t, j)
		if j.GetExecutor() == "e2" || slices.Contains(f.runsOf(j.GetJobId()), "e2") {
			t.Errorf("held job %s ran on %q (runs on %v), want elsewhere", j.GetJobId(), j.GetExecutor(), f.runsOf(j.GetJobId()))
		}
	}
	if g := getSession(); g.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING || !g.GetSuspended() ||
		g.GetSuspendReason() != typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_LOST {
		t.Errorf("session on lost e2: %v, suspended %v (%v), want running, suspended, EXECUTOR_LOST", g.GetSession().GetState(), g.GetSuspended(), g.GetSuspendReason())
	}

	f.startExecutor(t, "e2")
	// Back once its heartbeat is heard: until then the authority cannot
	// ask it how its sessions are, and does not resume them.
	for deadline := time.Now().Add(60 * time.Second); f.executor(t, "e2").GetState() != authorityv1.ExecutorState_EXECUTOR_STATE_UP; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("e2 is %v a minute after its restart, want up", f.executor(t, "e2").GetState())
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		g := getSession()
		if !g.GetSuspended() && g.GetSession().GetState() == authorityv1.JobState_JOB_STATE_RUNNING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session after e2 returned: %v, suspended %v (%v); want resumed", g.GetSession().GetState(), g.GetSuspended(), g.GetSuspendReason())
		}
	}
	if r := exec("after", "cat", "/work/mark"); r.code != 0 || r.stdout != "before\n" {
		t.Errorf("exec after e2 returned: exit %d %q\n%s", r.code, r.stdout, r.stderr)
	}
	if r := f.airlock(t, "session", "cancel", sess.GetJobId()); r.code != 0 {
		t.Errorf("session cancel: exit %d\n%s", r.code, r.stderr)
	}
	// The job that ended executor_lost does not run on in e2's sandbox.
	parent := f.cgroupParent("e2")
	for deadline := time.Now().Add(20 * time.Second); jobsWithLiveSleep(parent) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("a sleep still runs under e2 (%s) 20s after it returned; the lost job %s is over", parent, long.GetJobId())
			break
		}
	}
}

// testDrain: a drained e3 is given nothing new while its running job
// finishes; stopped once nothing is placed on it, nothing is lost.
func (f *fleet) testDrain(t *testing.T) {
	undrain := f.only(t, "e3")
	running := f.submit(t, "drain-running", "--", "sleep", "8")
	undrain()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	waitJob(ctx, t, f.dev, running.GetJobId(), func(j *authorityv1.Job) bool { return j.GetState() == authorityv1.JobState_JOB_STATE_RUNNING })
	f.drain(t, "e3", true, "fleet test: maintenance")
	var ids []string
	for i := range 6 {
		j := f.submit(t, fmt.Sprintf("drain-new-%d", i), "--", "true")
		if j.GetExecutor() == "e3" {
			t.Errorf("job %s submitted after the drain was placed on e3", j.GetJobId())
		}
		ids = append(ids, j.GetJobId())
	}
	for _, j := range f.waitEnded(t, nil, time.Minute, ids...) {
		checkFinished(t, j)
		if j.GetExecutor() == "e3" || slices.Contains(f.runsOf(j.GetJobId()), "e3") {
			t.Errorf("job %s ran on %q (runs on %v) after e3 was drained", j.GetJobId(), j.GetExecutor(), f.runsOf(j.GetJobId()))
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		x := f.executor(t, "e3")
		if x.GetPlaced() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("e3 still has %d jobs placed 30s after its drain", x.GetPlaced())
		}
	}
	checkFinished(t, f.job(t, nil, running.GetJobId()))
	e3 := f.executors["e3"]
	if err := e3.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-e3.proc.exited:
		e3.proc.dead = true
		if err != nil {
			t.Errorf("e3 stopped after its drain: %v, want a clean exit", err)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("e3 still runs %v after SIGTERM", stopTimeout)
	}
	checkFinished(t, f.job(t, nil, running.GetJobId()))
	f.drain(t, "e3", false, "")
	f.startExecutor(t, "e3")
}

// testGrantForAnother: e1's grant, presented to e2 by the authority
// itself, is refused, naming both, and e2 makes no run of it.
func (f *fleet) testGrantForAnother(t *testing.T) {
	undrain := f.only(t, "e1")
	j := f.submit(t, "grant-e1", "--", "true")
	undrain()
	j = f.waitEnded(t, nil, time.Minute, j.GetJobId())[0]
	checkFinished(t, j)
	if j.GetExecutor() != "e1" {
		t.Fatalf("job %s ran on %q, want e1", j.GetJobId(), j.GetExecutor())
	}
	data, err := os.ReadFile(filepath.Join(f.executors["e1"].dataDir, "runs", j.GetJobId(), "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		SignedGrant []byte `json:"signed_grant"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(rec.SignedGrant, sg); err != nil {
		t.Fatalf("e1's record of the grant: %v", err)
	}
	e2 := f.executors["e2"]
	server, err := identity.Parse("spiffe://" + trustDomain + "/service/executor/e2")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpcclient.Dial(e2.addr, f.source(t, "service/authority"), server)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = executorv1.NewExecutorServiceClient(cc).StartJob(ctx, &executorv1.StartJobRequest{Grant: sg})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "e1") || !strings.Contains(st.Message(), "e2") {
		t.Errorf("e2 given e1's grant: %v, want PermissionDenied naming e1 and e2", err)
	}
	if on := f.runsOf(j.GetJobId()); !slices.Equal(on, []string{"e1"}) {
		t.Errorf("job %s has runs on %v, want e1 only", j.GetJobId(), on)
	}
}

// owns says whether process pid (running cmdline) is the fleet's: its
// command line names the fleet's stack, or it runs in one of its
// executors' cgroups (a sandboxed job's process names neither path).
func (f *fleet) owns(pid int, cmdline string) bool {
	if strings.Contains(cmdline, f.dir) {
		return true
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, e := range f.executors {
		if e.cgroupParent != "" && strings.Contains(string(cg), e.cgroupParent) {
			return true
		}
	}
	return false
}

// reapStrays reaps the zombies this process inherited (as subreaper) from
// the fleet's killed processes — sandboxes an executor started before it
// was SIGKILLed — and fails for any such process of the fleet (its command
// line names its stack, or it runs in one of its executors' cgroups) still
// running; orphans of other tests running at once are theirs to reap.
func reapStrays(t *testing.T, tracked map[int]bool, ours func(pid int, cmdline string) bool) {
	t.Helper()
	self := fmt.Sprint(os.Getpid())
	for deadline := time.Now().Add(stopTimeout); ; time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		var running []string
		for _, e := range entries {
			var pid int
			if _, err := fmt.Sscan(e.Name(), &pid); err != nil || tracked[pid] || procStat(pid, 4) != self {
				continue
			}
			if procState(pid) == "Z" {
				_, _ = reap(pid, stopTimeout)
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if !ours(pid, string(cmdline)) {
				continue
			}
			running = append(running, fmt.Sprintf("%d %q", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
		if len(running) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: processes left by the fleet still run: %v", running)
			return
		}
	}
}

// checkHostClean, once the fleet's processes have stopped, removes what
// they left on the host and fails for it: job cgroups under an executor's
// cgroup parent, mounts under the stack's directory. (The hosts' links and
// namespaces go with nettest's cleanup.)
func (f *fleet) checkHostClean(t *testing.T) {
	t.Helper()
	roots := []string{"/sys/fs/cgroup"}
	if !cgroupV2() {
		roots, _ = filepath.Glob("/sys/fs/cgroup/*")
	}
	for name, e := range f.executors {
		if e.cgroupParent == "" {
			continue
		}
		for _, root := range roots {
			var dirs []string
			_ = filepath.WalkDir(filepath.Join(root, e.cgroupParent), func(path string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() && path != filepath.Join(root, e.cgroupParent) {
					dirs = append(dirs, path)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				procs, _ := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs"))
				t.Errorf("cleanup: executor %s left cgroup %s (processes %q), killed and removed", name, dirs[i], procs)
				for _, pid := range strings.Fields(string(procs)) {
					var n int
					if _, err := fmt.Sscan(pid, &n); err == nil && n > 0 {
						_ = syscall.Kill(n, syscall.SIGKILL)
					}
				}
				for deadline := time.Now().Add(stopTimeout); os.Remove(dirs[i]) != nil && time.Now().Before(deadline); {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, line := range strings.Split(string(mounts), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], f.dir+"/") {
			left = append(left, fields[4])
		}
	}
	for i := len(left) - 1; i >= 0; i-- {
		t.Errorf("cleanup: mount left at %s", left[i])
		_ = syscall.Unmount(left[i], syscall.MNT_DETACH)
	}
}
