// Package authz owns per-RPC authorization: one deny-by-default table from
// full gRPC method name to the principals that may call it, and the
// interceptor that enforces it. Every Airlock server imports it through
// pkg/grpcserver; nothing else should decide who may call an RPC.
//
// The table answers only "may this kind of caller call this RPC at all".
// Checks that depend on arguments (a client's tenant, a job's requester) are
// the handlers' job, after this gate.
package authz

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/identity"
)

// A Principal names who may call: either one exact identity such as
// "service/authority", or every name of a kind such as "client/*".
// "service/executor" covers every executor of a fleet
// (service/executor/NAME) as well as a deployment's single executor.
type Principal string

// Principals used by the table.
const (
	Authority Principal = "service/authority"
	Executor  Principal = "service/executor"
	Publisher Principal = "service/publisher"
	Clients   Principal = "client/*"
	Approvers Principal = "approver/*"
	Pipelines Principal = "pipeline/*"
	Operators Principal = "operator/*"
)

// Everyone is every identity the server's TLS layer accepted. It is meant
// only for infrastructure RPCs such as health checks, which reveal nothing.
var Everyone = []Principal{Authority, Executor, Publisher, Clients, Approvers, Pipelines, Operators}

// Matches reports whether id is covered by p.
func (p Principal) Matches(id identity.ID) bool {
	kind, name, ok := strings.Cut(string(p), "/")
	if !ok || kind != string(id.Kind) {
		return false
	}
	return name == "*" || name == id.Name
}

// Table maps a full method name ("/pkg.Service/Method") to the principals
// allowed to call it. A method that is not in the table is denied.
type Table map[string][]Principal

// Allows reports whether id may call method.
func (t Table) Allows(method string, id identity.ID) bool {
	for _, p := range t[method] {
		if p.Matches(id) {
			return true
		}
	}
	return false
}

// Merge returns a table holding the entries of all tables. A method listed
// twice is a programming error and panics at start-up.
func Merge(tables ...Table) Table {
	out := Table{}
	for _, t := range tables {
		for m, ps := range t {
			if _, dup := out[m]; dup {
				panic(fmt.Sprintf("authz: method %s listed twice", m))
			}
			out[m] = ps
		}
	}
	return out
}

// DenyHook is told about every refused call, so a service can put denials on
// its audit log. It must not block.
type DenyHook func(ctx context.Context, method string, caller identity.ID, reason string)

// Authorizer enforces a Table.
type Authorizer struct {
	table  Table
	logger *slog.Logger
	onDeny DenyHook
}

// New returns an Authorizer for table. logger receives one warning per
// denial; onDeny may be nil.
func New(table Table, logger *slog.Logger, onDeny DenyHook) *Authorizer {
	if logger == nil {
		logger = slog.Default()
	}
	return &Authorizer{table: table, logger: logger, onDeny: onDeny}
}

// Authorize extracts the caller's identity from the verified peer
// certificate, checks it against the table for the method in ctx, and
// returns a context carrying the identity. Its signature matches
// go-grpc-middleware's auth.AuthFunc.
func (a *Authorizer) Authorize(ctx context.Context) (context.Context, error) {
	method, ok := grpc.Method(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "authz: no method in context")
	}
	id, err := identity.FromPeer(ctx)
	if err != nil {
		// The TLS layer already refuses such peers; reaching here means a
		// listener was built without it, which must not serve anything.
		a.logger.WarnContext(ctx, "rpc refused: no caller identity", "method", method, "error", err)
		return nil, status.Error(codes.Unauthenticated, "authz: caller has no verified SPIFFE identity")
	}
	if !a.table.Allows(method, id) {
		reason := "not allowed by the authorization table"
		if _, listed := a.table[method]; !listed {
			reason = "method is not in the authorization table"
		}
		a.logger.WarnContext(ctx, "rpc denied", "method", method, "caller", id.String(), "reason", reason)
		if a.onDeny != nil {
			a.onDeny(ctx, method, id, reason)
		}
		return nil, status.Errorf(codes.PermissionDenied, "%s %s: %s may not call it", DeniedPrefix, method, id)
	}
	return identity.NewContext(ctx, id), nil
}

// DeniedPrefix starts the message of every PermissionDenied this package
// returns, so callers and tests can tell the table's refusal from a
// handler's own PermissionDenied.
const DeniedPrefix = "authz: permission denied:"
