// Package egresspb converts a job's egress record (pkg/egress.Record) to and
// from the authority API's EgressRecord messages, and holds the bounds a
// report's copy keeps to. It is the one place that does, so the executor
// (reporting), the authority (checking what it stores) and the CLI (showing
// it) cannot disagree; adapters import it, domain packages do not.
package egresspb

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/egress"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// Bounds of the copy a report carries (the bundle has the whole record).
const (
	// MaxRecords is how many decisions a report carries at most.
	MaxRecords = 1000
	// MaxText is the longest name, reason, address or end a record
	// carries; longer ones are cut (the bundle has them whole).
	MaxText = 1024
	// MaxAnswers is how many answers a record carries.
	MaxAnswers = 16
)

var vias = []string{egress.ViaConnect, egress.ViaHTTP, egress.ViaTransparent, egress.ViaDNS}

// Log is the report's copy of recs: the first MaxRecords, each cut to the
// bounds; total is how many the job's record holds.
func Log(recs []egress.Record, total int) *authorityv1.EgressLog {
	out := &authorityv1.EgressLog{Total: int64(max(total, len(recs)))}
	for _, r := range recs[:min(len(recs), MaxRecords)] {
		out.Records = append(out.Records, toProto(r))
	}
	return out
}

func toProto(r egress.Record) *authorityv1.EgressRecord {
	p := &authorityv1.EgressRecord{
		Time: timestamppb.New(r.Time), Via: r.Via, Name: cut(r.Name), Port: uint32(r.Port), Qtype: r.QType,
		Allowed: r.Allowed, Reason: cut(r.Reason), Addr: cut(r.Addr), BytesIn: r.BytesIn, BytesOut: r.BytesOut,
		DurationMs: r.DurationMS, End: cut(r.End), Suppressed: int64(r.Suppressed),
	}
	for _, a := range r.Answers[:min(len(r.Answers), MaxAnswers)] {
		p.Answers = append(p.Answers, cut(a))
	}
	return p
}

// cut shortens s to MaxText bytes on a rune boundary, marking the cut.
func cut(s string) string {
	if len(s) <= MaxText {
		return s
	}
	n := MaxText - len(" [cut]")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + " [cut]"
}

// Records converts a log's records back.
func Records(l *authorityv1.EgressLog) []egress.Record {
	var out []egress.Record
	for _, p := range l.GetRecords() {
		r := egress.Record{
			Via: p.GetVia(), Name: p.GetName(), Port: uint16(p.GetPort()), QType: p.GetQtype(), Allowed: p.GetAllowed(),
			Reason: p.GetReason(), Addr: p.GetAddr(), Answers: slices.Clone(p.GetAnswers()), BytesIn: p.GetBytesIn(),
			BytesOut: p.GetBytesOut(), DurationMS: p.GetDurationMs(), End: p.GetEnd(), Suppressed: int(p.GetSuppressed()),
		}
		if p.GetTime() != nil {
			r.Time = p.GetTime().AsTime()
		}
		out = append(out, r)
	}
	return out
}

// Check refuses a log a report may not carry, naming the field (under
// field) and why: more records than MaxRecords or than total, an unknown
// via, text past the bounds, a port past 65535, negative counts.
func Check(field string, l *authorityv1.EgressLog) error {
	if l == nil {
		return nil
	}
	switch {
	case len(l.GetRecords()) > MaxRecords:
		return fmt.Errorf("%s.records: %d records; at most %d", field, len(l.GetRecords()), MaxRecords)
	case l.GetTotal() < int64(len(l.GetRecords())):
		return fmt.Errorf("%s.total: %d, fewer than the %d records given", field, l.GetTotal(), len(l.GetRecords()))
	}
	for i, r := range l.GetRecords() {
		at := fmt.Sprintf("%s.records[%d]", field, i)
		switch {
		case !slices.Contains(vias, r.GetVia()) && !(r.GetVia() == "" && r.GetSuppressed() > 0):
			return fmt.Errorf("%s.via: %q is not one of %s", at, r.GetVia(), strings.Join(vias, ", "))
		case r.GetPort() > 65535:
			return fmt.Errorf("%s.port: %d is not a TCP port", at, r.GetPort())
		case len(r.GetAnswers()) > MaxAnswers:
			return fmt.Errorf("%s.answers: %d; at most %d", at, len(r.GetAnswers()), MaxAnswers)
		case r.GetBytesIn() < 0 || r.GetBytesOut() < 0 || r.GetDurationMs() < 0 || r.GetSuppressed() < 0:
			return fmt.Errorf("%s: negative counts", at)
		case r.GetTime() != nil && r.GetTime().CheckValid() != nil:
			return fmt.Errorf("%s.time: %v", at, r.GetTime().CheckValid())
		}
		for name, v := range map[string]string{"name": r.GetName(), "reason": r.GetReason(), "addr": r.GetAddr(), "end": r.GetEnd(), "qtype": r.GetQtype()} {
			if len(v) > MaxText {
				return fmt.Errorf("%s.%s: %d bytes; at most %d", at, name, len(v), MaxText)
			}
		}
		for j, a := range r.GetAnswers() {
			if len(a) > MaxText {
				return fmt.Errorf("%s.answers[%d]: %d bytes; at most %d", at, j, len(a), MaxText)
			}
		}
	}
	return nil
}
