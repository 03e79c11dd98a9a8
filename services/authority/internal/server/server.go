// Package server is the authority's composition root: it builds every part of
// the service once from the validated config, runs it, and stops it. Only
// the authority's main imports it.
package server

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/logging"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/authority/internal/api"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
	"github.com/airlockhq/airlock/services/authority/internal/checkpoints"
	"github.com/airlockhq/airlock/services/authority/internal/config"
	"github.com/airlockhq/airlock/services/authority/internal/executorclient"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
	"github.com/airlockhq/airlock/services/authority/internal/flow"
	"github.com/airlockhq/airlock/services/authority/internal/images"
	"github.com/airlockhq/airlock/services/authority/internal/jobs"
	"github.com/airlockhq/airlock/services/authority/internal/leases"
	"github.com/airlockhq/airlock/services/authority/internal/metering"
	"github.com/airlockhq/airlock/services/authority/internal/portforward"
	"github.com/airlockhq/airlock/services/authority/internal/source"
	"github.com/airlockhq/airlock/services/authority/internal/store"
	"github.com/airlockhq/airlock/services/authority/internal/store/postgres"
	"github.com/airlockhq/airlock/services/authority/internal/store/sqlite"
)

// sweepInterval is how often expired approvals and leases are rewritten,
// and the brokered leases of ended jobs revoked (which stay live until
// then: short).
const sweepInterval = 10 * time.Second

// forwardSweepInterval is how often port forwards past their expiry or of
// an ended session are closed, and pending ones follow their approval.
const forwardSweepInterval = 2 * time.Second

// Run runs the authority until ctx is cancelled or a part of it fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger, err := logging.New(os.Stderr, "authority", cfg.Log)
	if err != nil {
		return err
	}
	// The authorizer exists before the store does; denials that arrive
	// before the job service is built are only logged.
	var auditor atomic.Pointer[jobs.Service]
	return daemon.Run(ctx, daemon.Spec{
		Name:    "authority",
		Version: version.String(),
		Config:  cfg.Server,
		Table:   authz.AuthorityTable,
		OnDeny: func(ctx context.Context, method string, caller identity.ID, reason string) {
			if svc := auditor.Load(); svc != nil {
				svc.AuditDenied(ctx, method, caller, reason)
			}
		},
		Logger: logger,
		Start: func(ctx context.Context, env *daemon.Env) error {
			var (
				st    store.Store
				where string
				err   error
			)
			switch cfg.Store.Driver {
			case config.StorePostgres:
				// Logged by where, never by the DSN: it may hold a password.
				st, err = postgres.Open(ctx, cfg.Store.DSN, postgres.WithMaxConns(cfg.Store.MaxConns))
				where = postgres.Describe(cfg.Store.DSN)
			default:
				where = env.DataDir.Join("authority.db")
				st, err = sqlite.Open(ctx, where)
			}
			if err != nil {
				return err
			}
			env.Logger.Info("store opened", "driver", cfg.Store.Driver, "database", where)
			env.OnStop(st.Close)

			// The audit log's head is signed outside the database: at
			// least every CheckpointEvery entries or CheckpointInterval, and
			// once more when the authority stops.
			cpKey, err := pki.LoadOrCreateEd25519(cfg.Audit.CheckpointKey)
			if err != nil {
				return fmt.Errorf("audit.checkpoint_key: %w", err)
			}
			cps, err := checkpoints.Open(ctx, checkpoints.Config{
				Store: st, Key: cpKey, File: cfg.Audit.CheckpointFile,
				Every: cfg.Audit.CheckpointEvery, Interval: cfg.Audit.CheckpointInterval, Logger: env.Logger,
				Meter: env.Meter,
			})
			if err != nil {
				return err
			}
			// The last checkpoint is signed once every task that writes the
			// log has stopped, and before the store closes (cleanups run in
			// reverse order).
			env.OnStop(cps.Close)
			env.Go(cps.Run)

			key, published, err := grant.LoadSigningKeys(cfg.GrantKey)
			if err != nil {
				return err
			}
			src, err := source.New(env.DataDir.Join("source"), env.Logger)
			if err != nil {
				return err
			}
			// The fleet: executors join by their heartbeat, into the store
			// every replica shares; each is reached on its own connection,
			// pinned to its own identity.
			fl, err := fleet.New(fleet.Config{Store: st, Interval: cfg.Fleet.HeartbeatInterval, LostAfter: cfg.Fleet.LostAfter, Logger: env.Logger, Meter: env.Meter})
			if err != nil {
				return err
			}
			env.OnStop(fl.Close)
			pool := executorclient.NewPool(env.TLS, fl.Address)
			env.OnStop(pool.Close)
			self := identity.Service(cfg.TrustDomain, identity.ServiceAuthority)
			replica := cfg.Replica
			if replica == "" {
				replica = env.DataDir.Owner()
			}
			// One throttle of repeated refusals for the whole authority; the
			// counts of what it left out go on the log once each window has
			// passed, and all of them when the authority stops.
			refusals := audit.NewRefusalThrottle()
			env.Go(func(ctx context.Context) error {
				refusals.Flush(ctx, time.Second, func(ctx context.Context, e audit.Event) error {
					_, err := st.AppendAudit(ctx, e)
					return err
				}, func(err error) { env.Logger.Error("audit left-out refusals", "error", err) })
				return nil
			})
			imgs := images.New()
			env.OnStop(func() error { imgs.Close(); return nil })
			signer := executorclient.NewSigner(key)
			// Usage and its cost at the operator's rates, and the tenants'
			// budgets, kept at submission.
			usage, err := metering.New(metering.Config{Store: st, Decode: signer.MeteredJob, Tenants: cfg.Policy,
				Rates: cfg.MeteringPolicy.Rates, Budgets: cfg.MeteringPolicy.Budgets,
				Self: identity.Service(cfg.TrustDomain, identity.ServiceAuthority), Meter: env.Meter, Logger: env.Logger})
			if err != nil {
				return err
			}
			svc, err := jobs.New(jobs.Config{
				Store:    st,
				Tenants:  cfg.Policy,
				Source:   src,
				Images:   imgs,
				Metering: usage,
				Signer:   signer,
				Fleet:    fl, Executors: pool, Self: self, Replica: replica, LostResult: executorclient.LostResult(),
				SweepInterval: cfg.Fleet.HeartbeatInterval,
				GrantTTL:      cfg.GrantTTL,
				Auditors:      cfg.Audit.Auditors,
				Refusals:      refusals,
				Meter:         env.Meter,
				Logger:        env.Logger,
			})
			if err != nil {
				return err
			}
			auditor.Store(svc)
			// Sessions an executor suspended when it restarted resume when
			// it is back.
			fl.OnReturn(svc.ExecutorReturned)
			// The tenant policy in force goes on the log at every start, so
			// a policy change between starts is on the record.
			if err := svc.RecordPolicy(ctx, identity.Service(cfg.TrustDomain, identity.ServiceAuthority)); err != nil {
				return err
			}
			// Resumes unfinished jobs now and stops background work (before
			// the store closes) when the process stops.
			env.Go(svc.Run)
			appr, err := approvals.New(approvals.Config{Store: st, Tenants: cfg.Policy, Artifacts: svc, Refusals: refusals, Meter: env.Meter, Logger: env.Logger})
			if err != nil {
				return err
			}
			wf, err := flow.New(flow.Config{Jobs: svc, Approvals: appr})
			if err != nil {
				return err
			}
			// A result recorded just before a crash may still lack its approval.
			if n, err := appr.OpenMissing(ctx, identity.Service(cfg.TrustDomain, identity.ServiceAuthority), wf.Target); err != nil {
				return err
			} else if n > 0 {
				env.Logger.Info("opened missing approvals", "count", n)
			}
			lease, err := leases.New(leases.Config{Store: st, Tenants: cfg.Policy, Approvals: appr, Meter: env.Meter, Logger: env.Logger,
				Grants: executorclient.LeaseGrant})
			if err != nil {
				return err
			}
			// The brokered credentials an executor's previous process
			// leased for its jobs' proxies end when it comes back.
			fl.OnRestart(lease.OnRestart(identity.Service(cfg.TrustDomain, identity.ServiceAuthority)))
			// Approvals and leases past their expiry are rewritten as such,
			// on the log; every replica may sweep (each row changes once).
			env.Go(func(ctx context.Context) error {
				return appr.SweepEvery(ctx, identity.Service(cfg.TrustDomain, identity.ServiceAuthority), sweepInterval, lease.Sweep)
			})
			fwd, err := portforward.New(portforward.Config{Store: st, Tenants: cfg.Policy, Sessions: svc, Refused: appr.Refused,
				Self: identity.Service(cfg.TrustDomain, identity.ServiceAuthority), Logger: env.Logger})
			if err != nil {
				return err
			}
			// Forwards past their expiry or of an ended session close, and
			// pending ones follow their approval's decision.
			env.Go(func(ctx context.Context) error { return fwd.SweepEvery(ctx, forwardSweepInterval) })
			api.New(api.Config{Jobs: svc, Approvals: appr, Leases: lease, Flow: wf, Checkpoints: cps, Fleet: fl, Usage: usage, Forwards: fwd, Logger: env.Logger}).Register(env.Server)
			env.Logger.Info("authority ready", "tenants", len(cfg.Policy), "grant_key_id", key.KeyID(),
				"grant_public_key", cfg.GrantKey+".pub", "grant_public_keys", len(published),
				"audit_checkpoint_key_id", pki.Ed25519KeyID(cpKey.Public().(ed25519.PublicKey)), "audit_checkpoints", cfg.Audit.CheckpointFile,
				"replica", replica, "fleet_heartbeat", cfg.Fleet.HeartbeatInterval, "fleet_lost_after", cfg.Fleet.LostAfter)
			if len(cfg.Policy) == 0 {
				env.Logger.Warn("no tenants configured; every SubmitJob will be refused")
			}
			return nil
		},
	})
}
