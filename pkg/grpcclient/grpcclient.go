// Package grpcclient owns how Airlock processes and the CLI dial an Airlock
// server: mTLS with our certificate, the server's SPIFFE ID pinned, and the
// otelgrpc stats handler so the caller's trace continues on the server.
// Anything that dials an Airlock service goes through Dial.
package grpcclient

import (
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// Dial returns a lazily connecting client for the server at address, which
// must prove it is server. The connection is refused at handshake if the
// server presents any other identity.
func Dial(address string, src *tlsconfig.Source, server identity.ID, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial("passthrough:///", address, src, server, opts...)
}

// DialReplicas is Dial for a service that may run as several replicas
// behind one name: every address the name resolves to (DNS A and AAAA
// records, re-resolved when a connection breaks) is connected to and the
// calls spread over those that are up, so one replica going away moves the
// calls to the others at once. Each replica must still prove it is server.
func DialReplicas(address string, src *tlsconfig.Source, server identity.ID, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial("dns:///", address, src, server, append([]grpc.DialOption{grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)}, opts...)...)
}

func dial(scheme, address string, src *tlsconfig.Source, server identity.ID, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if address == "" {
		return nil, fmt.Errorf("grpcclient: no address for %s", server)
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(src, server))),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// gRPC's default reconnect back-off grows to two minutes, so a
		// service that was down a while was noticed only a minute after it
		// came back. Our peers are few and on the same network: try again
		// at least every second.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	cc, err := grpc.NewClient(scheme+address, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("grpcclient: dial %s (%s): %w", address, server, err)
	}
	return cc, nil
}

// Conns keeps one connection per peer identity, dialled (Dial) to the
// address last asked for: a peer that moves gets a new connection and its
// old one is closed. The executors of a fleet are reached through one.
// Its methods are safe for concurrent use.
type Conns struct {
	tls *tlsconfig.Source

	mu    sync.Mutex
	conns map[identity.ID]*peerConn
}

type peerConn struct {
	address string
	cc      *grpc.ClientConn
}

// NewConns returns an empty set of connections dialling with src.
func NewConns(src *tlsconfig.Source) *Conns {
	return &Conns{tls: src, conns: map[identity.ID]*peerConn{}}
}

// Get returns the connection to peer at address, which must prove it is
// peer.
func (c *Conns) Get(peer identity.ID, address string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.conns[peer]; p != nil && p.address == address {
		return p.cc, nil
	}
	cc, err := Dial(address, c.tls, peer)
	if err != nil {
		return nil, err
	}
	if old := c.conns[peer]; old != nil {
		// It moved: calls in flight on the old address fail, and their
		// retries go to the new one.
		_ = old.cc.Close()
	}
	c.conns[peer] = &peerConn{address: address, cc: cc}
	return cc, nil
}

// Close closes every connection.
func (c *Conns) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, p := range c.conns {
		_ = p.cc.Close()
		delete(c.conns, id)
	}
	return nil
}
