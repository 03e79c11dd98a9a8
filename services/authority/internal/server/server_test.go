package server_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/grpcserver"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/config"
	"github.com/airlockhq/airlock/services/authority/internal/fakeexecutor"
	"github.com/airlockhq/airlock/services/authority/internal/server"
)

const td = "airlock.test"

var (
	authorityID = identity.Service(td, identity.ServiceAuthority)
	executorID  = identity.Service(td, identity.ServiceExecutor)
	devID       = identity.MustParse("spiffe://" + td + "/client/dev")
)

func source(t *testing.T, dir string, id identity.ID) *tlsconfig.Source {
	t.Helper()
	cert, key := pki.Paths(dir, id)
	src, err := tlsconfig.NewFileSource(pki.CAPath(dir), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func gitInit(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	env := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"commit", "-q", "--allow-empty", "-m", "first"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

// TestRunServesJobs runs the composition root from a config file: it opens
// the store in the data directory, loads the grant key, dispatches to the
// executor, and keeps the job across a restart.
func TestRunServesJobs(t *testing.T) {
	pkiDir, data := t.TempDir(), filepath.Join(t.TempDir(), "data")
	if _, err := pki.Init(pkiDir, td, []identity.ID{devID}); err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(t.TempDir(), "keys", "grant.key")
	signer, err := grant.LoadOrCreateSigner(keyPath)
	if err != nil {
		t.Fatal(err)
	}

	fake := fakeexecutor.New(grant.NewVerifier(signer.PublicKey()))
	srv, err := grpcserver.New(grpcserver.Config{
		Listen: "127.0.0.1:0", TLS: tlsconfig.ServerConfig(source(t, pkiDir, executorID), td),
		Authorizer: authz.New(authz.ExecutorTable, nil, nil), ShutdownTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	fake.Register(srv.Registrar())
	execCtx, stopExec := context.WithCancel(context.Background())
	execDone := make(chan struct{})
	go func() { defer close(execDone); _ = srv.Serve(execCtx) }()
	t.Cleanup(func() { stopExec(); <-execDone })

	cert, key := pki.Paths(pkiDir, authorityID)
	addr := freePort(t)
	body := strings.Join([]string{
		"version: 1",
		"trust_domain: " + td,
		"listen: " + addr,
		"data_dir: " + data,
		"tls: {ca: " + pki.CAPath(pkiDir) + ", cert: " + cert + ", key: " + key + "}",
		"log: {level: warn}",
		"shutdown_timeout: 2s",
		"fleet: {heartbeat_interval: 1s, lost_after: 3s}",
		"grant_key: " + keyPath,
		"tenants:",
		"  dev:",
		"    clients: [client/dev]",
		"    repositories: {demo: {url: " + gitInit(t) + "}}",
		"",
	}, "\n")
	cfgPath := filepath.Join(t.TempDir(), "authority.yaml")
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath, nil)
	if err != nil {
		t.Fatal(err)
	}

	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- server.Run(ctx, cfg) }()
		return func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("server.Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("server.Run did not return after its context ended")
			}
		}
	}
	dial := func() authorityv1.AuthorityServiceClient {
		conn, err := grpcclient.Dial(addr, source(t, pkiDir, devID), authorityID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return authorityv1.NewAuthorityServiceClient(conn)
	}
	// retry calls f until the server is up.
	retry := func(f func() error) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			err := f()
			if err == nil {
				return
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	stop := run()
	dev := dial()
	// The fake executor joins the fleet as a real one does: a heartbeat
	// over mTLS with its own certificate, naming where it listens.
	execConn, err := grpcclient.Dial(addr, source(t, pkiDir, executorID), authorityID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { execConn.Close() })
	retry(func() error {
		resp, err := authorityv1.NewAuthorityServiceClient(execConn).Heartbeat(t.Context(), &authorityv1.HeartbeatRequest{
			Address: srv.Addr().String(), Report: &authorityv1.ExecutorReport{
				RuntimeClasses: []typesv1.RuntimeClass{typesv1.RuntimeClass_RUNTIME_CLASS_RUNC},
				Capacity:       &authorityv1.ExecutorCapacity{MemoryBytes: 8 << 30, MemoryFreeBytes: 8 << 30, CpuMillis: 8000, CpuFreeMillis: 8000, DiskBytes: 100 << 30, DiskFreeBytes: 100 << 30, Jobs: 10, JobsFree: 10},
			}})
		if err == nil && resp.GetName() != "default" {
			t.Errorf("the executor joined as %q, want default", resp.GetName())
		}
		return err
	})
	var job *authorityv1.Job
	retry(func() error {
		resp, err := dev.SubmitJob(t.Context(), &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "k",
			Spec: &authorityv1.JobSpec{Repository: "demo", Revision: "main", Command: []string{"true"}}})
		job = resp.GetJob()
		return err
	})
	deadline := time.Now().Add(10 * time.Second)
	for !fake.HasRun(job.GetJobId()) {
		if time.Now().After(deadline) {
			t.Fatalf("the job was not dispatched with a grant the executor accepts (rejections: %v)", fake.Rejections())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(data, "authority.db")); err != nil {
		t.Errorf("no database in the data directory: %v", err)
	}
	stop()

	stop = run()
	defer stop()
	dev = dial()
	retry(func() error {
		got, err := dev.GetJob(t.Context(), &authorityv1.GetJobRequest{JobId: job.GetJobId()})
		if err == nil && got.GetJob().GetCommit() != job.GetCommit() {
			t.Errorf("job after restart = %v", got.GetJob())
		}
		return err
	})
}
