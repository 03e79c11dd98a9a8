package approvals

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockhq/airlock/pkg/telemetry/instruments"
	"github.com/airlockhq/airlock/services/authority/internal/store"
)

// MeterName is the instrumentation scope of the approval metrics, and of
// the lease metrics (package leases) that were born here.
const MeterName = "github.com/airlockhq/airlock/services/authority/internal/approvals"

// metrics are the approval service's instruments. Their attributes are
// the approval's kind (publish, change), a vote's decision and the state a
// request reached: fixed sets, never an id.
type metrics struct {
	votes, decided metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	set := instruments.New(mp, MeterName)
	x := metrics{
		votes:   set.Counter("airlock.authority.approvals.votes", "{vote}", "Approvers' votes recorded, by decision."),
		decided: set.Counter("airlock.authority.approvals.decided", "{approval}", "Approval requests that became approved, denied or expired."),
	}
	if err := set.Err(); err != nil {
		return nil, err
	}
	return &x, nil
}

func kindAttr(k store.ApprovalKind) attribute.KeyValue {
	if k == "" {
		k = store.KindPublish
	}
	return attribute.String("kind", string(k))
}

// voted counts a vote recorded on a, and a's new state if the vote
// decided it.
func (x *metrics) voted(a store.Approval, decision string) {
	ctx := context.Background()
	x.votes.Add(ctx, 1, metric.WithAttributes(kindAttr(a.Kind), attribute.String("decision", decision)))
	if a.State == store.ApprovalApproved || a.State == store.ApprovalDenied {
		x.decided.Add(ctx, 1, metric.WithAttributes(kindAttr(a.Kind), attribute.String("state", string(a.State))))
	}
}

// expired counts requests the sweep rewrote as expired.
func (x *metrics) expired(list []store.Approval) {
	for _, a := range list {
		x.decided.Add(context.Background(), 1, metric.WithAttributes(kindAttr(a.Kind), attribute.String("state", string(store.ApprovalExpired))))
	}
}
