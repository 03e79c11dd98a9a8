package sqlstore

import (
	"testing"
	"time"
)

func TestCeilMicros(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, tc := range []struct {
		t    time.Time
		want int64
	}{
		{at, at.UnixMicro()},
		{at.Add(time.Nanosecond), at.UnixMicro() + 1},
		{at.Add(999 * time.Nanosecond), at.UnixMicro() + 1},
		{time.UnixMicro(-5).Add(-time.Nanosecond), -5},
	} {
		if got := ceilMicros(tc.t); got != tc.want {
			t.Errorf("ceilMicros(%v) = %d, want %d", tc.t, got, tc.want)
		}
	}
}
