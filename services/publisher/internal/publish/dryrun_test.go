package publish_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

func (h *harness) dryRun(s *publish.Service) (store.Deployment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return s.DryRun(ctx, pipeline, publish.Request{ApprovalID: "appr-1", IdempotencyKey: "dry"})
}

// wantNothingSpent checks that a dry run left no record, consumed no
// approval, took no lease and pushed nothing.
func (h *harness) wantNothingSpent() {
	h.t.Helper()
	list, _, err := h.store.List(context.Background(), "", "", 10, "")
	if err != nil || len(list) != 0 {
		h.t.Errorf("the store holds %d deployments after a dry run (%v), want none", len(list), err)
	}
	if n := h.auth.consumes(); n != 0 {
		h.t.Errorf("%d consumes after a dry run", n)
	}
	if n := h.auth.count("p1", "Lease"); n != 0 {
		h.t.Errorf("%d leases after a dry run", n)
	}
	if got := h.landed(); len(got) != 0 {
		h.t.Errorf("a dry run pushed %v", got)
	}
}

func TestDryRunRefusesAPlantedKeyAndSpendsNothing(t *testing.T) {
	h := newHarness(t, map[string]string{"config.ini": "[default]\naws_access_key_id = AKIAQYLPMN5HHHFPZAM2\n"})
	h.auth.setState("pending")
	s, _ := h.service("p1")
	d, err := h.dryRun(s)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Failed || d.ID != "" || d.Commit != "" || len(d.Findings) == 0 ||
		d.Findings[0].Rule != "secret.aws-access-token" || d.Findings[0].Path != "config.ini" || !strings.Contains(d.Message, "validation refused") ||
		!strings.HasPrefix(d.Message, "dry run, nothing recorded or pushed: ") {
		t.Fatalf("dry run: %+v", d)
	}
	h.wantNothingSpent()
}

func TestDryRunPassesCleanContent(t *testing.T) {
	h := newHarness(t, map[string]string{"lib/greet.txt": "hello, airlock\n"})
	s, _ := h.service("p1")
	d, err := h.dryRun(s)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.Succeeded || d.Step != store.StepValidated || d.Commit != "" || len(d.Findings) != 0 || d.FilesDigest == "" ||
		!strings.HasPrefix(d.Message, "dry run, nothing recorded or pushed") {
		t.Fatalf("dry run of clean content: %+v", d)
	}
	h.wantNothingSpent()
	// The real publish afterwards is untouched by it.
	if d, err := h.publish(s, "real"); err != nil || d.State != store.Succeeded {
		t.Fatalf("publish after a dry run: %+v, %v", d, err)
	}
}

func TestDryRunRefusesASpentOrDeniedApproval(t *testing.T) {
	for _, state := range []string{publish.ApprovalConsumed, "denied", "expired"} {
		h := newHarness(t, map[string]string{"a.txt": "a\n"})
		h.auth.setState(state)
		s, _ := h.service("p1")
		if _, err := h.dryRun(s); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "is "+state) {
			t.Errorf("dry run on a %s approval: %v, want a failed precondition naming it", state, err)
		}
	}
}

// Two dry runs at once hold the publisher's dry-run slots; a third is
// refused ResourceExhausted, and one goes through again once they end.
func TestDryRunsAreBounded(t *testing.T) {
	h := newHarness(t, map[string]string{"a.txt": "a\n"})
	held, release := make(chan struct{}, 2), make(chan struct{})
	h.auth.setFault(func(_, method string) error {
		if method == "Spec" {
			held <- struct{}{}
			<-release
		}
		return nil
	})
	s, _ := h.service("p1")
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := h.dryRun(s); errs <- err }()
	}
	<-held
	<-held
	if _, err := h.dryRun(s); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a third dry run at once: %v, want resource exhausted", err)
	}
	h.auth.setFault(nil)
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a held dry run: %v", err)
		}
	}
	if d, err := h.dryRun(s); err != nil || d.State != store.Succeeded {
		t.Errorf("a dry run after the others ended: %+v, %v", d, err)
	}
}

// A dry run's bundle copy that a stopped publisher left behind is removed
// when the publisher starts; a real deployment's bundle is not.
func TestDryRunLeftoversRemovedAtStart(t *testing.T) {
	h := newHarness(t, map[string]string{"a.txt": "a\n"})
	dir := t.TempDir()
	bundles := filepath.Join(dir, "bundles")
	if err := os.MkdirAll(bundles, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"dry-run-x.tar", "dry-run-x.tar.provenance", "dep-1.tar"} {
		if err := os.WriteFile(filepath.Join(bundles, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	checker, err := contentcheck.New(contentcheck.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := publish.New(ctx, publish.Config{Store: h.store, Authority: h.auth.as("p1"), Executor: h.exec, Checker: checker, Dir: dir})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() { cancel(); s.Wait() }()
	left, _ := filepath.Glob(filepath.Join(bundles, "*"))
	if len(left) != 1 || filepath.Base(left[0]) != "dep-1.tar" {
		t.Errorf("bundles after start: %v, want only dep-1.tar", left)
	}
}
