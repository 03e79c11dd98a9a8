//go:build linux

package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/airlockhq/airlock/pkg/nettest"
)

// startTestHost makes a test host (package nettest) that greets on each
// of ports. Its /30 is from 198.18.0.0/15 (RFC 2544, for benchmarking), so
// nothing here is routed off the machine.
func startTestHost(t *testing.T, ports ...int) *nettest.Host {
	t.Helper()
	id := os.Getpid() & 0xffff
	th := nettest.Start(t, nettest.Config{
		Name:   fmt.Sprintf("alke2e%04x", id),
		Prefix: nettest.Subnet(netip.MustParsePrefix("198.18.0.0/16"), 30, id%16384),
	})
	for _, p := range ports {
		nettest.Greet(t, th.Listen(t, "tcp", net.JoinHostPort(th.IP.String(), fmt.Sprint(p))))
	}
	return th
}

// probeTargets starts a test host listening on 8080 and 8081 and a
// listener on the executor host's own address in its network at 8082:
// the probe's targets "allowed" (the host's 8080), "other-port" (its
// 8081) and "host" (the executor host's 8082, never reachable).
func probeTargets(t *testing.T) (*nettest.Host, map[string]string) {
	t.Helper()
	th := startTestHost(t, 8080, 8081)
	hostLn, err := net.Listen("tcp", net.JoinHostPort(th.HostIP.String(), "8082"))
	if err != nil {
		t.Fatal(err)
	}
	nettest.Greet(t, hostLn)
	return th, map[string]string{"allowed": net.JoinHostPort(th.IP.String(), "8080"), "other-port": net.JoinHostPort(th.IP.String(), "8081"), "host": hostLn.Addr().String()}
}

// probeScript checks, every round, whether the job reaches each target
// and prints one line per target and "tick" after each round.
func probeScript(targets map[string]string) string {
	var b strings.Builder
	b.WriteString("while true; do\n")
	for name, addr := range targets {
		host, port, _ := net.SplitHostPort(addr)
		fmt.Fprintf(&b, "  if timeout 1 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null; then echo '%s open'; else echo '%s closed'; fi\n", host, port, name, name)
	}
	b.WriteString("  echo tick\n  sleep 0.2\ndone\n")
	return b.String()
}

// rounds splits probe output into complete rounds.
func rounds(out string) [][]string {
	var all [][]string
	var cur []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if sc.Text() == "tick" {
			all = append(all, cur)
			cur = nil
			continue
		}
		cur = append(cur, sc.Text())
	}
	return all
}

// nextRound waits for a round that started after the call and returns it
// as target -> open.
func nextRound(t *testing.T, b *background) map[string]bool {
	t.Helper()
	start := len(rounds(b.stdout.String()))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := rounds(b.stdout.String()); len(r) >= start+2 {
			out := map[string]bool{}
			for _, line := range r[len(r)-1] {
				name, state, _ := strings.Cut(line, " ")
				out[name] = state == "open"
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new probe round in 30s; output so far:\n%s\nstderr:\n%s", b.stdout.String(), b.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRound waits up to 20s for a round in which want(round) holds.
func waitRound(t *testing.T, b *background, what string, want func(map[string]bool) bool) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := nextRound(t, b)
		if want(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: last round %v", what, r)
		}
	}
}

var approvalIDLine = regexp.MustCompile(`waiting for approval (\S+)`)

// TestRunningJobChangesAreGatedAndEnforced runs a job that probes three
// destinations from its sandbox while its policy changes: deny-all; an
// allow rule widened only after another approver approved it (the
// requester cannot), then reaching exactly the allowed port — never the
// other port, nor the host's own address inside the allowed CIDR; deny-all
// again at once (narrowing needs nobody); and a raised memory limit that,
// once approved, is the limit in the job's cgroup.
func TestRunningJobChangesAreGatedAndEnforced(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	th, targets := probeTargets(t)

	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--memory", "256MiB", "--", "bash", "-c", probeScript(targets))
	if res.code != 0 {
		t.Fatalf("job submit: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)
	watch := s.startAirlock(t, "job", "watch", id)
	defer s.airlock(t, "job", "cancel", id)

	if r := nextRound(t, watch); r["allowed"] || r["other-port"] || r["host"] {
		t.Fatalf("under deny-all the job reached %v", r)
	}

	// Widening: an approval, and nothing changes until it is decided.
	res = s.airlock(t, "job", "update", id, "--allow", th.Prefix.String()+":8080,8082")
	m := approvalIDLine.FindStringSubmatch(res.stdout)
	if res.code != 0 || m == nil {
		t.Fatalf("job update --allow: exit %d, want an approval\n%s%s", res.code, res.stdout, res.stderr)
	}
	aid := m[1]
	if r := nextRound(t, watch); r["allowed"] {
		t.Fatal("the widening took effect before anyone approved it")
	}
	show := s.airlock(t, "approval", "show", aid, "--as", "approver/alice")
	if show.code != 0 || !strings.Contains(show.stdout, "widens     network_policy: allow") {
		t.Fatalf("approval show: exit %d\n%s%s", show.code, show.stdout, show.stderr)
	}
	if res := s.airlock(t, "approval", "approve", aid, "--as", "approver/dev"); res.code == 0 || !strings.Contains(res.stderr, "may not decide") {
		t.Fatalf("the requester approving its own change: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := s.airlock(t, "approval", "approve", aid, "--as", "approver/alice"); res.code != 0 || !strings.Contains(res.stdout, "consumed") {
		t.Fatalf("alice approves: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	r := waitRound(t, watch, "the approved allow rule", func(r map[string]bool) bool { return r["allowed"] })
	if r["other-port"] || r["host"] {
		t.Fatalf("beyond the allowed port the job reached %v (the host's own address is never reachable)", r)
	}
	job := s.job(t, id)
	if st := job.GetNetworkPolicyStatus(); st.GetGeneration() != 2 || st.GetPolicy().GetAllow() == nil || st.GetState().String() != "NETWORK_POLICY_STATE_APPLIED" {
		t.Fatalf("network policy status after the approved change: %v", st)
	}

	// Narrowing applies at once.
	if res := s.airlock(t, "job", "update", id, "--deny-all"); res.code != 0 || !strings.Contains(res.stdout, "network_policy: applied") {
		t.Fatalf("job update --deny-all: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if r := nextRound(t, watch); r["allowed"] || r["other-port"] || r["host"] {
		t.Fatalf("after narrowing to deny-all the job still reached %v", r)
	}

	// Raising memory: approved by bob, then in the job's cgroup.
	res = s.airlock(t, "job", "update", id, "--memory", "1GiB")
	if m = approvalIDLine.FindStringSubmatch(res.stdout); res.code != 0 || m == nil {
		t.Fatalf("job update --memory: exit %d, want an approval\n%s%s", res.code, res.stdout, res.stderr)
	}
	limitFile := jobLimitFile(s.executorCgroupParent(), id, "memory")
	if got := readTrim(t, limitFile); got != fmt.Sprint(256<<20) {
		t.Fatalf("memory limit in the cgroup before approval = %s, want %d", got, 256<<20)
	}
	if res := s.airlock(t, "approval", "approve", m[1], "--as", "approver/bob"); res.code != 0 {
		t.Fatalf("bob approves: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	job = s.job(t, id)
	if job.GetLimits().GetMemoryBytes() != 1<<30 || job.GetGrantGeneration() != 4 {
		t.Fatalf("after the approved memory change: limits %v, generation %d", job.GetLimits(), job.GetGrantGeneration())
	}
	if got := readTrim(t, limitFile); got != fmt.Sprint(1<<30) {
		t.Fatalf("memory limit in the job's cgroup = %s, want %d", got, 1<<30)
	}

	if res := s.airlock(t, "job", "cancel", id); res.code != 0 {
		t.Fatalf("job cancel: exit %d\n%s", res.code, res.stderr)
	}
	if watch.exitCode(20*time.Second) == -1 {
		t.Fatal("job watch did not end after the cancel")
	}
	// Nothing of the job's network is left: no table, no veth.
	sum := sha256.Sum256([]byte(s.services["executor"].DataDir))
	name := "airlock_" + hex.EncodeToString(sum[:4])
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := nftTables(t)
		links, _ := exec.Command("ip", "-o", "link", "show").CombinedOutput()
		if !strings.Contains(out, name) && !strings.Contains(string(links), name+":"+id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the job ended: tables\n%s\nlinks\n%s", out, links)
		}
		time.Sleep(100 * time.Millisecond)
	}

	audit := s.airlock(t, "audit", "list", "--as", "approver/alice", "--job", id, "--limit", "0")
	if n := strings.Count(audit.stdout, "job.changed"); n != 3 {
		t.Errorf("%d job.changed entries, want 3:\n%s", n, audit.stdout)
	}
	if res := s.airlock(t, "audit", "verify", "--as", "approver/alice"); res.code != 0 {
		t.Fatalf("audit verify: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// nftTables lists the host's inet tables over netlink, one name a line
// (the executor needs no nft command, and neither does this check).
func nftTables(t *testing.T) string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("list inet tables: %v", err)
	}
	var b strings.Builder
	for _, tb := range tables {
		b.WriteString(tb.Name + "\n")
	}
	return b.String()
}
