package cli

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// pendingForwards is an authority whose forwards stay pending until
// closed; it records the closes.
type pendingForwards struct {
	authorityv1.AuthorityServiceClient // nil: any other call panics the test
	mu                                 sync.Mutex
	closed                             []string
}

func (p *pendingForwards) OpenPortForward(_ context.Context, r *authorityv1.OpenPortForwardRequest, _ ...grpc.CallOption) (*authorityv1.OpenPortForwardResponse, error) {
	return &authorityv1.OpenPortForwardResponse{Forward: &authorityv1.PortForward{ForwardId: "f1", SessionId: r.GetSessionId(),
		Port: r.GetPort(), ApprovalId: "a1", State: authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING}}, nil
}

func (p *pendingForwards) ListPortForwards(_ context.Context, r *authorityv1.ListPortForwardsRequest, _ ...grpc.CallOption) (*authorityv1.ListPortForwardsResponse, error) {
	return &authorityv1.ListPortForwardsResponse{Forwards: []*authorityv1.PortForward{{ForwardId: "f1", SessionId: r.GetSessionId(),
		State: authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING}}}, nil
}

func (p *pendingForwards) ClosePortForward(_ context.Context, r *authorityv1.ClosePortForwardRequest, _ ...grpc.CallOption) (*authorityv1.ClosePortForwardResponse, error) {
	p.mu.Lock()
	p.closed = append(p.closed, r.GetForwardId())
	p.mu.Unlock()
	return &authorityv1.ClosePortForwardResponse{Forward: &authorityv1.PortForward{ForwardId: r.GetForwardId(),
		State: authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED}}, nil
}

// Ctrl-C while the forward waits for its approval is a clean exit that
// closes the forward (withdrawing its approval at the authority).
func TestPortForwardCtrlCWhilePending(t *testing.T) {
	fake := &pendingForwards{}
	var stdout, stderr bytes.Buffer
	g := &globals{Stdout: &stdout, Stderr: &stderr}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	if err := portForward(ctx, g, fake, "s1", 0, 8000, 0); err != nil {
		t.Fatalf("Ctrl-C while pending = %v, want a clean exit", err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.closed) != 1 || fake.closed[0] != "f1" {
		t.Fatalf("closes = %v, want f1 closed once", fake.closed)
	}
	if !bytes.Contains(stderr.Bytes(), []byte("waits for approval a1")) {
		t.Fatalf("stderr = %q", stderr.String())
	}
}
