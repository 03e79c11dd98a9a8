// Package audittamper is the attacker of the audit log's tests: someone
// with write access to the authority's SQLite database and the project's
// source, who changes an entry and recomputes every later hash and the head
// with pkg/audit's own code, so that the chain verifies on its own. Only
// tests import it.
package audittamper

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
)

// Rewrite sets entry seq's reason in the SQLite database db and relinks the
// chain from there to its head. It drops the triggers that keep the log
// append-only first, as such an attacker would.
func Rewrite(db *sql.DB, seq int64, reason string) error {
	for _, q := range []string{"DROP TRIGGER IF EXISTS audit_log_no_update", "DROP TRIGGER IF EXISTS audit_log_no_delete"} {
		if _, err := db.Exec(q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	rows, err := db.Query(`SELECT seq, occurred_at, kind, caller, subject, tenant, job_id, outcome, reason, prev_hash, hash
		FROM audit_log WHERE seq >= ? ORDER BY seq`, seq)
	if err != nil {
		return err
	}
	var events []audit.Event
	for rows.Next() {
		var (
			e  audit.Event
			at int64
		)
		if err := rows.Scan(&e.Sequence, &at, &e.Kind, &e.Caller, &e.Subject, &e.Tenant, &e.JobID, &e.Outcome, &e.Reason, &e.PrevHash, &e.Hash); err != nil {
			rows.Close()
			return err
		}
		e.Time = time.UnixMicro(at).UTC()
		events = append(events, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(events) == 0 || events[0].Sequence != seq {
		return fmt.Errorf("audittamper: no entry %d", seq)
	}
	events[0].Reason = reason
	prev := events[0].PrevHash
	for i := range events {
		events[i].PrevHash = prev
		h, err := events[i].ComputeHash()
		if err != nil {
			return err
		}
		events[i].Hash, prev = h, h
		if _, err := db.Exec(`UPDATE audit_log SET reason = ?, prev_hash = ?, hash = ? WHERE seq = ?`,
			events[i].Reason, events[i].PrevHash, events[i].Hash, events[i].Sequence); err != nil {
			return err
		}
	}
	last := events[len(events)-1]
	_, err = db.Exec(`UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1`, last.Sequence, last.Hash)
	return err
}
