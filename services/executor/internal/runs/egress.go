package runs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
	"github.com/airlockhq/airlock/services/executor/internal/jobdns"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
)

// Resolver resolves names for the egress proxy and DNS server of jobs
// with a domains policy: the executor's upstream resolvers
// (network.resolvers), or the host's.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// refusedCache is netpolicy's list of what no job may reach (the host's
// addresses among it), listed again at most every refusedEvery.
type refusedCache struct {
	mu    sync.Mutex
	tried bool
	at    time.Time // of the last listing, whether or not it worked
	list  []netip.Prefix
	err   error
}

const refusedEvery = time.Second

// get is the list, listed again when the last listing is older than
// refusedEvery; while listing fails, the last good list (nil if none) and
// the error.
func (c *refusedCache) get(nm *netpolicy.Manager, log *slog.Logger) ([]netip.Prefix, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tried && time.Since(c.at) < refusedEvery {
		return c.list, c.err
	}
	list, err := nm.Refused()
	c.tried, c.at, c.err = true, time.Now(), err
	if err == nil {
		c.list = list
	} else {
		log.Warn("egress: the host's addresses could not be listed; the last list stands", "error", err)
	}
	return c.list, err
}

// UpstreamResolver asks the DNS servers at addrs, and no other, in order:
// the next when one fails to answer within upstreamTimeout, none after one
// that says the name does not exist. Names are looked up as given, never
// with the host's search domains (nor its /etc/hosts).
func UpstreamResolver(addrs []netip.AddrPort) Resolver {
	u := upstream{timeout: upstreamTimeout}
	for _, a := range addrs {
		u.servers = append(u.servers, &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, a.String())
		}})
	}
	return u
}

// HostResolver is the host's resolver (its /etc/resolv.conf), looking names
// up as given, never with its search domains.
func HostResolver() Resolver {
	return upstream{servers: []*net.Resolver{net.DefaultResolver}, timeout: 0}
}

// upstreamTimeout is how long one upstream server has to answer.
const upstreamTimeout = 2 * time.Second

type upstream struct {
	servers []*net.Resolver
	// timeout bounds each server's answer; zero leaves it to the resolver
	// (the host's, which fails over by its resolv.conf).
	timeout time.Duration
}

func (u upstream) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if !strings.HasSuffix(host, ".") {
		host += "." // absolute: no search domain is tried
	}
	var errs []error
	for _, r := range u.servers {
		c, cancel := ctx, context.CancelFunc(func() {})
		if u.timeout > 0 {
			c, cancel = context.WithTimeout(ctx, u.timeout)
		}
		addrs, err := r.LookupNetIP(c, network, host)
		cancel()
		if err == nil {
			return addrs, nil
		}
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, err
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// maxEgressRecords is how many allowed decisions a run's egress.jsonl keeps
// one by one (refusals: as many again); the rest are counted by name.
const maxEgressRecords = 20000

// jobEgress is a domains job's egress services on the host end of its
// veth: the proxy (explicit and transparent listeners) and the DNS server,
// which decide on names, and the record of what they decided. The kernel's
// rules (netpolicy.Policy.Proxied) carry the job's traffic to them and
// nowhere else, so a listener that is gone leaves the job with no network,
// never an open one.
type jobEgress struct {
	proxy *egressproxy.Proxy
	dns   *jobdns.Server
	rec   *egressLog
	addrs []netip.Addr // where the job finds them, IPv4 first
	log   *slog.Logger
	wg    sync.WaitGroup
	once  sync.Once

	// The job's brokered credentials (credentials.go), in memory only:
	// those in the proxy, the leases to end, and who ends them.
	creds  []egressproxy.Credential
	leases []leasedCredential
	leaser CredentialLeaser
}

// startEgress starts job n's egress services for pol on n's host end. It
// fails, and leaves nothing running, when any listener cannot be bound.
// notify, if set, is called after each decision is written (a watch of
// the run wakes on it).
//
// b, when set, is the job's leased brokered credentials: the proxy is made
// with them, and the egress services end their leases when they close.
func (m *Manager) startEgress(jobID string, n *netpolicy.Net, pol egress.Policy, b *brokered, kept bool, notify func()) (_ *jobEgress, err error) {
	addrs := n.ProxyAddrs()
	if len(addrs) == 0 {
		return nil, fmt.Errorf("job %s: the network namespace has no interface for the egress proxy", jobID)
	}
	extra, err := m.refused.get(m.cfg.Network, m.cfg.Logger)
	if err != nil {
		return nil, err
	}
	// And at every decision, the host's addresses as they are then.
	now := func() []netip.Prefix {
		p, _ := m.refused.get(m.cfg.Network, m.cfg.Logger) // a failed listing is logged where it happens, once a period
		return p
	}
	resolver := m.cfg.Resolver
	if resolver == nil {
		resolver = HostResolver()
	}
	log := m.cfg.Logger.With("job_id", jobID)
	rec, err := openEgressLog(m.runDir(jobID), kept, log, notify)
	if err != nil {
		return nil, err
	}
	e := &jobEgress{rec: rec, addrs: addrs, log: log}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	pc := egressproxy.Config{Policy: pol, Resolver: resolver, Extra: extra, Refused: now, Record: rec.connection, Roots: m.roots}
	if b != nil {
		pc.Credentials = b.creds
	}
	e.proxy, err = egressproxy.New(pc)
	if err != nil {
		return nil, err
	}
	if b != nil {
		e.creds, e.leases, e.leaser = b.creds, b.leases, m.cfg.Credentials
	}
	e.dns, err = jobdns.New(jobdns.Config{Policy: pol, Resolver: resolver, Extra: extra, Refused: now, Record: rec.query})
	if err != nil {
		return nil, err
	}
	// Bound to the veth's host end too: only what comes in by it reaches
	// them (the rules drop the rest before that).
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), n.HostLink()) }); err != nil {
			return err
		}
		return serr
	}}
	ctx := context.Background()
	for _, a := range addrs {
		at := func(port int) string { return net.JoinHostPort(a.String(), strconv.Itoa(port)) }
		for _, s := range []struct {
			what  string
			port  int
			serve func(net.Listener) error
		}{
			{"egress proxy", netpolicy.ExplicitProxyPort, e.proxy.Serve},
			{"transparent egress proxy", netpolicy.TransparentPort, e.proxy.ServeTransparent},
			{"DNS server (TCP)", netpolicy.DNSPort, e.dns.ServeTCP},
		} {
			l, err := lc.Listen(ctx, "tcp", at(s.port))
			if err != nil {
				return nil, fmt.Errorf("job %s: %s: %w", jobID, s.what, err)
			}
			e.run(log, s.what, func() error { return s.serve(l) })
		}
		pc, err := lc.ListenPacket(ctx, "udp", at(netpolicy.DNSPort))
		if err != nil {
			return nil, fmt.Errorf("job %s: DNS server (UDP): %w", jobID, err)
		}
		e.run(log, "DNS server (UDP)", func() error { return e.dns.Serve(pc) })
	}
	log.Info("egress proxy and DNS server started", "at", addrs, "names", len(pol.Names))
	return e, nil
}

// run serves in the background until close; a listener that fails before
// that is logged (the job then has no way out through it).
func (e *jobEgress) run(log *slog.Logger, what string, serve func() error) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		err := serve()
		if err != nil && !errors.Is(err, egressproxy.ErrClosed) && !errors.Is(err, jobdns.ErrClosed) {
			log.Error("egress service stopped; the job has no way out through it", "service", what, "error", err)
		}
	}()
}

// setPolicy puts pol's names in force in the proxy and the DNS server at
// once; the proxy cuts what pol no longer allows, and loses the brokered
// credentials of hosts it no longer allows.
func (e *jobEgress) setPolicy(pol egress.Policy) error {
	if err := e.proxy.SetPolicy(pol); err != nil {
		return err
	}
	if err := e.dropCredentials(pol); err != nil {
		return err
	}
	return e.dns.SetPolicy(pol)
}

// env is what points the job's tools at the explicit proxy.
func (e *jobEgress) env() map[string]string {
	url := "http://" + net.JoinHostPort(e.addrs[0].String(), strconv.Itoa(netpolicy.ExplicitProxyPort))
	env := map[string]string{}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		env[k] = url
	}
	env["NO_PROXY"], env["no_proxy"] = "localhost,127.0.0.1", "localhost,127.0.0.1"
	return env
}

// close takes the brokered credentials out of the proxy and revokes their
// leases, stops everything and closes the record, once every decision is
// in it. It may be called again.
func (e *jobEgress) close() {
	e.once.Do(func() {
		e.revoke("the job ended")
		if e.proxy != nil {
			e.proxy.Close()
		}
		if e.dns != nil {
			e.dns.Close()
		}
		e.wg.Wait()
		e.rec.close()
	})
}

// reviewEgress is how many decisions a report carries, the first and the
// last half each: the authority's bound (the bundle has them all).
const reviewEgress = 1000 // egresspb.MaxRecords

// egressOf reads a run's egress.jsonl for its report: its first and last
// decisions, how many it holds, its summaries by name and by brokered
// credential, and whether there is one.
func egressOf(path string, log *slog.Logger) (first, last []egress.Record, total int, names []egress.NameSummary, creds []egress.CredentialSummary, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("egress record unreadable; reported without it", "error", err)
		}
		return nil, nil, 0, nil, nil, !errors.Is(err, os.ErrNotExist)
	}
	defer f.Close()
	var sum egress.Summary
	ring := make([]egress.Record, 0, reviewEgress/2)
	seen := 0
	total, err = egress.ScanRecords(f, func(r egress.Record) {
		sum.Add(r)
		seen++
		if len(first) < reviewEgress/2 {
			first = append(first, r)
			return
		}
		if len(ring) < cap(ring) {
			ring = append(ring, r)
		} else {
			ring[(seen-len(first)-1)%cap(ring)] = r
		}
	})
	if err != nil {
		log.Warn("egress record: lines skipped", "error", err)
	}
	// The ring in order: its oldest entry is where the next would go.
	if n := seen - len(first); n > cap(ring) {
		at := n % cap(ring)
		last = append(slices.Clone(ring[at:]), ring[:at]...)
	} else {
		last = ring
	}
	return first, last, total, sum.Names(), sum.Credentials(), true
}

// egressLog writes a run's decisions to egress.jsonl, each as it comes
// (a crash loses none written), and to the executor's log. It keeps
// maxEgressRecords allowed decisions one by one and twice as many lines in
// all for refusals (which the proxy and DNS server already cap per name per
// minute); past that it counts them by name, with their bytes, and writes
// those counts as summary lines when it closes, so the record's totals by
// name stay whole.
type egressLog struct {
	log    *slog.Logger
	notify func() // after each line written; nil: none

	mu      sync.Mutex
	f       *os.File
	n       int // lines written
	allowed int // of them, allowed decisions
	dropped map[dropKey]*egress.Record
	err     error
}

type dropKey struct {
	name    string
	allowed bool
	// credential is a request line's ("" for the rest): its summary
	// counts for the credential, never for the name (egress.Summary).
	credential string
}

// openEgressLog opens dir's egress record, empty, or for a session kept
// across an executor restart (kept) as the previous process left it, to
// go on: its record and bytes so far stay.
func openEgressLog(dir string, kept bool, log *slog.Logger, notify func()) (*egressLog, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if kept {
		flags = os.O_CREATE | os.O_RDWR | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(dir, bundle.EgressFile), flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("egress record: %w", err)
	}
	if kept {
		if err := endLine(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("egress record: %w", err)
		}
	}
	if notify == nil {
		notify = func() {}
	}
	return &egressLog{log: log, notify: notify, f: f, dropped: map[dropKey]*egress.Record{}}, nil
}

func (l *egressLog) connection(d egressproxy.Decision) {
	if d.Mode == egressproxy.ModeRequest {
		if req := requestOf(d); req != nil {
			l.write(requestRecord(d, req))
		}
		return
	}
	r := egress.Record{
		Time: d.Time.UTC(), Via: string(d.Mode), Name: d.Name, Port: d.Port, Allowed: d.Allowed, Reason: d.Reason,
		BytesIn: d.BytesIn, BytesOut: d.BytesOut, DurationMS: d.Duration.Milliseconds(), End: d.End, Suppressed: d.Suppressed,
		ClosedFirst: d.ClosedFirst, TLS: d.TLS,
	}
	if d.Addr.IsValid() {
		r.Addr = d.Addr.String()
	}
	l.write(r)
}

// requestRecord is request line d, whose request is req: what went over
// an intercepted connection to a brokered credential's host (never the
// credential's value, nor the request's query or headers).
func requestRecord(d egressproxy.Decision, req *egressproxy.Request) egress.Record {
	return egress.Record{
		Time: d.Time.UTC(), Via: egress.ViaRequest, Name: d.Name, Port: d.Port, Allowed: req.Allowed, Reason: d.Reason,
		Method: req.Method, Path: req.Path, Status: req.Status, Credential: req.Credential,
		BytesIn: d.BytesIn, BytesOut: d.BytesOut, DurationMS: d.Duration.Milliseconds(),
	}
}

func (l *egressLog) query(d jobdns.QueryDecision) {
	r := egress.Record{Time: d.Time.UTC(), Via: egress.ViaDNS, Name: d.Name, QType: d.TypeName(), Allowed: d.Allowed, Reason: d.Reason, Suppressed: d.Suppressed}
	for _, a := range d.Answers {
		r.Answers = append(r.Answers, a.String())
	}
	l.write(r)
}

func (l *egressLog) write(r egress.Record) {
	r = r.Bounded()
	l.log.Info("egress", "via", r.Via, "name", r.Name, "port", r.Port, "qtype", r.QType, "allowed", r.Allowed, "reason", r.Reason,
		"addr", r.Addr, "answers", r.Answers, "bytes_in", r.BytesIn, "bytes_out", r.BytesOut, "duration_ms", r.DurationMS, "end", r.End, "closed_first", r.ClosedFirst, "tls", r.TLS, "suppressed", r.Suppressed,
		"method", r.Method, "path", r.Path, "status", r.Status, "credential", r.Credential)
	if l.append(r) {
		l.notify()
	}
}

// append writes r, or counts it when past the caps, and reports whether a
// line was written.
func (l *egressLog) append(r egress.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil || l.err != nil {
		return false
	}
	if l.n >= 2*maxEgressRecords || r.Allowed && l.allowed >= maxEgressRecords {
		l.drop(r)
		return false
	}
	b, err := json.Marshal(r)
	if err == nil {
		_, err = l.f.Write(append(b, '\n'))
	}
	if err != nil {
		l.err = err
		l.log.Error("egress record: write; the rest is in the executor's log only", "error", err)
		return false
	}
	l.n++
	if r.Allowed {
		l.allowed++
	}
	return true
}

// drop counts r into its name's summary; past egress.MaxNames names, into
// egress.OtherNames's.
func (l *egressLog) drop(r egress.Record) {
	k := dropKey{name: r.Name, allowed: r.Allowed}
	if r.Via == egress.ViaRequest {
		k.credential = r.Credential
	}
	if _, ok := l.dropped[k]; !ok && len(l.dropped) >= 2*egress.MaxNames {
		k.name = egress.OtherNames
	}
	d := l.dropped[k]
	if d == nil {
		d = &egress.Record{Time: r.Time, Name: k.name, Allowed: r.Allowed}
		if r.Via == egress.ViaRequest {
			d.Via, d.Credential = egress.ViaRequest, r.Credential
		}
		l.dropped[k] = d
	}
	d.Suppressed += r.Count()
	d.BytesIn += r.BytesIn
	d.BytesOut += r.BytesOut
}

// close writes the counts of what was not written one by one, and syncs
// the file.
func (l *egressLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	keys := slices.SortedFunc(maps.Keys(l.dropped), func(a, b dropKey) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(fmt.Sprint(a.allowed), fmt.Sprint(b.allowed)), cmp.Compare(a.credential, b.credential))
	})
	for _, k := range keys {
		if l.err != nil {
			break
		}
		d := l.dropped[k]
		what, kept := "refusals", 2*maxEgressRecords
		if d.Allowed {
			what, kept = "allowed decisions", maxEgressRecords
		}
		if d.Via == egress.ViaRequest {
			what = "requests with credential " + cmp.Or(d.Credential, "none")
			if !d.Allowed {
				what = "refused requests with credential " + cmp.Or(d.Credential, "none")
			}
		}
		d.Reason = fmt.Sprintf("%d more %s of %s past the %d this record keeps one by one (the executor's log has each)", d.Suppressed, what, cmp.Or(d.Name, "no name"), kept)
		b, _ := json.Marshal(d)
		_, l.err = l.f.Write(append(b, '\n'))
	}
	err := l.err
	if err == nil {
		err = l.f.Sync()
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		l.log.Error("egress record: close", "error", err)
	}
	l.f = nil
}

// endLine ends f's last line, one a killed process left half written, so
// what is appended is a line of its own.
func endLine(f *os.File) error {
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, fi.Size()-1); err != nil {
		return err
	}
	if last[0] == '\n' {
		return nil
	}
	_, err = f.Write([]byte{'\n'})
	return err
}
