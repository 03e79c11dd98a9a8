//go:build linux

package e2e

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/identity"
	// Register every Airlock API with protoregistry.GlobalFiles, so the walk
	// below sees every generated service.
	_ "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	_ "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	_ "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// callers are the identities every RPC is tried as: each service, and one
// of each caller kind. All of them hold certificates from the stack's CA.
var callers = []string{
	"service/authority", "service/executor", "service/publisher",
	"client/dev", "approver/alice", "pipeline/deploy",
}

// tables maps each server to the authorization table it must enforce.
var tables = map[string]authz.Table{
	identity.ServiceAuthority: authz.AuthorityTable,
	identity.ServiceExecutor:  authz.ExecutorTable,
	identity.ServicePublisher: authz.PublisherTable,
}

// rpc is one method of a generated Airlock service and the server that
// must serve it.
type rpc struct {
	server string
	desc   protoreflect.MethodDescriptor
}

func (r rpc) fullMethod() string {
	return "/" + string(r.desc.Parent().FullName()) + "/" + string(r.desc.Name())
}

// airlockRPCs walks every service in every registered "airlock.*" proto
// package. The server is named after the service: AuthorityService is
// served by the authority, and so on.
func airlockRPCs(t *testing.T) []rpc {
	t.Helper()
	var out []rpc
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "airlock.") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			server := strings.ToLower(strings.TrimSuffix(string(sd.Name()), "Service"))
			if _, ok := tables[server]; !ok {
				t.Errorf("service %s has no server to test it on (want one of authority, executor, publisher)", sd.FullName())
				continue
			}
			for j := range sd.Methods().Len() {
				out = append(out, rpc{server: server, desc: sd.Methods().Get(j)})
			}
		}
		return true
	})
	return out
}

func TestAuthorizationMatrixOverMTLS(t *testing.T) {
	t.Parallel()
	rpcs := airlockRPCs(t)
	perServer := map[string]int{}
	for _, r := range rpcs {
		perServer[r.server]++
	}
	for server := range tables {
		if perServer[server] == 0 {
			t.Fatalf("found no RPCs of the %s in the registry; is its proto package imported?", server)
		}
	}

	t.Run("table covers exactly the generated methods", func(t *testing.T) {
		for server, table := range tables {
			var generated []string
			for _, r := range rpcs {
				if r.server != server {
					continue
				}
				generated = append(generated, r.fullMethod())
				if len(table[r.fullMethod()]) == 0 {
					t.Errorf("%s: %s has no entry in the table, so nobody may call it", server, r.fullMethod())
				}
			}
			for method := range table {
				if strings.HasPrefix(method, "/airlock.") && !slices.Contains(generated, method) {
					t.Errorf("%s: table lists %s, which the %s does not have", server, method, server)
				}
			}
		}
	})

	s := startStack(t)
	conns := map[[2]string]*grpc.ClientConn{}
	conn := func(as, server string) *grpc.ClientConn {
		k := [2]string{as, server}
		if conns[k] == nil {
			conns[k] = s.dial(t, as, server)
		}
		return conns[k]
	}

	calls := 0
	allowed, denied := map[string]int{}, map[string]int{}
	for _, r := range rpcs {
		method := r.fullMethod()
		table := tables[r.server]
		for _, as := range callers {
			id := identity.MustParse("spiffe://" + trustDomain + "/" + as)
			want := table.Allows(method, id)
			err := invoke(conn(as, r.server), r)
			calls++
			st := status.Convert(err)
			if want {
				allowed[r.server]++
				switch {
				case st.Code() == codes.PermissionDenied && strings.HasPrefix(st.Message(), authz.DeniedPrefix):
					t.Errorf("%s as %s: denied by the table (%v), want allowed", method, as, err)
				case st.Code() == codes.Unauthenticated:
					t.Errorf("%s as %s: %v, want the caller authenticated", method, as, err)
				case strings.Contains(st.Message(), "unknown service") || strings.Contains(st.Message(), "unknown method"):
					t.Errorf("%s as %s: %v, want the method registered on the %s", method, as, err, r.server)
				case st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded:
					t.Errorf("%s as %s: %v, want an answer from the %s", method, as, err, r.server)
				}
				continue
			}
			denied[r.server]++
			if st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), authz.DeniedPrefix) {
				t.Errorf("%s as %s: %v, want PermissionDenied from the table (%q...)", method, as, err, authz.DeniedPrefix)
				continue
			}
			// The message names the method and the identity the server read
			// from the certificate, which proves it saw the right caller.
			if !strings.Contains(st.Message(), method) || !strings.Contains(st.Message(), id.String()) {
				t.Errorf("%s as %s: message %q does not name the method and %s", method, as, st.Message(), id)
			}
		}
	}
	if want := len(rpcs) * len(callers); calls != want || calls == 0 {
		t.Errorf("made %d calls, want %d (%d methods x %d callers)", calls, want, len(rpcs), len(callers))
	}
	t.Logf("%d calls: %d methods x %d callers; allowed %v, denied %v", calls, len(rpcs), len(callers), allowed, denied)
	for server := range tables {
		if allowed[server] == 0 || denied[server] == 0 {
			t.Errorf("%s: %d allowed and %d denied calls, want at least one of each", server, allowed[server], denied[server])
		}
	}

	t.Run("health check allowed for every caller", func(t *testing.T) {
		for server := range tables {
			for _, as := range callers {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := healthpb.NewHealthClient(conn(as, server)).Check(ctx, &healthpb.HealthCheckRequest{})
				cancel()
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("health check of %s as %s: %v %v, want SERVING", server, as, resp.GetStatus(), err)
				}
			}
		}
	})
}

// invoke calls r with an empty request, generically from its descriptor,
// and returns the call's error (nil for OK).
func invoke(cc *grpc.ClientConn, r rpc) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in, out := dynamicpb.NewMessage(r.desc.Input()), dynamicpb.NewMessage(r.desc.Output())
	if !r.desc.IsStreamingClient() && !r.desc.IsStreamingServer() {
		return cc.Invoke(ctx, r.fullMethod(), in, out)
	}
	desc := &grpc.StreamDesc{
		StreamName:    string(r.desc.Name()),
		ServerStreams: r.desc.IsStreamingServer(),
		ClientStreams: r.desc.IsStreamingClient(),
	}
	stream, err := cc.NewStream(ctx, desc, r.fullMethod())
	if err != nil {
		return err
	}
	if err := stream.SendMsg(in); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	// Drain until the status arrives; io.EOF is the OK status.
	for {
		if err := stream.RecvMsg(out); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
