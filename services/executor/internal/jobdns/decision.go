package jobdns

import (
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlockhq/airlock/pkg/refusalcap"
	"github.com/airlockhq/airlock/services/executor/internal/egressbase"
)

// QueryDecision is the record of one query: what it asked, whether it was
// answered and why, and with what.
type QueryDecision struct {
	// Time is when the server read the query.
	Time time.Time
	// Proto is "udp" or "tcp".
	Proto string
	// Name is the question's name, normalised when it is a host name (as
	// the job sent it, without the trailing dot, when it is not); "" when
	// no single question was read.
	Name string
	// Type is the question's type (zero when none was read).
	Type dnsmessage.Type
	// Allowed reports whether the policy allowed the name and the server
	// answered with what the upstream resolver said.
	Allowed bool
	// Reason says why: the rule that allowed it, or what refused it.
	Reason string
	// RCode is the response's code; a query left unanswered (a response,
	// a message shorter than a header) has RCodeSuccess and no Answers.
	RCode dnsmessage.RCode
	// Answers are the vetted addresses answered.
	Answers []netip.Addr
	// Suppressed, when not zero, makes this a summary: that many refusals
	// of Name past the cap, from Time over a minute, were not recorded one
	// by one. Name is "" both for refusals that named nothing and for the
	// summary over all names; Reason tells which.
	Suppressed int
}

// emit records d, unless it is a refusal past the cap, which is counted.
func (s *Server) emit(d QueryDecision) { s.log.Emit(d, d.Allowed, d.Name) }

// summary is the record of the refused queries a window of the cap held
// back.
func summary(w refusalcap.Summary[QueryDecision]) QueryDecision {
	return QueryDecision{
		Time:       w.Start,
		Name:       w.Key,
		Reason:     egressbase.SummaryReason("refused queries", w),
		Suppressed: w.Suppressed,
	}
}

// TypeName is the question's type as people write it ("A", "AAAA"), ""
// when none was read.
func (d QueryDecision) TypeName() string {
	if d.Type == 0 {
		return ""
	}
	return typeName(d.Type.String(), "Type")
}
