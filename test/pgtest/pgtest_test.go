package pgtest

import "testing"

func TestMissingFailsOnlyInCI(t *testing.T) {
	for _, tc := range []struct {
		ci   string
		fail bool
	}{{"true", true}, {"1", true}, {"", false}, {"false", false}} {
		fail, msg := missing(func(k string) string {
			if k == "CI" {
				return tc.ci
			}
			return ""
		})
		if fail != tc.fail || msg == "" {
			t.Errorf("CI=%q: fail=%v (%s), want %v", tc.ci, fail, msg, tc.fail)
		}
	}
}

func TestWithParam(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@127.0.0.1:5432/db?sslmode=disable", "postgres://u:p@127.0.0.1:5432/db?search_path=s1&sslmode=disable"},
		{"postgres://u@127.0.0.1/db?search_path=old", "postgres://u@127.0.0.1/db?search_path=s1"},
		{"host=127.0.0.1 dbname=db", "host=127.0.0.1 dbname=db search_path=s1"},
	} {
		if got := WithParam(tc.dsn, "search_path", "s1"); got != tc.want {
			t.Errorf("WithParam(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
}
