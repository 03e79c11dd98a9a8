package publish_test

import (
	"testing"

	"github.com/airlockhq/airlock/pkg/telemetry/metricstest"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// A refused run and a run that lands are counted by outcome, each with
// its duration.
func TestMetrics(t *testing.T) {
	rd := metricstest.NewReader(t)
	h := newHarness(t, approvedChange)
	h.meter = rd.Provider
	h.exec.damage(1000)
	s, _ := h.service("a")
	if d, err := h.publish(s, "k"); err != nil || d.State != store.Failed {
		t.Fatalf("a damaged bundle: %s, %v; want failed", d.State, err)
	}
	h.exec.damage(0)
	if d, err := h.publish(s, "k"); err != nil || d.State != store.Succeeded {
		t.Fatalf("asked again: %s, %v; want succeeded", d.State, err)
	}
	got := rd.Collect(t)
	for _, outcome := range []string{"refused", "succeeded"} {
		attrs := map[string]string{"outcome": outcome}
		if n, ok := got.Value("airlock.publisher.runs", attrs); !ok || n != 1 {
			t.Errorf("runs %v = %v (%v), want 1\n%s", attrs, n, ok, got.Points("airlock.publisher.runs"))
		}
		if n, sum, ok := got.Histogram("airlock.publisher.run.duration", attrs); !ok || n != 1 || sum <= 0 {
			t.Errorf("run.duration %v: count %d sum %v (%v), want one run\n%s", attrs, n, sum, ok, got.Points("airlock.publisher.run.duration"))
		}
	}
}
