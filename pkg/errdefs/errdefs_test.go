package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestDetail(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: target: x", ErrFailedPrecondition), "target: x"},
		{fmt.Errorf("%w: job_id: required", ErrInvalidArgument), "job_id: required"},
		// Only the words of the sentinel it wraps come off.
		{errors.New("failed precondition: not wrapped"), "failed precondition: not wrapped"},
		{fmt.Errorf("authority: %w: gone", ErrUnavailable), "authority: unavailable: gone"},
	} {
		if got := Detail(tc.err); got != tc.want {
			t.Errorf("Detail(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
