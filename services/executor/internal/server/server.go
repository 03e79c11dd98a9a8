// Package server is the executor's composition root: it builds every part of
// the service once from the validated config, runs it, and stops it. Only
// the executor's main imports it.
package server

import (
	"context"
	"os"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/pkg/logging"
	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/executor/internal/api"
	"github.com/airlockhq/airlock/services/executor/internal/config"
)

// Run runs the executor until ctx is cancelled or a part of it fails.
func Run(ctx context.Context, cfg *config.Config) error {
	logger, err := logging.New(os.Stderr, "executor", cfg.Log)
	if err != nil {
		return err
	}
	return daemon.Run(ctx, daemon.Spec{
		Name:    "executor",
		Version: version.String(),
		Config:  cfg.Server,
		Table:   authz.ExecutorTable,
		Logger:  logger,
		Start: func(_ context.Context, env *daemon.Env) error {
			api.New(api.Config{}).Register(env.Server)
			return nil
		},
	})
}
