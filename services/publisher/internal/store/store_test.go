package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
	"github.com/airlockhq/airlock/test/pgtest"
)

// backends runs one test against each database the store runs on: a
// SQLite file and, from AIRLOCK_TEST_POSTGRES_DSN, a PostgreSQL schema of
// its own (in CI a missing PostgreSQL fails the test).
func backends(t *testing.T, test func(t *testing.T, open func() *store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "publisher.db")
		test(t, func() *store.Store {
			s, err := store.OpenSQLite(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn, _ := pgtest.Schema(t)
		test(t, func() *store.Store {
			s, err := store.OpenPostgres(context.Background(), dsn, 4)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func deployment(id, key, approval, digest string) store.Deployment {
	return store.Deployment{ID: id, IdempotencyKey: key, RequestDigest: digest, Requester: "spiffe://airlock.test/pipeline/deploy",
		JobID: "job-" + approval, ApprovalID: approval, Tenant: "dev", BundleDigest: "sha256:b", TargetRepo: "demo", TargetBranch: "main",
		State: store.InProgress, Step: store.StepAccepted, Steps: map[store.Step]time.Time{store.StepAccepted: t0},
		CreatedAt: t0, UpdatedAt: t0}
}

func TestIdempotencyAndOneDeploymentPerApproval(t *testing.T) {
	backends(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		d, created, err := s.Create(ctx, deployment("d1", "k1", "a1", "req-1"))
		if err != nil || !created {
			t.Fatalf("first: %v %v", created, err)
		}
		// The same key and request: the same deployment.
		if again, created, err := s.Create(ctx, deployment("d2", "k1", "a1", "req-1")); err != nil || created || again.ID != d.ID {
			t.Fatalf("same key: %s %v %v", again.ID, created, err)
		}
		// The same key, another request: refused naming the field.
		if _, _, err := s.Create(ctx, deployment("d3", "k1", "a9", "req-2")); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("same key, other request: %v", err)
		}
		// Another key for the same approval: that deployment, not a second.
		if other, created, err := s.Create(ctx, deployment("d4", "k2", "a1", "req-3")); err != nil || created || other.ID != d.ID {
			t.Fatalf("another key, same approval: %s %v %v", other.ID, created, err)
		}
	})
}

func TestConcurrentCreatesMakeOneDeployment(t *testing.T) {
	backends(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			ids     = map[string]bool{}
			created int
		)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, c, err := s.Create(ctx, deployment(fmt.Sprintf("d%d", i), fmt.Sprintf("k%d", i), "a1", fmt.Sprintf("r%d", i)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids[d.ID] = true
				if c {
					created++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if len(ids) != 1 || created != 1 {
			t.Fatalf("20 pipelines publishing one approval at once made %d deployments (%d created)", len(ids), created)
		}
	})
}

func TestStepsSurviveReopen(t *testing.T) {
	backends(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		if _, _, err := s.Create(ctx, deployment("d1", "k1", "a1", "r")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Create(ctx, deployment("d2", "k2", "a2", "r")); err != nil {
			t.Fatal(err)
		}
		at := t0.Add(time.Minute)
		if _, err := s.Update(ctx, "d1", func(d *store.Deployment) error {
			d.Step, d.Steps[store.StepPrepared] = store.StepPrepared, at
			d.Commit, d.ParentCommit = "c0ffee", "base"
			d.Findings = []store.Finding{{Rule: "path.dotgit", Path: ".git/config", Message: "no"}}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Update(ctx, "d2", func(d *store.Deployment) error { d.State = store.Failed; return nil }); err != nil {
			t.Fatal(err)
		}
		refused := errors.New("refused")
		if _, err := s.Update(ctx, "d1", func(d *store.Deployment) error { d.Commit = "lost"; return refused }); !errors.Is(err, refused) {
			t.Fatalf("an update that fails: %v", err)
		}
		s2 := open()
		d, err := s2.Get(ctx, "d1")
		if err != nil {
			t.Fatal(err)
		}
		if d.Step != store.StepPrepared || d.Commit != "c0ffee" || !d.Steps[store.StepPrepared].Equal(at) || d.Version != 2 ||
			len(d.Findings) != 1 || d.Findings[0].Path != ".git/config" {
			t.Fatalf("after reopening: %+v", d)
		}
		un, err := s2.Unfinished(ctx)
		if err != nil || len(un) != 1 || un[0].ID != "d1" {
			t.Fatalf("unfinished: %v %v", un, err)
		}
		if _, err := s2.Get(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a missing deployment: %v", err)
		}
		page, next, err := s2.List(ctx, "", "demo", 1, "")
		if err != nil || len(page) != 1 || next == "" {
			t.Fatalf("list page 1: %v %q %v", page, next, err)
		}
		page2, next2, err := s2.List(ctx, "", "demo", 1, next)
		if err != nil || len(page2) != 1 || next2 != "" || page2[0].ID == page[0].ID {
			t.Fatalf("list page 2: %v %q %v", page2, next2, err)
		}
		if _, _, err := s2.List(ctx, "", "", 1, "garbage"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("a bad token: %v", err)
		}
	})
}
