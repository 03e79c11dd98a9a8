package nettest

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is a test's upstream DNS server on loopback: it answers A and AAAA
// questions from its table (NXDOMAIN for a name it does not have) and
// records every name it is asked, so a test can assert what reached it.
type DNS struct {
	Addr netip.AddrPort

	mu      sync.Mutex
	records map[string][]netip.Addr
	// seqs are answers that change: the k-th question of a type for
	// the name gets the k-th set (the last one from then on).
	seqs  map[string][][]netip.Addr
	count map[string]int // questions so far, by name and type
	asked []string
}

// Sequence makes name's answers change from lookup to lookup: the first
// A (and AAAA) question gets sets[0], the next sets[1], and so on, the
// last set from then on. A rebinding resolver does this.
func (d *DNS) Sequence(name string, sets ...[]netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seqs[name] = sets
}

// StartDNS serves records (lower-case names without the trailing dot) over
// UDP on 127.0.0.1 until the test ends.
func StartDNS(t testing.TB, records map[string][]netip.Addr) *DNS {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	d := &DNS{Addr: netip.MustParseAddrPort(pc.LocalAddr().String()), records: records, seqs: map[string][][]netip.Addr{}, count: map[string]int{}}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := d.answer(buf[:n]); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	return d
}

// Asked is every name asked so far, in order.
func (d *DNS) Asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asked)
}

func (d *DNS) answer(msg []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	d.mu.Lock()
	d.asked = append(d.asked, name)
	addrs, ok := d.records[name]
	if seq := d.seqs[name]; len(seq) > 0 {
		k := name + "/" + q.Type.String()
		addrs, ok = seq[min(d.count[k], len(seq)-1)], true
		d.count[k]++
	}
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !ok {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	for _, a := range addrs {
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
		switch {
		case a.Is4() && q.Type == dnsmessage.TypeA:
			b.AResource(hdr, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && q.Type == dnsmessage.TypeAAAA:
			b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	out, _ := b.Finish()
	return out
}
