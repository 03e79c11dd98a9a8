package netpolicy

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// TestBytes: Bytes counts what crossed the job's veth, both ways, and
// keeps the counts of a veth Apply of deny-all removed, and of the last
// one after Close; a deny-all namespace counts nothing.
func TestBytes(t *testing.T) {
	m := newManager(t, false)
	th := startTestHost(t, m)
	ctx := context.Background()
	const size = 100_000
	line := strings.Repeat("x", size)
	echo := func(n *Net) {
		t.Helper()
		c, err := nettest.DialFrom(n.Path(), th.addr(th.ip, th.ports[0]), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		if _, err := r.ReadString('\n'); err != nil { // the greeting
			t.Fatal(err)
		}
		if _, err := fmt.Fprintln(c, line); err != nil {
			t.Fatal(err)
		}
		if got, err := r.ReadString('\n'); err != nil || len(got) != size+1 {
			t.Fatalf("echo: %d bytes, %v", len(got), err)
		}
	}
	atLeast := func(n *Net, what string, want int64) {
		t.Helper()
		sent, received := n.Bytes()
		t.Logf("%s: %d sent, %d received", what, sent, received)
		if sent < want || received < want || sent > 3*want || received > 3*want {
			t.Fatalf("%s: %d sent, %d received; want each at least %d (and not three times that)", what, sent, received, want)
		}
	}

	n := create(t, m, allow(rule(th.ip, 32)))
	if s, r := n.Bytes(); s > 1000 || r > 1000 {
		t.Fatalf("a new veth: %d sent, %d received", s, r)
	}
	echo(n)
	atLeast(n, "live", size)
	if err := n.Apply(ctx, Policy{}, 2); err != nil {
		t.Fatal(err)
	}
	atLeast(n, "its veth removed", size)
	if err := n.Apply(ctx, allow(rule(th.ip, 32)), 3); err != nil {
		t.Fatal(err)
	}
	echo(n)
	atLeast(n, "a second veth", 2*size)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	atLeast(n, "closed", 2*size)

	d := create(t, m, Policy{})
	if err := dialFrom(d.Path(), th.addr(th.ip, th.ports[0]), 300*time.Millisecond); err == nil {
		t.Fatal("a deny-all job reached the test host")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if s, r := d.Bytes(); s != 0 || r != 0 {
		t.Fatalf("deny-all: %d sent, %d received", s, r)
	}
}
