// Command executor runs the Airlock executor service: flags, config, then the
// composition root, nothing else.
package main

import (
	"context"

	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/services/executor/internal/config"
	"github.com/airlockhq/airlock/services/executor/internal/server"
)

func main() {
	own := &config.Flags{}
	daemon.Main("executor", own.Check, func(ctx context.Context, f *daemon.Flags) error {
		cfg, err := config.Load(f.Config, f.Apply, *own)
		if err != nil {
			return err
		}
		return server.Run(ctx, cfg)
	}, daemon.ServiceFlag{
		Name:  "advertise",
		Usage: "override the config's advertise address (host:port), where the authority reaches this executor; in Kubernetes --advertise $(POD_IP):7402",
		Value: &own.Advertise,
	})
}
