package tunnel

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// pair returns the two ends of a TCP connection on loopback.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	a, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-acc
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// Join carries both ways and counts each; the client's half-close reaches
// the service, whose answer still comes back; the service's end ends Join
// and half-closes the client.
func TestJoin(t *testing.T) {
	user, clientSide := pair(t)
	serviceSide, server := pair(t)
	var in, out atomic.Int64
	done := make(chan error, 1)
	go func() { done <- Join(Conn(clientSide), Conn(serviceSide), &in, &out) }()

	req := bytes.Repeat([]byte("q"), 100<<10)
	go func() {
		user.Write(req)
		user.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(server) // ends at the client's half-close
	if err != nil || !bytes.Equal(got, req) {
		t.Fatalf("the service got %d bytes, %v; want %d", len(got), err, len(req))
	}
	if _, err := server.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	server.Close()
	if err := <-done; err != nil {
		t.Fatalf("Join = %v", err)
	}
	back, err := io.ReadAll(user)
	if err != nil || string(back) != "answer" {
		t.Fatalf("the user got %q, %v", back, err)
	}
	if in.Load() != int64(len(req)) || out.Load() != 6 {
		t.Fatalf("counted in %d out %d, want %d and 6", in.Load(), out.Load(), len(req))
	}
}

// A failure either way ends Join with it.
func TestJoinFails(t *testing.T) {
	boom := errors.New("boom")
	stuck := make(chan struct{})
	defer close(stuck)
	client := Funcs{RecvFunc: func() ([]byte, error) { return nil, boom }, SendFunc: func([]byte) error { return nil }}
	service := Funcs{RecvFunc: func() ([]byte, error) { <-stuck; return nil, io.EOF }, SendFunc: func([]byte) error { return nil }}
	errc := make(chan error, 1)
	go func() { errc <- Join(client, service, nil, nil) }()
	select {
	case err := <-errc:
		if !errors.Is(err, boom) {
			t.Fatalf("Join = %v, want boom", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Join did not return on the client's failure")
	}
}
