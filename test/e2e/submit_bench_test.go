//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// submitters is how many clients submit at once in BenchmarkSubmit8.
const submitters = 8

// BenchmarkSubmit8 is a platform submitting `true` jobs from 8 clients at
// once through the real stack (`airlock dev up`: the authority, the
// executor, the repository served over HTTPS by the dev git server), each
// client waiting for its job to finish before it submits the next. It
// reports the throughput (jobs/s), the CPU per job of the authority and of
// the executor (user + system, from /proc, with what their child processes
// such as git and runc used), and SubmitJob's median and worst latency. The
// revision is a branch ("main": one ref listing per submission) or the
// commit itself ("sha": no request to the git server at all).
func BenchmarkSubmit8(b *testing.B) {
	repo := benchRepo(b, 3)
	commit := strings.TrimSpace(git(b, repo, "rev-parse", "HEAD"))
	s := startStack(b, "--repo", "bench="+repo)
	client := authorityv1.NewAuthorityServiceClient(s.dial(b, "client/dev", "authority"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := runTrue(ctx, client, "bench", "warm-up"); err != nil {
		b.Fatal(err)
	}
	authority, executor := s.services["authority"].PID, s.services["executor"].PID
	for _, rev := range []struct{ name, rev string }{{"main", "main"}, {"sha", commit}} {
		b.Run("rev="+rev.name, func(b *testing.B) {
			var (
				next    atomic.Int64
				mu      sync.Mutex
				submits []time.Duration
				errs    []error
				wg      sync.WaitGroup
			)
			cpu0, ecpu0 := cpuTicks(b, authority), cpuTicks(b, executor)
			b.ResetTimer()
			start := time.Now()
			for w := range submitters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						took, err := submitAndWait(ctx, client, rev.rev, fmt.Sprintf("submit8-%s-%d-%d-%d", rev.name, b.N, w, i))
						mu.Lock()
						submits = append(submits, took)
						if err != nil {
							errs = append(errs, err)
						}
						mu.Unlock()
						if err != nil {
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if len(errs) > 0 {
				b.Fatalf("%d of %d jobs failed; first: %v", len(errs), b.N, errs[0])
			}
			cpu, ecpu := cpuTicks(b, authority)-cpu0, cpuTicks(b, executor)-ecpu0
			slices.Sort(submits)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			b.ReportMetric(float64(cpu)*1000/clockTicks/float64(b.N), "authority-cpu-ms/job")
			b.ReportMetric(float64(ecpu)*1000/clockTicks/float64(b.N), "executor-cpu-ms/job")
			b.ReportMetric(float64(submits[len(submits)/2].Microseconds())/1000, "submit-median-ms")
			b.ReportMetric(float64(submits[len(submits)-1].Microseconds())/1000, "submit-max-ms")
		})
	}
}

// submitAndWait submits `true` at rev and waits for it to finish with
// status 0; it returns how long SubmitJob alone took.
func submitAndWait(ctx context.Context, client authorityv1.AuthorityServiceClient, rev, key string) (time.Duration, error) {
	t0 := time.Now()
	resp, err := client.SubmitJob(ctx, &authorityv1.SubmitJobRequest{
		Tenant: "dev", IdempotencyKey: key,
		Spec: &authorityv1.JobSpec{Repository: "bench", Revision: rev, Command: []string{"true"}},
	})
	took := time.Since(t0)
	if err != nil {
		return took, err
	}
	stream, err := client.WatchJob(ctx, &authorityv1.WatchJobRequest{JobId: resp.GetJob().GetJobId()})
	if err != nil {
		return took, err
	}
	var last *authorityv1.Job
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return took, err
		}
		if j := msg.GetJob(); j != nil {
			last = j
		}
	}
	if last.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || last.GetResult().GetExitCode() != 0 {
		return took, fmt.Errorf("job %s ended %v: %s", last.GetJobId(), last.GetState(), last.GetMessage())
	}
	return took, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times (100 on
// every Linux this runs on).
const clockTicks = 100

// cpuTicks is the CPU time pid has used, in clock ticks: its own user and
// system time and that of its children it has waited for (git, runc).
func cpuTicks(b *testing.B, pid int) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name may hold spaces; the fields after it do not.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	// utime, stime, cutime and cstime are fields 14 to 17, 12 to 15
	// after the name.
	var sum int64
	for _, i := range []int{11, 12, 13, 14} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %q", pid, data)
		}
		sum += n
	}
	return sum
}
