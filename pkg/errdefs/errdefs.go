// Package errdefs owns Airlock's error vocabulary: the sentinel errors domain
// packages wrap, and the one mapping from them to gRPC status codes. Domain
// packages return wrapped sentinels and never import grpc; API adapters call
// ToGRPC and nothing else to turn an error into a status.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinels. Wrap them with detail meant for the caller:
// fmt.Errorf("%w: spec.command: at least one element is required", ErrInvalidArgument).
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrNotImplemented     = errors.New("not implemented")
	// ErrDataLoss: stored data is not what it must be (a bundle whose
	// bytes do not have its recorded digest).
	ErrDataLoss = errors.New("data loss")
)

var codeOf = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrUnavailable, codes.Unavailable},
	{ErrNotImplemented, codes.Unimplemented},
	{ErrDataLoss, codes.DataLoss},
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

// Detail is err's message without the sentinel's words it starts with
// ("failed precondition: target: …" → "target: …"), for a record or a
// status that says its kind elsewhere.
func Detail(err error) string {
	msg := err.Error()
	for _, c := range codeOf {
		if rest, ok := strings.CutPrefix(msg, c.err.Error()+": "); ok && errors.Is(err, c.err) {
			return rest
		}
	}
	return msg
}
