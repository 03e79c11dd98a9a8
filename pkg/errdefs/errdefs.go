// Package errdefs owns Airlock's error vocabulary: the sentinel errors domain
// packages wrap. It imports no grpc: domain packages return wrapped sentinels,
// and pkg/errgrpc alone maps them to gRPC status codes and back.
package errdefs

import (
	"context"
	"errors"
	"strings"
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

// kinds are the errors whose words Detail strips: the sentinels and the
// context errors a caller is also told by kind.
var kinds = []error{
	ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrPermissionDenied,
	ErrFailedPrecondition, ErrResourceExhausted, ErrUnavailable, ErrNotImplemented,
	ErrDataLoss, context.Canceled, context.DeadlineExceeded,
}

// Detail is err's message without the sentinel's words it starts with
// ("failed precondition: target: …" → "target: …"), for a record or a
// status that says its kind elsewhere.
func Detail(err error) string {
	msg := err.Error()
	for _, k := range kinds {
		if rest, ok := strings.CutPrefix(msg, k.Error()+": "); ok && errors.Is(err, k) {
			return rest
		}
	}
	return msg
}
