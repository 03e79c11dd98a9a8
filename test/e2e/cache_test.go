//go:build linux

package e2e

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// TestCachesEndToEnd: through the real services, a tenant's named cache
// keeps what a repository's first job wrote for its second job (whose
// result says it did not start clean); another tenant's job on the same
// repository starts cold; cache list shows it, cache clear wipes it (on
// the audit log), and a name the tenant's policy lacks is refused.
func TestCachesEndToEnd(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	caches := map[string]any{"go-build": map[string]any{"path": "/root/.cache/go-build", "max_size": "1MiB"}}
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.editTenants(t, func(tenants, dev map[string]any) {
		dev["caches"] = caches
		tenants["other"].(map[string]any)["caches"] = caches
	})
	s.restartService(t, "authority")

	write := s.airlock(t, "job", "submit", "--repo", "sample", "--cache", "go-build", "--wait", "--",
		"sh", "-c", "mkdir -p /root/.cache/go-build/ab && echo hot > /root/.cache/go-build/ab/obj")
	if write.code != 0 || !strings.Contains(write.stderr, "cache      go-build at /root/.cache/go-build: started from empty") ||
		!strings.Contains(write.stderr, "committed") {
		t.Fatalf("first job: exit %d\n%s", write.code, write.stderr)
	}
	read := []string{"--wait", "-o", "json", "--", "sh", "-c", "cat /root/.cache/go-build/ab/obj 2>/dev/null || echo cold"}
	res := s.airlock(t, append([]string{"job", "submit", "--repo", "sample", "--cache", "go-build"}, read...)...)
	if res.code != 0 || !strings.Contains(res.stderr, "hot") {
		t.Fatalf("second job: exit %d, want it to read the first's file\n%s", res.code, res.stderr)
	}
	job := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
		t.Fatal(err)
	}
	if c := job.GetResult().GetCaches(); len(c) != 1 || c[0].GetSizeBefore() == 0 || !c[0].GetCommitted() {
		t.Errorf("second job's result caches %v: want a non-empty start, committed", c)
	}

	res = s.airlock(t, append([]string{"--as", "client/other", "job", "submit", "--tenant", "other", "--repo", "sample", "--cache", "go-build"}, read...)...)
	if res.code != 0 || !strings.Contains(res.stderr, "cold") || strings.Contains(res.stderr, "hot") {
		t.Fatalf("another tenant's job on the same repository: exit %d, want cold\n%s", res.code, res.stderr)
	}

	list := s.airlock(t, "cache", "list")
	if list.code != 0 || !strings.Contains(list.stdout, "sample") || !strings.Contains(list.stdout, "go-build") {
		t.Fatalf("cache list: exit %d\n%s%s", list.code, list.stdout, list.stderr)
	}
	if other := s.airlock(t, "--as", "client/other", "cache", "clear", "--tenant", "dev"); other.code == 0 || !strings.Contains(other.stderr, "does not act for tenant") {
		t.Errorf("another tenant's client cleared dev's caches: exit %d\n%s", other.code, other.stderr)
	}
	if clear := s.airlock(t, "cache", "clear", "--repository", "sample", "go-build"); clear.code != 0 || !strings.Contains(clear.stdout, "cleared 1") {
		t.Fatalf("cache clear: exit %d\n%s%s", clear.code, clear.stdout, clear.stderr)
	}
	res = s.airlock(t, append([]string{"job", "submit", "--repo", "sample", "--cache", "go-build"}, read...)...)
	if res.code != 0 || !strings.Contains(res.stderr, "cold") {
		t.Errorf("after clear: exit %d, want cold\n%s", res.code, res.stderr)
	}
	audit := s.airlock(t, "audit", "list", "--as", "approver/alice", "--kind", "caches.cleared")
	if audit.code != 0 || !strings.Contains(audit.stdout, "caches.cleared") {
		t.Errorf("audit of the clear: exit %d\n%s%s", audit.code, audit.stdout, audit.stderr)
	}

	bad := s.airlock(t, "job", "submit", "--repo", "sample", "--cache", "npm", "--", "true")
	if bad.code == 0 || !strings.Contains(bad.stderr, `spec.caches[0]: "npm" is not a cache of tenant "dev"`) {
		t.Errorf("an unknown cache: exit %d\n%s", bad.code, bad.stderr)
	}
}
