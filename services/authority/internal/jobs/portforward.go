package jobs

import (
	"context"

	"github.com/airlockhq/airlock/pkg/tunnel"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// ForwardPort connects to port inside session j at its executor
// (Executor.ForwardPort), for package portforward, which has checked the
// forward and the caller.
func (s *Service) ForwardPort(ctx context.Context, j store.Job, port uint32, forwardID string) (tunnel.End, error) {
	if err := runningSession(j); err != nil {
		return nil, err
	}
	return s.cfg.Executors.For(j.Executor).ForwardPort(ctx, j.ID, port, forwardID)
}
