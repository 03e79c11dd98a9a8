// Package metricstest scrapes a service's Prometheus /metrics endpoint the
// way Prometheus does, over plain HTTP, and finds series in what it got,
// for the tests of the endpoint (pkg/daemon, test/e2e); and gives a
// domain package's tests an in-process meter provider whose recordings
// they read by OpenTelemetry name (Reader). Only tests import it.
package metricstest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// config that must name its port before the process starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs http://addr/metrics and parses the text format, failing the
// test on any error or a status other than 200.
func Scrape(t testing.TB, addr string) Families {
	t.Helper()
	fams, err := TryScrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// TryScrape is Scrape returning its error.
func TryScrape(addr string) (Families, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s\n%s", addr, resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("GET %s/metrics: Content-Type %q, want the text format", addr, ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w\n%s", addr, err, body)
	}
	return fams, nil
}

// Find returns the series of family name (of type typ) whose labels
// include want, failing the test when there is none.
func (f Families) Find(t testing.TB, name string, typ dto.MetricType, want map[string]string) []*dto.Metric {
	t.Helper()
	out, err := f.Series(name, typ, want)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Series is Find returning its error.
func (f Families) Series(name string, typ dto.MetricType, want map[string]string) ([]*dto.Metric, error) {
	fam, ok := f[name]
	if !ok {
		return nil, fmt.Errorf("no metric %s; the scrape has %v", name, f.Names())
	}
	if fam.GetType() != typ {
		return nil, fmt.Errorf("%s is a %v, want a %v", name, fam.GetType(), typ)
	}
	var out []*dto.Metric
	for _, m := range fam.Metric {
		if HasLabels(m, want) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		var have []string
		for _, m := range fam.Metric {
			have = append(have, Labels(m))
		}
		return nil, fmt.Errorf("no %s series with labels %v; the series are:\n%s", name, want, strings.Join(have, "\n"))
	}
	return out, nil
}

// Await scrapes addr until check passes, and returns that scrape; it
// fails the test with check's last error after timeout. A server records
// a call's metrics when the call ends on its side, which may be just
// after the client has its answer.
func Await(t testing.TB, addr string, timeout time.Duration, check func(Families) error) Families {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		fams, err := TryScrape(addr)
		if err == nil {
			if err = check(fams); err == nil {
				return fams
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Names lists the families, sorted.
func (f Families) Names() []string {
	var out []string
	for n := range f {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// HasLabels says whether m has every label of want with its value.
func HasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Labels renders m's labels as Prometheus shows them.
func Labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
