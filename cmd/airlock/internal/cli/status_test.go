package cli

import (
	"reflect"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The executor's components below runtime/CLASS become one note per class:
// a runsc that failed its self-check says so beside its NOT_SERVING.
func TestRuntimeNotes(t *testing.T) {
	const serving, notServing = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	for _, tc := range []struct {
		name  string
		comps map[string]healthpb.HealthCheckResponse_ServingStatus
		want  map[string]string
	}{
		{"older executor", map[string]healthpb.HealthCheckResponse_ServingStatus{"runtime/runc": serving, "cgroup/v1": serving}, nil},
		{"passed", map[string]healthpb.HealthCheckResponse_ServingStatus{
			"runtime/runsc": serving, "runtime/runsc/platform/ptrace": serving, "runtime/runsc/self-check": serving,
		}, map[string]string{"runsc": "platform ptrace, self-check passed"}},
		{"cached", map[string]healthpb.HealthCheckResponse_ServingStatus{
			"runtime/runsc": serving, "runtime/runsc/platform/ptrace": serving, "runtime/runsc/self-check": serving, "runtime/runsc/self-check/cached": serving,
		}, map[string]string{"runsc": "platform ptrace, self-check passed (cached from an earlier start)"}},
		{"failed", map[string]healthpb.HealthCheckResponse_ServingStatus{
			"runtime/runsc": notServing, "runtime/runsc/platform/systrap": notServing, "runtime/runsc/self-check": notServing,
		}, map[string]string{"runsc": "platform systrap, self-check FAILED: refused (see the executor's log)"}},
		{"emulated vm", map[string]healthpb.HealthCheckResponse_ServingStatus{
			"runtime/runc": serving, "runtime/vm": serving, "runtime/vm/emulated": serving,
		}, map[string]string{"vm": "vm: emulated (QEMU's TCG, no KVM: for development and CI only)"}},
		{"kvm vm", map[string]healthpb.HealthCheckResponse_ServingStatus{"runtime/vm": serving}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := runtimeNotes(tc.comps); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("runtimeNotes = %v, want %v", got, tc.want)
			}
		})
	}
}
