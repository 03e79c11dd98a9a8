package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

func (f *fakeAuthority) ListCaches(_ context.Context, req *authorityv1.ListCachesRequest) (*authorityv1.ListCachesResponse, error) {
	f.sawTenant(req.GetTenant())
	return &authorityv1.ListCachesResponse{Caches: f.caches}, f.err
}

func (f *fakeAuthority) ListImages(_ context.Context, req *authorityv1.ListImagesRequest) (*authorityv1.ListImagesResponse, error) {
	f.sawTenant(req.GetTenant())
	return &authorityv1.ListImagesResponse{Images: f.images, Cache: &typesv1.ImageCacheStats{}}, f.err
}

// TestImageListNamesTheExecutor: image list and inspect say which
// executor of the fleet holds each image, escaped.
func TestImageListNamesTheExecutor(t *testing.T) {
	cfg := serveFake(t, &fakeAuthority{images: []*typesv1.ImageInfo{{Reference: "alpine@sha256:ab", Executor: "exec-b\x1b[2J", SizeBytes: 5 << 20}}})
	for _, args := range [][]string{{"image", "list"}, {"image", "inspect", "sha256:" + strings.Repeat("ab", 32)}} {
		code, out, errOut := runCLI(t, cfg, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		checkShown(t, args[1], out)
		if !strings.Contains(out, `exec-b⟦\x1b⟧[2J`) {
			t.Errorf("%v does not name the executor:\n%s", args, out)
		}
	}
	_, out, _ := runCLI(t, cfg, nil, "image", "list")
	if fields := strings.Fields(strings.SplitN(out, "\n", 2)[0]); len(fields) < 2 || fields[1] != "EXECUTOR" {
		t.Errorf("image list header %q", fields)
	}
}

func (f *fakeAuthority) ClearCaches(_ context.Context, req *authorityv1.ClearCachesRequest) (*authorityv1.ClearCachesResponse, error) {
	f.sawTenant(req.GetTenant())
	f.mu.Lock()
	f.clears = append(f.clears, req)
	f.mu.Unlock()
	return &authorityv1.ClearCachesResponse{Cleared: f.caches}, f.err
}

// TestCacheCommands: --cache reaches the spec, repeatable; cache list
// prints each cache and the executor keeping it (names escaped); cache clear sends the repository and
// name it was given.
func TestCacheCommands(t *testing.T) {
	f := &fakeAuthority{
		job: &authorityv1.Job{JobId: "j1"},
		caches: []*typesv1.CacheInfo{{Repository: "demo", Name: "go-build\x1b[2J", SizeBytes: 3 << 20,
			LastUsed: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), Executor: "exec-a\x1b[1A"}},
	}
	cfg := serveFake(t, f)
	if code, _, errOut := runCLI(t, cfg, nil, "job", "submit", "--repo", "demo", "--cache", "go-build", "--cache", "npm", "--", "true"); code != 0 {
		t.Fatalf("submit: %d %s", code, errOut)
	}
	if got := f.specs[0].GetCaches(); strings.Join(got, ",") != "go-build,npm" {
		t.Errorf("spec caches %q", got)
	}
	code, out, errOut := runCLI(t, cfg, nil, "cache", "list")
	if code != 0 {
		t.Fatalf("list: %d %s", code, errOut)
	}
	checkShown(t, "cache list", out)
	for _, want := range []string{"REPOSITORY", "EXECUTOR", "demo", "go-build", "3.0MiB", "exec-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("cache list lacks %q:\n%s", want, out)
		}
	}
	if code, out, errOut = runCLI(t, cfg, nil, "cache", "clear", "--repository", "demo", "go-build"); code != 0 {
		t.Fatalf("clear: %d %s", code, errOut)
	}
	if len(f.clears) != 1 || f.clears[0].GetTenant() != "t1" || f.clears[0].GetRepository() != "demo" || f.clears[0].GetName() != "go-build" {
		t.Errorf("clear requests %v", f.clears)
	}
	if !strings.Contains(out, "cleared 1:") {
		t.Errorf("clear says:\n%s", out)
	}
}

// TestJobGetSaysWhichCachesItStartedFrom: a job's summary names each cache
// it used, its size before and after, and whether it was committed or
// evicted, so nobody takes the run for a clean one.
func TestJobGetSaysWhichCachesItStartedFrom(t *testing.T) {
	f := &fakeAuthority{job: &authorityv1.Job{JobId: "j1", State: authorityv1.JobState_JOB_STATE_FINISHED, Result: &typesv1.RunResult{
		Reason: typesv1.TerminationReason_TERMINATION_REASON_EXITED,
		Caches: []*typesv1.CacheUse{
			{Name: "go-build", Path: "/root/.cache/go-build", SizeBefore: 2 << 20, SizeAfter: 3 << 20, Committed: true},
			{Name: "npm", Path: "/tmp/npm", SizeAfter: 0, Committed: true, Evicted: true, Message: "over its max size of 4096 bytes: wiped"},
			{Name: "cold", Path: "/tmp/cold", Message: "the run ended cancelled"},
		},
	}}}
	cfg := serveFake(t, f)
	code, out, errOut := runCLI(t, cfg, nil, "job", "get", "j1")
	if code != 0 {
		t.Fatalf("get: %d %s", code, errOut)
	}
	for _, want := range []string{
		"cache      go-build at /root/.cache/go-build: started from 2.0MiB kept from earlier jobs, after 3.0MiB, committed",
		"cache      npm at /tmp/npm: started from empty, after 0B, committed, then evicted (over its max size of 4096 bytes: wiped)",
		"cache      cold at /tmp/cold: started from empty, after 0B, not committed (the run ended cancelled)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("job get lacks %q:\n%s", want, out)
		}
	}
}
