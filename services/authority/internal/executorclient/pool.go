package executorclient

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
)

// Resolver returns where the executor with SPIFFE ID id is reached, and
// whether the fleet knows it.
type Resolver func(ctx context.Context, id string) (address string, ok bool, err error)

// Pool keeps one connection per executor of the fleet, each pinned to the
// executor's own identity (spiffe://TD/service/executor/NAME), so a
// connection meant for one executor never talks to another. It implements
// jobs.Executors.
type Pool struct {
	conns   *grpcclient.Conns
	resolve Resolver
}

// NewPool returns a pool dialing with src, finding executors with resolve.
func NewPool(src *tlsconfig.Source, resolve Resolver) *Pool {
	return &Pool{conns: grpcclient.NewConns(src), resolve: resolve}
}

var _ jobs.Executors = (*Pool)(nil)

// resolveTimeout bounds one lookup of an executor's address.
const resolveTimeout = 5 * time.Second

// For implements jobs.Executors. An executor the fleet does not know, or
// whose id is not an executor's, answers every call with Unavailable.
func (p *Pool) For(id string) jobs.Executor {
	x, err := identity.Parse(id)
	if err != nil || !x.IsExecutor() {
		return New(unreachable{fmt.Sprintf("%q is not an executor of the fleet", id)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	addr, ok, err := p.resolve(ctx, id)
	switch {
	case err != nil:
		return New(unreachable{fmt.Sprintf("executor %s: the fleet could not be read: %v", id, err)})
	case !ok:
		return New(unreachable{fmt.Sprintf("executor %s is not in the fleet", id)})
	}
	cc, err := p.conns.Get(x, addr)
	if err != nil {
		return New(unreachable{fmt.Sprintf("executor %s at %s: %v", id, addr, err)})
	}
	return New(cc) // a thin wrapper: the connection is what is kept
}

// Close closes every connection.
func (p *Pool) Close() error { return p.conns.Close() }

// unreachable is a connection to an executor the pool cannot reach: every
// call fails Unavailable, saying why.
type unreachable struct{ why string }

func (u unreachable) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Unavailable, u.why)
}

func (u unreachable) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unavailable, u.why)
}

// LostResult is the run result the authority records for a job whose
// executor was lost: reason executor_lost, no exit status.
func LostResult() []byte {
	b, err := proto.Marshal(&typesv1.RunResult{Reason: typesv1.TerminationReason_TERMINATION_REASON_EXECUTOR_LOST, ExitCode: -1,
		Message: "the executor stopped answering while the job ran; how far it got is not known"})
	if err != nil {
		panic(err) // a fixed message always marshals
	}
	return b
}
