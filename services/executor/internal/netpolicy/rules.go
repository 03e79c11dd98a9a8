package netpolicy

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// txTimeout bounds one nftables transaction or listing over netlink; one
// takes milliseconds.
const txTimeout = 30 * time.Second

// jobRules is the whole of one job's table, as one transaction queues it.
type jobRules struct {
	table  *nftables.Table
	chains []*nftables.Chain
	rules  []jobRule
}

// jobRule is one rule and the anonymous sets it looks up, which exist
// only bound to it.
type jobRule struct {
	chain *nftables.Chain
	sets  []anonSet
	exprs []expr.Any
}

type anonSet struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

// jobRules are p's rules for n: its table, replaced as a whole by queue.
//
// The chains, all matching only the job's veth:
//   - prerouting (priority raw, before any DNAT of the host): the host's
//     own addresses (a fib lookup, so every address of every interface,
//     now or later), broadcast, multicast and the always-denied prefixes
//     are dropped before anything could rewrite them;
//   - input: nothing from the job reaches the host itself (the veth's
//     neighbours are static, so not even ARP or neighbour discovery
//     needs to);
//   - forward, from the job: a spoofed source, the always-denied prefixes
//     (again, after DNAT) and everything not allowed are dropped. This
//     does not look at connection state, so a narrower policy also cuts
//     connections it no longer allows. A new connection beyond
//     Config.MaxConnections of the job's is rejected (at once, so the job
//     sees an error rather than a timeout); the count starts again with
//     each new set of rules, since it lives in the table Apply replaces;
//   - forward, to the job: replies only;
//   - postrouting: the job's address is masqueraded behind the host's, so
//     replies find their way back.
//
// A Proxied policy adds the way to the egress services at the host end of
// the veth, and nothing more: prerouting lets through, before the drops,
// what goes to the host end's own addresses on ExplicitProxyPort and on
// port 53; a NAT chain (priority dstnat) sends port 53 there to DNSPort
// and TCP to port 80 or 443 of any address to TransparentPort on the host
// end; and input accepts exactly those three ports on the host end's
// addresses, at most Config.MaxConnections TCP connections at once, as the
// forward chain counts them. What the job sends anywhere else is still
// dropped, and what reaches those ports on the host end's addresses by any
// other interface than the veth is dropped too: the services are the
// job's alone.
func (m *Manager) jobRules(n *Net, p Policy) *jobRules {
	a := n.addr
	t := &nftables.Table{Name: n.table, Family: nftables.TableFamilyINet}
	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return &nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept}
	}
	regular := func(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: t} }
	var (
		prerouting  = base("prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
		fromJobPre  = regular("from_job_pre")
		input       = base("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
		fromJobIn   = regular("from_job_input")
		forward     = base("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
		fromJob     = regular("from_job")
		toJob       = regular("to_job")
		postrouting = base("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	)
	r := &jobRules{table: t, chains: []*nftables.Chain{prerouting, fromJobPre, input, fromJobIn, forward, fromJob, toJob, postrouting}}
	var (
		natPre  = base("nat_prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
		proxyTo = regular("to_proxy")
	)
	if p.Proxied {
		r.chains = append(r.chains, natPre, proxyTo)
	}
	var setID uint32
	// A set's id names it within the transaction; ours are set here, not
	// by the library, whose counter is shared by every connection.
	newSet := func(key nftables.SetDatatype, interval bool, elems []nftables.SetElement) anonSet {
		setID++
		return anonSet{&nftables.Set{Table: t, ID: setID, Name: "__set%d", Anonymous: true, Constant: true, Interval: interval, KeyType: key}, elems}
	}
	add := func(c *nftables.Chain, sets []anonSet, exprs ...[]expr.Any) {
		r.rules = append(r.rules, jobRule{chain: c, sets: sets, exprs: slices.Concat(exprs...)})
	}
	// denyRules drop what goes to an always-denied address, IPv4 and
	// IPv6 apart.
	denyRules := func(c *nftables.Chain) {
		for _, fam := range []addrFamily{ipv4, ipv6} {
			ps := fam.of(m.deny)
			if len(ps) == 0 {
				continue
			}
			s := newSet(fam.setType, true, intervalElems(ps))
			add(c, []anonSet{s}, fam.match(), loadAddr(fam.daddr, fam.size), lookup(s), verdict(expr.VerdictDrop))
		}
	}

	add(prerouting, nil, ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, n.veth), jump(fromJobPre))
	// The host end's addresses, where a proxied job's services listen.
	var hostEnd []netip.Addr
	for _, h := range []netip.Prefix{a.host4, a.host6} {
		if h.IsValid() {
			hostEnd = append(hostEnd, h.Addr())
		}
	}
	if p.Proxied {
		// The job's side of the services, before the drop of the host's
		// own addresses: the explicit proxy, and DNS (redirected below).
		for _, h := range hostEnd {
			fam := familyOf(h)
			add(fromJobPre, nil, fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h), l4Dport(unix.IPPROTO_TCP), portIs(ExplicitProxyPort), verdict(expr.VerdictAccept))
			for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				add(fromJobPre, nil, fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h), l4Dport(proto), portIs(53), verdict(expr.VerdictAccept))
			}
		}
		add(natPre, nil, ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, n.veth), jump(proxyTo))
		for _, h := range hostEnd {
			fam := familyOf(h)
			for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				add(proxyTo, nil, fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h), l4Dport(proto), portIs(53), dnatTo(fam, h, DNSPort))
			}
			web := newSet(nftables.TypeInetService, false, []nftables.SetElement{
				{Key: binaryutil.BigEndian.PutUint16(80)}, {Key: binaryutil.BigEndian.PutUint16(443)}})
			add(proxyTo, []anonSet{web}, fam.match(), l4Dport(unix.IPPROTO_TCP), lookup(web), dnatTo(fam, h, TransparentPort))
		}
	}
	fib := newSet(nftables.TypeFIBAddr, false, nativeElems(unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_MULTICAST, unix.RTN_ANYCAST))
	add(fromJobPre, []anonSet{fib}, []expr.Any{&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}}, lookup(fib), verdict(expr.VerdictDrop))
	denyRules(fromJobPre)

	if p.Proxied {
		// The job's services are the job's alone: nothing that does not
		// come in by its veth (a host process, another interface's
		// neighbour routing to the pool) reaches them.
		for _, h := range hostEnd {
			fam := familyOf(h)
			for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				ports := newSet(nftables.TypeInetService, false, []nftables.SetElement{{Key: binaryutil.BigEndian.PutUint16(ExplicitProxyPort)},
					{Key: binaryutil.BigEndian.PutUint16(TransparentPort)}, {Key: binaryutil.BigEndian.PutUint16(DNSPort)}})
				add(input, []anonSet{ports}, ifname(expr.MetaKeyIIFNAME, expr.CmpOpNeq, n.veth), fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h),
					l4Dport(proto), lookup(ports), verdict(expr.VerdictDrop))
			}
		}
	}
	add(input, nil, ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, n.veth), jump(fromJobIn))
	if p.Proxied {
		// As many TCP connections at once as through the forward chain:
		// the proxied ones end here, after the redirect. (DNS has the
		// server's own rate limit.)
		add(fromJobIn, nil, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		}, ctState(expr.CtStateBitNEW), []expr.Any{
			&expr.Connlimit{Count: uint32(m.cfg.MaxConnections), Flags: expr.NFT_CONNLIMIT_F_INV},
			&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
		})
		for _, h := range hostEnd {
			fam := familyOf(h)
			for _, port := range []uint16{ExplicitProxyPort, TransparentPort, DNSPort} {
				add(fromJobIn, nil, fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h), l4Dport(unix.IPPROTO_TCP), portIs(port), verdict(expr.VerdictAccept))
			}
			add(fromJobIn, nil, fam.match(), addrIs(fam.daddr, expr.CmpOpEq, h), l4Dport(unix.IPPROTO_UDP), portIs(DNSPort), verdict(expr.VerdictAccept))
		}
	}
	add(fromJobIn, nil, verdict(expr.VerdictDrop))

	add(forward, nil, ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, n.veth), jump(fromJob))
	add(forward, nil, ifname(expr.MetaKeyOIFNAME, expr.CmpOpEq, n.veth), jump(toJob))
	add(fromJob, nil, ipv4.match(), addrIs(ipv4.saddr, expr.CmpOpNeq, a.job4.Addr()), verdict(expr.VerdictDrop))
	if a.job6.IsValid() {
		add(fromJob, nil, ipv6.match(), addrIs(ipv6.saddr, expr.CmpOpNeq, a.job6.Addr()), verdict(expr.VerdictDrop))
	} else {
		add(fromJob, nil, ipv6.match(), verdict(expr.VerdictDrop))
	}
	denyRules(fromJob)
	// One rule, so one count: every rule with a connection limit keeps
	// its own.
	add(fromJob, nil, ctState(expr.CtStateBitNEW), []expr.Any{
		&expr.Connlimit{Count: uint32(m.cfg.MaxConnections), Flags: expr.NFT_CONNLIMIT_F_INV},
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
	})
	for _, rl := range p.Allow {
		fam := familyOf(rl.Prefix.Addr())
		match := slices.Concat(fam.match(), prefixMatch(fam.daddr, rl.Prefix))
		var sets []anonSet
		switch len(rl.Ports) {
		case 0:
		case 1:
			match = slices.Concat(match, tcpDport(), []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(rl.Ports[0])}})
		default:
			elems := make([]nftables.SetElement, len(rl.Ports))
			for i, port := range rl.Ports {
				elems[i] = nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(port)}
			}
			s := newSet(nftables.TypeInetService, false, elems)
			sets = append(sets, s)
			match = slices.Concat(match, tcpDport(), lookup(s))
		}
		add(fromJob, sets, match, verdict(expr.VerdictAccept))
	}
	add(fromJob, nil, verdict(expr.VerdictDrop))
	add(toJob, nil, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))
	add(toJob, nil, verdict(expr.VerdictDrop))

	// Postrouting has no input interface; the source address is the
	// job's, which the forward chain made sure of.
	for _, job := range []netip.Prefix{a.job4, a.job6} {
		if !job.IsValid() {
			continue
		}
		fam := familyOf(job.Addr())
		add(postrouting, nil, fam.match(), addrIs(fam.saddr, expr.CmpOpEq, job.Addr()),
			ifname(expr.MetaKeyOIFNAME, expr.CmpOpNeq, n.veth), []expr.Any{&expr.Masq{}})
	}
	return r
}

// queue adds to c what replaces the job's table with r: "add" makes sure
// there is a table to delete, so the transaction works whether or not the
// job had rules before. The chains come first, so that jumps find them.
func (r *jobRules) queue(c *nftables.Conn) error {
	c.AddTable(r.table)
	c.DelTable(r.table)
	c.AddTable(r.table)
	for _, ch := range r.chains {
		c.AddChain(ch)
	}
	for _, rl := range r.rules {
		for _, s := range rl.sets {
			if err := c.AddSet(s.set, s.elems); err != nil {
				return fmt.Errorf("set of chain %s: %w", rl.chain.Name, err)
			}
		}
		c.AddRule(&nftables.Rule{Table: r.table, Chain: rl.chain, Exprs: rl.exprs})
	}
	return nil
}

// queueDeleteTable adds to c the deletion of table, which need not exist.
func queueDeleteTable(c *nftables.Conn, table string) {
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
}

// addrFamily is where an IP version keeps its addresses in the header.
type addrFamily struct {
	nfproto      byte
	saddr, daddr uint32 // offsets in the network header
	size         uint32
	setType      nftables.SetDatatype
}

var (
	ipv4 = addrFamily{unix.NFPROTO_IPV4, 12, 16, 4, nftables.TypeIPAddr}
	ipv6 = addrFamily{unix.NFPROTO_IPV6, 8, 24, 16, nftables.TypeIP6Addr}
)

func familyOf(a netip.Addr) addrFamily {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// of returns the prefixes of ps of this family.
func (f addrFamily) of(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if familyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// match matches packets of this family (the table is inet: both).
func (f addrFamily) match() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
	}
}

func loadAddr(offset, size uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size}}
}

func addrIs(offset uint32, op expr.CmpOp, a netip.Addr) []expr.Any {
	b := a.AsSlice()
	return append(loadAddr(offset, uint32(len(b))), &expr.Cmp{Op: op, Register: 1, Data: b})
}

// prefixMatch matches an address in p at offset: only the bytes the
// prefix covers are loaded, and a partial last byte is masked.
func prefixMatch(offset uint32, p netip.Prefix) []expr.Any {
	if p.Bits() == 0 {
		return nil
	}
	n := uint32(p.Bits()+7) / 8
	want := p.Masked().Addr().AsSlice()[:n]
	out := loadAddr(offset, n)
	if p.Bits()%8 != 0 {
		mask := make([]byte, n)
		for i := range mask {
			bits := min(8, p.Bits()-8*i)
			mask[i] = byte(0xff << (8 - bits))
		}
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want})
}

// tcpDport loads the TCP destination port of a TCP packet.
func tcpDport() []expr.Any { return l4Dport(unix.IPPROTO_TCP) }

// l4Dport loads the destination port of a packet of protocol proto (TCP
// and UDP keep it at the same offset).
func l4Dport(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// portIs compares the port l4Dport loaded with port.
func portIs(port uint16) []expr.Any {
	return []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)}}
}

// dnatTo rewrites the destination to addr:port.
func dnatTo(fam addrFamily, addr netip.Addr, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: addr.AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam.nfproto), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// ifname compares the input or output interface's name with name.
func ifname(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: b}}
}

// ctState matches a connection in any of the states (expr.CtStateBit*).
func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func lookup(s anonSet) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: s.set.Name, SetID: s.set.ID}}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(c *nftables.Chain) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: c.Name}}
}

// nativeElems are set elements of 32-bit values in host byte order, as
// the kernel's fib address types are.
func nativeElems(vs ...uint32) []nftables.SetElement {
	out := make([]nftables.SetElement, len(vs))
	for i, v := range vs {
		out[i] = nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(v)}
	}
	return out
}

// addrRange is [start, end); end is invalid when the range runs to the
// last address.
type addrRange struct{ start, end netip.Addr }

// intervals are ps (of one family) as sorted ranges, overlapping and
// adjacent ones merged: an interval set refuses overlapping elements.
func intervals(ps []netip.Prefix) []addrRange {
	rs := make([]addrRange, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, addrRange{p.Addr(), lastAddr(p).Next()})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.start.Compare(b.start) })
	var out []addrRange
	for _, r := range rs {
		if len(out) > 0 {
			last := &out[len(out)-1]
			if !last.end.IsValid() {
				break // the last range runs to the end: it holds the rest
			}
			if r.start.Compare(last.end) <= 0 {
				if !r.end.IsValid() || r.end.Compare(last.end) > 0 {
					last.end = r.end
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// intervalElems are an interval set's elements for ps: each range's
// start, and its end (the address after it) flagged as one, unless it
// runs to the last address. As nft does, a set whose first range starts
// above the lowest address begins with an end at the lowest address.
func intervalElems(ps []netip.Prefix) []nftables.SetElement {
	var out []nftables.SetElement
	rs := intervals(ps)
	if len(rs) > 0 && !rs[0].start.IsUnspecified() {
		out = append(out, nftables.SetElement{Key: make([]byte, rs[0].start.BitLen()/8), IntervalEnd: true})
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.start.AsSlice()})
		if r.end.IsValid() {
			out = append(out, nftables.SetElement{Key: r.end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// lastAddr is the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := range b {
		host := max(0, min(8, 8*(i+1)-p.Bits()))
		b[i] |= byte(1<<host - 1)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// nftConn is a connection for one transaction or listing, in the
// executor's own network namespace (the host's, where the nft command ran
// too) or, with netns > 0, in the namespace that file descriptor refers
// to. Its socket gives up at ctx's deadline or after txTimeout, whichever
// is first.
func (m *Manager) nftConn(ctx context.Context, netns int) (*nftables.Conn, error) {
	deadline := time.Now().Add(txTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetDeadline(deadline) })}
	if netns > 0 {
		opts = append(opts, nftables.WithNetNSFd(netns))
	}
	return nftables.New(append(opts, m.nftOpts...)...)
}

// commit sends what queue adds as one transaction, and returns once the
// kernel has committed all of it or refused all of it. A cancelled ctx
// does not stop it: once sent, the kernel decides.
func (m *Manager) commit(ctx context.Context, queue func(c *nftables.Conn) error) error {
	return m.commitIn(context.WithoutCancel(ctx), 0, queue)
}

func (m *Manager) commitIn(ctx context.Context, netns int, queue func(c *nftables.Conn) error) error {
	c, err := m.nftConn(ctx, netns)
	if err == nil {
		err = queue(c)
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		return fmt.Errorf("nftables transaction: %w", err)
	}
	return nil
}

// installRules replaces n's table with p's rules in one transaction.
func (m *Manager) installRules(ctx context.Context, n *Net, p Policy) error {
	return m.commit(ctx, m.jobRules(n, p).queue)
}

// deleteTables deletes the tables (which need not exist) in one
// transaction.
func (m *Manager) deleteTables(ctx context.Context, tables ...string) error {
	return m.commit(ctx, func(c *nftables.Conn) error {
		for _, t := range tables {
			queueDeleteTable(c, t)
		}
		return nil
	})
}

// probeKernel commits a whole job's rules in a network namespace made for
// it, which goes with them: the kernel then has the modules they need
// loaded, and the host's rules are untouched.
func (m *Manager) probeKernel(p Policy) error {
	fd, err := scratchNetns()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	probe := m.newNet("probe")
	probe.addr = m.addrs(0)
	return m.commitIn(context.Background(), fd, m.jobRules(probe, p).queue)
}

// scratchNetns makes a network namespace and returns a file descriptor
// for it, its only reference: closing it removes the namespace.
func scratchNetns() (int, error) {
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread switches namespace and is never unlocked: when this
		// goroutine ends the runtime ends the thread too.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{-1, fmt.Errorf("unshare a network namespace: %w", err)}
			return
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			err = fmt.Errorf("open the new network namespace: %w", err)
		}
		ch <- res{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

// ourTables lists this manager's tables: "inet <Name>_<12 hex digits>".
func (m *Manager) ourTables(ctx context.Context) ([]string, error) {
	c, err := m.nftConn(ctx, 0)
	var ts []*nftables.Table
	if err == nil {
		ts, err = c.ListTablesOfFamily(nftables.TableFamilyINet)
	}
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var tables []string
	for _, t := range ts {
		if isOurTable(m.cfg.Name, t.Name) {
			tables = append(tables, t.Name)
		}
	}
	slices.Sort(tables)
	return tables, nil
}

func isOurTable(name, table string) bool {
	h, ok := strings.CutPrefix(table, name+"_")
	if !ok || len(h) != 12 {
		return false
	}
	for _, c := range h {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
