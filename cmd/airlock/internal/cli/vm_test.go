package cli

import (
	"slices"
	"strings"
	"testing"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestSubmitRuntimeAndWith: --runtime vm and --with docker (shared by job
// submit and session create) reach the spec; a class no build knows is
// refused before any call, naming the flag and the classes there are.
// What with may hold is the authority's to say, so the CLI passes it on.
func TestSubmitRuntimeAndWith(t *testing.T) {
	f := &fakeAuthority{job: &authorityv1.Job{JobId: "j1"}}
	cfg := serveFake(t, f)
	for _, args := range [][]string{
		{"job", "submit", "--repo", "demo", "--runtime", "vm", "--with", "docker", "--", "docker", "build", "."},
		{"session", "create", "--repo", "demo", "--runtime", "vm", "--with", "docker", "--no-wait"},
	} {
		n := len(f.specs)
		if code, _, errOut := runCLI(t, cfg, nil, args...); code != 0 {
			t.Fatalf("%q: %d %s", args, code, errOut)
		}
		s := f.specs[n]
		if s.GetRuntimeClass() != typesv1.RuntimeClass_RUNTIME_CLASS_VM || !slices.Equal(s.GetWith(), []string{"docker"}) {
			t.Errorf("%q: spec class %v with %q, want vm with [docker]", args, s.GetRuntimeClass(), s.GetWith())
		}
	}
	for word, want := range map[string]typesv1.RuntimeClass{"runc": typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, "runsc": typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC} {
		n := len(f.specs)
		if code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--runtime", word, "--", "true"); code != 0 || f.specs[n].GetRuntimeClass() != want {
			t.Errorf("--runtime %s: %d %s", word, code, errOut)
		}
	}
	for _, bad := range []string{"kata", "VM", "unspecified", "runtime_class_vm"} {
		n := len(f.specs)
		code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--runtime", bad, "--", "true")
		if code != 2 || !strings.Contains(errOut, "--runtime") || !strings.Contains(errOut, "runc, runsc or vm") {
			t.Errorf("--runtime %s: exit %d, %q; want 2 naming --runtime and the classes", bad, code, errOut)
		}
		if len(f.specs) != n {
			t.Errorf("--runtime %s: submitted anyway", bad)
		}
	}
}

// TestGetShowsWith: job get and session get say what runs beside the job,
// and a result's runtime says when its VM was emulated.
func TestGetShowsWith(t *testing.T) {
	job := &authorityv1.Job{JobId: "j1", Spec: &authorityv1.JobSpec{RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_VM, With: []string{"docker"}},
		State: authorityv1.JobState_JOB_STATE_FINISHED,
		Result: &typesv1.RunResult{RuntimeClass: typesv1.RuntimeClass_RUNTIME_CLASS_VM,
			RuntimeVersion: "airlock-vm dev; qemu QEMU emulator version 8.2.2; accel tcg (emulated); sha256:00"}}
	f := &fakeAuthority{job: job, session: &authorityv1.GetSessionResponse{Session: job}}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "job", "get", "j1")
	if code != 0 || !strings.Contains(out, "with       docker\n") || !strings.Contains(out, "runtime    vm (airlock-vm dev, emulated)") {
		t.Errorf("job get: %d %q %q; want a with line and an emulated vm runtime", code, out, errOut)
	}
	code, out, errOut = runCLI(t, cfg, nil, "session", "get", "j1")
	if code != 0 || !strings.Contains(out, "with       docker\n") {
		t.Errorf("session get: %d %q %q; want a with line", code, out, errOut)
	}
	if got := runtimeVersionText("runc 1.2.3; sha256:00"); got != "runc 1.2.3" {
		t.Errorf("runtimeVersionText of runc = %q", got)
	}
}
