package authz_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/identity"
	// Register every Airlock API with the global registry so the walk
	// below sees every generated service.
	_ "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	_ "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	_ "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// The caller kinds every RPC must have an expectation for.
const (
	authority = "service/authority"
	executor  = "service/executor"
	publisher = "service/publisher"
	client    = "client"
	approver  = "approver"
	pipeline  = "pipeline"
	operator  = "operator"
	// fleetExecutor is one executor of a fleet: it may call exactly what
	// the single executor may.
	fleetExecutor = "service/executor/exec-1"
)

var callerKinds = []string{authority, executor, fleetExecutor, publisher, client, approver, pipeline, operator}

// expected is written independently of policy.go on purpose: a change to the
// table must be made twice, once here, so no boundary moves by accident.
// Every RPC of every Airlock service must appear with every caller kind.
var expected = map[string]map[string]bool{
	"/airlock.authority.v1.AuthorityService/SubmitJob":            only(client),
	"/airlock.authority.v1.AuthorityService/GetJob":               only(client),
	"/airlock.authority.v1.AuthorityService/GetJobEgress":         only(client),
	"/airlock.authority.v1.AuthorityService/ListJobs":             only(client),
	"/airlock.authority.v1.AuthorityService/WatchJob":             only(client),
	"/airlock.authority.v1.AuthorityService/CancelJob":            only(client),
	"/airlock.authority.v1.AuthorityService/DownloadBundle":       only(client, approver),
	"/airlock.authority.v1.AuthorityService/CreateSession":        only(client),
	"/airlock.authority.v1.AuthorityService/GetSession":           only(client),
	"/airlock.authority.v1.AuthorityService/ListSessions":         only(client),
	"/airlock.authority.v1.AuthorityService/FinishSession":        only(client),
	"/airlock.authority.v1.AuthorityService/CancelSession":        only(client),
	"/airlock.authority.v1.AuthorityService/SuspendSession":       only(client),
	"/airlock.authority.v1.AuthorityService/ResumeSession":        only(client),
	"/airlock.authority.v1.AuthorityService/StartExec":            only(client),
	"/airlock.authority.v1.AuthorityService/GetExec":              only(client),
	"/airlock.authority.v1.AuthorityService/WatchExec":            only(client),
	"/airlock.authority.v1.AuthorityService/CancelExec":           only(client),
	"/airlock.authority.v1.AuthorityService/RunExec":              only(client),
	"/airlock.authority.v1.AuthorityService/ReadFile":             only(client),
	"/airlock.authority.v1.AuthorityService/WriteFile":            only(client),
	"/airlock.authority.v1.AuthorityService/ListFiles":            only(client),
	"/airlock.authority.v1.AuthorityService/ListCaches":           only(client),
	"/airlock.authority.v1.AuthorityService/ClearCaches":          only(client),
	"/airlock.authority.v1.AuthorityService/ListImages":           only(client),
	"/airlock.authority.v1.AuthorityService/PruneImages":          only(client),
	"/airlock.authority.v1.AuthorityService/FetchImageBlob":       only(executor),
	"/airlock.authority.v1.AuthorityService/FetchSource":          only(executor),
	"/airlock.authority.v1.AuthorityService/ReportResult":         only(executor),
	"/airlock.authority.v1.AuthorityService/ListApprovals":        only(approver, client),
	"/airlock.authority.v1.AuthorityService/GetApproval":          only(approver, client),
	"/airlock.authority.v1.AuthorityService/ReadReview":           only(approver, client),
	"/airlock.authority.v1.AuthorityService/DecideApproval":       only(approver),
	"/airlock.authority.v1.AuthorityService/ConsumeApproval":      only(publisher),
	"/airlock.authority.v1.AuthorityService/GetPublishSpec":       only(publisher),
	"/airlock.authority.v1.AuthorityService/LeaseCredential":      only(publisher, executor),
	"/airlock.authority.v1.AuthorityService/RevokeCredential":     only(publisher, executor, approver),
	"/airlock.authority.v1.AuthorityService/ListLeases":           only(approver, publisher),
	"/airlock.authority.v1.AuthorityService/UseLease":             only(publisher),
	"/airlock.authority.v1.AuthorityService/UpdateNetworkPolicy":  only(client),
	"/airlock.authority.v1.AuthorityService/UpdateJobLimits":      only(client),
	"/airlock.authority.v1.AuthorityService/ListAuditEvents":      only(approver),
	"/airlock.authority.v1.AuthorityService/ListAuditCheckpoints": only(approver),

	"/airlock.executor.v1.ExecutorService/StartJob":    only(authority),
	"/airlock.executor.v1.ExecutorService/GetRun":      only(authority),
	"/airlock.executor.v1.ExecutorService/WatchRun":    only(authority),
	"/airlock.executor.v1.ExecutorService/CancelRun":   only(authority),
	"/airlock.executor.v1.ExecutorService/UpdateRun":   only(authority),
	"/airlock.executor.v1.ExecutorService/GetArtifact": only(publisher, authority),
	"/airlock.executor.v1.ExecutorService/StartExec":   only(authority),
	"/airlock.executor.v1.ExecutorService/GetExec":     only(authority),
	"/airlock.executor.v1.ExecutorService/ListExecs":   only(authority),
	"/airlock.executor.v1.ExecutorService/WatchExec":   only(authority),
	"/airlock.executor.v1.ExecutorService/CancelExec":  only(authority),
	"/airlock.executor.v1.ExecutorService/RunExec":     only(authority),
	"/airlock.executor.v1.ExecutorService/FinishRun":   only(authority),
	"/airlock.executor.v1.ExecutorService/SuspendRun":  only(authority),
	"/airlock.executor.v1.ExecutorService/ResumeRun":   only(authority),
	"/airlock.executor.v1.ExecutorService/ForwardPort": only(authority),
	"/airlock.executor.v1.ExecutorService/ReadFile":    only(authority),
	"/airlock.executor.v1.ExecutorService/WriteFile":   only(authority),
	"/airlock.executor.v1.ExecutorService/ListFiles":   only(authority),
	"/airlock.executor.v1.ExecutorService/ListCaches":  only(authority),
	"/airlock.executor.v1.ExecutorService/ClearCaches": only(authority),
	"/airlock.executor.v1.ExecutorService/ListImages":  only(authority),
	"/airlock.executor.v1.ExecutorService/PruneImages": only(authority),

	"/airlock.authority.v1.AuthorityService/Heartbeat":     only(executor),
	"/airlock.authority.v1.AuthorityService/ListExecutors": only(operator),
	"/airlock.authority.v1.AuthorityService/GetExecutor":   only(operator),
	"/airlock.authority.v1.AuthorityService/DrainExecutor": only(operator),

	"/airlock.authority.v1.AuthorityService/GetUsage":         only(client, approver, operator),
	"/airlock.authority.v1.AuthorityService/OpenPortForward":  only(client),
	"/airlock.authority.v1.AuthorityService/ForwardPort":      only(client),
	"/airlock.authority.v1.AuthorityService/ClosePortForward": only(client, operator),
	"/airlock.authority.v1.AuthorityService/ListPortForwards": only(client, approver, operator),

	"/airlock.publisher.v1.PublisherService/Publish":         only(pipeline),
	"/airlock.publisher.v1.PublisherService/GetDeployment":   only(pipeline, approver),
	"/airlock.publisher.v1.PublisherService/ListDeployments": only(pipeline, approver),
}

func only(kinds ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range callerKinds {
		m[k] = false
	}
	for _, k := range kinds {
		m[k] = true
		if k == executor {
			m[fleetExecutor] = true
		}
	}
	return m
}

// Sample identities, one per caller kind.
func sampleID(t *testing.T, kind string) identity.ID {
	t.Helper()
	name := map[string]string{client: "client/dev", approver: "approver/alice", pipeline: "pipeline/deploy", operator: "operator/ops"}[kind]
	if name == "" {
		name = kind
	}
	return identity.MustParse("spiffe://airlock.test/" + name)
}

// Tables returns each Airlock service's table by proto service name.
func tables() map[protoreflect.FullName]authz.Table {
	return map[protoreflect.FullName]authz.Table{
		"airlock.authority.v1.AuthorityService": authz.AuthorityTable,
		"airlock.executor.v1.ExecutorService":   authz.ExecutorTable,
		"airlock.publisher.v1.PublisherService": authz.PublisherTable,
	}
}

// airlockMethods walks the generated descriptors of every Airlock service.
func airlockMethods(t *testing.T) map[string]protoreflect.FullName {
	t.Helper()
	methods := map[string]protoreflect.FullName{}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "airlock.") {
			return true
		}
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				methods["/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name())] = sd.FullName()
			}
		}
		return true
	})
	if len(methods) == 0 {
		t.Fatal("no Airlock services registered; the walk would prove nothing")
	}
	return methods
}

func TestEveryRPCHasAnExpectationForEveryCallerKind(t *testing.T) {
	methods := airlockMethods(t)
	services := tables()
	for method, svc := range methods {
		exp, ok := expected[method]
		if !ok {
			t.Errorf("%s: no expectation in this test; add one for every caller kind", method)
			continue
		}
		for _, kind := range callerKinds {
			if _, ok := exp[kind]; !ok {
				t.Errorf("%s: no expectation for caller kind %s", method, kind)
			}
		}
		table, ok := services[svc]
		if !ok {
			t.Errorf("%s: service %s has no authorization table", method, svc)
			continue
		}
		if _, ok := table[method]; !ok {
			t.Errorf("%s: not in %s's table, so it is denied to everyone", method, svc)
		}
		for kind, want := range exp {
			if got := table.Allows(method, sampleID(t, kind)); got != want {
				t.Errorf("%s as %s: table allows=%v, expected %v", method, kind, got, want)
			}
		}
	}
	for method := range expected {
		if _, ok := methods[method]; !ok {
			t.Errorf("expectation for %s, which no generated service has", method)
		}
	}
	// A table must not list an Airlock method of another service, which
	// would make it look covered while the real server denies it.
	for svc, table := range services {
		for method := range table {
			if owner, ok := methods[method]; ok && owner != svc {
				t.Errorf("%s's table lists %s of %s", svc, method, owner)
			}
		}
	}
}

func TestPrincipalMatches(t *testing.T) {
	for _, tc := range []struct {
		p    authz.Principal
		id   string
		want bool
	}{
		{authz.Executor, "spiffe://d/service/executor", true},
		{authz.Executor, "spiffe://d/service/authority", false},
		{authz.Clients, "spiffe://d/client/anyone", true},
		{authz.Clients, "spiffe://d/approver/anyone", false},
		{"client/dev", "spiffe://d/client/dev", true},
		{"client/dev", "spiffe://d/client/dev2", false},
		{"malformed", "spiffe://d/client/dev", false},
	} {
		if got := tc.p.Matches(identity.MustParse(tc.id)); got != tc.want {
			t.Errorf("%s.Matches(%s) = %v, want %v", tc.p, tc.id, got, tc.want)
		}
	}
}

// fakeStream carries a method name the way grpc's server puts it in the
// context, so Authorize can be exercised without a listener (the real-mTLS
// version of this lives in test/e2e).
type fakeStream struct{ method string }

func (s fakeStream) Method() string             { return s.method }
func (fakeStream) SetHeader(metadata.MD) error  { return nil }
func (fakeStream) SendHeader(metadata.MD) error { return nil }
func (fakeStream) SetTrailer(metadata.MD) error { return nil }

func TestAuthorizeDeniesByDefault(t *testing.T) {
	id := identity.MustParse("spiffe://airlock.test/client/dev")
	var denied []string
	a := authz.New(authz.AuthorityTable, nil, func(_ context.Context, method string, caller identity.ID, _ string) {
		denied = append(denied, method+" "+caller.Principal())
	})
	for _, tc := range []struct {
		method string
		code   codes.Code
	}{
		{"/airlock.authority.v1.AuthorityService/SubmitJob", codes.OK},
		{"/airlock.authority.v1.AuthorityService/ReportResult", codes.PermissionDenied},
		{"/airlock.authority.v1.AuthorityService/NoSuchMethod", codes.PermissionDenied},
		{"/some.other.Service/Method", codes.PermissionDenied},
	} {
		ctx := grpc.NewContextWithServerTransportStream(peerContext(t, id), fakeStream{tc.method})
		got, err := a.Authorize(ctx)
		if code := status.Code(err); code != tc.code {
			t.Errorf("%s: code %v, want %v (err %v)", tc.method, code, tc.code, err)
			continue
		}
		if err != nil {
			if !strings.HasPrefix(status.Convert(err).Message(), authz.DeniedPrefix) {
				t.Errorf("%s: message %q lacks %q", tc.method, status.Convert(err).Message(), authz.DeniedPrefix)
			}
			continue
		}
		if caller, ok := identity.FromContext(got); !ok || caller != id {
			t.Errorf("%s: identity in context = %v, %v; want %v", tc.method, caller, ok, id)
		}
	}
	if len(denied) != 3 {
		t.Errorf("deny hook saw %v, want 3 denials", denied)
	}
}

func TestAuthorizeWithoutPeerIsUnauthenticated(t *testing.T) {
	a := authz.New(authz.AuthorityTable, nil, nil)
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), fakeStream{"/airlock.authority.v1.AuthorityService/SubmitJob"})
	if _, err := a.Authorize(ctx); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no peer: got %v, want Unauthenticated", err)
	}
}

func TestMergeRefusesDuplicates(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("Merge of a method listed twice did not panic")
		}
	}()
	authz.Merge(authz.Table{"/a.B/C": nil}, authz.Table{"/a.B/C": nil})
}

// peerContext returns a context whose peer presented a certificate for id,
// as the TLS layer leaves it after a verified handshake.
func peerContext(t *testing.T, id identity.ID) context.Context {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), URIs: []*url.URL{id.URL()}, NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	info := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}
