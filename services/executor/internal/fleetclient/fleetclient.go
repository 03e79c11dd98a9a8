// Package fleetclient keeps the executor a member of the authority's
// fleet: for the life of the process it sends the authority a heartbeat
// saying where it is reached and what it can run — runtime classes,
// capacity and what of it is free, images, sources, network pools, the
// runs it holds — at the interval the last answer gave, backing off on
// errors; it applies the answer (the drain, the runs to cancel) and keeps
// the Fence that stops new sandboxes while the authority does not answer.
// Only the executor's composition root imports it.
package fleetclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

// The heartbeat's timing: the interval before the first answer, the
// bounds of any interval an answer gives, and how long one call may take.
const (
	DefaultInterval = 5 * time.Second
	MinInterval     = time.Second
	MaxInterval     = time.Minute
	callTimeout     = 10 * time.Second
)

// The report's bounds (the API's).
const (
	maxImages  = 1024
	maxSources = 1024
	maxRuns    = 4096
	// maxWarmPools bounds the warm pools a report lists.
	maxWarmPools = 256
)

// CancelReason is the message of a run the authority's answer cancels.
const CancelReason = "the authority placed this job elsewhere or ended it while this executor was out of its reach"

// Config is what the heartbeat reports and acts on.
type Config struct {
	// Authority is the connection to the authority.
	Authority grpc.ClientConnInterface
	// Address is where the authority reaches this executor (advertise).
	Address string
	// Runs is the run manager: its admission accounting and its runs are
	// reported, and the answer's runs to cancel are cancelled there.
	Runs *runs.Manager
	// Images and Sources are the caches reported; nil reports none.
	Images  *images.Store
	Sources *stage.Cache
	// Classes are the runtime classes the self-checks found available.
	Classes []sandbox.Class
	// Pools are the prefixes the jobs' addresses come from.
	Pools []netip.Prefix
	// Version is the build's, StartedAt when the process started.
	Version   string
	StartedAt time.Time
	// Fence is opened by every answer.
	Fence  *Fence
	Meter  metric.MeterProvider
	Logger *slog.Logger
}

// Client sends the heartbeats.
type Client struct {
	cfg Config
	api authorityv1.AuthorityServiceClient

	mu       sync.Mutex
	name     string // the fleet's name for this executor, from the last answer
	draining bool

	observed metric.Registration
}

// New returns a client; Run sends the heartbeats.
func New(cfg Config) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, api: authorityv1.NewAuthorityServiceClient(cfg.Authority)}
	set := instruments.New(cfg.Meter, "github.com/airlockhq/airlock/services/executor/internal/fleetclient")
	draining := set.IntGauge("airlock.executor.draining", "1", "1 while the authority drains this executor (places no new work on it), else 0.")
	fenced := set.IntGauge("airlock.executor.fenced", "1", "1 while this executor starts no new sandbox because the authority has not answered its heartbeat lately, else 0.")
	c.observed = set.Observe(func(_ context.Context, o metric.Observer) error {
		f, _ := cfg.Fence.Fenced()
		o.ObserveInt64(draining, flag(c.Draining()))
		o.ObserveInt64(fenced, flag(f))
		return nil
	}, draining, fenced)
	if err := set.Err(); err != nil {
		return nil, fmt.Errorf("fleetclient: metrics: %w", err)
	}
	return c, nil
}

func flag(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Close unregisters the client's gauges.
func (c *Client) Close() error { return c.observed.Unregister() }

// Draining reports whether the authority's last answer said it places no
// new work on this executor.
func (c *Client) Draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

// Run sends heartbeats until ctx ends: every interval the last answer
// gave (DefaultInterval before the first), bounded to [MinInterval,
// MaxInterval]; after a failure again after MinInterval, doubling up to
// the interval. Failures are logged, never returned.
func (c *Client) Run(ctx context.Context) error {
	interval, retry, failures, noFleet := DefaultInterval, time.Duration(0), 0, false
	for {
		resp, err := c.beat(ctx)
		wait := interval
		switch {
		case ctx.Err() != nil:
			return nil
		case status.Code(err) == codes.Unimplemented:
			if !noFleet {
				c.cfg.Logger.Info("the authority takes no heartbeats (it runs no fleet); this executor keeps asking", "interval", interval)
			}
			noFleet = true
		case err != nil:
			failures++
			retry = min(max(2*retry, MinInterval), interval)
			wait = retry
			fenced, _ := c.cfg.Fence.Fenced()
			c.cfg.Logger.Warn("heartbeat to the authority failed", "error", err, "failures", failures, "retry_in", wait, "fenced", fenced)
		default:
			if failures > 0 {
				c.cfg.Logger.Info("the authority answers heartbeats again", "failures", failures)
			}
			failures, retry, noFleet = 0, 0, false
			if d := resp.GetInterval(); d != nil {
				interval = min(max(d.AsDuration(), MinInterval), MaxInterval)
			}
			wait = interval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// beat sends one heartbeat and applies its answer.
func (c *Client) beat(ctx context.Context) (*authorityv1.HeartbeatResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	sent := c.cfg.Fence.now()
	resp, err := c.api.Heartbeat(ctx, &authorityv1.HeartbeatRequest{Address: c.cfg.Address, Report: c.report()})
	if status.Code(err) == codes.Unimplemented {
		// An authority without a fleet: it answered, so it is reached,
		// and it never places a job elsewhere, so nothing needs fencing.
		c.cfg.Fence.answer(sent, 0)
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	c.apply(resp, sent)
	return resp, nil
}

// apply acts on an answer. The runs to cancel are cancelled before the
// answer opens the fence, so a run the authority placed elsewhere while
// this executor was fenced is cancelled before it could start here.
func (c *Client) apply(resp *authorityv1.HeartbeatResponse, sent time.Time) {
	log := c.cfg.Logger
	for _, id := range resp.GetCancelRuns() {
		run, err := c.cfg.Runs.CancelBecause(id, CancelReason)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			// Cancel remembers it: a StartJob of it still on its way is refused.
			log.Info("the authority cancelled a job this executor has no run of", "job_id", id)
		case err != nil:
			log.Error("cancel a run the authority placed elsewhere", "job_id", id, "error", err)
		default:
			log.Warn("cancelled a run: "+CancelReason, "job_id", id, "state", run.State)
		}
	}
	c.mu.Lock()
	first := c.name == ""
	wasDraining := c.draining
	c.name, c.draining = resp.GetName(), resp.GetDraining()
	c.mu.Unlock()
	if first {
		log.Info("the authority answers this executor's heartbeats", "name", resp.GetName(), "address", c.cfg.Address, "draining", resp.GetDraining())
	} else if wasDraining != resp.GetDraining() {
		log.Info("the authority changed this executor's drain", "draining", resp.GetDraining())
	}
	c.cfg.Fence.answer(sent, resp.GetLostAfter().AsDuration())
}

// report is what the executor can run now.
func (c *Client) report() *authorityv1.ExecutorReport {
	a := c.cfg.Runs.Admission(maxRuns)
	r := &authorityv1.ExecutorReport{
		Version:   c.cfg.Version,
		StartedAt: timestamppb.New(c.cfg.StartedAt),
		Capacity: &authorityv1.ExecutorCapacity{
			MemoryBytes: a.Capacity.MemoryBytes, MemoryFreeBytes: a.Free.MemoryBytes,
			CpuMillis: a.Capacity.CPUMillis, CpuFreeMillis: a.Free.CPUMillis,
			DiskBytes: a.Capacity.DiskBytes, DiskFreeBytes: a.Free.DiskBytes,
			Jobs: int64(a.Capacity.Jobs), JobsFree: int64(a.Free.Jobs),
		},
		Runs:          a.Open,
		RunsTruncated: a.Truncated,
	}
	for _, cl := range c.cfg.Classes {
		r.RuntimeClasses = append(r.RuntimeClasses, convert.RuntimeClass(cl))
	}
	for _, p := range c.cfg.Runs.WarmPools() {
		if len(r.WarmPools) == maxWarmPools {
			break
		}
		r.WarmPools = append(r.WarmPools, &authorityv1.WarmPoolReport{
			Tenant: p.Tenant, RuntimeClass: convert.RuntimeClass(p.Class), Uid: p.User.UID, Gid: p.User.GID,
			DiskBytes: p.DiskBytes, ShmBytes: p.ShmBytes, Ready: int32(p.Ready), Target: int32(p.Target), Hits: p.Hits, Misses: p.Misses,
			RefillLast: durationpb.New(p.RefillLast), RefillMedian: durationpb.New(p.RefillMedian), LastError: p.LastError,
		})
	}
	for _, p := range c.cfg.Pools {
		r.NetworkPools = append(r.NetworkPools, p.String())
	}
	if c.cfg.Images != nil {
		r.Images = c.cfg.Images.Digests(maxImages)
	}
	if c.cfg.Sources != nil {
		src, err := c.cfg.Sources.Repositories(maxSources)
		if err != nil {
			c.cfg.Logger.Warn("list the staged sources for the heartbeat", "error", err)
		}
		r.Sources = src
	}
	return r
}

var _ runs.Fence = (*Fence)(nil)
