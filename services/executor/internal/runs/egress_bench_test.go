package runs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// The egress proxy's price (issue 11): the same client, in a job's network
// namespace, fetches from a test host by an allow-CIDR policy (via=cidr,
// the kernel forwards) and by a domains policy, through the transparent
// listener (via=proxy: the job dials the host's address, the kernel
// redirects it) or the explicit proxy (via=explicit). The targets are at
// most 1.1× the time for the download and at most 2 ms more per
// connection; `benchstat -col /via` gives the ratios. No sandbox: what is
// measured is the path, and each job's namespace is made the way the run
// manager makes it (netpolicy), its proxy the way startEgress starts it.
// Everything the benchmarks need is required: none is skipped, in CI or
// not.

// benchName is the name the domains policy allows, resolved by the
// benchmark's upstream DNS server to the test host.
const benchName = "bench.test"

const downloadSize = 100 << 20

// cidrHostPort is where the allow-CIDR job reaches the test host's
// server, which listens on 80 too. Not 80: the job's connections are
// masqueraded behind the host's address, as the proxy's are made from it,
// so on one port the server's TIME_WAIT sockets of one way would clash
// with new connections of the other (whose sequence numbers and
// timestamps come from another namespace's addresses), and a SYN taken
// for an old segment waits a second for its retransmission.
const cidrHostPort = 8080

// BenchmarkEgressConnect is one connection per op: connect, a tiny GET,
// its reply, close.
func BenchmarkEgressConnect(b *testing.B) {
	for _, v := range startEgressBench(b) {
		b.Run("via="+v.name, func(b *testing.B) {
			v.get(b, "/", 3) // warm: neighbours resolved, code paths paged in
			n := 0
			for b.Loop() {
				v.get(b, "/", 3)
				n++
			}
			v.proxied(b, n+1)
		})
	}
}

// BenchmarkEgressDownload100MB is one 100 MB download per op.
func BenchmarkEgressDownload100MB(b *testing.B) {
	for _, v := range startEgressBench(b) {
		b.Run("via="+v.name, func(b *testing.B) {
			b.SetBytes(downloadSize)
			v.get(b, "/100mb", downloadSize)
			n := 0
			for b.Loop() {
				v.get(b, "/100mb", downloadSize)
				n++
			}
			v.proxied(b, n+1)
		})
	}
}

// via is one way from a job's namespace to the test host.
type via struct {
	name   string
	client *http.Client
	// mode is the proxy's mode for this way ("" for none), and allowed
	// counts the connections it let through in that mode.
	mode    egressproxy.Mode
	allowed *atomic.Int64
	base    int64
}

func (v *via) get(b *testing.B, path string, want int64) {
	resp, err := v.client.Get("http://" + benchName + path)
	if err != nil {
		b.Fatalf("via %s: %v", v.name, err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n != want {
		b.Fatalf("via %s: GET %s: %s, %d bytes, %v; want 200 and %d bytes", v.name, path, resp.Status, n, err, want)
	}
}

// proxied fails b unless the proxy let through the n connections made via
// v (a way that went around the proxy would measure nothing). Decisions
// are recorded as connections close, so it waits for them a little.
func (v *via) proxied(b *testing.B, n int) {
	if v.mode == "" {
		return
	}
	end := time.Now().Add(5 * time.Second)
	for v.allowed.Load()-v.base < int64(n) {
		if time.Now().After(end) {
			b.Fatalf("via %s: the proxy let %d connections through in mode %s; want the %d made", v.name, v.allowed.Load()-v.base, v.mode, n)
		}
		time.Sleep(time.Millisecond)
	}
	v.base = v.allowed.Load()
}

// startEgressBench makes the test host, a netpolicy manager with two jobs'
// namespaces (an allow-CIDR policy to the host's cidrHostPort, and a domains
// policy with its proxy on the host end of the veth), and a client in
// each: the ways to compare.
func startEgressBench(b *testing.B) []*via {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatalf("the egress benchmarks must run as root, not uid %d", os.Geteuid())
	}
	host := startBenchHost(b)
	hostPort, cidrPort := netip.AddrPortFrom(host, 80), netip.AddrPortFrom(host, cidrHostPort)
	u := nettest.StartDNS(b, map[string][]netip.Addr{benchName: {host}})

	n := int(testSeq.Add(1))
	logger := slog.New(slog.NewTextHandler(testWriter{b}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nm, err := netpolicy.New(netpolicy.Config{
		Dir:    filepath.Join(b.TempDir(), "net"),
		Name:   fmt.Sprintf("rbe%d_%d", os.Getpid(), n),
		Pool4:  netip.MustParsePrefix(fmt.Sprintf("10.218.%d.0/24", (os.Getpid()*7+n)%256)),
		Logger: logger,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := nm.Close(); err != nil {
			b.Errorf("netpolicy Close: %v", err)
		}
	})
	ctx := context.Background()
	create := func(id string, p netpolicy.Policy) *netpolicy.Net {
		jn, err := nm.Create(ctx, id, p)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := jn.Close(); err != nil {
				b.Errorf("close %s: %v", id, err)
			}
		})
		return jn
	}
	cidrNet := create("bench-cidr", netpolicy.Policy{Allow: []netpolicy.Rule{{Prefix: netip.PrefixFrom(host, 32), Ports: []uint16{cidrHostPort}}}})
	proxiedNet := create("bench-proxied", netpolicy.Policy{Proxied: true})

	// The proxy as startEgress starts it for a domains job: the upstream
	// resolver, the manager's refusals, a record written to egress.jsonl.
	extra, err := nm.Refused()
	if err != nil {
		b.Fatal(err)
	}
	rec, err := openEgressLog(b.TempDir(), false, logger, nil)
	if err != nil {
		b.Fatal(err)
	}
	allowed := map[egressproxy.Mode]*atomic.Int64{egressproxy.ModeTransparent: {}, egressproxy.ModeHTTP: {}}
	proxy, err := egressproxy.New(egressproxy.Config{
		Policy:   egress.Policy{Names: []egress.Name{{Name: benchName}}},
		Resolver: UpstreamResolver([]netip.AddrPort{u.Addr}),
		Extra:    extra,
		Record: func(d egressproxy.Decision) {
			if c := allowed[d.Mode]; c != nil && d.Allowed {
				c.Add(1)
			}
			rec.connection(d)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	proxyAt := proxiedNet.ProxyAddrs()[0]
	for _, s := range []struct {
		port  int
		serve func(net.Listener) error
	}{{netpolicy.ExplicitProxyPort, proxy.Serve}, {netpolicy.TransparentPort, proxy.ServeTransparent}} {
		l, err := net.Listen("tcp", net.JoinHostPort(proxyAt.String(), strconv.Itoa(s.port)))
		if err != nil {
			b.Fatal(err)
		}
		go s.serve(l)
	}
	b.Cleanup(func() {
		proxy.Close()
		rec.close()
	})

	cidrDial := startNSDialer(b, cidrNet.Path())
	proxiedDial := startNSDialer(b, proxiedNet.Path())
	explicit := &url.URL{Scheme: "http", Host: net.JoinHostPort(proxyAt.String(), strconv.Itoa(netpolicy.ExplicitProxyPort))}
	return []*via{
		{name: "cidr", client: benchClient(cidrDial, cidrPort, nil)},
		{name: "proxy", client: benchClient(proxiedDial, hostPort, nil), mode: egressproxy.ModeTransparent, allowed: allowed[egressproxy.ModeTransparent]},
		{name: "explicit", client: benchClient(proxiedDial, hostPort, explicit), mode: egressproxy.ModeHTTP, allowed: allowed[egressproxy.ModeHTTP]},
	}
}

// benchClient is a plain HTTP client that dials with d, taking benchName
// to the test host (as curl --resolve does), by proxy if set, and a new
// connection for every request.
func benchClient(d *nsDialer, host netip.AddrPort, proxy *url.URL) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			if addr == benchName+":80" {
				addr = host.String()
			}
			return d.dial(ctx, addr)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	if proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	return &http.Client{Transport: tr}
}

// nsDialer makes TCP connections from a network namespace: one goroutine,
// on a thread that stays in the namespace, dials for every caller (a
// socket belongs to the namespace it was made in, whichever thread uses
// it). Entering the namespace per dial would add a thread's start to
// every connection.
type nsDialer struct {
	reqs chan dialReq
}

type dialReq struct {
	ctx   context.Context
	addr  string
	reply chan<- dialResult
}

type dialResult struct {
	conn net.Conn
	err  error
}

func startNSDialer(tb testing.TB, path string) *nsDialer {
	tb.Helper()
	d := &nsDialer{reqs: make(chan dialReq)}
	ready, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		err := nettest.InPath(path, func() error {
			ready <- nil
			var nd net.Dialer
			for r := range d.reqs {
				c, err := nd.DialContext(r.ctx, "tcp", r.addr)
				r.reply <- dialResult{c, err}
			}
			return nil
		})
		if err != nil {
			ready <- err
		}
	}()
	if err := <-ready; err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		close(d.reqs)
		<-done
	})
	return d
}

func (d *nsDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	reply := make(chan dialResult, 1)
	d.reqs <- dialReq{ctx: ctx, addr: addr, reply: reply}
	r := <-reply
	return r.conn, r.err
}

// startBenchHost makes a test host (package nettest) whose HTTP server on
// ports 80 and cidrHostPort answers "ok" to any path but /100mb, which
// sends downloadSize bytes, and returns its address.
func startBenchHost(tb testing.TB) netip.Addr {
	tb.Helper()
	n := int(testSeq.Add(1))
	th := nettest.Start(tb, nettest.Config{
		Name:   fmt.Sprintf("rb%04x%02x", os.Getpid()&0xffff, n&0xff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, (os.Getpid()+n)%32),
	})
	chunk := make([]byte, 1<<20)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/100mb" {
			io.WriteString(w, "ok\n")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(downloadSize))
		for range downloadSize / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	tb.Cleanup(func() { srv.Close() })
	go srv.Serve(th.Listen(tb, "tcp4", ":80"))
	go srv.Serve(th.Listen(tb, "tcp4", ":"+strconv.Itoa(cidrHostPort)))
	return th.IP
}
