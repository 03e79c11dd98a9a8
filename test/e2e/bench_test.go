//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// benchRepo makes a git repository with n small files.
func benchRepo(b testing.TB, n int) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), fmt.Sprintf("repo-%d", n))
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	git(b, dir, "init", "-q", "-b", "main")
	git(b, dir, "add", "-A")
	git(b, dir, "-c", "user.name=b", "-c", "user.email=b@example.com", "commit", "-q", "-m", "bench")
	return dir
}

// runTrue submits `true` on repo and waits for the job to finish.
func runTrue(ctx context.Context, client authorityv1.AuthorityServiceClient, repo, key string) error {
	return runJob(ctx, client, repo, key, []string{"true"})
}

// runJob submits argv on repo and waits for the job to finish with status 0.
func runJob(ctx context.Context, client authorityv1.AuthorityServiceClient, repo, key string, argv []string) error {
	return runSpec(ctx, client, key, &authorityv1.JobSpec{Repository: repo, Revision: "main", Command: argv})
}

// runSpec submits spec for the dev tenant and waits for the job to finish
// with status 0.
func runSpec(ctx context.Context, client authorityv1.AuthorityServiceClient, key string, spec *authorityv1.JobSpec) error {
	_, err := runSpecJob(ctx, client, key, spec)
	return err
}

// runSpecJob is runSpec returning the job's last record.
func runSpecJob(ctx context.Context, client authorityv1.AuthorityServiceClient, key string, spec *authorityv1.JobSpec) (*authorityv1.Job, error) {
	resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: key, Spec: spec})
	if err != nil {
		return nil, err
	}
	stream, err := client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: resp.GetJob().GetJobId()})
	if err != nil {
		return nil, err
	}
	var last *authorityv1.Job
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if j := msg.GetJob(); j != nil {
			last = j
		}
	}
	if last.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || last.GetResult().GetExitCode() != 0 {
		return last, fmt.Errorf("job %s ended %v: %s", last.GetJobId(), last.GetState(), last.GetMessage())
	}
	return last, nil
}

// benchJobs measures submit → result of `true` jobs on repo over mTLS,
// after one warm-up job has staged the source. It reports the median too,
// since the mean of a latency is easily skewed on a shared machine.
func benchJobs(b *testing.B, files, warmPool int) {
	repo := benchRepo(b, files)
	s := startStack(b, "--repo", "bench="+repo, "--warm-pool", fmt.Sprint(warmPool))
	client := authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := runTrue(ctx, client, "bench", "warm-up"); err != nil {
		b.Fatal(err)
	}
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		if warmPool > 0 {
			// Off the clock: the pool refills (a pooled sandbox is made
			// in about a third of a second here).
			b.StopTimer()
			time.Sleep(time.Second)
			b.StartTimer()
		}
		start := time.Now()
		if err := runTrue(ctx, client, "bench", fmt.Sprintf("bench-%d-%d", files, i)); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkEndToEndTrue is the whole path for a `true` job: SubmitJob over
// mTLS, grant, dispatch, staging (cached), sandbox, patch, bundle,
// provenance, report, WatchJob to the end.
func BenchmarkEndToEndTrue(b *testing.B) { benchJobs(b, 3, 0) }

// BenchmarkEndToEndTrueWarm is BenchmarkEndToEndTrue with a warm pool of
// 2: each job claims a sandbox made ahead of it (the pool refills between
// jobs, off the clock).
func BenchmarkEndToEndTrueWarm(b *testing.B) { benchJobs(b, 3, 2) }

// BenchmarkEndToEndTrueLargeRepo is the same on a 20,000-file repository:
// with the source cached, staging should not depend on repository size.
func BenchmarkEndToEndTrueLargeRepo(b *testing.B) { benchJobs(b, 20000, 0) }
