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
	go func() { done <- Join(Conn(clientSide), Conn(serviceSide), &in, &out, nil) }()

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
	go func() { errc <- Join(client, service, nil, nil, nil) }()
	select {
	case err := <-errc:
		if !errors.Is(err, boom) {
			t.Fatalf("Join = %v, want boom", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Join did not return on the client's failure")
	}
}

// Once one direction ends, Join stops both ends and waits for the other
// direction; a direction stop cannot end never sends (nor counts) after
// Join returned.
func TestJoinStopsAndWaits(t *testing.T) {
	boom := errors.New("boom")
	release := make(chan struct{})
	stopped := make(chan struct{})
	var sentAfter atomic.Bool
	var returned atomic.Bool
	// The client fails at once; the service's Recv ends only when stop
	// runs (its stream cancelled), with a chunk for the client.
	client := Funcs{RecvFunc: func() ([]byte, error) { return nil, boom }, SendFunc: func([]byte) error {
		if returned.Load() {
			sentAfter.Store(true)
		}
		return nil
	}}
	service := Funcs{RecvFunc: func() ([]byte, error) { <-release; return []byte("late"), nil }, SendFunc: func([]byte) error { return nil }}
	var out atomic.Int64
	err := Join(client, service, nil, &out, func() { close(stopped) })
	returned.Store(true)
	if !errors.Is(err, boom) {
		t.Fatalf("Join = %v, want boom", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("Join returned without calling stop")
	}
	close(release) // the stuck Recv returns only now, after Join
	time.Sleep(100 * time.Millisecond)
	if sentAfter.Load() || out.Load() != 0 {
		t.Fatalf("a chunk was sent after Join returned (counted %d)", out.Load())
	}

	// A stop that ends the other direction: Join waits for it.
	var otherDone atomic.Bool
	stop := make(chan struct{})
	service = Funcs{RecvFunc: func() ([]byte, error) {
		<-stop
		time.Sleep(50 * time.Millisecond)
		otherDone.Store(true)
		return nil, errors.New("cancelled")
	}, SendFunc: func([]byte) error { return nil }}
	if err := Join(client, service, nil, nil, func() { close(stop) }); !errors.Is(err, boom) {
		t.Fatalf("Join = %v, want boom", err)
	}
	if !otherDone.Load() {
		t.Fatal("Join returned before the other direction ended")
	}
}
