package execspec_test

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/execspec"
)

// TestWholeDigestIsTheRecordedOne: the whole request's digest is the one
// the authority's exec records have kept since they were first written
// (values from that code), so a retry of an old request is still the same
// request.
func TestWholeDigestIsTheRecordedOne(t *testing.T) {
	for _, tc := range []struct {
		spec execspec.Spec
		want string
	}{
		{execspec.Spec{Argv: []string{"make", "test"}, Env: map[string]string{"V": "1"}, Cwd: "/work/sub", Timeout: time.Minute, StdinSize: 2, StdinSHA256: "ab"},
			"sha256:8d965fb4981da5af19e3ed1d6c33df305665d162d5e14c152e425711140f1e0c"},
		{execspec.Spec{Argv: []string{"sh"}, StdinStream: true}, "sha256:45f0b5e26c6b9753fa5b7aa37ffc087efc40e8cb9205f3e5049d5e20889732e2"},
	} {
		if _, got := tc.spec.Digests(); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.spec, got, tc.want)
		}
	}
}

// TestDiffers names the first field that differs, in one set of names.
func TestDiffers(t *testing.T) {
	base := execspec.Spec{Argv: []string{"make"}, Env: map[string]string{"A": "1"}, Cwd: "/work", Timeout: time.Second, StdinSize: 1, StdinSHA256: "x"}
	recorded, _ := base.Digests()
	for _, tc := range []struct {
		edit func(*execspec.Spec)
		want string
	}{
		{func(*execspec.Spec) {}, ""},
		{func(x *execspec.Spec) { x.Argv = []string{"rm"}; x.Cwd = "/" }, "spec.argv"},
		{func(x *execspec.Spec) { x.Env = map[string]string{"A": "2"} }, "spec.env"},
		{func(x *execspec.Spec) { x.Cwd = "/work/sub" }, "spec.cwd"},
		{func(x *execspec.Spec) { x.Timeout = 0 }, "spec.timeout"},
		{func(x *execspec.Spec) { x.StdinStream = true }, "spec.stdin_stream"},
		{func(x *execspec.Spec) { x.StdinSHA256 = "y" }, "spec.stdin"},
	} {
		x := base
		tc.edit(&x)
		if got := execspec.Differs(recorded, x); got != tc.want {
			t.Errorf("%+v: %q, want %q", x, got, tc.want)
		}
	}
	// No environment and an empty one are the same.
	none := base
	none.Env = nil
	d, _ := none.Digests()
	if got := execspec.Differs(d, execspec.Spec{Argv: base.Argv, Env: map[string]string{}, Cwd: base.Cwd, Timeout: base.Timeout, StdinSize: 1, StdinSHA256: "x"}); got != "" {
		t.Errorf("empty env vs none: %q", got)
	}
	// A record from before stdin_stream had a digest of its own names the
	// stream's difference by stdin.
	delete(recorded, "stdin_stream")
	stream := base
	stream.StdinStream = true
	if got := execspec.Differs(recorded, stream); got != "spec.stdin" {
		t.Errorf("old record, stream differs: %q", got)
	}
}

func TestCut(t *testing.T) {
	long := strings.Repeat("a", 3000)
	argv, env, cut := execspec.Cut([]string{"sh", long, long, "x"}, map[string]string{"B": "2", "A": "1"}, execspec.CutBytes)
	if len(argv) != 2 || !cut || len(env) != 2 {
		t.Fatalf("argv %d, env %v, cut %v: want the first two arguments, the env that still fits, cut", len(argv), env, cut)
	}
	argv, env, cut = execspec.Cut([]string{"true"}, nil, 10)
	if len(argv) != 1 || env != nil || cut {
		t.Fatalf("%v %v %v", argv, env, cut)
	}
	_, env, cut = execspec.Cut(nil, map[string]string{"A": "1", "B": strings.Repeat("b", 20)}, 10)
	if len(env) != 1 || env["A"] != "1" || !cut {
		t.Fatalf("env %v cut %v: want A only, cut", env, cut)
	}
}
