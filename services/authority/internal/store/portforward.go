package store

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/pkg/audit"
)

// ForwardState is where a port forward is. The values are what the
// database holds, so they never change.
type ForwardState string

// Port forward states: pending (waiting for its approval) → open →
// closed, or pending → closed.
const (
	ForwardPending ForwardState = "pending"
	ForwardOpen    ForwardState = "open"
	ForwardClosed  ForwardState = "closed"
)

// KindPortForward is an approval of a port forward into a running
// session: Approval.JobID is the session, Change what the forward asks.
const KindPortForward ApprovalKind = "port_forward"

// PortForward is the record of one forward into a session: who opened it,
// to which port, its life, and what it carried.
type PortForward struct {
	ID        string
	SessionID string
	Tenant    string
	// Requester is the SPIFFE ID of the client that opened it; only it
	// carries connections.
	Requester string
	Port      uint32
	State     ForwardState
	CreatedAt time.Time
	ExpiresAt time.Time
	ClosedAt  time.Time
	// CloseReason says who or what closed it.
	CloseReason string
	// ApprovalID is the approval it waits for or was opened by.
	ApprovalID string
	// Connections carried; bytes into the session and out of it.
	Connections, BytesIn, BytesOut int64
	// Version increases by one with every stored change.
	Version int64
}

// ForwardFilter selects forwards for ListPortForwards: a session's, or a
// tenant's.
type ForwardFilter struct {
	SessionID string
	Tenant    string
	// States filters by state; empty means all.
	States []ForwardState
	// Limit is the most returned, newest first; it must be positive.
	Limit int
}

// ForwardStore is the part of Store that keeps port forwards.
type ForwardStore interface {
	// CreatePortForwardAudited records f (state pending or open) and e in
	// one transaction, unless f's tenant already has maxOpen forwards
	// pending or open: then nothing is written and the error wraps
	// errdefs.ErrResourceExhausted. Creations for one tenant take turns,
	// across replicas too, so the bound holds.
	CreatePortForwardAudited(ctx context.Context, f PortForward, maxOpen int, e audit.Event) (PortForward, error)
	// GetPortForward returns one forward, or ErrNotFound.
	GetPortForward(ctx context.Context, id string) (PortForward, error)
	// ListPortForwards returns forwards matching f, newest first.
	ListPortForwards(ctx context.Context, f ForwardFilter) ([]PortForward, error)
	// UpdatePortForwardAudited locks forward id, lets update change its
	// state, times, reason and approval, and writes it with the event
	// update returns (nil: none) in one transaction; an error from update
	// writes nothing and is returned. The counters are AddForwardTraffic's.
	UpdatePortForwardAudited(ctx context.Context, id string, update func(*PortForward) (*audit.Event, error)) (PortForward, error)
	// AddForwardTraffic adds to forward id's counters, whatever its state
	// (a connection's last bytes are counted after its close).
	AddForwardTraffic(ctx context.Context, id string, connections, bytesIn, bytesOut int64) error
	// ForwardsToEnd returns up to limit forwards pending or open that
	// should end at now: past their expiry, or of a session that has
	// ended (a terminal job).
	ForwardsToEnd(ctx context.Context, now time.Time, limit int) ([]PortForward, error)
}
