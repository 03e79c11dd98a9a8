//go:build linux

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// BenchmarkCLISubmitWait is what a user waits for: `airlock job submit
// --wait -- true`, the built CLI binary run as a user runs it against the
// dev stack (the repository served over HTTPS by its git server, the
// revision a branch), from the process's start to its exit (via=cli),
// against the job's own time, created to ended, from the record the CLI
// prints. It reports the median job time (job-ms) and the median of the
// CLI's wall time over the job's own (cli/job; the goal is ≤ 2). In the
// same run: a trivial CLI call, `airlock job get` of one job (via=get:
// process start, config, the mTLS handshake and one call), and the same
// submission and wait over a warm gRPC connection (via=api, no process
// and no handshake).
func BenchmarkCLISubmitWait(b *testing.B) {
	s, client, ctx := benchStack(b)
	// The CLI's per-user files (its TLS session cache) go to a directory of
	// this run's, as they would to a user's cache directory.
	env := append(s.env(), "XDG_CACHE_HOME="+b.TempDir())
	submit := func(b *testing.B) (time.Duration, *authorityv1.Job) {
		res := runCommand(b, env, bin("airlock"), "job", "submit", "--repo", "bench", "--rev", "main", "--wait", "-o", "json", "--", "true")
		if res.code != 0 {
			b.Fatalf("job submit --wait: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		job := &authorityv1.Job{}
		if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
			b.Fatalf("job submit --wait -o json: %v\n%s", err, res.stdout)
		}
		if job.GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
			b.Fatalf("job %s ended %v: %s", job.GetJobId(), job.GetState(), job.GetMessage())
		}
		return res.elapsed, job
	}
	// Warm-up: the stack's first job, and the CLI's first handshake.
	_, first := submit(b)

	b.Run("via=cli", func(b *testing.B) {
		var walls, jobs []time.Duration
		for range b.N {
			wall, job := submit(b)
			walls = append(walls, wall)
			jobs = append(jobs, jobTime(job))
		}
		b.StopTimer()
		reportJobRatio(b, walls, jobs, "cli/job")
	})
	b.Run("via=get", func(b *testing.B) {
		for range b.N {
			if res := runCommand(b, env, bin("airlock"), "job", "get", first.GetJobId(), "-o", "json"); res.code != 0 {
				b.Fatalf("job get: exit %d: %s", res.code, res.stderr)
			}
		}
	})
	seq := 0
	b.Run("via=api", func(b *testing.B) {
		var walls, jobs, heads, tails []time.Duration
		for range b.N {
			seq++
			t0 := time.Now()
			job, err := runSpecJob(ctx, client, fmt.Sprintf("cli-bench-api-%d-%d", b.N, seq),
				&authorityv1.JobSpec{Repository: "bench", Revision: "main", Command: []string{"true"}})
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			walls = append(walls, t1.Sub(t0))
			jobs = append(jobs, jobTime(job))
			// Where the rest goes (one machine, one clock): before the
			// job's record exists (SubmitJob, its revision's resolution
			// first), and from its end to the watch's.
			heads = append(heads, job.GetCreatedAt().AsTime().Sub(t0))
			tails = append(tails, t1.Sub(job.GetUpdatedAt().AsTime()))
		}
		b.StopTimer()
		reportJobRatio(b, walls, jobs, "api/job")
		b.ReportMetric(float64(median(heads).Microseconds())/1000, "submit-ms")
		b.ReportMetric(float64(median(tails).Microseconds())/1000, "watch-tail-ms")
	})
}

// jobTime is a job's own time: created (submitted, its revision resolved)
// to its last change (ended).
func jobTime(job *authorityv1.Job) time.Duration {
	return job.GetUpdatedAt().AsTime().Sub(job.GetCreatedAt().AsTime())
}

// reportJobRatio reports the median job time (job-ms) and the median wall
// time over it (unit). Medians: a ratio of medians is steadier than a
// median of ratios on a shared machine.
func reportJobRatio(b *testing.B, walls, jobs []time.Duration, unit string) {
	jobMedian, wallMedian := median(jobs), median(walls)
	b.ReportMetric(float64(jobMedian.Microseconds())/1000, "job-ms")
	b.ReportMetric(float64(wallMedian)/float64(jobMedian), unit)
}

// median is the middle of ds (the upper one of an even count).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
