// Package errgrpc maps Airlock's error vocabulary (pkg/errdefs) to gRPC
// status codes and back, in one table. Only adapters import it: the API
// packages call ToGRPC to answer, the clients of another service call
// FromGRPC on what it answered; domain packages see sentinels only.
package errgrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

var codeOf = []struct {
	err  error
	code codes.Code
}{
	{errdefs.ErrInvalidArgument, codes.InvalidArgument},
	{errdefs.ErrNotFound, codes.NotFound},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	{errdefs.ErrUnavailable, codes.Unavailable},
	{errdefs.ErrNotImplemented, codes.Unimplemented},
	{errdefs.ErrDataLoss, codes.DataLoss},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// ToGRPC maps err to a status error. An error that wraps a sentinel keeps its
// message, which is written for the caller; any other error becomes Internal
// with a generic message, because its text may carry internal detail — the
// caller of ToGRPC logs the original. A status error passes through.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, c := range codeOf {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Internal, "internal error")
}

// FromGRPC maps a status error from a peer back to a wrapped sentinel, so a
// domain package can test it with errors.Is.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, c := range codeOf {
		if c.code == st.Code() {
			return fmt.Errorf("%w: %s", c.err, st.Message())
		}
	}
	return err
}

// FromPeer maps a status from peer (a service's name, for the message) for
// a client that retries what may pass by itself: the peer restarting, a
// deadline, a peer out of capacity (Unavailable, Aborted, Internal,
// Unknown, DeadlineExceeded, ResourceExhausted) is ErrUnavailable; Canceled
// is context.Canceled; the rest is FromGRPC's sentinel, named after peer.
func FromPeer(peer string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable, codes.Aborted, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted:
		return fmt.Errorf("%w: %s: %s", errdefs.ErrUnavailable, peer, st.Message())
	case codes.Canceled:
		return context.Canceled
	}
	return fmt.Errorf("%s: %w", peer, FromGRPC(err))
}
