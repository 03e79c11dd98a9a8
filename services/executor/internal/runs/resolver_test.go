package runs

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// network.resolvers are tried in order: a first one that never answers
// costs its timeout, and the second answers; a name one of them says does
// not exist is not asked of the next; names go as given, never with a
// search domain.
func TestUpstreamResolver(t *testing.T) {
	silent, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := silent.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	want := netip.MustParseAddr("203.0.113.9")
	second := nettest.StartDNS(t, map[string][]netip.Addr{"a.test": {want}})
	third := nettest.StartDNS(t, map[string][]netip.Addr{"gone.test": {want}})
	r := UpstreamResolver([]netip.AddrPort{netip.MustParseAddrPort(silent.LocalAddr().String()), second.Addr, third.Addr})

	start := time.Now()
	got, err := r.LookupNetIP(context.Background(), "ip4", "a.test")
	if err != nil || !slices.Equal(got, []netip.Addr{want}) {
		t.Fatalf("a.test: %v %v; want %s from the second resolver", got, err, want)
	}
	if d := time.Since(start); d > upstreamTimeout+2*time.Second {
		t.Errorf("took %s", d)
	}
	if _, err := r.LookupNetIP(context.Background(), "ip4", "gone.test"); err == nil {
		t.Error("gone.test resolved: the second resolver's NXDOMAIN did not end the lookup")
	}
	for _, n := range third.Asked() {
		if n == "gone.test" {
			t.Error("the third resolver was asked after the second said the name does not exist")
		}
	}
	for _, n := range second.Asked() {
		if n != "a.test" && n != "gone.test" {
			t.Errorf("the resolver was asked %q: a search domain was tried", n)
		}
	}
}
