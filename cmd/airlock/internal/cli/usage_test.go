package cli

import (
	"strings"
	"testing"
	"time"
)

// TestUsageFlagsRefused: a bad --by, --since, --until or --limit is
// refused, naming the flag, before any call.
func TestUsageFlagsRefused(t *testing.T) {
	f := &fakeAuthority{}
	cfg := serveFake(t, f)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--by", "week"}, `--by "week": want job or day`},
		{[]string{"--since", "yesterday"}, `--since "yesterday": want a date`},
		{[]string{"--until", "2026-13-01"}, `--until "2026-13-01"`},
		{[]string{"--since", "-1h"}, `--since "-1h": a duration ago must not be negative`},
		{[]string{"--until", "-30m"}, `--until "-30m": a duration ago must not be negative`},
		{[]string{"--limit", "1001"}, "--limit 1001: want 1 to 1000"},
	} {
		code, _, errOut := runCLI(t, cfg, nil, append([]string{"usage"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("usage %v: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
	if got := f.sawTenants(); len(got) != 0 {
		t.Fatalf("a refused flag reached the authority (%d requests)", len(got))
	}
}

func TestWhenFlagAndDollars(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-12-01":           time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"72h":                  now.Add(-72 * time.Hour),
		"2026-12-02T03:04:05Z": time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC),
	} {
		got, err := whenFlag("since", in, now)
		if err != nil || !got.AsTime().Equal(want) {
			t.Errorf("whenFlag(%q) = %v, %v; want %v", in, got.AsTime(), err, want)
		}
	}
	for micros, want := range map[int64]string{4_760_000: "$4.76", 11_360_000: "$11.36", 100_015_000: "$100.02", 4_999: "$0.004999", 18: "$0.000018", 5_000: "$0.01", 0: "$0.00"} {
		if got := dollars(micros); got != want {
			t.Errorf("dollars(%d) = %s, want %s", micros, got, want)
		}
	}
}
