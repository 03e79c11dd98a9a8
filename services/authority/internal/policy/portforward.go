package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PortForward is a tenant's port forward policy: which TCP ports inside
// its sessions its clients may reach through the authority, for how long,
// how many at once, and whether an approver must agree first. A tenant
// without one may open none.
type PortForward struct {
	Ports []PortRange
	// ApprovalRequired holds a new forward PENDING until an approver who
	// is not its requester approves it.
	ApprovalRequired bool
	// DefaultTTL is a forward's life when its request names none; MaxTTL
	// the most one may ask.
	DefaultTTL, MaxTTL time.Duration
	// MaxOpen bounds the tenant's forwards open or pending at once.
	MaxOpen int
}

// PortRange is an inclusive range of TCP ports; a single port is First ==
// Last.
type PortRange struct{ First, Last uint16 }

func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParsePortRange parses "PORT" or "FIRST-LAST" (1 to 65535, FIRST <= LAST).
func ParsePortRange(s string) (PortRange, error) {
	first, last, isRange := strings.Cut(s, "-")
	if !isRange {
		last = first
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(first), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(last), 10, 16)
	switch {
	case err1 != nil || err2 != nil || a == 0 || b == 0:
		return PortRange{}, fmt.Errorf("%q is not a TCP port (1 to 65535) or a range FIRST-LAST of them", s)
	case a > b:
		return PortRange{}, fmt.Errorf("%q: the range's first port is above its last", s)
	}
	return PortRange{First: uint16(a), Last: uint16(b)}, nil
}

// Allows reports whether port is in one of p's ranges.
func (p *PortForward) Allows(port uint32) bool {
	if p == nil {
		return false
	}
	for _, r := range p.Ports {
		if port >= uint32(r.First) && port <= uint32(r.Last) {
			return true
		}
	}
	return false
}

// PortList is p's ranges for a message, e.g. "3000, 8000-8999".
func (p *PortForward) PortList() string {
	parts := make([]string, len(p.Ports))
	for i, r := range p.Ports {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}
