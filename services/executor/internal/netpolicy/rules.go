package netpolicy

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// nftTimeout bounds one nft command; a transaction takes milliseconds.
const nftTimeout = 30 * time.Second

// replaceScript is one nft transaction that replaces the job's table with
// one holding p's rules: "add" makes sure there is a table to delete, so
// the script works whether or not the job had rules before.
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
func (m *Manager) replaceScript(n *Net, p Policy) string {
	var b strings.Builder
	a := n.addr
	v6 := a.job6.IsValid()
	fmt.Fprintf(&b, "add table inet %s\ndelete table inet %s\n", n.table, n.table)
	fmt.Fprintf(&b, "table inet %s {\n", n.table)
	deny4, deny6 := splitFamilies(m.deny)

	fmt.Fprintf(&b, "\tchain prerouting {\n\t\ttype filter hook prerouting priority raw; policy accept;\n\t\tiifname %q jump from_job_pre\n\t}\n", n.veth)
	b.WriteString("\tchain from_job_pre {\n")
	b.WriteString("\t\tfib daddr type { local, broadcast, multicast, anycast } drop\n")
	fmt.Fprintf(&b, "\t\tip daddr %s drop\n\t\tip6 daddr %s drop\n\t}\n", set(deny4), set(deny6))

	fmt.Fprintf(&b, "\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tiifname %q jump from_job_input\n\t}\n", n.veth)
	b.WriteString("\tchain from_job_input {\n\t\tdrop\n\t}\n")

	fmt.Fprintf(&b, "\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tiifname %q jump from_job\n\t\toifname %q jump to_job\n\t}\n", n.veth, n.veth)
	b.WriteString("\tchain from_job {\n")
	fmt.Fprintf(&b, "\t\tmeta nfproto ipv4 ip saddr != %s drop\n", a.job4.Addr())
	if v6 {
		fmt.Fprintf(&b, "\t\tmeta nfproto ipv6 ip6 saddr != %s drop\n", a.job6.Addr())
	} else {
		b.WriteString("\t\tmeta nfproto ipv6 drop\n")
	}
	fmt.Fprintf(&b, "\t\tip daddr %s drop\n\t\tip6 daddr %s drop\n", set(deny4), set(deny6))
	// One rule, so one count: every rule with a ct count keeps its own.
	fmt.Fprintf(&b, "\t\tct state new ct count over %d reject with icmpx admin-prohibited\n", m.cfg.MaxConnections)
	for _, r := range p.Allow {
		fam := "ip"
		if r.Prefix.Addr().Is6() {
			fam = "ip6"
		}
		if len(r.Ports) == 0 {
			fmt.Fprintf(&b, "\t\t%s daddr %s accept\n", fam, r.Prefix)
			continue
		}
		ports := make([]string, len(r.Ports))
		for i, port := range r.Ports {
			ports[i] = fmt.Sprint(port)
		}
		fmt.Fprintf(&b, "\t\t%s daddr %s tcp dport { %s } accept\n", fam, r.Prefix, strings.Join(ports, ", "))
	}
	b.WriteString("\t\tdrop\n\t}\n")
	b.WriteString("\tchain to_job {\n\t\tct state established,related accept\n\t\tdrop\n\t}\n")

	// Postrouting has no input interface; the source address is the
	// job's, which the forward chain made sure of.
	fmt.Fprintf(&b, "\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr %s oifname != %q masquerade\n", a.job4.Addr(), n.veth)
	if v6 {
		fmt.Fprintf(&b, "\t\tip6 saddr %s oifname != %q masquerade\n", a.job6.Addr(), n.veth)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

func deleteTableScript(table string) string {
	return fmt.Sprintf("add table inet %s\ndelete table inet %s\n", table, table)
}

// splitFamilies returns the IPv4 and IPv6 prefixes of ps, each without
// those another one covers (nft refuses overlapping set elements).
func splitFamilies(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return minimal(v4), minimal(v6)
}

func minimal(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	var out []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Contains(p.Addr()) }) {
			out = append(out, p)
		}
	}
	return out
}

func set(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

// runNft runs script as one transaction (nft -f -); with check it only
// checks it (nft -c), in the kernel, and commits nothing. It returns once
// the kernel has committed the transaction or refused all of it.
func (m *Manager) runNft(ctx context.Context, check bool, script string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nftTimeout)
	defer cancel()
	args := []string{"-f", "-"}
	if check {
		args = append([]string{"-c"}, args...)
	}
	cmd := exec.CommandContext(ctx, m.nft, args...)
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// ourTables lists this manager's tables: "inet <Name>_<12 hex digits>".
func (m *Manager) ourTables(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.nft, "list", "tables", "inet")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft list tables inet: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var tables []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" || f[1] != "inet" {
			continue
		}
		if isOurTable(m.cfg.Name, f[2]) {
			tables = append(tables, f[2])
		}
	}
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
