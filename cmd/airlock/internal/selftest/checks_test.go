package selftest

import (
	"bytes"
	"encoding/xml"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// A row that passed with some checks skipped says which, in its detail
// and in JUnit, so CI does not read it as fully green.
func TestPartlySkippedRow(t *testing.T) {
	row := &Row{Name: "isolation", Runtime: "runc"}
	row.pass("earlier job", "wrote")
	row.skip("dummy secret", "no secret")
	row.pass("earlier job's files and credentials", "none")
	row.settle()
	if row.Status != Pass {
		t.Fatalf("status %s, want pass", row.Status)
	}
	if got := summary(row); got != "2 passed, 1 skipped: dummy secret" {
		t.Errorf("summary %q", got)
	}
	row.Detail = summary(row)
	var buf bytes.Buffer
	if err := (&Report{Rows: []*Row{row}}).WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	var doc JUnitSuites
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range doc.Suites[0].Cases[0].Properties {
		found = found || (p.Name == "skipped_checks" && p.Value == "dummy secret")
	}
	if !found {
		t.Errorf("no skipped_checks property:\n%s", buf.String())
	}
}

// A search that could not run (a tool missing, a timeout, its own
// control file not found) is not "nothing found".
func TestSearchWorked(t *testing.T) {
	ctl := "/tmp/ctl"
	for _, tc := range []struct {
		out   string
		found []string
		want  bool
	}{
		{"selftest-search-exit 0\n", []string{ctl}, true},
		{"selftest-search-exit 2\n", []string{ctl, "/x"}, true},
		{"selftest-search-exit 124\n", []string{ctl}, false},
		{"selftest-search-exit 127\n", nil, false},
		{"selftest-search-exit 1\n", nil, false},
		{"selftest-search-exit 0\n", []string{"/x"}, false},
		{"selftest-missing-tool grep\nselftest-search-exit 0\n", []string{ctl}, false},
		{"", []string{ctl}, false},
	} {
		if got, why := searchWorked(tc.out, tc.found, ctl); got != tc.want {
			t.Errorf("searchWorked(%q, %v) = %v (%s), want %v", tc.out, tc.found, got, why, tc.want)
		}
	}
}

// The probes' shell text, run for real with bash and no tools on PATH:
// every missing tool is named, so the checks fail rather than pass.
func TestProbesNameMissingTools(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, "-c", searchTools+search("selftest-found", `-e x`)+reachTools+reach("a", "127.0.0.1", 9)+"echo selftest-done")
	cmd.Env = []string{"PATH=/nonexistent"}
	out, _ := cmd.Output()
	o := string(out)
	missing := lines(o, "selftest-missing-tool ")
	for _, tool := range []string{"grep", "timeout", "getent"} {
		if !contains(missing, tool) {
			t.Errorf("missing tool %s not named: %q", tool, o)
		}
	}
	if ok, _ := searchWorked(o, lines(o, "selftest-found "), "/tmp/ctl"); ok {
		t.Errorf("a search without grep counted as done: %q", o)
	}
	row := &Row{}
	(&runner{}).reachChecks(row, "job", o, nil, []target{{text: "a"}}, outside)
	if row.settle(); row.Status != Fail {
		t.Errorf("reach checks without tools: %+v", row.Checks)
	}
}

// An allow-list that lets an unlisted destination through fails.
func TestReachChecksUnlisted(t *testing.T) {
	out := "selftest-reach ok want\nselftest-reach ok unlisted 1.1.1.1:443\n"
	row := &Row{}
	(&runner{}).reachChecks(row, "job", out, nil, []target{{text: "want"}}, outside)
	if row.settle(); row.Status != Fail || !strings.Contains(row.Checks[1].Detail, "unlisted 1.1.1.1:443") {
		t.Errorf("reach checks: %+v", row.Checks)
	}
	row = &Row{}
	(&runner{}).reachChecks(row, "job", "selftest-reach ok want\nselftest-reach fail unlisted 1.1.1.1:443\n", nil, []target{{text: "want"}}, outside)
	if row.settle(); row.Status != Pass {
		t.Errorf("reach checks: %+v", row.Checks)
	}
}

func TestForkRefused(t *testing.T) {
	for out, want := range map[string]bool{
		"selftest-forked 1\nsh: 1: Cannot fork\n":                         true,
		"sh: can't fork: Resource temporarily unavailable\n":              true,
		"bash: fork: retry: Resource temporarily unavailable\n":           true,
		"selftest-forked 1\nsh: 1: sleep: Permission denied\n":            false,
		"selftest-forked 1\nselftest-forked 2\nselftest-pids-unbounded\n": false,
	} {
		if got := forkRefused(out); got != want {
			t.Errorf("forkRefused(%q) = %v, want %v", out, got, want)
		}
	}
}

// The counter counts only paths it handed out (each with a nonce), and
// every accepted connection, even one that sent no request.
func TestCounter(t *testing.T) {
	c, err := startCounter("127.0.0.1:0", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	p := c.path("x")
	if !strings.HasSuffix(p, "/x") || len(p) < 20 || p == c.path("x") {
		t.Fatalf("path %q: want a nonce per path", p)
	}
	get := func(path string) int {
		resp, err := http.Get("http://" + c.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(p); code != 200 {
		t.Errorf("issued path: %d", code)
	}
	if code := get("/guessed/x"); code != 404 || c.count("/guessed/x") != 0 {
		t.Errorf("unissued path: %d, counted %d", code, c.count("/guessed/x"))
	}
	if c.count(p) != 1 {
		t.Errorf("count %d, want 1", c.count(p))
	}
	before := c.accepted()
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.accepted() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.accepted() != before+1 {
		t.Errorf("a bare connection was not counted: %d then %d", before, c.accepted())
	}
	for i := 0; i < maxPaths; i++ {
		c.path("fill")
	}
	if c.path("over") != "" {
		t.Errorf("more than %d paths handed out", maxPaths)
	}
}

// The row's policy digest covers every job it ran: a change in the
// second job's network policy (a tenant's egress) changes the row's.
func TestRecordCoversEveryJob(t *testing.T) {
	job := func(id string, cidr string) *authorityv1.Job {
		j := &authorityv1.Job{JobId: id, Limits: &typesv1.ResourceLimits{MemoryBytes: 1 << 30}}
		if cidr != "" {
			j.NetworkPolicyStatus = &typesv1.NetworkPolicyStatus{Policy: allow([]*typesv1.AllowRule{{Cidr: cidr}})}
		}
		return j
	}
	digest := func(cidr string) (string, Record) {
		row := &Row{}
		record(row, job("a", ""))
		record(row, job("b", cidr))
		record(row, &authorityv1.Job{}) // no job: not recorded
		return row.Record.PolicyDigest, row.Record
	}
	d1, rec := digest("192.0.2.0/24")
	d2, _ := digest("198.51.100.0/24")
	if d1 == d2 || !strings.HasPrefix(d1, "sha256:") {
		t.Errorf("digests %s and %s: want different", d1, d2)
	}
	if len(rec.Each) != 2 || rec.Each[0].PolicyDigest == rec.Each[1].PolicyDigest || rec.Each[1].Shape == "" || len(rec.Jobs) != 2 {
		t.Errorf("record %+v", rec)
	}
}

// With --counter-from, requests and connections from anyone else are not
// counted.
func TestCounterFrom(t *testing.T) {
	c, err := startCounter("127.0.0.1:0", "", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	p := c.path("x")
	resp, err := http.Get("http://" + c.addr + p)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || c.count(p) != 0 || c.accepted() != 0 {
		t.Errorf("a request from 127.0.0.1 outside --counter-from: %d, counted %d, connections %d", resp.StatusCode, c.count(p), c.accepted())
	}
	if !c.counts("192.0.2.9:4000") || c.counts("198.51.100.1:4000") || c.counts("garbage") {
		t.Error("counts() judges sources wrong")
	}
}
