package portforward

import (
	"context"
	"errors"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// sweepBatch bounds the forwards one sweep step reads.
const sweepBatch = 100

// Sweep closes every forward past its expiry or whose session has ended,
// and brings every pending forward up to date with its approval. It
// returns how many it closed or opened.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n := 0
	for {
		list, err := s.cfg.Store.ForwardsToEnd(ctx, s.now(), sweepBatch)
		if err != nil {
			return n, err
		}
		for _, f := range list {
			reason := "expired"
			if s.now().Before(f.ExpiresAt) {
				reason = "session ended"
			}
			if _, err := s.closeForward(ctx, s.self(), f.ID, reason); err != nil {
				return n, err
			}
			n++
		}
		if len(list) < sweepBatch {
			break
		}
	}
	var errs []error
	for name, t := range s.cfg.Tenants {
		if t.PortForward == nil || !t.PortForward.ApprovalRequired {
			continue
		}
		pending, err := s.cfg.Store.ListPortForwards(ctx, store.ForwardFilter{Tenant: name, States: []store.ForwardState{store.ForwardPending}, Limit: MaxList})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range pending {
			got, err := s.resolve(ctx, f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if got.State != store.ForwardPending {
				n++
			}
		}
	}
	return n, errors.Join(errs...)
}

// SweepEvery runs Sweep every interval until ctx ends; failures are
// logged and tried again at the next tick.
func (s *Service) SweepEvery(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := s.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Logger.ErrorContext(ctx, "port forward sweep", "changed", n, "error", err)
		case n > 0:
			s.cfg.Logger.InfoContext(ctx, "port forward sweep", "changed", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
