package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Recover removes what jobs of an earlier, killed executor left behind and
// returns their ids: namespaces under Dir, veths carrying this manager's
// alias, and this manager's nftables tables. Call it at start, before the
// first Create.
func (m *Manager) Recover(ctx context.Context) ([]string, error) {
	m.mu.Lock()
	busy := len(m.live)
	m.mu.Unlock()
	if busy > 0 {
		return nil, fmt.Errorf("%w: netpolicy: Recover must run before any namespace is created (%d live)", errdefs.ErrFailedPrecondition, busy)
	}
	ids := map[string]bool{}
	var errs []error
	// The tables of veths that could not be deleted stay: a veth with a
	// route and no rules would let its job out unfiltered.
	keep := map[string]bool{}
	ents, err := os.ReadDir(m.nsDir)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: recover: %w", err)
	}
	for _, e := range ents {
		ids[e.Name()] = true
		// Veth and table names follow from the id, even where the alias
		// was never set.
		n := m.newNet(e.Name())
		if _, _, err := deleteLink(n.veth); err != nil {
			errs = append(errs, err)
			keep[n.table] = true
		}
		if err := removeNetns(n.path); err != nil {
			errs = append(errs, err)
		}
	}
	left, err := m.ourLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for name, id := range left {
		ids[id] = true
		if _, _, err := deleteLink(name); err != nil {
			errs = append(errs, err)
			// The table's name follows from the id; a veth whose alias
			// names no valid id keeps every table.
			if idFormat.MatchString(id) {
				keep[m.newNet(id).table] = true
			} else {
				keep["*"] = true
			}
		}
	}
	if err == nil && len(keep) == 0 {
		// No job of ours has an interface left: no entry of the pools
		// belongs to a live connection.
		if err := deleteFlows(prefixFilter{m.cfg.Pool4, m.cfg.Pool6}, m.cfg.Pool6.IsValid()); err != nil {
			errs = append(errs, fmt.Errorf("remove connection tracking entries of pool %s: %w", m.cfg.Pool4, err))
		}
	}
	tables, err := m.ourTables(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	var gone []string
	for _, t := range tables {
		if !keep[t] && !keep["*"] {
			gone = append(gone, t)
		}
	}
	if len(gone) > 0 {
		if err := m.deleteTables(ctx, gone...); err != nil {
			errs = append(errs, fmt.Errorf("remove tables %v: %w", gone, err))
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		if id != "" {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	if len(out) > 0 || len(tables) > 0 {
		m.log.Info("netpolicy: recovered", "job_ids", out, "tables", tables)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("netpolicy: recover: %w", errors.Join(errs...))
	}
	return out, nil
}
