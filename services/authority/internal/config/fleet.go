package config

import (
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/services/authority/internal/fleet"
)

// FleetFile is the fleet part of the authority's file.
type FleetFile struct {
	// HeartbeatInterval is how often executors report; default 5s.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// LostAfter is how long an executor may miss its heartbeats before it
	// is lost: its running jobs end executor_lost and its queued ones go
	// elsewhere. Default 30s; at least three heartbeat intervals.
	LostAfter time.Duration `yaml:"lost_after"`
}

func (f *FleetFile) validate() error {
	if f.HeartbeatInterval == 0 {
		f.HeartbeatInterval = fleet.DefaultInterval
	}
	if f.LostAfter == 0 {
		f.LostAfter = fleet.DefaultLostAfter
	}
	switch {
	case f.HeartbeatInterval < time.Second || f.HeartbeatInterval > time.Minute:
		return config.Field("fleet.heartbeat_interval", "%v: must be between 1s and 1m", f.HeartbeatInterval)
	case f.LostAfter < 3*f.HeartbeatInterval:
		return config.Field("fleet.lost_after", "%v: must be at least three heartbeat intervals (%v)", f.LostAfter, 3*f.HeartbeatInterval)
	case f.LostAfter > time.Hour:
		return config.Field("fleet.lost_after", "%v: at most 1h", f.LostAfter)
	}
	return nil
}
