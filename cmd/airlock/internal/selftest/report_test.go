package selftest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	pass := &Row{Name: "limits", Runtime: "runc", Duration: 1500 * time.Millisecond,
		Record: Record{RuntimeClass: "runc", RuntimeVersion: "runc 1.5.3", Template: "sha256:aa", Shape: "cpu 1, memory 512MiB", PolicyDigest: "sha256:bb", Jobs: []string{"j1", "j2"}}}
	pass.pass("memory", "ended oom")
	pass.pass("pids", "forks refused")
	fail := &Row{Name: "isolation", Runtime: "runsc", Duration: time.Second}
	fail.pass("earlier job", "wrote markers")
	// Job-controlled text, with markup and a control character.
	fail.fail("dummy secret", "a job read [/usr/<x>&\x01secret]")
	skip := &Row{Name: "restart", Runtime: "runc"}
	skip.skip("executor restart", "not run: needs --disruptive")
	for _, r := range []*Row{pass, fail, skip} {
		r.settle()
		r.Detail = summary(r)
	}
	return &Report{Started: time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC), Duration: 3 * time.Second, Tenant: "dev", Rows: []*Row{pass, fail, skip}}
}

func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		checks []Status
		want   Status
	}{
		{nil, Skip},
		{[]Status{Skip}, Skip},
		{[]Status{Skip, Pass}, Pass},
		{[]Status{Pass, Fail, Skip}, Fail},
	} {
		r := &Row{}
		for _, c := range tc.checks {
			r.add("c", c, "")
		}
		if r.settle(); r.Status != tc.want {
			t.Errorf("checks %v: status %s, want %s", tc.checks, r.Status, tc.want)
		}
	}
}

func TestJUnitParsesBack(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "<?xml") {
		t.Fatalf("no XML header:\n%s", buf.String())
	}
	var got JUnitSuites
	if err := xml.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("parse the JUnit XML back: %v\n%s", err, buf.String())
	}
	if len(got.Suites) != 1 {
		t.Fatalf("%d suites, want 1", len(got.Suites))
	}
	s := got.Suites[0]
	if s.Tests != 3 || s.Failures != 1 || s.Skipped != 1 || s.Time != "3.000" || s.Timestamp != "2026-12-05T09:00:00Z" {
		t.Errorf("suite tests=%d failures=%d skipped=%d time=%s timestamp=%s; want 3, 1, 1, 3.000, 2026-12-05T09:00:00Z", s.Tests, s.Failures, s.Skipped, s.Time, s.Timestamp)
	}
	byName := map[string]JUnitCase{}
	for _, c := range s.Cases {
		byName[c.Classname+"/"+c.Name] = c
	}
	lim, ok := byName["airlock.selftest.runc/limits"]
	if !ok || lim.Failure != nil || lim.Skipped != nil || lim.Time != "1.500" {
		t.Errorf("limits case: %+v", lim)
	}
	props := map[string]string{}
	for _, p := range lim.Properties {
		props[p.Name] = p.Value
	}
	if props["runtime_version"] != "runc 1.5.3" || props["policy_digest"] != "sha256:bb" || props["shape"] != "cpu 1, memory 512MiB" || props["jobs"] != "j1 j2" {
		t.Errorf("limits properties: %v", props)
	}
	iso := byName["airlock.selftest.runsc/isolation"]
	if iso.Failure == nil || !strings.Contains(iso.Failure.Message, "isolation[runsc] failed: dummy secret") {
		t.Fatalf("isolation case: %+v", iso)
	}
	if !strings.Contains(iso.Failure.Text, "/usr/<x>&") {
		t.Errorf("the failure text lost the job's markup: %q", iso.Failure.Text)
	}
	if strings.ContainsRune(iso.Failure.Text, '\x01') {
		t.Errorf("a control character reached the XML: %q", iso.Failure.Text)
	}
	if rs := byName["airlock.selftest.runc/restart"]; rs.Skipped == nil || !strings.Contains(rs.Skipped.Message, "--disruptive") {
		t.Errorf("restart case: %+v", rs)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Rows) != 3 || got.Rows[1].Status != Fail || got.Rows[1].Checks[1].Name != "dummy secret" || got.Rows[0].Record.PolicyDigest != "sha256:bb" {
		t.Errorf("round trip: %+v", got.Rows)
	}
	if f := got.Failed(); len(f) != 1 || f[0] != "isolation[runsc]" {
		t.Errorf("Failed() = %v", f)
	}
}

func TestText(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"limits     runc     PASS", "isolation  runsc    FAIL", "restart    runc     SKIP",
		"fail dummy secret:", "ran on: runtime runc runc 1.5.3, template sha256:aa", "selftest FAILED: isolation[runsc]"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, '\x01') {
		t.Errorf("a control character reached the text:\n%q", out)
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in, dial string
		port     uint32
		name     bool
		bad      bool
	}{
		{in: "proxy.golang.org", dial: "proxy.golang.org", port: 443, name: true},
		{in: "registry.example:5000", dial: "registry.example", port: 5000, name: true},
		{in: "192.0.2.7", dial: "192.0.2.7", port: 443},
		{in: "192.0.2.7:8080", dial: "192.0.2.7", port: 8080},
		{in: "192.0.2.7/32:22", dial: "192.0.2.7", port: 22},
		{in: "[2001:db8::1]:80", dial: "2001:db8::1", port: 80},
		{in: "2001:db8::/64", dial: "2001:db8::1", port: 443},
		{in: "10.20.0.0/16:5432", dial: "10.20.0.1", port: 5432},
		{in: "192.0.2.6/31", dial: "192.0.2.6", port: 443},
		{in: "Proxy.Golang.org:443", dial: "proxy.golang.org", port: 443, name: true},
		{in: "host:0", bad: true},
		{in: "localhost", bad: true},
		{in: "*.example.com", bad: true},
		{in: "10.20.0.5/16", bad: true},
		{in: "a b.example.com", bad: true},
		{in: "x.example.com;reboot", bad: true},
		{in: "$(id).example.com", bad: true},
		{in: "a'b", bad: true},
		{in: "", bad: true},
	} {
		got, err := parseTarget(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseTarget(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got.dial() != tc.dial || got.port != tc.port || (got.name != "") != tc.name {
			t.Errorf("parseTarget(%q) = %+v (dial %s), %v; want %s port %d", tc.in, got, got.dial(), err, tc.dial, tc.port)
		}
	}
}
