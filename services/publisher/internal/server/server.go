// Package server is the publisher's composition root: it builds every part of
// the service once from the validated config, runs it, and stops it. Only
// the publisher's main imports it.
package server

import (
	"context"
	"os"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/contentcheck"
	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/logging"
	"github.com/airlockhq/airlock/pkg/sqldb"
	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/publisher/internal/api"
	"github.com/airlockhq/airlock/services/publisher/internal/authorityclient"
	"github.com/airlockhq/airlock/services/publisher/internal/config"
	"github.com/airlockhq/airlock/services/publisher/internal/executorclient"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
	"github.com/airlockhq/airlock/services/publisher/internal/store"
)

// Run runs the publisher until ctx is cancelled or a part of it fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger, err := logging.New(os.Stderr, "publisher", cfg.Log)
	if err != nil {
		return err
	}
	return daemon.Run(ctx, daemon.Spec{
		Name:    "publisher",
		Version: version.String(),
		Config:  cfg.Server,
		Table:   authz.PublisherTable,
		Logger:  logger,
		Start: func(ctx context.Context, env *daemon.Env) error {
			var (
				st    *store.Store
				where string
			)
			switch cfg.Store.Driver {
			case sqldb.DriverPostgres:
				// Logged by where, never by the DSN: it may hold a password.
				st, err = store.OpenPostgres(ctx, cfg.Store.DSN, cfg.Store.MaxConns)
				where = sqldb.Describe(cfg.Store.DSN)
			default:
				where = env.DataDir.Join("publisher.db")
				st, err = store.OpenSQLite(ctx, where)
			}
			if err != nil {
				return err
			}
			env.Logger.Info("store opened", "driver", cfg.Store.Driver, "database", where)
			env.OnStop(st.Close)

			grants, err := grant.NewFileVerifier(cfg.Authority.GrantPublicKey, logger)
			if err != nil {
				return err
			}
			roots, err := env.TLS.Roots()
			if err != nil {
				return err
			}
			checker, err := contentcheck.New(contentcheck.Config{DecodeDepth: cfg.Scan.DecodeDepth})
			if err != nil {
				return err
			}
			ac, err := grpcclient.Dial(cfg.Authority.Address, env.TLS, env.PeerID(identity.ServiceAuthority))
			if err != nil {
				return err
			}
			env.OnStop(ac.Close)
			// Each job's bundle is fetched from the executor it ran on,
			// which the authority names.
			ec := executorclient.New(env.TLS)
			env.OnStop(ec.Close)
			svc, err := publish.New(ctx, publish.Config{
				Store: st, Authority: authorityclient.New(ac, env.TLS), Executor: ec, Checker: checker,
				Trust: publish.Trust{Roots: roots, Grants: grants},
				Dir:   env.DataDir.Join("work"), Logger: logger, Meter: env.Meter,
				// The data directory is one process's at a time (locked): a
				// publisher restarted on it takes its claims up at once.
				Owner: env.DataDir.Owner(),
			})
			if err != nil {
				return err
			}
			// Runs end with ctx; the store closes after them.
			env.OnStop(func() error { svc.Wait(); return nil })
			api.New(api.Config{Publish: svc, Store: st, Logger: logger}).Register(env.Server)
			// What a crash, a stop or an outage left half done goes on now
			// and every RetryEvery.
			env.Go(svc.Run)
			return nil
		},
	})
}
