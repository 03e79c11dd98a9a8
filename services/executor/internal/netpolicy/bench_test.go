package netpolicy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
)

// benchManager is a manager of the benchmark's own (pool 10.221.x.0/24).
// The benchmarks but RulesTransaction use only the package's API, so they
// run against any version of it.
func benchManager(b *testing.B) *Manager {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatalf("the netpolicy benchmarks must run as root, not uid %d", os.Geteuid())
	}
	m, err := New(Config{
		Dir:   b.TempDir(),
		Name:  fmt.Sprintf("npb%d", os.Getpid()),
		Pool4: netip.MustParsePrefix(fmt.Sprintf("10.221.%d.0/24", os.Getpid()%256)),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := m.Close(); err != nil {
			b.Error(err)
		}
	})
	return m
}

var benchPolicy = Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("198.18.0.0/15"), Ports: []uint16{443}}}}

// BenchmarkAllowNet makes and removes an allow job's network: Create
// (namespace, rules, veth pair) then Close (veth, rules, conntrack
// entries, namespace). make-ms and remove-ms are the medians of each half.
func BenchmarkAllowNet(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	var made, removed []time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		n, err := m.Create(ctx, fmt.Sprintf("bench-%d", i), benchPolicy)
		if err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
		made, removed = append(made, mid.Sub(start)), append(removed, time.Since(mid))
	}
	b.ReportMetric(medianMS(made), "make-ms")
	b.ReportMetric(medianMS(removed), "remove-ms")
}

// BenchmarkApply replaces a running allow job's rules, one transaction
// each (and the conntrack sweep that follows it).
func BenchmarkApply(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	n, err := m.Create(ctx, "bench-apply", benchPolicy)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	other := Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("198.18.0.0/15"), Ports: []uint16{443, 80}}, {Prefix: netip.MustParsePrefix("203.0.113.0/24")}}}
	for gen := int64(2); b.Loop(); gen++ {
		p := benchPolicy
		if gen%2 == 0 {
			p = other
		}
		if err := n.Apply(ctx, p, gen); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRulesTransaction replaces a running job's table alone: one
// nftables transaction, without Apply's conntrack sweep.
func BenchmarkRulesTransaction(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	n, err := m.Create(ctx, "bench-tx", benchPolicy)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	for b.Loop() {
		if err := m.installRules(ctx, n, benchPolicy); err != nil {
			b.Fatal(err)
		}
	}
}

func medianMS(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Microseconds()) / 1000
}
