package api

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
)

// GetUsage answers usage and its cost; metering scopes the caller to its
// tenants.
func (s *Service) GetUsage(ctx context.Context, req *authorityv1.GetUsageRequest) (*authorityv1.GetUsageResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if s.cfg.Usage == nil {
		return nil, status.Error(codes.Unimplemented, "this authority meters no usage")
	}
	q := metering.Query{Tenant: req.GetTenant(), Limit: int(req.GetLimit())}
	for _, t := range []struct {
		field string
		ts    *timestamppb.Timestamp
	}{{"since", req.GetSince()}, {"until", req.GetUntil()}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", t.field, err)
		}
	}
	if req.GetSince() != nil {
		q.Since = req.GetSince().AsTime()
	}
	if req.GetUntil() != nil {
		q.Until = req.GetUntil().AsTime()
	}
	switch req.GetBy() {
	case authorityv1.UsageGrouping_USAGE_GROUPING_UNSPECIFIED, authorityv1.UsageGrouping_USAGE_GROUPING_JOB:
		q.By = metering.ByJob
	case authorityv1.UsageGrouping_USAGE_GROUPING_DAY:
		q.By = metering.ByDay
	default:
		return nil, status.Errorf(codes.InvalidArgument, "by: %d is not a grouping (job or day)", req.GetBy())
	}
	rep, err := s.cfg.Usage.Usage(ctx, id, q)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := &authorityv1.GetUsageResponse{Total: usageToProto(rep.Total), Truncated: rep.Truncated, Rates: ratesToProto(s.cfg.Usage.Rates())}
	for _, r := range rep.Rows {
		out.Rows = append(out.Rows, usageToProto(r))
	}
	for _, b := range rep.Budgets {
		out.Budgets = append(out.Budgets, &authorityv1.Budget{Tenant: b.Tenant, MonthlyLimitMicros: int64(b.Limit), UsedMicros: int64(b.Used)})
	}
	return out, nil
}

func usageToProto(u metering.Usage) *authorityv1.Usage {
	p := &authorityv1.Usage{
		JobId: u.JobID, Tenant: u.Tenant, Day: u.Day,
		VcpuMinutes: u.Alloc.VCPUMinutes(), MemoryGbMinutes: u.Alloc.MemoryByteMinutes.GBMinutes(),
		CpuUsedMinutes: u.CPUUsedMinutes, MemoryUsedGbMinutes: u.MemoryUsedGBMinutes,
		DiskGbMinutes: u.Alloc.DiskByteMinutes.GBMinutes(),
		AwakeMinutes:  u.AwakeMinutes, AsleepMinutes: u.AsleepMinutes,
		NetworkSentBytes: u.NetSent, NetworkReceivedBytes: u.NetReceived,
		CostMicros: int64(u.Cost), Running: u.Running,
	}
	if u.Class != "" {
		if rc, err := executorclient.RuntimeClassToProto(u.Class); err == nil {
			p.RuntimeClass = rc
		}
	}
	return p
}

func ratesToProto(r metering.Rates) *authorityv1.UsageRates {
	out := &authorityv1.UsageRates{VcpuMonthMicros: int64(r.VCPUMonth), MemoryGbMonthMicros: int64(r.MemoryGBMonth),
		DiskGbMonthMicros: int64(r.DiskGBMonth), ClassComputeMillis: map[string]int64{}}
	for _, c := range r.Classes() {
		out.ClassComputeMillis[c] = r.ComputeMillis(c)
	}
	return out
}
