package executorclient

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/grant"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// TestMeteredJob reads real signed grants and protobuf results as the
// authority stores them: the grant's limits and class, the result's class
// over it, its awake and asleep times (a sleeping session billed for disk
// only), a job not ended with no end whatever its record says, and an
// unreadable result refused naming the job.
func TestMeteredJob(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s := NewSigner(grant.NewSigner(key))
	start := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	limits := policy.Limits{CPUMillis: 2000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30}
	signed := func(class string) []byte {
		t.Helper()
		req := jobs.GrantRequest{JobID: "j", Tenant: "dev", Requester: "spiffe://test.example/client/dev", Repository: "demo",
			Commit: strings.Repeat("a", 40), Command: []string{"true"}, Limits: limits, Network: jobs.Network{Mode: jobs.NetworkDenyAll},
			RuntimeClass: class, Generation: 1, IssuedAt: start, ExpiresAt: start.Add(time.Hour)}
		sg, err := s.Sign(req)
		if err != nil {
			t.Fatal(err)
		}
		return sg.Wire
	}
	result := func(class typesv1.RuntimeClass, awake, asleep, wall time.Duration) []byte {
		t.Helper()
		b, err := proto.Marshal(&typesv1.RunResult{RuntimeClass: class, Usage: &typesv1.ResourceUsage{
			AwakeTime: durationpb.New(awake), AsleepTime: durationpb.New(asleep), WallTime: durationpb.New(wall),
			CpuTime: durationpb.New(3 * time.Minute), PeakMemoryBytes: 1 << 30, NetworkSentBytes: 100, NetworkReceivedBytes: 200}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	shape := metering.Shape{CPUMillis: 2000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30}
	for _, c := range []struct {
		name string
		rec  store.UsageRecord
		want metering.Job
		// awake and asleep minutes Meter bills over the job's span.
		awake, asleep int64
		// fails says MeteredJob refuses the record, its error holding err.
		fails bool
		err   string
	}{
		{
			name: "the result's class over the grant's",
			rec: store.UsageRecord{State: store.StateFinished, Grant: signed(policy.RuntimeRunc),
				Result: result(typesv1.RuntimeClass_RUNTIME_CLASS_VM, 10*time.Minute, 0, 11*time.Minute), EndedAt: start.Add(11 * time.Minute)},
			want:  metering.Job{Class: policy.RuntimeVM, End: start.Add(11 * time.Minute), Awake: 10 * time.Minute, Wall: 11 * time.Minute, Reported: true},
			awake: 10,
		},
		{
			name: "a session that slept: awake and asleep apart",
			rec: store.UsageRecord{State: store.StateFinished, Grant: signed(policy.RuntimeRunsc),
				Result: result(typesv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED, 5*time.Minute, 20*time.Minute, 25*time.Minute), EndedAt: start.Add(25 * time.Minute)},
			want: metering.Job{Class: policy.RuntimeRunsc, End: start.Add(25 * time.Minute), Awake: 5 * time.Minute, Asleep: 20 * time.Minute,
				Wall: 25 * time.Minute, Reported: true},
			awake: 5, asleep: 20,
		},
		{
			name: "an older executor's result: no awake time, its wall time",
			rec: store.UsageRecord{State: store.StateFailed, Grant: signed(policy.RuntimeRunc),
				Result: result(typesv1.RuntimeClass_RUNTIME_CLASS_RUNC, 0, 0, 7*time.Minute), EndedAt: start.Add(8 * time.Minute)},
			want:  metering.Job{Class: policy.RuntimeRunc, End: start.Add(8 * time.Minute), Wall: 7 * time.Minute, Reported: true},
			awake: 7,
		},
		{
			name: "not ended: no end, whatever the record holds",
			rec:  store.UsageRecord{State: store.StateRunning, Grant: signed(policy.RuntimeRunc), EndedAt: start.Add(time.Minute)},
			want: metering.Job{Class: policy.RuntimeRunc},
		},
		{
			name:  "ended with no result and no end stamp: a span of nothing",
			rec:   store.UsageRecord{State: store.StateCancelled, Grant: signed(policy.RuntimeRunc)},
			want:  metering.Job{Class: policy.RuntimeRunc, End: start},
			awake: 0,
		},
		{
			name:  "a result that is not a RunResult",
			rec:   store.UsageRecord{State: store.StateFinished, Grant: signed(policy.RuntimeRunc), Result: []byte{0xff, 0xff}},
			fails: true, err: "stored result of job j1",
		},
		{
			name:  "a grant that is not one",
			rec:   store.UsageRecord{State: store.StateFinished, Grant: []byte("not a grant")},
			fails: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.rec.ID, c.rec.Tenant, c.rec.StartedAt = "j1", "dev", start
			got, err := s.MeteredJob(c.rec)
			if c.fails {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.want.ID, c.want.Tenant, c.want.Start, c.want.Shape = "j1", "dev", start, shape
			if c.want.Reported {
				c.want.CPUTime, c.want.PeakMemoryBytes, c.want.NetSent, c.want.NetReceived = 3*time.Minute, 1<<30, 100, 200
			}
			if got != c.want {
				t.Fatalf("MeteredJob = %+v\nwant %+v", got, c.want)
			}
			if got.Running() {
				return
			}
			u := metering.Meter(got, got.Start, got.End.Add(time.Minute), got.End, metering.DefaultRates())
			if u.AwakeMinutes != c.awake || u.AsleepMinutes != c.asleep || u.Alloc.CPUMilliMinutes != 2000*c.awake ||
				u.Alloc.DiskByteMinutes.GBMinutes() != float64(8*(c.awake+c.asleep)) || u.Class != c.want.Class {
				t.Fatalf("metered: %d awake, %d asleep, %d CPU milli-minutes, %v disk GB-minutes, class %s; want %d, %d (disk for both)",
					u.AwakeMinutes, u.AsleepMinutes, u.Alloc.CPUMilliMinutes, u.Alloc.DiskByteMinutes.GBMinutes(), u.Class, c.awake, c.asleep)
			}
		})
	}
}
