//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// selftestReport is the part of `airlock selftest -o json` the test reads.
type selftestReport struct {
	Rows []struct {
		Name    string `json:"name"`
		Runtime string `json:"runtime"`
		Status  string `json:"status"`
		Detail  string `json:"detail"`
		Checks  []struct {
			Name, Status, Detail string
		} `json:"checks"`
		Record struct {
			RuntimeClass   string `json:"runtime_class"`
			RuntimeVersion string `json:"runtime_version"`
			Template       string `json:"template"`
			Shape          string `json:"shape"`
			PolicyDigest   string `json:"policy_digest"`
		} `json:"record"`
	} `json:"rows"`
}

// selftestNet is what the selftest's jobs reach in this test: a relay in a
// test host of its own that forwards to the counter the selftest serves on
// the host's loopback (sandboxes never reach the executor host's own
// addresses), and a greeting listener in a second test host, the
// operator's "intended connection".
type selftestNet struct {
	counterListen, counterAddr string
	reach                      string // IP/32:PORT
	reachPrefix, relayPrefix   netip.Prefix
}

func startSelftestNet(t *testing.T) selftestNet {
	t.Helper()
	pid := os.Getpid()
	relayHost := nettest.Start(t, nettest.Config{
		Name:   fmt.Sprintf("sc%04x", pid&0xffff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("198.51.100.128/25"), 30, pid%32),
	})
	reachHost := nettest.Start(t, nettest.Config{
		Name:   fmt.Sprintf("sr%04x", pid&0xffff),
		Prefix: nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, pid%32),
	})
	port := freePort(t)
	target := net.JoinHostPort("127.0.0.1", port)
	relay := relayHost.Listen(t, "tcp", net.JoinHostPort(relayHost.IP.String(), "0"))
	go func() {
		for {
			c, err := relay.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
	greet := reachHost.Listen(t, "tcp", net.JoinHostPort(reachHost.IP.String(), "0"))
	nettest.Greet(t, greet)
	_, gport, _ := net.SplitHostPort(greet.Addr().String())
	return selftestNet{
		counterListen: target, counterAddr: relay.Addr().String(),
		reach:       reachHost.IP.String() + "/32:" + gport,
		reachPrefix: reachHost.Prefix, relayPrefix: relayHost.Prefix,
	}
}

// runSelftest runs `airlock selftest` on the stack with extra arguments and
// returns its exit code and report.
func (s *stack) runSelftest(t *testing.T, n selftestNet, extra ...string) (int, selftestReport, result) {
	t.Helper()
	args := append([]string{"selftest", "--repo", "sample", "--rev", "main", "-o", "json",
		"--counter-listen", n.counterListen, "--counter-addr", n.counterAddr, "--counter-from", "127.0.0.1/32", "--expect-reach", n.reach,
		"--approver", "approver/alice", "--publish-to", "sample:main", "--pipeline", "pipeline/deploy", "--on-executor-host"}, extra...)
	res := runCommandWithin(t, 4*time.Minute, s.env(), bin("airlock"), args...)
	var rep selftestReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("selftest -o json: exit %d, %v\n%s\nstderr:\n%s", res.code, err, res.stdout, res.stderr)
	}
	t.Logf("selftest %v: exit %d in %s", extra, res.code, res.elapsed.Round(time.Millisecond))
	return res.code, rep, res
}

// failedRows are the rows of rep that failed, by name.
func failedRows(rep selftestReport) []string {
	var out []string
	for _, r := range rep.Rows {
		if r.Status == "fail" {
			out = append(out, r.Name)
		}
	}
	return out
}

// wantOnly fails the test unless exactly row failed, and the selftest
// said so with its exit status.
func wantOnly(t *testing.T, hole string, code int, rep selftestReport, res result, row string) {
	t.Helper()
	failed := failedRows(rep)
	if code == 0 || len(failed) != 1 || failed[0] != row {
		t.Fatalf("%s: exit %d, failed rows %v; want exit 1 and exactly %q\n%s\nstderr:\n%s", hole, code, failed, row, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, "selftest failed: "+row+"[") {
		t.Fatalf("%s: stderr does not name the row:\n%s", hole, res.stderr)
	}
}

// TestSelftest runs `airlock selftest` against the dev stack: it passes as
// deployed, and with one boundary broken on purpose at a time it fails
// naming exactly that row. The holes are real configuration: a secret
// where jobs can see it (the host's /usr), a tenant whose default pids
// limit a fork bomb cannot hit, and a tenant policy that does not permit
// the operator's intended destination.
func TestSelftest(t *testing.T) {
	repo, _ := sampleRepo(t)
	n := startSelftestNet(t)
	s := startStack(t, "--repo", "sample="+repo)

	code, rep, res := s.runSelftest(t, n)
	if code != 0 || len(failedRows(rep)) != 0 {
		t.Fatalf("selftest on the dev stack as deployed: exit %d, failed %v\n%s\nstderr:\n%s", code, failedRows(rep), res.stdout, res.stderr)
	}
	for _, r := range rep.Rows {
		want := "pass"
		if r.Name == "restart" {
			want = "skip"
		}
		if r.Status != want {
			t.Errorf("row %s: %s, want %s: %+v", r.Name, r.Status, want, r.Checks)
		}
		if want == "pass" && (r.Record.RuntimeClass != "runc" || r.Record.RuntimeVersion == "" || r.Record.Template == "" ||
			!strings.Contains(r.Record.Shape, "memory") || !strings.HasPrefix(r.Record.PolicyDigest, "sha256:")) {
			t.Errorf("row %s: record %+v lacks runtime, template, shape or policy digest", r.Name, r.Record)
		}
		for _, c := range r.Checks {
			if c.Status == "skip" && want == "pass" {
				t.Errorf("row %s: check %s skipped with a counter and --expect-reach given: %s", r.Name, c.Name, c.Detail)
			}
		}
	}
	if !strings.Contains(res.stderr, "selftest: limits[default]: pass") {
		t.Errorf("no progress on stderr:\n%s", res.stderr)
	}
	t.Logf("progress:\n%s", res.stderr)

	// JUnit XML for CI, one testcase per row and runtime class. Run as
	// from a CI runner (no --on-executor-host, no --secret-path): the
	// dummy-secret check is skipped, and the passed isolation row says so.
	junit := runCommandWithin(t, 4*time.Minute, s.env(), bin("airlock"), "selftest", "--repo", "sample", "--rev", "main",
		"--runtime", "runc", "--row", "exit-status", "--row", "isolation", "-o", "junit")
	type property struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
	}
	var doc struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name       string     `xml:"name,attr"`
				Classname  string     `xml:"classname,attr"`
				Properties []property `xml:"properties>property"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal([]byte(junit.stdout), &doc); err != nil || junit.code != 0 || len(doc.Suites) != 1 || doc.Suites[0].Tests != 2 ||
		len(doc.Suites[0].Cases) != 2 || doc.Suites[0].Failures != 0 || doc.Suites[0].Cases[0].Classname != "airlock.selftest.runc" ||
		doc.Suites[0].Cases[0].Name != "exit-status" || doc.Suites[0].Cases[1].Name != "isolation" {
		t.Fatalf("selftest -o junit: exit %d, %v, %+v\n%s\nstderr:\n%s", junit.code, err, doc, junit.stdout, junit.stderr)
	}
	if props := doc.Suites[0].Cases[1].Properties; !slices.Contains(props, property{"skipped_checks", "dummy secret"}) {
		t.Errorf("isolation without --on-executor-host or --secret-path: properties %+v, want skipped_checks naming the dummy secret\n%s", props, junit.stdout)
	}
	// It leaves nothing running behind it.
	list := s.airlock(t, "job", "list", "-o", "json")
	if strings.Contains(list.stdout, "JOB_STATE_RUNNING") || strings.Contains(list.stdout, "JOB_STATE_QUEUED") {
		t.Errorf("selftest left jobs running:\n%s", list.stdout)
	}
	// The export row's approval was denied, never approved.
	approvals := s.airlock(t, "approval", "list", "--as", "approver/alice", "-o", "json")
	if approvals.code != 0 || !strings.Contains(approvals.stdout, "APPROVAL_STATE_DENIED") ||
		strings.Contains(approvals.stdout, "APPROVAL_STATE_PENDING") || strings.Contains(approvals.stdout, "APPROVAL_STATE_APPROVED") {
		t.Errorf("the selftest's approvals are not all denied: exit %d\n%s%s", approvals.code, approvals.stdout, approvals.stderr)
	}

	t.Run("hole=secret-on-the-host", func(t *testing.T) {
		// The operator kept a secret under the host's /usr, which jobs on
		// the host template see.
		path := filepath.Join("/usr/local/share", fmt.Sprintf("airlock-selftest-hole-%d", os.Getpid()))
		if err := os.WriteFile(path, []byte("not for jobs\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
		code, rep, res := s.runSelftest(t, n, "--secret-path", path)
		wantOnly(t, "secret under /usr", code, rep, res, "isolation")
		if !strings.Contains(res.stdout, path) {
			t.Errorf("the isolation row does not name %s:\n%s", path, res.stdout)
		}
	})

	// The tenant holes are config the authority reads at start: edited and
	// restarted by the test itself (a restart's process belongs to the t
	// that started it), one hole at a time.
	s.editTenants(t, func(_, dev map[string]any) {
		dev["limits"].(map[string]any)["default"].(map[string]any)["pids"] = 2048
	})
	s.restartService(t, "authority")
	t.Run("hole=pids-the-job-cannot-hit", func(t *testing.T) {
		code, rep, res := s.runSelftest(t, n)
		wantOnly(t, "default pids 2048", code, rep, res, "limits")
		if !strings.Contains(res.stdout, "default pids limit (2048)") {
			t.Errorf("the limits row does not say which limit:\n%s", res.stdout)
		}
	})

	s.editTenants(t, func(_, dev map[string]any) {
		dev["limits"].(map[string]any)["default"].(map[string]any)["pids"] = 256
		dev["egress"] = map[string]any{"cidrs": []string{n.relayPrefix.String()}}
	})
	s.restartService(t, "authority")
	t.Run("hole=intended-destination-not-permitted", func(t *testing.T) {
		code, rep, res := s.runSelftest(t, n)
		wantOnly(t, "tenant egress without "+n.reachPrefix.String(), code, rep, res, "egress")
		if ip, _, _ := strings.Cut(n.reach, "/"); !strings.Contains(res.stdout, ip+"/32 is outside tenant") {
			t.Errorf("the egress row does not name the refused destination:\n%s", res.stdout)
		}
	})
}

// TestSelftestRestart runs the restart row (--disruptive) against the dev
// stack: its --restart-command asks this test, which restarts the executor
// as an operator would, and answers once the stack serves again.
func TestSelftestRestart(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	dir := t.TempDir()
	asked, done := filepath.Join(dir, "restart-asked"), filepath.Join(dir, "restart-done")
	restart := fmt.Sprintf("touch %s; i=0; while [ ! -e %s ]; do i=$((i+1)); [ $i -gt 1500 ] && exit 1; sleep 0.2; done", asked, done)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("airlock"), "selftest", "--repo", "sample", "--rev", "main", "-o", "json",
		"--row", "restart", "--disruptive", "--restart-command", restart)
	cmd.Env = append(os.Environ(), s.env()...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
wait:
	for {
		select {
		case err = <-exited:
			t.Fatalf("the selftest ended (%v) without asking for the restart\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		case <-time.After(100 * time.Millisecond):
			if _, err := os.Stat(asked); err == nil {
				break wait
			}
		}
	}
	// As restartService does, with the time a graceful stop takes to keep
	// a running session's files (the selftest's session runs).
	pid := s.services["executor"].PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws, err := reap(pid, 2*time.Minute); err != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("executor stopped for the restart: %v, exit status %d", err, ws.ExitStatus())
	}
	startService(t, s, "executor", 100*time.Millisecond, func() error {
		if res := s.airlock(t, "status"); res.code != 0 {
			return fmt.Errorf("airlock status fails:\n%s%s", res.stdout, res.stderr)
		}
		return nil
	})
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err = <-exited
	var rep selftestReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil || err != nil || len(rep.Rows) != 1 || rep.Rows[0].Status != "pass" {
		t.Fatalf("selftest --row restart: %v (%v)\n%s\nstderr:\n%s", err, jerr, stdout.String(), stderr.String())
	}
	want := map[string]bool{"executor restart": false, "recorded results": false, "retained source": false, "scratch in a new job": false, "scratch in the session": false,
		"retained source in the session": false}
	for _, c := range rep.Rows[0].Checks {
		if _, ok := want[c.Name]; ok && c.Status == "pass" {
			want[c.Name] = true
		}
	}
	for name, ok := range want {
		if !ok {
			t.Errorf("check %q did not pass: %+v", name, rep.Rows[0].Checks)
		}
	}
	t.Logf("restart row: %+v", rep.Rows[0].Checks)
}
