package acceptloop

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
)

// fakeListener fails its first accepts with a passing error, then hands
// out one connection, then reports closed.
type fakeListener struct {
	net.Listener
	calls   int
	fails   int
	closed  atomic.Bool
	handout net.Conn
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.calls++
	switch {
	case f.calls <= f.fails:
		return nil, errors.New("accept: too many open files")
	case f.calls == f.fails+1:
		return f.handout, nil
	}
	f.closed.Store(true)
	return nil, net.ErrClosed
}

// Serve keeps serving through passing errors, hands each connection on, and
// returns the server's own error once the server is closed.
func TestServe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	f := &fakeListener{fails: 3, handout: a}
	var got []net.Conn
	errServer := errors.New("server closed")
	err := Serve(f, f.closed.Load, errServer, func(c net.Conn) { got = append(got, c) })
	if !errors.Is(err, errServer) {
		t.Errorf("Serve = %v, want the server's error", err)
	}
	if len(got) != 1 || got[0] != a || f.calls != 5 {
		t.Errorf("handled %d connections after %d accepts; want the one, after 5", len(got), f.calls)
	}

	// A listener closed under a server that is not: its own error.
	g := &fakeListener{handout: a}
	if err := Serve(g, func() bool { return false }, errServer, func(net.Conn) {}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve = %v, want net.ErrClosed", err)
	}
}
