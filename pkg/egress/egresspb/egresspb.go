// Package egresspb converts a job's egress record (pkg/egress.Record) to and
// from the authority API's EgressRecord messages, and holds the bounds a
// report's copy keeps to. It is the one place that does, so the executor
// (reporting), the authority (checking what it stores) and the CLI (showing
// it) cannot disagree; adapters import it, domain packages do not.
package egresspb

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/egress"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Bounds of the copy a report carries (the bundle has the whole record).
const (
	// MaxRecords is how many decisions a report carries at most.
	MaxRecords = 1000
	// MaxText is the longest name, reason, address or end a record
	// carries (egress.MaxText: records are written cut to it).
	MaxText = egress.MaxText
	// MaxAnswers is how many answers a record carries.
	MaxAnswers = 16
	// Budget bounds a report's copy, encoded: beside the file list's 2 MiB
	// and the patch's 1 MiB it keeps a report inside gRPC's 4 MiB.
	Budget = 512 << 10
)

// qtypeFormat is a DNS type's name as records carry it ("A", "AAAA", or
// dnsmessage's "Type65" for one it has no name for), or none.
var qtypeFormat = regexp.MustCompile(`^[A-Za-z0-9]{0,16}$`)

var vias = []string{egress.ViaConnect, egress.ViaHTTP, egress.ViaTransparent, egress.ViaDNS, egress.ViaRequest}

// Bounds of a request line's own fields (egress.Record.Bounded's).
const (
	maxMethod     = 32
	maxCredential = 256
	maxStatus     = 999
)

// Log is the report's copy of a job's record: the first and the last
// decisions (at most MaxRecords in all), each cut to the bounds, as many as
// fit in Budget, the whole record's summary by name and by brokered credential, and total, how many
// decisions the record holds.
func Log(first, last []egress.Record, total int, names []egress.NameSummary, creds []egress.CredentialSummary) *authorityv1.EgressLog {
	out := &authorityv1.EgressLog{Total: int64(max(total, len(first)+len(last))), Names: namesOf(names), Credentials: Credentials(creds)}
	size := proto.Size(out)
	kept := 0
	add := func(recs []egress.Record, budget, most int) []*typesv1.EgressRecord {
		var to []*typesv1.EgressRecord
		for _, r := range recs {
			p := toProto(r.Bounded())
			if size+proto.Size(p)+4 > budget || len(to) >= most || kept >= MaxRecords {
				break
			}
			size += proto.Size(p) + 4
			kept++
			to = append(to, p)
		}
		return to
	}
	// Half the budget and half the count for the last ones, newest first
	// (so a cut drops the oldest of them), the first taking what they
	// leave unused.
	rev := slices.Clone(last)
	slices.Reverse(rev)
	out.Last = add(rev, size+(Budget-size)/2, MaxRecords/2)
	slices.Reverse(out.Last)
	out.Records = add(first, Budget, MaxRecords)
	return out
}

// namesBudget bounds the encoded summary by name within Budget.
const namesBudget = Budget / 4

// namesOf is the summary by name as a report carries it: names that had
// anything allowed or any bytes first, then those only refused, each cut to
// MaxText, and what does not fit in namesBudget (or past MaxRecords names)
// totalled under egress.OtherNames.
func namesOf(names []egress.NameSummary) []*authorityv1.EgressName {
	ordered := slices.Clone(names)
	slices.SortStableFunc(ordered, func(a, b egress.NameSummary) int {
		used := func(n egress.NameSummary) int {
			if n.Allowed > 0 || n.BytesIn > 0 || n.BytesOut > 0 {
				return 0
			}
			return 1
		}
		return used(a) - used(b)
	})
	var out []*authorityv1.EgressName
	other := &authorityv1.EgressName{Name: egress.OtherNames}
	size := 0
	for _, s := range ordered {
		n := &authorityv1.EgressName{Name: egress.Cut(s.Name, MaxText), Allowed: int64(s.Allowed), Refused: int64(s.Refused), BytesIn: s.BytesIn, BytesOut: s.BytesOut}
		if s.Name == egress.OtherNames || size+proto.Size(n)+4 > namesBudget || len(out) >= MaxRecords-1 {
			other.Allowed += n.Allowed
			other.Refused += n.Refused
			other.BytesIn += n.BytesIn
			other.BytesOut += n.BytesOut
			continue
		}
		size += proto.Size(n) + 4
		out = append(out, n)
	}
	if other.Allowed+other.Refused > 0 || other.BytesIn+other.BytesOut > 0 {
		out = append(out, other)
	}
	return out
}

func toProto(r egress.Record) *typesv1.EgressRecord {
	return &typesv1.EgressRecord{
		Time: timestamppb.New(r.Time), Via: r.Via, Name: r.Name, Port: uint32(r.Port), Qtype: r.QType,
		Allowed: r.Allowed, Reason: r.Reason, Addr: r.Addr, Answers: r.Answers, BytesIn: r.BytesIn, BytesOut: r.BytesOut,
		DurationMs: r.DurationMS, End: r.End, Suppressed: int64(r.Suppressed),
		ClosedFirst: sideToProto[r.ClosedFirst], Tls: tlsToProto(r.TLS),
		Method: r.Method, Path: r.Path, Status: uint32(max(r.Status, 0)), Credential: r.Credential,
	}
}

// Credentials is the report's copy of a job's brokered credentials' uses
// (egress.Summary.Credentials), at most egress.MaxCredentials.
func Credentials(cs []egress.CredentialSummary) []*authorityv1.CredentialUse {
	var out []*authorityv1.CredentialUse
	for _, c := range cs[:min(len(cs), egress.MaxCredentials)] {
		out = append(out, &authorityv1.CredentialUse{Name: egress.Cut(c.Name, maxCredential), Requests: int64(c.Requests), Refused: int64(c.Refused),
			BytesIn: c.BytesIn, BytesOut: c.BytesOut})
	}
	return out
}

var (
	sideToProto = map[egress.Side]typesv1.EgressSide{
		egress.SideJob: typesv1.EgressSide_EGRESS_SIDE_JOB, egress.SideServer: typesv1.EgressSide_EGRESS_SIDE_SERVER,
	}
	handshakeToProto = map[egress.Handshake]typesv1.EgressHandshake{
		egress.HandshakeCompleted: typesv1.EgressHandshake_EGRESS_HANDSHAKE_COMPLETED,
		egress.HandshakeFailed:    typesv1.EgressHandshake_EGRESS_HANDSHAKE_FAILED,
		egress.HandshakeNotTLS:    typesv1.EgressHandshake_EGRESS_HANDSHAKE_NOT_TLS,
		egress.HandshakeUndecided: typesv1.EgressHandshake_EGRESS_HANDSHAKE_UNDECIDED,
	}
	sideFromProto      = invert(sideToProto)
	handshakeFromProto = invert(handshakeToProto)
)

func invert[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

func tlsToProto(t *egress.TLS) *typesv1.EgressTLS {
	t = t.Bounded()
	if t == nil {
		return nil
	}
	return &typesv1.EgressTLS{Handshake: handshakeToProto[t.Handshake], By: sideToProto[t.By], After: t.After}
}

// Event is the watch's message for r, the job's record at index.
func Event(index int64, r egress.Record) *typesv1.EgressEvent {
	return &typesv1.EgressEvent{Index: index, Record: toProto(r.Bounded())}
}

// FromEvent converts a watch's message back, refusing what a record may
// not carry (CheckRecord) and bounding the rest.
func FromEvent(field string, e *typesv1.EgressEvent) (int64, egress.Record, error) {
	if e.GetIndex() < 0 {
		return 0, egress.Record{}, fmt.Errorf("%s.index: %d is negative", field, e.GetIndex())
	}
	if e.GetRecord() == nil {
		return 0, egress.Record{}, fmt.Errorf("%s.record: required", field)
	}
	if err := CheckRecord(field+".record", e.GetRecord()); err != nil {
		return 0, egress.Record{}, err
	}
	return e.GetIndex(), Records([]*typesv1.EgressRecord{e.GetRecord()})[0], nil
}

// Names converts a log's summary by name back.
func Names(l *authorityv1.EgressLog) []egress.NameSummary {
	var out []egress.NameSummary
	for _, n := range l.GetNames() {
		out = append(out, egress.NameSummary{Name: n.GetName(), Allowed: int(n.GetAllowed()), Refused: int(n.GetRefused()), BytesIn: n.GetBytesIn(), BytesOut: n.GetBytesOut()})
	}
	return out
}

// CredentialUses converts a log's brokered credentials' uses back.
func CredentialUses(l *authorityv1.EgressLog) []egress.CredentialSummary {
	var out []egress.CredentialSummary
	for _, c := range l.GetCredentials() {
		out = append(out, egress.CredentialSummary{Name: c.GetName(), Requests: int(c.GetRequests()), Refused: int(c.GetRefused()), BytesIn: c.GetBytesIn(), BytesOut: c.GetBytesOut()})
	}
	return out
}

// Records converts records back.
func Records(recs []*typesv1.EgressRecord) []egress.Record {
	var out []egress.Record
	for _, p := range recs {
		r := egress.Record{
			Via: p.GetVia(), Name: p.GetName(), Port: uint16(p.GetPort()), QType: p.GetQtype(), Allowed: p.GetAllowed(),
			Reason: p.GetReason(), Addr: p.GetAddr(), Answers: slices.Clone(p.GetAnswers()), BytesIn: p.GetBytesIn(),
			BytesOut: p.GetBytesOut(), DurationMS: p.GetDurationMs(), End: p.GetEnd(), Suppressed: int(p.GetSuppressed()),
			ClosedFirst: sideFromProto[p.GetClosedFirst()],
			Method:      p.GetMethod(), Path: p.GetPath(), Status: int(p.GetStatus()), Credential: p.GetCredential(),
		}
		if t := p.GetTls(); t != nil {
			r.TLS = (&egress.TLS{Handshake: handshakeFromProto[t.GetHandshake()], By: sideFromProto[t.GetBy()], After: t.GetAfter()}).Bounded()
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
	switch n := len(l.GetRecords()) + len(l.GetLast()); {
	case n > MaxRecords:
		return fmt.Errorf("%s.records: %d records; at most %d", field, n, MaxRecords)
	case l.GetTotal() < int64(n):
		return fmt.Errorf("%s.total: %d, fewer than the %d records given", field, l.GetTotal(), n)
	case len(l.GetNames()) > MaxRecords:
		return fmt.Errorf("%s.names: %d names; at most %d", field, len(l.GetNames()), MaxRecords)
	case len(l.GetCredentials()) > egress.MaxCredentials:
		return fmt.Errorf("%s.credentials: %d; at most %d", field, len(l.GetCredentials()), egress.MaxCredentials)
	}
	for i, c := range l.GetCredentials() {
		switch {
		case len(c.GetName()) > maxCredential:
			return fmt.Errorf("%s.credentials[%d].name: %d bytes; at most %d", field, i, len(c.GetName()), maxCredential)
		case c.GetRequests() < 0 || c.GetRefused() < 0 || c.GetBytesIn() < 0 || c.GetBytesOut() < 0:
			return fmt.Errorf("%s.credentials[%d]: negative counts", field, i)
		}
	}
	for i, n := range l.GetNames() {
		switch {
		case len(n.GetName()) > MaxText:
			return fmt.Errorf("%s.names[%d].name: %d bytes; at most %d", field, i, len(n.GetName()), MaxText)
		case n.GetAllowed() < 0 || n.GetRefused() < 0 || n.GetBytesIn() < 0 || n.GetBytesOut() < 0:
			return fmt.Errorf("%s.names[%d]: negative counts", field, i)
		}
	}
	for i, r := range slices.Concat(l.GetRecords(), l.GetLast()) {
		at := fmt.Sprintf("%s.records[%d]", field, i)
		if i >= len(l.GetRecords()) {
			at = fmt.Sprintf("%s.last[%d]", field, i-len(l.GetRecords()))
		}
		if err := CheckRecord(at, r); err != nil {
			return err
		}
	}
	return nil
}

// CheckRecord refuses a record a report or a watch may not carry, naming
// the field (at) and the reason.
func CheckRecord(at string, r *typesv1.EgressRecord) error {
	switch {
	case !slices.Contains(vias, r.GetVia()) && !(r.GetVia() == "" && r.GetSuppressed() > 0):
		return fmt.Errorf("%s.via: %q is not one of %s", at, r.GetVia(), strings.Join(vias, ", "))
	case r.GetPort() > 65535:
		return fmt.Errorf("%s.port: %d is not a TCP port", at, r.GetPort())
	case !qtypeFormat.MatchString(r.GetQtype()):
		return fmt.Errorf("%s.qtype: %q is not a DNS type name", at, r.GetQtype())
	case len(r.GetAnswers()) > MaxAnswers:
		return fmt.Errorf("%s.answers: %d; at most %d", at, len(r.GetAnswers()), MaxAnswers)
	case r.GetBytesIn() < 0 || r.GetBytesOut() < 0 || r.GetDurationMs() < 0 || r.GetSuppressed() < 0:
		return fmt.Errorf("%s: negative counts", at)
	case r.GetTime() != nil && r.GetTime().CheckValid() != nil:
		return fmt.Errorf("%s.time: %v", at, r.GetTime().CheckValid())
	case r.GetClosedFirst() != typesv1.EgressSide_EGRESS_SIDE_UNSPECIFIED && sideFromProto[r.GetClosedFirst()] == "":
		return fmt.Errorf("%s.closed_first: %v is not a side", at, r.GetClosedFirst())
	case r.GetTls() != nil && handshakeFromProto[r.GetTls().GetHandshake()] == "":
		return fmt.Errorf("%s.tls.handshake: %v is not an outcome", at, r.GetTls().GetHandshake())
	case r.GetTls().GetBy() != typesv1.EgressSide_EGRESS_SIDE_UNSPECIFIED && sideFromProto[r.GetTls().GetBy()] == "":
		return fmt.Errorf("%s.tls.by: %v is not a side", at, r.GetTls().GetBy())
	case r.GetTls().GetAfter() < 0:
		return fmt.Errorf("%s.tls.after: %d is negative", at, r.GetTls().GetAfter())
	case len(r.GetMethod()) > maxMethod:
		return fmt.Errorf("%s.method: %d bytes; at most %d", at, len(r.GetMethod()), maxMethod)
	case len(r.GetCredential()) > maxCredential:
		return fmt.Errorf("%s.credential: %d bytes; at most %d", at, len(r.GetCredential()), maxCredential)
	case r.GetStatus() > maxStatus:
		return fmt.Errorf("%s.status: %d is not an HTTP status", at, r.GetStatus())
	}
	for name, v := range map[string]string{"name": r.GetName(), "reason": r.GetReason(), "addr": r.GetAddr(), "end": r.GetEnd(), "qtype": r.GetQtype(), "path": r.GetPath()} {
		if len(v) > MaxText {
			return fmt.Errorf("%s.%s: %d bytes; at most %d", at, name, len(v), MaxText)
		}
	}
	for j, a := range r.GetAnswers() {
		if len(a) > MaxText {
			return fmt.Errorf("%s.answers[%d]: %d bytes; at most %d", at, j, len(a), MaxText)
		}
	}
	return nil
}
