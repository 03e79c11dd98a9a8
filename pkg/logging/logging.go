// Package logging owns how Airlock processes build their slog logger from
// configuration. Composition roots call New once and pass the logger down;
// libraries take a *slog.Logger and never build their own.
package logging

import (
	"io"
	"log/slog"

	"github.com/airlockhq/airlock/pkg/config"
)

// New returns a logger writing to w in cfg's format at cfg's level, with
// every line tagged by service.
func New(w io.Writer, service string, cfg config.Log) (*slog.Logger, error) {
	level, err := config.ParseLevel(cfg.Level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if cfg.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	} else {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(h).With("service", service), nil
}
