package runs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

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

// UpstreamResolver is a resolver that asks the DNS servers at addrs, in
// turn, and no other: the executor's network.resolvers.
func UpstreamResolver(addrs []netip.AddrPort) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		var errs []error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, network, a.String())
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}}
}

// egressFile is a run's record of its egress decisions, in the run's
// directory and in its bundle.
const egressFile = "egress.jsonl"

// maxEgressRecords is how many decisions a run's egress.jsonl keeps one by
// one; the rest are counted in one last line. Refusals are already capped
// per name per minute before they get here.
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
	wg    sync.WaitGroup
	once  sync.Once
}

// startEgress starts job n's egress services for pol on n's host end. It
// fails, and leaves nothing running, when any listener cannot be bound.
func (m *Manager) startEgress(jobID string, n *netpolicy.Net, pol egress.Policy) (_ *jobEgress, err error) {
	addrs := n.ProxyAddrs()
	if len(addrs) == 0 {
		return nil, fmt.Errorf("job %s: the network namespace has no interface for the egress proxy", jobID)
	}
	extra, err := m.cfg.Network.Refused()
	if err != nil {
		return nil, err
	}
	resolver := m.cfg.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	log := m.cfg.Logger.With("job_id", jobID)
	rec, err := openEgressLog(m.runDir(jobID), log)
	if err != nil {
		return nil, err
	}
	e := &jobEgress{rec: rec, addrs: addrs}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	e.proxy, err = egressproxy.New(egressproxy.Config{Policy: pol, Resolver: resolver, Extra: extra, Record: rec.connection})
	if err != nil {
		return nil, err
	}
	e.dns, err = jobdns.New(jobdns.Config{Policy: pol, Resolver: resolver, Extra: extra, Record: rec.query})
	if err != nil {
		return nil, err
	}
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
			l, err := net.Listen("tcp", at(s.port))
			if err != nil {
				return nil, fmt.Errorf("job %s: %s: %w", jobID, s.what, err)
			}
			e.run(log, s.what, func() error { return s.serve(l) })
		}
		pc, err := net.ListenPacket("udp", at(netpolicy.DNSPort))
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
// once; the proxy cuts what pol no longer allows.
func (e *jobEgress) setPolicy(pol egress.Policy) error {
	if err := e.proxy.SetPolicy(pol); err != nil {
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

// close stops everything and closes the record, once every decision is in
// it. It may be called again.
func (e *jobEgress) close() {
	e.once.Do(func() {
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

// reviewEgress is how many decisions a report carries: the authority's
// bound (the bundle has them all).
const reviewEgress = 1000

// egressOf reads a run's egress.jsonl for its report: the first
// reviewEgress records, how many it holds, and whether there is one.
func egressOf(path string, log *slog.Logger) ([]egress.Record, int, bool) {
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("egress record unreadable; reported without it", "error", err)
		}
		return nil, 0, !errors.Is(err, os.ErrNotExist)
	}
	defer f.Close()
	recs, more, err := egress.ReadRecords(f, reviewEgress)
	if err != nil {
		log.Warn("egress record: reported up to where it could be read", "error", err)
	}
	total := len(recs)
	if more {
		// Count the rest: the report says how many there are.
		if _, err := f.Seek(0, 0); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 0, 4096), egress.MaxRecordLine)
			for total = 0; sc.Scan(); total++ {
			}
		}
	}
	return recs, total, true
}

// egressLog writes a run's decisions to egress.jsonl and the executor's
// log as they come.
type egressLog struct {
	log *slog.Logger

	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	n       int
	dropped int
	err     error
}

func openEgressLog(dir string, log *slog.Logger) (*egressLog, error) {
	f, err := os.OpenFile(dir+"/"+egressFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("egress record: %w", err)
	}
	return &egressLog{log: log, f: f, w: bufio.NewWriter(f)}, nil
}

func (l *egressLog) connection(d egressproxy.Decision) {
	r := egress.Record{
		Time: d.Time.UTC(), Via: string(d.Mode), Name: d.Name, Port: d.Port, Allowed: d.Allowed, Reason: d.Reason,
		BytesIn: d.BytesIn, BytesOut: d.BytesOut, DurationMS: d.Duration.Milliseconds(), End: d.End, Suppressed: d.Suppressed,
	}
	if d.Addr.IsValid() {
		r.Addr = d.Addr.String()
	}
	l.write(r)
}

func (l *egressLog) query(d jobdns.QueryDecision) {
	r := egress.Record{Time: d.Time.UTC(), Via: egress.ViaDNS, Name: d.Name, Allowed: d.Allowed, Reason: d.Reason, Suppressed: d.Suppressed}
	if d.Type != 0 {
		r.QType = typeName(d.Type.String())
	}
	for _, a := range d.Answers {
		r.Answers = append(r.Answers, a.String())
	}
	l.write(r)
}

// typeName is "A" for dnsmessage's "TypeA".
func typeName(s string) string {
	if len(s) > 4 && s[:4] == "Type" {
		return s[4:]
	}
	return s
}

func (l *egressLog) write(r egress.Record) {
	l.log.Info("egress", "via", r.Via, "name", r.Name, "port", r.Port, "qtype", r.QType, "allowed", r.Allowed, "reason", r.Reason,
		"addr", r.Addr, "answers", r.Answers, "bytes_in", r.BytesIn, "bytes_out", r.BytesOut, "duration_ms", r.DurationMS, "end", r.End, "suppressed", r.Suppressed)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil || l.err != nil {
		return
	}
	if l.n >= maxEgressRecords {
		l.dropped++
		return
	}
	b, err := json.Marshal(r)
	if err == nil {
		b = append(b, '\n')
		_, err = l.w.Write(b)
	}
	if err != nil {
		l.err = err
		l.log.Error("egress record: write; the rest is in the executor's log only", "error", err)
		return
	}
	l.n++
}

// close writes the count of what was left out, and syncs the file.
func (l *egressLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.dropped > 0 && l.err == nil {
		b, _ := json.Marshal(egress.Record{Time: time.Now().UTC(), Allowed: false, Suppressed: l.dropped,
			Reason: fmt.Sprintf("%d more decisions, past the %d this record keeps, are in the executor's log only", l.dropped, maxEgressRecords)})
		_, l.err = l.w.Write(append(b, '\n'))
	}
	err := l.w.Flush()
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
