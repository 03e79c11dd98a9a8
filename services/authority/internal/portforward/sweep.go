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
// and every forward its tenant's current policy no longer allows, and
// brings every pending forward up to date with its approval (a pending
// forward's expiry is its approval's). It returns how many it closed or
// opened.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n := 0
	for {
		list, err := s.cfg.Store.ForwardsToEnd(ctx, s.now(), sweepBatch)
		if err != nil {
			return n, err
		}
		stuck := 0
		for _, f := range list {
			reason := "expired"
			switch {
			case s.now().Before(f.ExpiresAt):
				reason = "session ended"
			case f.State == store.ForwardPending:
				// Its approval's expiry: resolve closes it as such (or
				// opens it, decided in time).
				got, err := s.resolve(ctx, f)
				if err != nil {
					return n, err
				}
				if got.State == store.ForwardPending {
					stuck++
				} else {
					n++
				}
				continue
			}
			if _, err := s.closeForward(ctx, s.self(), f.ID, reason); err != nil {
				return n, err
			}
			n++
		}
		if len(list) < sweepBatch || stuck == len(list) {
			break
		}
	}
	var errs []error
	for name, t := range s.cfg.Tenants {
		live, err := s.cfg.Store.ListPortForwards(ctx, store.ForwardFilter{Tenant: name,
			States: []store.ForwardState{store.ForwardPending, store.ForwardOpen}, Limit: MaxList})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range live {
			if why := s.policyRefusal(name, f.Port); why != "" {
				if _, err := s.closeForward(ctx, s.self(), f.ID, why); err != nil {
					errs = append(errs, err)
				} else {
					n++
				}
				continue
			}
			if f.State != store.ForwardPending || t.PortForward == nil {
				continue
			}
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
