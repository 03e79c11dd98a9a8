package egress

import (
	"net/netip"
	"strings"
	"testing"
)

// Every form of an internal address a hostile resolver could answer with
// is refused; the documentation ranges tests use for public hosts are not.
func TestInternal(t *testing.T) {
	host := []netip.Prefix{netip.MustParsePrefix("203.0.113.77/32"), netip.MustParsePrefix("10.213.0.0/16")}
	for _, tc := range []struct {
		addr, want string
	}{
		{"127.0.0.1", "loopback"},
		{"127.1.2.3", "loopback"},
		{"169.254.169.254", "link-local"},
		{"10.1.2.3", "private"},
		{"172.31.0.1", "private"},
		{"192.168.1.1", "private"},
		{"100.64.0.1", "CGNAT"},
		{"0.0.0.0", "this network"},
		{"224.0.0.1", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"192.0.0.192", "Oracle"},
		{"168.63.129.16", "Azure"},
		{"100.100.100.200", "Alibaba"},
		{"::1", "loopback"},
		{"::", "unspecified"},
		{"fe80::1%eth0", "link-local"},
		{"fd00:ec2::254", "AWS metadata"},
		{"fc00::1", "unique local"},
		{"ff02::1", "multicast"},
		{"::ffff:127.0.0.1", "embeds 127.0.0.1"},
		{"::ffff:169.254.169.254", "embeds 169.254.169.254"},
		{"::127.0.0.1", "embeds 127.0.0.1"},
		{"64:ff9b::a9fe:a9fe", "embeds 169.254.169.254"},
		{"64:ff9b:1:a9fe:00a9:fe00::", "embeds 169.254.169.254"},
		{"2002:7f00:1::", "embeds 127.0.0.1"},
		{"2002:a9fe:a9fe::1", "embeds 169.254.169.254"},
		{"2001:0:7f00:1::", "embeds 127.0.0.1"},             // Teredo server
		{"2001:0:cb00:7101::80ff:fefe", "embeds 127.0.1.1"}, // Teredo client, XOR-ed
		{"203.0.113.77", "refused by this executor"},        // the host's own
		{"::ffff:203.0.113.77", "refused by this executor"}, // and embedded
		{"10.213.4.5", "private"},                           // a job pool (private first)
	} {
		got := Internal(netip.MustParseAddr(tc.addr), host)
		if !strings.Contains(got, tc.want) {
			t.Errorf("Internal(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
	for _, public := range []string{"203.0.113.10", "198.51.100.1", "192.0.2.1", "2001:db8::1", "8.8.8.8", "2606:4700::1111",
		"2002:0808:0808::1", "64:ff9b::808:808"} {
		if got := Internal(netip.MustParseAddr(public), host); got != "" {
			t.Errorf("Internal(%s) = %q, want public", public, got)
		}
	}
	if Internal(netip.Addr{}, nil) == "" {
		t.Error("the zero address passes")
	}
}
