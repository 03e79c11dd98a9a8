package usd

import (
	"math"
	"testing"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		micros int64
		want   string
	}{
		{0, "$0.00"},
		{4760000, "$4.76"},
		{11360000, "$11.36"},
		{4999, "$0.004999"},
		{18, "$0.000018"},
		{1, "$0.000001"},
		{5000, "$0.01"},
		{14999, "$0.01"},
		{15000, "$0.02"},
		{100020000, "$100.02"},
		{-4760000, "-$4.76"},
		{-18, "-$0.000018"},
		{math.MaxInt64, "$9223372036854.78"},
		{math.MinInt64, "-$9223372036854.78"},
	} {
		if got := Format(tc.micros); got != tc.want {
			t.Errorf("Format(%d) = %q, want %q", tc.micros, got, tc.want)
		}
	}
}
