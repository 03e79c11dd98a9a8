//go:build linux

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// forwardServers serves HTTP on 8000 (a marker file) and echoes on 8001,
// on every address of the session (so a dial of its address from outside
// would reach them, were anything to let it).
const forwardServers = `
import http.server, socketserver, threading, os, sys
os.makedirs('/tmp/www', exist_ok=True)
open('/tmp/www/marker.txt', 'w').write(sys.argv[1])
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(s, *a, **k): super().__init__(*a, directory='/tmp/www', **k)
class Echo(socketserver.BaseRequestHandler):
    def handle(s):
        while True:
            b = s.request.recv(65536)
            if not b: return
            s.request.sendall(b)
class T(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True
e = T(('0.0.0.0', 8001), Echo)
threading.Thread(target=e.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
`

// tryConnect prints, for each HOST:PORT, "HOST:PORT ok" or "HOST:PORT
// refused: why", with a short timeout: what a session can reach.
const tryConnect = `
import socket, sys
for a in sys.argv[1:]:
    h, p = a.rsplit(':', 1)
    try:
        socket.create_connection((h, int(p)), timeout=3).close()
        print(a, 'ok')
    except Exception as e:
        print(a, 'refused:', e)
`

// ownAddress prints the session's source address toward a public one
// (no packet is sent: a UDP connect only picks the route).
const ownAddress = `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(('203.0.113.1', 9))
print(s.getsockname()[0])
`

// TestPortForward: a server in a session is reachable through `airlock
// session port-forward` (runc and runsc) and from nowhere else: not from
// the host's network, not from another session; the tunnel is the tenant's
// clients' alone, only to the ports the policy lists; closing it cuts a
// live connection and refuses new ones; a deny-all session still reaches
// nothing outside through it; under approval: required it stays pending
// until an approver who is not its requester approves; the record counts
// the bytes each way.
func TestPortForward(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.addTenant(t, "gated", map[string]string{"sample": repo})
	s.editTenants(t, func(tenants, dev map[string]any) {
		dev["port_forward"] = map[string]any{"ports": []string{"8000-8001"}, "max_ttl": "30m"}
		tenants["other"].(map[string]any)["port_forward"] = map[string]any{"ports": []string{"8000-8001"}}
		g := tenants["gated"].(map[string]any)
		g["clients"] = []string{"client/dev"}
		g["port_forward"] = map[string]any{"ports": []string{"8000"}, "approval": "required"}
		g["approvals"] = dev["approvals"]
	})
	s.restartService(t, "authority")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the executor said of the forwards, for the failure.
		for _, name := range []string{"executor", "authority"} {
			data, _ := os.ReadFile(s.services[name].Log)
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(strings.ToLower(line), "forward") {
					t.Logf("%s: %s", name, line)
				}
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dev := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	other := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/other", "authority"))

	classes := []string{"runc", "runsc"}
	if _, err := os.Stat(binDir + "/runsc"); err != nil && os.Getenv("CI") != "true" {
		t.Logf("runsc is not in %s: runc only", binDir)
		classes = classes[:1]
	}
	for _, class := range classes {
		t.Run(class, func(t *testing.T) {
			// An allow policy gives the session an address of its own on
			// the host's side, which the host then must not reach.
			sid := s.forwardSession(t, "dev", class, "--allow", "203.0.113.0/24:443")
			mark := fmt.Sprintf("marker-%s-%d", class, time.Now().UnixNano())
			startServers(ctx, t, dev, sid, mark)

			// Through the CLI: an HTTP GET of the marker.
			fwd := s.startAirlock(t, "session", "port-forward", sid, "0:8000", "--ttl", "10m")
			addr := waitLine(t, fwd, 60*time.Second)
			var body string
			deadline := time.Now().Add(30 * time.Second)
			for {
				r, err := http.Get("http://" + addr + "/marker.txt")
				if err == nil {
					b, _ := io.ReadAll(r.Body)
					r.Body.Close()
					body = string(b)
					if r.StatusCode == 200 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("GET through the tunnel: %v %q\n%s", err, body, fwd.stderr.String())
				}
				time.Sleep(300 * time.Millisecond)
			}
			if body != mark {
				t.Fatalf("through the tunnel: %q, want %q", body, mark)
			}
			if _, p, _ := net.SplitHostPort(addr); !strings.HasPrefix(addr, "127.0.0.1:") || p == "0" {
				t.Fatalf("the CLI listens on %s, want 127.0.0.1 and a port", addr)
			}

			// From nowhere else: the host dialling the session's own
			// address, and another session of the same tenant allowed to
			// reach it.
			own := strings.TrimSpace(sessionExec(ctx, t, dev, sid, "addr", "python3", "-c", ownAddress))
			if net.ParseIP(own) == nil {
				t.Fatalf("the session's address: %q", own)
			}
			for _, p := range []string{"8000", "8001"} {
				if c, err := net.DialTimeout("tcp", net.JoinHostPort(own, p), 2*time.Second); err == nil {
					c.Close()
					t.Fatalf("the host reached the session's %s:%s directly", own, p)
				}
			}
			peer := s.forwardSession(t, "dev", class, "--allow", own+"/32:8000,8001")
			got := sessionExec(ctx, t, dev, peer, "peer", "python3", "-c", tryConnect, own+":8000", own+":8001", "127.0.0.1:8000")
			if strings.Contains(got, " ok") {
				t.Fatalf("another session reached this one's servers:\n%s", got)
			}

			// A live connection (echo on 8001, over the API) is cut by the
			// close, and the closed forward carries nothing new.
			open, err := dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8001})
			if err != nil {
				t.Fatal(err)
			}
			fid := open.GetForward().GetForwardId()
			stream, err := forwardStream(ctx, dev, fid)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&authorityv1.ForwardPortRequest{Msg: &authorityv1.ForwardPortRequest_Data{Data: []byte("ping")}}); err != nil {
				t.Fatal(err)
			}
			if m, err := stream.Recv(); err != nil || string(m.GetData()) != "ping" {
				t.Fatalf("echo through the forward: %q, %v", m.GetData(), err)
			}
			// Another tenant's client: as if it did not exist.
			if _, err := other.ClosePortForward(ctx, &authorityv1.ClosePortForwardRequest{ForwardId: fid}); status.Code(err) != codes.NotFound {
				t.Fatalf("another tenant closing it: %v", err)
			}
			if _, err := forwardStream(ctx, other, fid); status.Code(err) != codes.NotFound {
				t.Fatalf("another tenant carrying on it: %v", err)
			}
			closed, err := dev.ClosePortForward(ctx, &authorityv1.ClosePortForwardRequest{ForwardId: fid})
			if err != nil || closed.GetForward().GetState() != authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED {
				t.Fatalf("close: %v, %v", closed, err)
			}
			cut := make(chan error, 1)
			go func() {
				_, err := stream.Recv()
				cut <- err
			}()
			select {
			case err := <-cut:
				if err == nil {
					t.Fatal("the live connection got data after the close, want its end")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the live connection was not cut by the close")
			}
			if _, err := forwardStream(ctx, dev, fid); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("a new connection on the closed forward: %v, want FailedPrecondition", err)
			}
			// The record: one connection, the bytes each way.
			list, err := dev.ListPortForwards(ctx, &authorityv1.ListPortForwardsRequest{SessionId: sid})
			if err != nil {
				t.Fatal(err)
			}
			var rec *authorityv1.PortForward
			for _, f := range list.GetForwards() {
				if f.GetForwardId() == fid {
					rec = f
				}
			}
			if rec == nil || rec.GetConnections() != 1 || rec.GetBytesIn() != 4 || rec.GetBytesOut() != 4 || !strings.Contains(rec.GetCloseReason(), "client/dev") {
				t.Fatalf("the closed forward's record: %v", rec)
			}

			// Ctrl-C closes the CLI's forward, which said what it carried.
			if err := fwd.cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			if code := fwd.exitCode(20 * time.Second); code == -1 {
				t.Fatalf("the CLI did not stop on SIGINT:\n%s", fwd.stderr.String())
			}
			// One HTTP connection (kept alive), its bytes flushed before
			// the close reported them.
			var conns, bin, bout int64
			if m := regexp.MustCompile(`closed: (\d+) connection\(s\), (\d+) byte\(s\) in, (\d+) byte\(s\) out`).FindStringSubmatch(fwd.stderr.String()); m != nil {
				conns, _ = strconv.ParseInt(m[1], 10, 64)
				bin, _ = strconv.ParseInt(m[2], 10, 64)
				bout, _ = strconv.ParseInt(m[3], 10, 64)
			}
			if conns != 1 || bin == 0 || bout < int64(len(mark)) {
				t.Fatalf("the CLI's close, want 1 connection with its bytes: %s", fwd.stderr.String())
			}
			res := s.airlock(t, "session", "forwards", sid, "-o", "json")
			var all authorityv1.ListPortForwardsResponse
			if res.code != 0 || protojson.Unmarshal([]byte(res.stdout), &all) != nil {
				t.Fatalf("session forwards: exit %d\n%s%s", res.code, res.stdout, res.stderr)
			}
			for _, f := range all.GetForwards() {
				if f.GetState() != authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED {
					t.Fatalf("after Ctrl-C, forward %s is %s", f.GetForwardId(), f.GetState())
				}
				if f.GetPort() == 8000 && (f.GetBytesIn() == 0 || f.GetBytesOut() < int64(len(mark))) {
					t.Fatalf("the CLI's forward's record: %v", f)
				}
			}
		})
	}

	t.Run("refusals", func(t *testing.T) {
		sid := s.forwardSession(t, "dev", "runc")
		// A port outside the policy.
		_, err := dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 9000})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "port_forward.ports") {
			t.Fatalf("port 9000: %v", err)
		}
		res := s.airlock(t, "session", "port-forward", sid, "0:22")
		if res.code == 0 || !strings.Contains(res.stderr, "port_forward.ports") {
			t.Fatalf("CLI port 22: exit %d\n%s", res.code, res.stderr)
		}
		// A ttl past max_ttl.
		if _, err := dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000,
			Ttl: durationpb.New(2 * time.Hour)}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_ttl") {
			t.Fatalf("ttl 2h: %v", err)
		}
		// Another tenant's client, whose own policy allows the port.
		if _, err := other.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000}); status.Code(err) != codes.NotFound {
			t.Fatalf("another tenant: %v", err)
		}
		// An approver, a pipeline: not clients.
		for _, as := range []string{"approver/alice", "pipeline/deploy"} {
			c := authorityv1.NewAuthorityServiceClient(s.dial(t, as, "authority"))
			if _, err := c.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000}); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("%s: %v", as, err)
			}
		}
	})

	// A deny-all session reaches nothing outside, the forward open: not the
	// host's addresses (a listener of the test's on every one), not the
	// services, not the CLI's side of the tunnel.
	for _, class := range classes {
		t.Run("deny-all/"+class, func(t *testing.T) {
			sid := s.forwardSession(t, "dev", class)
			startServers(ctx, t, dev, sid, "deny")
			l, err := net.Listen("tcp", ":0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			_, lport, _ := net.SplitHostPort(l.Addr().String())
			fwd := s.startAirlock(t, "session", "port-forward", sid, "0:8000")
			addr := waitLine(t, fwd, 60*time.Second)
			_, cport, _ := net.SplitHostPort(addr)
			targets := []string{"127.0.0.1:" + cport, "127.0.0.1:" + lport}
			for _, ip := range hostAddrs(t) {
				targets = append(targets, net.JoinHostPort(ip, lport), net.JoinHostPort(ip, cport))
			}
			for _, svc := range s.services {
				targets = append(targets, svc.Address)
			}
			got := sessionExec(ctx, t, dev, sid, "out", append([]string{"python3", "-c", tryConnect}, targets...)...)
			for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
				if strings.HasSuffix(line, " ok") {
					t.Fatalf("the deny-all session reached %s\n%s", line, got)
				}
			}
			if n := len(strings.Split(strings.TrimSpace(got), "\n")); n != len(targets) {
				t.Fatalf("%d answers for %d targets:\n%s", n, len(targets), got)
			}
			// The tunnel still works the other way.
			if r, err := http.Get("http://" + addr + "/marker.txt"); err != nil || r.StatusCode != 200 {
				t.Fatalf("the tunnel into the deny-all session: %v", err)
			} else {
				r.Body.Close()
			}
		})
	}

	t.Run("approval", func(t *testing.T) {
		sid := s.forwardSession(t, "gated", "runc")
		startServers(ctx, t, dev, sid, "gated")
		open, err := dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000})
		if err != nil {
			t.Fatal(err)
		}
		f := open.GetForward()
		if f.GetState() != authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING || f.GetApprovalId() == "" {
			t.Fatalf("opened under approval: required: %v", f)
		}
		if _, err := forwardStream(ctx, dev, f.GetForwardId()); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pending") {
			t.Fatalf("a connection while pending: %v", err)
		}
		a := s.airlock(t, "approval", "show", f.GetApprovalId(), "--as", "approver/alice", "-o", "json")
		if a.code != 0 || !strings.Contains(a.stdout, "APPROVAL_KIND_PORT_FORWARD") || !strings.Contains(a.stdout, f.GetForwardId()) ||
			!strings.Contains(a.stdout, `"ttl"`) {
			t.Fatalf("approval show: exit %d\n%s%s", a.code, a.stdout, a.stderr)
		}
		// The requester, as an approver, may not decide it.
		if r := s.airlock(t, "approval", "approve", f.GetApprovalId(), "--as", "approver/dev"); r.code == 0 || !strings.Contains(r.stderr, "may not decide") {
			t.Fatalf("the requester approving: exit %d\n%s", r.code, r.stderr)
		}
		if st := forwardState(ctx, t, dev, sid, f.GetForwardId()); st != authorityv1.PortForwardState_PORT_FORWARD_STATE_PENDING {
			t.Fatalf("after the requester's try: %s", st)
		}
		if r := s.airlock(t, "approval", "approve", f.GetApprovalId(), "--as", "approver/alice"); r.code != 0 {
			t.Fatalf("approve: exit %d\n%s", r.code, r.stderr)
		}
		if st := forwardState(ctx, t, dev, sid, f.GetForwardId()); st != authorityv1.PortForwardState_PORT_FORWARD_STATE_OPEN {
			t.Fatalf("approved: %s", st)
		}
		stream, err := forwardStream(ctx, dev, f.GetForwardId())
		if err != nil {
			t.Fatalf("a connection once approved: %v", err)
		}
		// It carries: an HTTP GET of the marker.
		if err := stream.Send(&authorityv1.ForwardPortRequest{Msg: &authorityv1.ForwardPortRequest_Data{
			Data: []byte("GET /marker.txt HTTP/1.0\r\n\r\n")}}); err != nil {
			t.Fatal(err)
		}
		stream.CloseSend()
		var answer []byte
		for {
			m, err := stream.Recv()
			if err != nil {
				break
			}
			answer = append(answer, m.GetData()...)
		}
		if !strings.HasPrefix(string(answer), "HTTP/1.0 200") || !strings.HasSuffix(string(answer), "gated") {
			t.Fatalf("GET through the approved forward: %q", answer)
		}
		// A pending one closed by its requester withdraws its approval.
		open, err = dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000})
		if err != nil {
			t.Fatal(err)
		}
		w := open.GetForward()
		if _, err := dev.ClosePortForward(ctx, &authorityv1.ClosePortForwardRequest{ForwardId: w.GetForwardId()}); err != nil {
			t.Fatal(err)
		}
		if a := s.airlock(t, "approval", "show", w.GetApprovalId(), "--as", "approver/alice", "-o", "json"); a.code != 0 ||
			!strings.Contains(a.stdout, "APPROVAL_STATE_EXPIRED") {
			t.Fatalf("the closed pending forward's approval: exit %d\n%s%s", a.code, a.stdout, a.stderr)
		}
		// A denied one closes.
		open, err = dev.OpenPortForward(ctx, &authorityv1.OpenPortForwardRequest{SessionId: sid, Port: 8000})
		if err != nil {
			t.Fatal(err)
		}
		g := open.GetForward()
		if r := s.airlock(t, "approval", "deny", g.GetApprovalId(), "--as", "approver/bob", "--comment", "not now"); r.code != 0 {
			t.Fatalf("deny: exit %d\n%s", r.code, r.stderr)
		}
		if st := forwardState(ctx, t, dev, sid, g.GetForwardId()); st != authorityv1.PortForwardState_PORT_FORWARD_STATE_CLOSED {
			t.Fatalf("denied: %s", st)
		}
	})
}

// forwardSession creates a session of tenant under class with the extra
// create flags, as client/dev, and returns its id once it runs.
func (s *stack) forwardSession(t *testing.T, tenant, class string, extra ...string) string {
	t.Helper()
	args := append([]string{"session", "create", "--tenant", tenant, "--repo", "sample", "--rev", "main", "--runtime", class, "--idle-timeout", "10m", "-o", "json"}, extra...)
	res := s.airlock(t, args...)
	if res.code != 0 {
		t.Fatalf("session create: exit %d\n%s", res.code, res.stderr)
	}
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil {
		t.Fatalf("session create -o json: %v\n%s", err, res.stdout)
	}
	return sess.GetJobId()
}

// startServers starts forwardServers in session sid (an exec left
// running) and waits until port 8000 answers inside it.
func startServers(ctx context.Context, t *testing.T, c authorityv1.AuthorityServiceClient, sid, mark string) {
	t.Helper()
	if _, err := c.StartExec(ctx, &authorityv1.StartExecRequest{SessionId: sid, Spec: &typesv1.ExecSpec{ExecId: "servers",
		Argv: []string{"python3", "-c", forwardServers, mark}}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		out := sessionExec(ctx, t, c, sid, fmt.Sprintf("wait-%d", i), "python3", "-c", tryConnect, "127.0.0.1:8000", "127.0.0.1:8001")
		if strings.Count(out, " ok") == 2 {
			return
		}
		if i == 50 {
			t.Fatalf("the servers did not start: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sessionExec runs argv in sid and returns its stdout (status 0).
func sessionExec(ctx context.Context, t *testing.T, c authorityv1.AuthorityServiceClient, sid, execID string, argv ...string) string {
	t.Helper()
	out, err := execWait(ctx, c, sid, execID, argv...)
	if err != nil {
		t.Fatalf("exec %s: %v", execID, err)
	}
	return out
}

// forwardStream opens one connection on forward id and waits for it to be
// made.
func forwardStream(ctx context.Context, c authorityv1.AuthorityServiceClient, id string) (authorityv1.AuthorityService_ForwardPortClient, error) {
	stream, err := c.ForwardPort(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&authorityv1.ForwardPortRequest{Msg: &authorityv1.ForwardPortRequest_ForwardId{ForwardId: id}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if !m.GetConnected() {
		return nil, fmt.Errorf("first message %v, want connected", m)
	}
	return stream, nil
}

func forwardState(ctx context.Context, t *testing.T, c authorityv1.AuthorityServiceClient, sid, id string) authorityv1.PortForwardState {
	t.Helper()
	list, err := c.ListPortForwards(ctx, &authorityv1.ListPortForwardsRequest{SessionId: sid})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range list.GetForwards() {
		if f.GetForwardId() == id {
			return f.GetState()
		}
	}
	t.Fatalf("forward %s not listed", id)
	return 0
}

// waitLine waits for the background command's first stdout line.
func waitLine(t *testing.T, b *background, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if line, err := bufio.NewReader(strings.NewReader(b.stdout.String())).ReadString('\n'); err == nil {
			return strings.TrimSpace(line)
		}
		if time.Now().After(deadline) || b.exitCode(0) != -1 {
			t.Fatalf("no line from %v:\n%s\n%s", b.cmd.Args, b.stdout.String(), b.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hostAddrs are the host's IPv4 addresses but loopback.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok && p.IP.To4() != nil && !p.IP.IsLoopback() {
			out = append(out, p.IP.String())
		}
	}
	return out
}
