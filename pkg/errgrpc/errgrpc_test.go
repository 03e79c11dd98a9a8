package errgrpc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

func TestRoundTrip(t *testing.T) {
	for _, c := range codeOf {
		err := fmt.Errorf("%w: job_id: required", c.err)
		st := ToGRPC(err)
		if got := status.Code(st); got != c.code {
			t.Errorf("ToGRPC(%q) code = %v, want %v", err, got, c.code)
		}
		if got := status.Convert(st).Message(); got != err.Error() {
			t.Errorf("ToGRPC(%q) message = %q", err, got)
		}
		back := FromGRPC(st)
		if !errors.Is(back, c.err) {
			t.Errorf("FromGRPC(%v) = %v, does not wrap %v", st, back, c.err)
		}
	}
}

func TestToGRPCHidesInternalDetail(t *testing.T) {
	st := ToGRPC(errors.New("open /var/lib/airlock/secret: permission denied"))
	if status.Code(st) != codes.Internal || status.Convert(st).Message() != "internal error" {
		t.Fatalf("ToGRPC(plain error) = %v, want Internal \"internal error\"", st)
	}
	pass := status.Error(codes.Unauthenticated, "no caller identity")
	if got := ToGRPC(pass); got != pass {
		t.Fatalf("a status error changed: %v", got)
	}
	if ToGRPC(nil) != nil || FromGRPC(nil) != nil {
		t.Fatal("nil did not stay nil")
	}
}

func TestFromGRPCKeepsUnknownCodes(t *testing.T) {
	st := status.Error(codes.Aborted, "try again")
	got := FromGRPC(st)
	if got != st {
		t.Fatalf("FromGRPC(Aborted) = %v, want the status unchanged", got)
	}
	plain := errors.New("not a status")
	if FromGRPC(plain) != plain {
		t.Fatal("a plain error changed")
	}
	if errors.Is(FromGRPC(status.Error(codes.NotFound, "x")), errdefs.ErrInvalidArgument) {
		t.Fatal("NotFound mapped to the wrong sentinel")
	}
}

func TestFromPeer(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want error
		msg  string
	}{
		{codes.Unavailable, errdefs.ErrUnavailable, "unavailable: executor: down"},
		{codes.ResourceExhausted, errdefs.ErrUnavailable, "unavailable: executor: down"},
		{codes.Internal, errdefs.ErrUnavailable, "unavailable: executor: down"},
		{codes.NotFound, errdefs.ErrNotFound, "executor: not found: down"},
		{codes.PermissionDenied, errdefs.ErrPermissionDenied, "executor: permission denied: down"},
		{codes.Canceled, context.Canceled, "context canceled"},
	} {
		got := FromPeer("executor", status.Error(tc.code, "down"))
		if !errors.Is(got, tc.want) || got.Error() != tc.msg {
			t.Errorf("FromPeer(%v) = %q, want %q wrapping %v", tc.code, got, tc.msg, tc.want)
		}
	}
}
