//go:build linux

package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// collector is an OTLP/gRPC endpoint on loopback that keeps every span the
// stack's services export (and takes their metrics, which it drops).
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []collected
}

// collected is one span and the service that sent it.
type collected struct {
	service string
	span    *tracev1.Span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, collected{service: service, span: sp})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

type metricsSink struct {
	collectormetrics.UnimplementedMetricsServiceServer
}

func (metricsSink) Export(context.Context, *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

func startCollector(t testing.TB) (*collector, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	collectormetrics.RegisterMetricsServiceServer(srv, metricsSink{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return c, lis.Addr().String()
}

// trace is every span of trace id, by the time they came.
func (c *collector) trace(id []byte) []collected {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []collected
	for _, s := range c.spans {
		if string(s.span.GetTraceId()) == string(id) {
			out = append(out, s)
		}
	}
	return out
}

// lastServerSpan is the last server span named name that service sent.
func (c *collector) lastServerSpan(service, name string) *tracev1.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var last *tracev1.Span
	for _, s := range c.spans {
		if s.service == service && s.span.GetName() == name && s.span.GetKind() == tracev1.Span_SPAN_KIND_SERVER &&
			(last == nil || s.span.GetStartTimeUnixNano() > last.GetStartTimeUnixNano()) {
			last = s.span
		}
	}
	return last
}

// TestColdStartTrace: with a warm pool, one trace runs from the client's
// CreateSession through the authority's dispatch to the executor's
// StartJob, its source staged and its pooled sandbox claimed, and up to
// the session taking execs; the first exec is a trace of its own. The
// test prints each step's time from the CreateSession call, as the
// services recorded them (docs/performance.md carries a run's table).
func TestColdStartTrace(t *testing.T) {
	col, addr := startCollector(t)
	s := startStack(t, "--repo", "bench="+benchRepo(t, 3), "--warm-pool", "1", "--otlp-endpoint", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, ops, finish := coldStartClients(ctx, t, s)
	waitWarm(ctx, t, ops, "ready", func(p *authorityv1.WarmPoolReport) bool { return p.GetReady() == 1 })

	sid, st, err := sessionFirstOutput(ctx, client, "traced")
	if err != nil {
		t.Fatal(err)
	}
	finish(sid)
	t.Logf("from the client: CreateSession answered %v, running %v, first output %v", st.created, st.running, st.first)

	// The CreateSession span whose trace holds this session's run (the
	// teaching session made another).
	var root *tracev1.Span
	var spans []collected
	want := []string{"jobs.dispatch", "runs.stage_source", "runs.make_sandbox", "runs.start_sandbox"}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		col.mu.Lock()
		var roots []*tracev1.Span
		for _, c := range col.spans {
			if c.service == "airlock-authority" && strings.HasSuffix(c.span.GetName(), "/CreateSession") && c.span.GetKind() == tracev1.Span_SPAN_KIND_SERVER {
				roots = append(roots, c.span)
			}
		}
		col.mu.Unlock()
		root, spans = nil, nil
		for _, r := range roots {
			tr := col.trace(r.GetTraceId())
			if pooledSandbox(tr) {
				root, spans = r, tr
			}
		}
		if root != nil && hasAll(spans, want) {
			break
		}
		if time.Now().After(end) {
			var names []string
			col.mu.Lock()
			for _, c := range col.spans {
				names = append(names, c.service+":"+c.span.GetName())
			}
			col.mu.Unlock()
			t.Fatalf("no trace from a CreateSession to a claimed pooled sandbox with %v; spans: %v", want, names)
		}
	}
	// The executor's StartJob is in it, under the authority's dispatch.
	if !slices.ContainsFunc(spans, func(c collected) bool {
		return c.service == "airlock-executor" && strings.HasSuffix(c.span.GetName(), "/StartJob") && c.span.GetKind() == tracev1.Span_SPAN_KIND_SERVER
	}) {
		t.Errorf("the executor's StartJob is not in the CreateSession's trace")
	}
	slices.SortFunc(spans, func(a, b collected) int { return int(a.span.GetStartTimeUnixNano() - b.span.GetStartTimeUnixNano()) })
	t0 := root.GetStartTimeUnixNano()
	var table strings.Builder
	fmt.Fprintf(&table, "trace %s\n%-18s %-52s %10s %10s\n", hex.EncodeToString(root.GetTraceId()), "service", "span", "starts at", "takes")
	for _, c := range spans {
		fmt.Fprintf(&table, "%-18s %-52s %8.1fms %8.1fms\n", c.service, c.span.GetName(),
			float64(c.span.GetStartTimeUnixNano()-t0)/1e6, float64(c.span.GetEndTimeUnixNano()-c.span.GetStartTimeUnixNano())/1e6)
	}
	t.Logf("the session's trace, from the authority's CreateSession:\n%s", table.String())
	// The first exec, a trace of its own (the client's RunExec call).
	if ex := col.lastServerSpan("airlock-authority", "airlock.authority.v1.AuthorityService/RunExec"); ex != nil {
		t.Logf("its first exec: RunExec on the authority from %.1fms, taking %.1fms to the exec's record", float64(ex.GetStartTimeUnixNano()-t0)/1e6,
			float64(ex.GetEndTimeUnixNano()-ex.GetStartTimeUnixNano())/1e6)
	}
}

// pooledSandbox reports whether a trace made its run's sandbox from the
// pool.
func pooledSandbox(spans []collected) bool {
	for _, c := range spans {
		if c.span.GetName() != "runs.make_sandbox" {
			continue
		}
		for _, a := range c.span.GetAttributes() {
			if a.GetKey() == "airlock.pooled" && a.GetValue().GetBoolValue() {
				return true
			}
		}
	}
	return false
}

func hasAll(spans []collected, names []string) bool {
	for _, n := range names {
		if !slices.ContainsFunc(spans, func(c collected) bool { return c.span.GetName() == n }) {
			return false
		}
	}
	return true
}
