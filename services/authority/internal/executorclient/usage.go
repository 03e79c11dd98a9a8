package executorclient

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// MeteredJob reads a stored job for metering: its grant's limits and
// runtime class, its result's usage (the class that ran it, when the
// result says), its start and end. A job not ended has no end.
func (s *Signer) MeteredJob(r store.UsageRecord) (metering.Job, error) {
	g, err := s.Decode(r.Grant)
	if err != nil {
		return metering.Job{}, err
	}
	j := metering.Job{ID: r.ID, Tenant: r.Tenant, Class: g.RuntimeClass, Start: r.StartedAt, End: r.EndedAt,
		Shape: metering.Shape{CPUMillis: g.Limits.CPUMillis, MemoryBytes: g.Limits.MemoryBytes, DiskBytes: g.Limits.DiskBytes}}
	switch {
	case !r.State.Terminal():
		j.End = time.Time{}
	case j.End.IsZero():
		j.End = j.Start
	}
	if len(r.Result) == 0 {
		return j, nil
	}
	var res typesv1.RunResult
	if err := proto.Unmarshal(r.Result, &res); err != nil {
		return metering.Job{}, fmt.Errorf("executorclient: stored result of job %s: %w", r.ID, err)
	}
	if rc, ok := RuntimeClassFromProto(res.GetRuntimeClass()); ok && rc != "" {
		j.Class = rc
	}
	u := res.GetUsage()
	j.Awake, j.Asleep, j.Wall = u.GetAwakeTime().AsDuration(), u.GetAsleepTime().AsDuration(), u.GetWallTime().AsDuration()
	j.CPUTime, j.PeakMemoryBytes = u.GetCpuTime().AsDuration(), u.GetPeakMemoryBytes()
	j.NetSent, j.NetReceived = u.GetNetworkSentBytes(), u.GetNetworkReceivedBytes()
	j.Reported = true
	return j, nil
}
