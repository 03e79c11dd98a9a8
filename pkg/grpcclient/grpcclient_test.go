package grpcclient_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/grpcserver"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

const td = "airlock.test"

// TestDialReplicas: a name or an address, the replicas' pinned identity
// holds, and a replica restarted on the same address is reached again.
func TestDialReplicas(t *testing.T) {
	dir := t.TempDir()
	authority, executor := identity.Service(td, identity.ServiceAuthority), identity.Service(td, identity.ServiceExecutor)
	if _, err := pki.Init(dir, td, nil); err != nil {
		t.Fatal(err)
	}
	source := func(id identity.ID) *tlsconfig.Source {
		cert, key := pki.Paths(dir, id)
		src, err := tlsconfig.NewFileSource(pki.CAPath(dir), cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	serve := func(id identity.ID, listen string) (addr string, stop func()) {
		srv, err := grpcserver.New(grpcserver.Config{Listen: listen, TLS: tlsconfig.ServerConfig(source(id), td),
			Authorizer: authz.New(authz.AuthorityTable, slog.New(slog.NewTextHandler(io.Discard, nil)), nil),
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)), ShutdownTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ctx) }()
		srv.SetServing(true)
		return srv.Addr().String(), func() { cancel(); <-done }
	}
	check := func(cc interface {
		grpc_health_v1.HealthClient
	}) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cc.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
		return err
	}

	addr, stop := serve(authority, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(addr)
	for _, target := range []string{addr, "localhost:" + port} {
		cc, err := grpcclient.DialReplicas(target, source(executor), authority)
		if err != nil {
			t.Fatal(err)
		}
		if err := check(grpc_health_v1.NewHealthClient(cc)); err != nil {
			t.Errorf("DialReplicas(%s): %v", target, err)
		}
		cc.Close()
	}
	cc, err := grpcclient.DialReplicas("localhost:"+port, source(executor), authority)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stop()
	if err := check(grpc_health_v1.NewHealthClient(cc)); err == nil {
		t.Error("a call succeeded with the only replica stopped")
	}
	_, stop = serve(authority, addr)
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for check(grpc_health_v1.NewHealthClient(cc)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the replica back on its address was not reached again")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A server of another identity at the name is refused.
	otherAddr, stopOther := serve(executor, "127.0.0.1:0")
	defer stopOther()
	_, otherPort, _ := net.SplitHostPort(otherAddr)
	bad, err := grpcclient.DialReplicas("localhost:"+otherPort, source(executor), authority)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := check(grpc_health_v1.NewHealthClient(bad)); err == nil {
		t.Error("a server with the executor's certificate passed for the authority")
	}
}

// TestConns: one connection per peer, kept while its address stays, and
// replaced (the old one closed) when the peer moves.
func TestConns(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, td, nil); err != nil {
		t.Fatal(err)
	}
	cert, key := pki.Paths(dir, identity.Service(td, identity.ServiceAuthority))
	src, err := tlsconfig.NewFileSource(pki.CAPath(dir), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c := grpcclient.NewConns(src)
	e1 := identity.Service(td, identity.ServiceExecutor)
	a, err := c.Get(e1, "127.0.0.1:7402")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get(e1, "127.0.0.1:7402"); again != a {
		t.Error("a second Get at the same address dialled again")
	}
	moved, err := c.Get(e1, "127.0.0.2:7402")
	if err != nil || moved == a {
		t.Fatalf("after a move: %v, same connection %v", err, moved == a)
	}
	if st := a.GetState().String(); st != "SHUTDOWN" {
		t.Errorf("the old connection is %s, want SHUTDOWN", st)
	}
	if err := c.Close(); err != nil || moved.GetState().String() != "SHUTDOWN" {
		t.Errorf("Close: %v, the connection is %s", err, moved.GetState())
	}
}
