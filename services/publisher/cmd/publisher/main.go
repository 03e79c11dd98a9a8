// Command publisher runs the Airlock publisher service: flags, config, then the
// composition root, nothing else.
package main

import (
	"context"

	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/services/publisher/internal/config"
	"github.com/airlockhq/airlock/services/publisher/internal/server"
)

func main() {
	daemon.Main("publisher", config.Check, func(ctx context.Context, f *daemon.Flags) error {
		cfg, err := config.Load(f.Config, f.Apply)
		if err != nil {
			return err
		}
		return server.Run(ctx, cfg)
	})
}
