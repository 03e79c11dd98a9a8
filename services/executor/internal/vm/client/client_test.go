package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
)

// guestSide is the other end of a Client: a test plays the guest on it.
func guestSide(t *testing.T) (*Client, *proto.Reader, *proto.Writer, net.Conn) {
	t.Helper()
	host, guest := net.Pipe()
	c := New(host)
	t.Cleanup(func() { c.Close(); guest.Close() })
	return c, proto.NewReader(guest), proto.NewWriter(guest), guest
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestProcessLifecycle(t *testing.T) {
	c, r, w, _ := guestSide(t)
	go func() {
		w.WriteJSON(0, proto.TypeHello, proto.Hello{Version: "v1"})
		f, _ := r.Read() // start
		var p proto.Process
		proto.Decode(f, &p)
		w.WriteJSON(f.Stream, proto.TypeStarted, proto.Started{Pid: 42})
		w.Write(f.Stream, proto.TypeStdout, []byte("out"))
		w.Write(f.Stream, proto.TypeStderr, []byte("err"))
		w.WriteJSON(f.Stream, proto.TypeExit, proto.Exit{Code: 3})
	}()
	if h, err := c.Hello(ctx(t)); err != nil || h.Version != "v1" {
		t.Fatalf("hello %+v %v", h, err)
	}
	var out, errb bytes.Buffer
	p, err := c.Start(ctx(t), proto.Process{Args: []string{"x"}}, &out, &errb)
	if err != nil || p.Pid != 42 {
		t.Fatalf("start %+v %v", p, err)
	}
	e, err := p.Wait(ctx(t))
	if err != nil || e.Code != 3 || out.String() != "out" || errb.String() != "err" {
		t.Fatalf("exit %+v %v %q %q", e, err, out.String(), errb.String())
	}
}

func TestExecError(t *testing.T) {
	c, r, w, _ := guestSide(t)
	go func() {
		f, _ := r.Read()
		w.WriteJSON(f.Stream, proto.TypeError, proto.Error{Message: `exec: "x": executable file not found in $PATH`, ExitCode: 127})
	}()
	_, err := c.Start(ctx(t), proto.Process{Args: []string{"x"}}, nil, nil)
	var ee *ExecError
	if !errors.As(err, &ee) || ee.Code != 127 || !strings.Contains(ee.Message, "not found in $PATH") {
		t.Fatalf("got %v", err)
	}
}

// A hostile guest ends the connection with an error; the client never panics.
func TestHostileGuest(t *testing.T) {
	raw := func(n uint32, stream uint32, typ byte, payload string) []byte {
		b := binary.BigEndian.AppendUint32(nil, n)
		b = binary.BigEndian.AppendUint32(b, stream)
		return append(append(b, typ), payload...)
	}
	for _, tc := range []struct {
		name  string
		bytes []byte
	}{
		{"oversized frame", raw(1<<30, 0, byte(proto.TypeHello), "")},
		{"unknown type", raw(5, 0, 99, "")},
		{"bad hello json", raw(6, 0, byte(proto.TypeHello), "{")},
		{"unrequested ready", raw(5, 0, byte(proto.TypeReady), "")},
		{"unknown stream", raw(5, 7, byte(proto.TypeStdout), "")},
		{"host-only type", raw(5, 0, byte(proto.TypeStart), "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _, guest := guestSide(t)
			go guest.Write(tc.bytes)
			select {
			case <-c.Done():
				if !errors.Is(c.Err(), proto.ErrProtocol) {
					t.Fatalf("ended with %v, want a protocol error", c.Err())
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the connection survived")
			}
		})
	}
	t.Run("exit before started, bad code, huge ack", func(t *testing.T) {
		for _, typ := range []proto.Type{proto.TypeExit, proto.TypeStdinAck} {
			c, r, w, _ := guestSide(t)
			go func() {
				f, _ := r.Read()
				if typ == proto.TypeStdinAck {
					w.WriteJSON(f.Stream, proto.TypeStarted, proto.Started{Pid: 1})
					w.WriteJSON(f.Stream, typ, proto.StdinAck{Bytes: 1 << 40})
					return
				}
				w.WriteJSON(f.Stream, typ, proto.Exit{Code: 1000})
			}()
			p, err := c.Start(ctx(t), proto.Process{Args: []string{"x"}, Stdin: true}, nil, nil)
			if err == nil {
				_, err = p.Wait(ctx(t))
			}
			if !errors.Is(err, proto.ErrProtocol) && !errors.Is(c.Err(), proto.ErrProtocol) {
				t.Fatalf("%s: got %v / %v, want a protocol error", typ, err, c.Err())
			}
		}
	})
}
