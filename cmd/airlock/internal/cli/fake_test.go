package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// fakeAuthority answers the CLI's calls with canned responses, or err.
// Fill it in before serveFake: the server reads it from other goroutines.
type fakeAuthority struct {
	authorityv1.UnimplementedAuthorityServiceServer
	err         error
	job         *authorityv1.Job
	approval    *authorityv1.GetApprovalResponse
	session     *authorityv1.GetSessionResponse
	approvals   []*authorityv1.Approval
	events      []*authorityv1.AuditEvent
	leases      []*authorityv1.Lease
	watch       []*authorityv1.WatchJobResponse
	review      []*authorityv1.ReadReviewResponse // ReadReview sends these, then returns reviewErr
	reviewErr   error
	download    []*authorityv1.DownloadBundleResponse // DownloadBundle sends these, then returns downloadErr
	downloadErr error

	caches []*typesv1.CacheInfo // ListCaches and ClearCaches answer these
	images []*typesv1.ImageInfo // ListImages answers these

	// The fleet: ListExecutors lists executors, GetExecutor and
	// DrainExecutor answer the one named (NotFound for another) with
	// executorJobs; each GetExecutor then takes the next of placed as its
	// count of placed jobs, the last one staying.
	executors    []*authorityv1.Executor
	executorJobs []string
	placed       []int64

	mu      sync.Mutex
	tenants []string               // the tenant of each SubmitJob, ListJobs, ListApprovals and ListAuditEvents, in order
	specs   []*authorityv1.JobSpec // each SubmitJob's and CreateSession's spec
	clears  []*authorityv1.ClearCachesRequest
	watches []*authorityv1.WatchJobRequest
	drains  []*authorityv1.DrainExecutorRequest
	callers []string // the identity of each fleet call, KIND/NAME
}

func (f *fakeAuthority) sawTenant(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tenants = append(f.tenants, tenant)
}

// sawTenants returns the tenants requests named so far.
func (f *fakeAuthority) sawTenants() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tenants)
}

func (f *fakeAuthority) ReadReview(_ *authorityv1.ReadReviewRequest, stream grpc.ServerStreamingServer[authorityv1.ReadReviewResponse]) error {
	for _, m := range f.review {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return f.reviewErr
}

// sawSpec records a submission's tenant and spec.
func (f *fakeAuthority) sawSpec(tenant string, spec *authorityv1.JobSpec) {
	f.sawTenant(tenant)
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
}

func (f *fakeAuthority) SubmitJob(_ context.Context, req *authorityv1.SubmitJobRequest) (*authorityv1.SubmitJobResponse, error) {
	f.sawSpec(req.GetTenant(), req.GetSpec())
	return &authorityv1.SubmitJobResponse{Job: f.job}, f.err
}

func (f *fakeAuthority) CreateSession(_ context.Context, req *authorityv1.CreateSessionRequest) (*authorityv1.CreateSessionResponse, error) {
	f.sawSpec(req.GetTenant(), req.GetSpec())
	return &authorityv1.CreateSessionResponse{Session: f.job}, f.err
}

func (f *fakeAuthority) GetJob(context.Context, *authorityv1.GetJobRequest) (*authorityv1.GetJobResponse, error) {
	return &authorityv1.GetJobResponse{Job: f.job}, f.err
}

func (f *fakeAuthority) ListJobs(_ context.Context, req *authorityv1.ListJobsRequest) (*authorityv1.ListJobsResponse, error) {
	f.sawTenant(req.GetTenant())
	return &authorityv1.ListJobsResponse{Jobs: []*authorityv1.Job{f.job}}, f.err
}

func (f *fakeAuthority) CancelJob(context.Context, *authorityv1.CancelJobRequest) (*authorityv1.CancelJobResponse, error) {
	return &authorityv1.CancelJobResponse{Job: f.job}, f.err
}

func (f *fakeAuthority) UpdateJobLimits(context.Context, *authorityv1.UpdateJobLimitsRequest) (*authorityv1.UpdateJobLimitsResponse, error) {
	return &authorityv1.UpdateJobLimitsResponse{ApprovalId: f.job.GetApprovalId()}, f.err
}

func (f *fakeAuthority) WatchJob(req *authorityv1.WatchJobRequest, stream grpc.ServerStreamingServer[authorityv1.WatchJobResponse]) error {
	f.mu.Lock()
	f.watches = append(f.watches, req)
	f.mu.Unlock()
	for _, m := range f.watch {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return f.err
}

func (f *fakeAuthority) GetSession(context.Context, *authorityv1.GetSessionRequest) (*authorityv1.GetSessionResponse, error) {
	return f.session, f.err
}

func (f *fakeAuthority) GetApproval(context.Context, *authorityv1.GetApprovalRequest) (*authorityv1.GetApprovalResponse, error) {
	return f.approval, f.err
}

func (f *fakeAuthority) ListApprovals(_ context.Context, req *authorityv1.ListApprovalsRequest) (*authorityv1.ListApprovalsResponse, error) {
	f.sawTenant(req.GetTenant())
	return &authorityv1.ListApprovalsResponse{Approvals: f.approvals}, f.err
}

func (f *fakeAuthority) DecideApproval(context.Context, *authorityv1.DecideApprovalRequest) (*authorityv1.DecideApprovalResponse, error) {
	return &authorityv1.DecideApprovalResponse{Approval: f.approval.GetApproval()}, f.err
}

func (f *fakeAuthority) ListLeases(context.Context, *authorityv1.ListLeasesRequest) (*authorityv1.ListLeasesResponse, error) {
	return &authorityv1.ListLeasesResponse{Leases: f.leases}, f.err
}

func (f *fakeAuthority) RevokeCredential(context.Context, *authorityv1.RevokeCredentialRequest) (*authorityv1.RevokeCredentialResponse, error) {
	return &authorityv1.RevokeCredentialResponse{Lease: f.leases[0]}, f.err
}

func (f *fakeAuthority) ListAuditEvents(_ context.Context, req *authorityv1.ListAuditEventsRequest) (*authorityv1.ListAuditEventsResponse, error) {
	f.sawTenant(req.GetTenant())
	return &authorityv1.ListAuditEventsResponse{Events: f.events}, f.err
}

const fakeTrustDomain = "test.airlock"

// serveFake serves f as the authority over real mTLS, from a fresh CA, and
// returns the path of a client config (identity client/dev, tenant t1)
// that reaches it; approver/alice's, operator/admin's (the dev stack's
// operator) and operator/ops's certificates are in its pki_dir too. It
// serves gRPC health, always SERVING, as the authority.
func serveFake(t *testing.T, f *fakeAuthority) string {
	t.Helper()
	dir := t.TempDir()
	client, err := identity.New(fakeTrustDomain, identity.KindClient, "dev")
	if err != nil {
		t.Fatal(err)
	}
	approver, err := identity.New(fakeTrustDomain, identity.KindApprover, "alice")
	if err != nil {
		t.Fatal(err)
	}
	ids := []identity.ID{client, approver}
	for _, name := range []string{"admin", "ops"} {
		op, err := identity.New(fakeTrustDomain, identity.KindOperator, name)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, op)
	}
	if _, err := pki.Init(dir, fakeTrustDomain, ids); err != nil {
		t.Fatal(err)
	}
	cert, key := pki.Paths(dir, identity.Service(fakeTrustDomain, identity.ServiceAuthority))
	src, err := tlsconfig.NewFileSource(pki.CAPath(dir), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsconfig.ServerConfig(src, fakeTrustDomain))))
	authorityv1.RegisterAuthorityServiceServer(srv, f)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	path := filepath.Join(dir, "client.yaml")
	cfg := &clientconfig.Config{
		Version: config.Version, TrustDomain: fakeTrustDomain, PKIDir: dir, Identity: "client/dev", Tenant: "t1",
		Authority: config.Peer{Address: lis.Addr().String()},
	}
	if err := cfg.Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCLI runs the airlock command with args against the client config and
// returns its exit code, stdout and stderr.
func runCLI(t *testing.T, cfg string, stdout io.Writer, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if stdout == nil {
		stdout = &out
	}
	code := Main(append([]string{"--config", cfg}, args...), stdout, &errOut)
	return code, out.String(), errOut.String()
}

// checkShown fails t when out holds anything a terminal would act on or
// hide: a control byte other than newline and tab, DEL, invalid UTF-8
// (such as a raw C1 byte), a C1 control rune, or a format rune; or a mark
// of termtext's that is not around exactly one escape (text passing for
// an escape).
func checkShown(t *testing.T, what, out string) {
	t.Helper()
	if marks := markedEscape.ReplaceAllString(out, ""); strings.ContainsAny(marks, "\u27e6\u27e7") {
		t.Errorf("%s: a mark not around one escape reaches the terminal:\n%s", what, out)
	}
	for i := 0; i < len(out); {
		r, size := utf8.DecodeRuneInString(out[i:])
		bad := ""
		switch {
		case r == utf8.RuneError && size == 1:
			bad = fmt.Sprintf("invalid UTF-8 byte %#x", out[i])
		case r < 0x20 && r != '\n' && r != '\t', r == 0x7f:
			bad = fmt.Sprintf("control byte %#x", r)
		case r >= 0x80 && r <= 0x9f:
			bad = fmt.Sprintf("C1 control %U", r)
		case unicode.Is(unicode.Cf, r), r == '\u2028', r == '\u2029':
			bad = fmt.Sprintf("format character %U", r)
		}
		if bad != "" {
			t.Errorf("%s: %s at byte %d reaches the terminal:\n%s", what, bad, i, out)
			return
		}
		i += size
	}
}

// markedEscape is one escape between termtext's marks.
var markedEscape = regexp.MustCompile(`\x{27e6}(\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8})\x{27e7}`)

// runCLIOnTerminal runs the airlock command as runCLI does with its
// stdout a pseudo-terminal, and returns what the terminal was sent.
func runCLIOnTerminal(t *testing.T, cfg string, args ...string) (int, string, string) {
	t.Helper()
	pty, tty := openPTY(t)
	var shown bytes.Buffer
	read := make(chan struct{})
	go func() {
		io.Copy(&shown, pty)
		close(read)
	}()
	code, _, errOut := runCLI(t, cfg, tty, args...)
	tty.Close()
	<-read
	return code, shown.String(), errOut
}
