package api_test

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"github.com/airlockhq/airlock/test/gittest"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/grpcserver"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/api"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/fakeexecutor"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/flow"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/source"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

const td = "airlock.test"

var (
	authorityID = identity.Service(td, identity.ServiceAuthority)
	executorID  = identity.Service(td, identity.ServiceExecutor)
	devID       = identity.MustParse("spiffe://" + td + "/client/dev")
	otherID     = identity.MustParse("spiffe://" + td + "/client/other")
	publisherID = identity.Service(td, identity.ServicePublisher)
	aliceID     = identity.MustParse("spiffe://" + td + "/approver/alice")
	operatorID  = identity.MustParse("spiffe://" + td + "/operator/ops")
	bobID       = identity.MustParse("spiffe://" + td + "/approver/bob")
	// devApproverID is the requester client/dev holding an approver
	// certificate: the same person, who may not approve their own job.
	devApproverID = identity.MustParse("spiffe://" + td + "/approver/dev")
	// eveID is an approver no tenant lists.
	eveID = identity.MustParse("spiffe://" + td + "/approver/eve")
)

// deploySecret is the content of the demo repository's deploy credential.
const deploySecret = "deploy-7c4e2a91-DO-NOT-LEAK"

// secret is the content of the mirrored repository's credential file.
const secret = "cred-9b1d7e3f-DO-NOT-LEAK"

// harness is one authority (real store, real git, real mTLS, real
// authorization) in front of a fake executor, both on 127.0.0.1.
type harness struct {
	opts    harnessOptions
	t       *testing.T
	pkiDir  string
	data    string
	origin  *gittest.Repo
	tenants policy.Tenants
	signer  *grant.Signer
	cpKey   ed25519.PrivateKey // signs audit checkpoints
	fake    *fakeexecutor.Executor
	exec    string
	// stopExec stops the fake executor's server: the executor is gone.
	stopExec func()
	logs     *logtest.Buffer
	auth     *authority

	// fleet is every fake executor the harness reports heartbeats for;
	// the first is fake, the fleet's "default".
	fleetMu sync.Mutex
	fleet   []*member
}

// member is one fake executor of the fleet.
type member struct {
	id   identity.ID
	addr string
	fake *fakeexecutor.Executor
	stop func()
	// report is what its heartbeats say; silent stops them (it is lost
	// once the fleet's bound passes).
	report fleet.Report
	silent bool
}

// bigReport is the report of an executor with room for anything.
func bigReport(classes ...string) fleet.Report {
	return fleet.Report{Classes: classes, Capacity: fleet.Capacity{MemoryBytes: 64 << 30, MemoryFree: 64 << 30, CPUMillis: 64000, CPUFree: 64000,
		DiskBytes: 1 << 40, DiskFree: 1 << 40, Jobs: 1000, JobsFree: 1000}}
}

type authority struct {
	addr string
	stop func()
	// jobs is the job domain behind the API, for what no mTLS caller of
	// this PKI can reach; fleet its executors.
	jobs  *jobs.Service
	fleet *fleet.Fleet
}

// addExecutor starts another fake executor, spiffe://TD/service/executor/
// NAME, reporting report, and waits until the fleet knows it.
func (h *harness) addExecutor(name string, report fleet.Report) *member {
	h.t.Helper()
	id, err := identity.Executor(td, name)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := pki.IssueInto(h.pkiDir, id, pki.IssueOptions{}); err != nil {
		h.t.Fatal(err)
	}
	m := &member{id: id, fake: fakeexecutor.New(grant.NewVerifier(h.signer.PublicKey())), report: report}
	m.fake.Is(id.String())
	for _, c := range report.Classes {
		if rc, err := executorclient.RuntimeClassToProto(c); err == nil {
			m.fake.Runs(rc)
		}
	}
	m.addr, m.stop = h.serveStoppable(id, authz.ExecutorTable, m.fake.Register)
	h.fleetMu.Lock()
	h.fleet = append(h.fleet, m)
	h.fleetMu.Unlock()
	eventually(h.t, "executor "+name+" joins", func() bool {
		_, ok, err := h.auth.fleet.Lookup(h.t.Context(), id.String())
		return err == nil && ok
	})
	return m
}

// setReport changes what m's heartbeats say, or silences them.
func (h *harness) setReport(m *member, report fleet.Report, silent bool) {
	h.fleetMu.Lock()
	defer h.fleetMu.Unlock()
	m.report, m.silent = report, silent
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, harnessOptions{})
}

// harnessOptions change the authority the harness runs.
type harnessOptions struct {
	grantTTL, startDeadline time.Duration
	// checkpointEvery and checkpointInterval default to 100 and 1 minute.
	checkpointEvery    int64
	checkpointInterval time.Duration
	// devQuota is tenant dev's quota, devSessions its session bounds.
	devQuota    policy.Quota
	devSessions policy.Sessions
	// devHistoryDepth is tenant dev's git history depth.
	devHistoryDepth int
	// meter, if set, records the job and approval metrics.
	meter metric.MeterProvider
	// approvalTTL is tenant dev's approvals.ttl; default 1h.
	approvalTTL time.Duration
	// rates default to metering.DefaultRates; budgets to none.
	rates   *metering.Rates
	budgets map[string]metering.Micros
}

func newHarnessWith(t *testing.T, opts harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, opts: opts, pkiDir: t.TempDir(), data: t.TempDir(), logs: &logtest.Buffer{}}
	if _, err := pki.Init(h.pkiDir, td, []identity.ID{devID, otherID, aliceID, bobID, devApproverID, eveID, operatorID}); err != nil {
		t.Fatal(err)
	}
	h.origin = newRepo(t)
	tools := newRepo(t)
	credFile := filepath.Join(t.TempDir(), "mirrored.token")
	if err := os.WriteFile(credFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	deployFile := filepath.Join(t.TempDir(), "demo.deploy")
	if err := os.WriteFile(deployFile, []byte(deploySecret), 0o600); err != nil {
		t.Fatal(err)
	}
	h.tenants = policy.Tenants{
		"dev": {
			Name: "dev", Clients: []string{"client/dev"},
			Repositories: map[string]policy.Repository{
				"demo":     {Tenant: "dev", Name: "demo", URL: h.origin.Dir},
				"mirrored": {Tenant: "dev", Name: "mirrored", URL: "file://" + h.origin.Dir, Credential: credFile},
			},
			Default: policy.DefaultLimits, Max: policy.DefaultMax,
			RuntimeClasses:    []string{policy.RuntimeRunc, policy.RuntimeRunsc, policy.RuntimeVM},
			Egress:            policy.Egress{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Domains: []string{"proxy.golang.org", "*.example.com"}},
			Approvals:         policy.Approvals{Approvers: []string{"approver/alice", "approver/bob", "approver/dev"}, Required: 1, TTL: cmp.Or(opts.approvalTTL, time.Hour)},
			DeployCredentials: map[string]string{"demo": deployFile},
			Quota:             opts.devQuota,
			GitHistoryDepth:   opts.devHistoryDepth,
			Sessions:          opts.devSessions,
			Caches:            map[string]policy.Cache{"go-build": {Path: "/root/.cache/go-build", MaxSize: 1 << 30}},
			Credentials: map[string]policy.Credential{
				"goproxy":   {Name: "goproxy", Hosts: []string{"proxy.golang.org"}, Header: "Authorization", Format: "Bearer {value}", File: credFile, MaxTTL: time.Hour},
				"deploybot": {Name: "deploybot", Hosts: []string{"api.example.com"}, Header: "Authorization", Format: "Bearer {value}", File: deployFile, MaxTTL: time.Hour, ApprovalRequired: true},
				"wild":      {Name: "wild", Hosts: []string{"*.example.com"}, Header: "Authorization", Format: "Bearer {value}", File: deployFile, MaxTTL: time.Hour},
			},
		},
		"other": {
			Name: "other", Clients: []string{"client/other"},
			Repositories: map[string]policy.Repository{"tools": {Tenant: "other", Name: "tools", URL: tools.Dir}},
			Default:      policy.DefaultLimits, Max: policy.DefaultMax,
			RuntimeClasses: []string{policy.RuntimeRunc},
			// A tenant as new ones are written: jobs run as agent, and
			// root is not allowed.
			User: runspec.Agent,
		},
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h.signer = grant.NewSigner(key)
	if _, h.cpKey, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	h.fake = fakeexecutor.New(grant.NewVerifier(h.signer.PublicKey()))
	h.exec, h.stopExec = h.serveStoppable(executorID, authz.ExecutorTable, h.fake.Register)
	h.fleet = []*member{{id: executorID, addr: h.exec, fake: h.fake, stop: h.stopExec, report: bigReport(policy.RuntimeRunc, policy.RuntimeRunsc)}}
	h.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("authority log:\n%s", h.logs.String())
		}
	})
	return h
}

func (h *harness) source(id identity.ID) *tlsconfig.Source {
	h.t.Helper()
	cert, key := pki.Paths(h.pkiDir, id)
	src, err := tlsconfig.NewFileSource(pki.CAPath(h.pkiDir), cert, key)
	if err != nil {
		h.t.Fatal(err)
	}
	return src
}

func (h *harness) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// serve runs a gRPC server for id with table until the test ends and
// returns its address.
func (h *harness) serve(id identity.ID, table authz.Table, register func(grpc.ServiceRegistrar)) string {
	h.t.Helper()
	addr, _ := h.serveStoppable(id, table, register)
	return addr
}

// serveStoppable is serve that also returns a function stopping the
// server before the test ends.
func (h *harness) serveStoppable(id identity.ID, table authz.Table, register func(grpc.ServiceRegistrar)) (string, func()) {
	h.t.Helper()
	srv, err := grpcserver.New(grpcserver.Config{
		Listen: "127.0.0.1:0", TLS: tlsconfig.ServerConfig(h.source(id), td),
		Authorizer: authz.New(table, h.logger(), nil), Logger: h.logger(), ShutdownTimeout: 2 * time.Second,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	register(srv.Registrar())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx) }()
	srv.SetServing(true)
	stop := sync.OnceFunc(func() { cancel(); <-done })
	h.t.Cleanup(stop)
	return srv.Addr().String(), stop
}

// start runs an authority on the harness's data directory, as the
// composition root would build it.
func (h *harness) start() {
	t := h.t
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(h.data, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := source.New(filepath.Join(h.data, "source"), h.logger())
	if err != nil {
		t.Fatal(err)
	}
	// The fake executor is the fleet's one member (name "default": its
	// certificate names no instance); the harness reports for it, as a
	// real executor's heartbeat would, for as long as the authority runs.
	fl, err := fleet.New(fleet.Config{Store: st, Interval: time.Second, LostAfter: 3 * time.Second, Logger: h.logger()})
	if err != nil {
		t.Fatal(err)
	}
	beat := func() error {
		h.fleetMu.Lock()
		members := slices.Clone(h.fleet)
		h.fleetMu.Unlock()
		var errs []error
		for _, m := range members {
			h.fleetMu.Lock()
			silent, report := m.silent, m.report
			h.fleetMu.Unlock()
			if !silent {
				_, err := fl.Heartbeat(ctx, m.id, m.addr, report)
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	if err := beat(); err != nil {
		t.Fatal(err)
	}
	pool := executorclient.NewPool(h.source(authorityID), fl.Address)
	signer := executorclient.NewSigner(h.signer)
	rates := metering.DefaultRates()
	if h.opts.rates != nil {
		rates = *h.opts.rates
	}
	usage, err := metering.New(metering.Config{Store: st, Decode: signer.MeteredJob, Tenants: h.tenants, Rates: rates,
		Budgets: h.opts.budgets, Self: authorityID, Meter: h.opts.meter, Logger: h.logger()})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := jobs.New(jobs.Config{
		Store: st, Tenants: h.tenants, Source: src, Signer: signer, Metering: usage,
		Fleet: fl, Executors: pool, Self: authorityID, LostResult: executorclient.LostResult(), GrantTTL: cmp.Or(h.opts.grantTTL, 10*time.Minute), StartDeadline: h.opts.startDeadline, Logger: h.logger(),
		Auditors: []string{"approver/alice"},
		Retry:    jobs.Retry{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}, DrainTimeout: 5 * time.Second, SweepInterval: 200 * time.Millisecond,
		Meter: h.opts.meter,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = svc.Run(runCtx) }()
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		for {
			select {
			case <-runCtx.Done():
				return
			case <-time.After(300 * time.Millisecond):
				if err := beat(); err != nil && runCtx.Err() == nil {
					t.Logf("heartbeat for the fake executor: %v", err)
				}
			}
		}
	}()

	srv, err := grpcserver.New(grpcserver.Config{
		Listen: "127.0.0.1:0", TLS: tlsconfig.ServerConfig(h.source(authorityID), td),
		Authorizer: authz.New(authz.AuthorityTable, h.logger(), nil), Logger: h.logger(), ShutdownTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	appr, err := approvals.New(approvals.Config{Store: st, Tenants: h.tenants, Artifacts: svc, Meter: h.opts.meter, Logger: h.logger()})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := leases.New(leases.Config{Store: st, Tenants: h.tenants, Approvals: appr, Meter: h.opts.meter, Logger: h.logger(),
		Grants: executorclient.LeaseGrant})
	if err != nil {
		t.Fatal(err)
	}
	fl.OnRestart(lease.OnRestart(authorityID))
	wf, err := flow.New(flow.Config{Jobs: svc, Approvals: appr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := appr.OpenMissing(ctx, authorityID, wf.Target); err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoints.Open(ctx, checkpoints.Config{
		Store: st, Key: h.cpKey, File: filepath.Join(h.data, "audit-checkpoints.jsonl"),
		Every: h.opts.checkpointEvery, Interval: h.opts.checkpointInterval, Logger: h.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan struct{})
	go func() { defer close(cpDone); _ = cps.Run(runCtx) }()
	api.New(api.Config{Jobs: svc, Approvals: appr, Leases: lease, Flow: wf, Checkpoints: cps, Fleet: fl, Usage: usage, Logger: h.logger()}).Register(srv.Registrar())
	serveDone := make(chan struct{})
	go func() { defer close(serveDone); _ = srv.Serve(runCtx) }()
	srv.SetServing(true)

	a := &authority{addr: srv.Addr().String(), jobs: svc, fleet: fl}
	a.stop = sync.OnceFunc(func() {
		cancel()
		<-serveDone
		<-runDone
		<-beatDone
		<-cpDone
		cps.Close()
		pool.Close()
		st.Close()
	})
	h.auth = a
	t.Cleanup(a.stop)
}

// restart stops the authority and starts a new one on the same data.
func (h *harness) restart() {
	h.auth.stop()
	h.start()
}

// client dials the current authority as id.
func (h *harness) client(id identity.ID) authorityv1.AuthorityServiceClient {
	h.t.Helper()
	conn, err := grpcclient.Dial(h.auth.addr, h.source(id), authorityID)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { conn.Close() })
	return authorityv1.NewAuthorityServiceClient(conn)
}

// spec is a plain job on the demo repository.
func spec() *authorityv1.JobSpec {
	return &authorityv1.JobSpec{
		Repository: "demo", Revision: "main", Command: []string{"make", "test"},
		Env: map[string]string{"GOFLAGS": "-mod=mod", "GIT_AUTHOR_NAME": "agent", "BASE": strings.Repeat("ab12", 10)},
	}
}

func (h *harness) submit(c authorityv1.AuthorityServiceClient, key string, s *authorityv1.JobSpec) *authorityv1.SubmitJobResponse {
	h.t.Helper()
	resp, err := c.SubmitJob(h.t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", Spec: s, IdempotencyKey: key})
	if err != nil {
		h.t.Fatalf("SubmitJob: %v", err)
	}
	return resp
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) waitState(c authorityv1.AuthorityServiceClient, id string, want authorityv1.JobState) *authorityv1.Job {
	h.t.Helper()
	var last *authorityv1.Job
	eventually(h.t, "job "+id+" to reach "+want.String(), func() bool {
		resp, err := c.GetJob(h.t.Context(), &authorityv1.GetJobRequest{JobId: id})
		if err != nil {
			h.t.Fatalf("GetJob: %v", err)
		}
		last = resp.GetJob()
		return last.GetState() == want
	})
	return last
}

// wantStatus checks err's code and that its message holds every want.
func wantStatus(t *testing.T, err error, code codes.Code, want ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("message %q does not mention %q", status.Convert(err).Message(), w)
		}
	}
}

// newRepo makes a repository whose main branch holds a file large enough
// to need several FetchSource chunks, and a feature branch.
func newRepo(t *testing.T) *gittest.Repo {
	t.Helper()
	r := gittest.Init(t, filepath.Join(t.TempDir(), "origin"))
	if err := os.MkdirAll(filepath.Join(r.Dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 700<<10)
	_, _ = rand.Read(big)
	for name, data := range map[string][]byte{"README.md": []byte("hello\n"), "data/blob.bin": big} {
		if err := os.WriteFile(filepath.Join(r.Dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.Run("add", "-A")
	r.Run("commit", "-q", "-m", "first")
	r.Run("branch", "feature")
	return r
}
