package api

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/egress"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
)

// maxExecutorJobs bounds the job ids GetExecutor lists.
const maxExecutorJobs = 1000

// Heartbeat implements AuthorityService.Heartbeat: the executor is named
// by its certificate, never by the request.
func (s *Service) Heartbeat(ctx context.Context, req *authorityv1.HeartbeatRequest) (*authorityv1.HeartbeatResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	a, err := s.cfg.Fleet.Heartbeat(ctx, id, req.GetAddress(), reportFromProto(req.GetReport()))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.HeartbeatResponse{Name: a.Name, Interval: durationpb.New(a.Interval), LostAfter: durationpb.New(a.LostAfter),
		Draining: a.Draining, CancelRuns: a.CancelRuns}, nil
}

// ListExecutors implements AuthorityService.ListExecutors.
func (s *Service) ListExecutors(ctx context.Context, _ *authorityv1.ListExecutorsRequest) (*authorityv1.ListExecutorsResponse, error) {
	members, err := s.cfg.Fleet.List(ctx)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.ListExecutorsResponse{}
	for _, m := range members {
		out.Executors = append(out.Executors, memberToProto(m))
	}
	return out, nil
}

// GetExecutor implements AuthorityService.GetExecutor.
func (s *Service) GetExecutor(ctx context.Context, req *authorityv1.GetExecutorRequest) (*authorityv1.GetExecutorResponse, error) {
	m, jobs, err := s.cfg.Fleet.Get(ctx, req.GetName(), maxExecutorJobs)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.GetExecutorResponse{Executor: memberToProto(m), Jobs: jobs}, nil
}

// DrainExecutor implements AuthorityService.DrainExecutor.
func (s *Service) DrainExecutor(ctx context.Context, req *authorityv1.DrainExecutorRequest) (*authorityv1.DrainExecutorResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	m, err := s.cfg.Fleet.Drain(ctx, id, req.GetName(), req.GetDrain(), req.GetReason())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &authorityv1.DrainExecutorResponse{Executor: memberToProto(m)}, nil
}

func reportFromProto(r *authorityv1.ExecutorReport) fleet.Report {
	c := r.GetCapacity()
	out := fleet.Report{
		Version: r.GetVersion(), StartedAt: r.GetStartedAt().AsTime(),
		Capacity: fleet.Capacity{MemoryBytes: c.GetMemoryBytes(), MemoryFree: c.GetMemoryFreeBytes(), CPUMillis: c.GetCpuMillis(),
			CPUFree: c.GetCpuFreeMillis(), DiskBytes: c.GetDiskBytes(), DiskFree: c.GetDiskFreeBytes(), Jobs: c.GetJobs(), JobsFree: c.GetJobsFree()},
		Images: r.GetImages(), Sources: r.GetSources(), Pools: r.GetNetworkPools(), Runs: r.GetRuns(), RunsTruncated: r.GetRunsTruncated(),
	}
	for _, rc := range r.GetRuntimeClasses() {
		if name, ok := executorclient.RuntimeClassFromProto(rc); ok && name != "" {
			out.Classes = append(out.Classes, name)
		}
	}
	for _, p := range r.GetWarmPools() {
		if len(out.WarmPools) == maxWarmPools {
			break
		}
		class, _ := executorclient.RuntimeClassFromProto(p.GetRuntimeClass())
		out.WarmPools = append(out.WarmPools, fleet.WarmPool{
			Tenant: egress.Cut(p.GetTenant(), maxPoolText), Class: class, UID: p.GetUid(), GID: p.GetGid(),
			DiskBytes: p.GetDiskBytes(), ShmBytes: p.GetShmBytes(), Ready: int(p.GetReady()), Target: int(p.GetTarget()),
			Hits: p.GetHits(), Misses: p.GetMisses(), RefillLast: p.GetRefillLast().AsDuration(), RefillMedian: p.GetRefillMedian().AsDuration(),
			LastError: egress.Cut(p.GetLastError(), maxPoolText),
		})
	}
	return out
}

// A report's warm pools are bounded as the executor bounds them: a
// misbehaving executor cannot grow the fleet's records.
const (
	maxWarmPools = 256
	maxPoolText  = 512
)

func memberToProto(m fleet.Member) *authorityv1.Executor {
	state := authorityv1.ExecutorState_EXECUTOR_STATE_UP
	if m.Lost {
		state = authorityv1.ExecutorState_EXECUTOR_STATE_LOST
	}
	c := m.Report.Capacity
	rep := &authorityv1.ExecutorReport{
		Version: m.Report.Version, StartedAt: timestamppb.New(m.Report.StartedAt),
		Capacity: &authorityv1.ExecutorCapacity{MemoryBytes: c.MemoryBytes, MemoryFreeBytes: c.MemoryFree, CpuMillis: c.CPUMillis,
			CpuFreeMillis: c.CPUFree, DiskBytes: c.DiskBytes, DiskFreeBytes: c.DiskFree, Jobs: c.Jobs, JobsFree: c.JobsFree},
		Images: m.Report.Images, Sources: m.Report.Sources, NetworkPools: m.Report.Pools, Runs: m.Report.Runs, RunsTruncated: m.Report.RunsTruncated,
	}
	for _, c := range m.Report.Classes {
		if rc, err := executorclient.RuntimeClassToProto(c); err == nil {
			rep.RuntimeClasses = append(rep.RuntimeClasses, rc)
		}
	}
	for _, p := range m.Report.WarmPools {
		rc, _ := executorclient.RuntimeClassToProto(p.Class)
		rep.WarmPools = append(rep.WarmPools, &authorityv1.WarmPoolReport{
			Tenant: p.Tenant, RuntimeClass: rc, Uid: p.UID, Gid: p.GID, DiskBytes: p.DiskBytes, ShmBytes: p.ShmBytes,
			Ready: int32(p.Ready), Target: int32(p.Target), Hits: p.Hits, Misses: p.Misses,
			RefillLast: durationpb.New(p.RefillLast), RefillMedian: durationpb.New(p.RefillMedian), LastError: p.LastError,
		})
	}
	out := &authorityv1.Executor{
		Name: m.Name, Id: m.ID, Address: m.Address, State: state, Draining: m.Draining, DrainedBy: m.DrainedBy,
		DrainReason: m.DrainReason, JoinedAt: timestamppb.New(m.JoinedAt), LastSeen: timestamppb.New(m.LastSeen),
		Report: rep, Placed: m.Placed,
	}
	if !m.DrainedAt.IsZero() {
		out.DrainedAt = timestamppb.New(m.DrainedAt)
	}
	return out
}
