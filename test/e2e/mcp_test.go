//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// mcpInspector installs the pinned MCP Inspector (tools/mcpinspector, npm
// ci, cached) and returns the path of its launcher. Without node or npm
// the test skips, and under CI=true fails.
func mcpInspector(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", "../../tools/mcpinspector/install.sh").Output()
	if err != nil {
		msg := fmt.Sprintf("the MCP Inspector could not be installed (tools/mcpinspector/install.sh: %v; it needs node and npm)", err)
		if ee, ok := err.(*exec.ExitError); ok {
			msg += "\n" + string(ee.Stderr)
		}
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return strings.TrimSpace(string(out))
}

// toolResult is what the Inspector prints for tools/call.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent map[string]any `json:"structuredContent"`
	IsError           bool           `json:"isError"`
}

func (r toolResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// inspector runs the MCP Inspector's CLI mode once: target is the server
// (a command, or a URL with its flags) and args the method's.
type inspector struct {
	launcher string
	env      []string
	target   []string
}

func (in inspector) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append(append([]string{in.launcher, "--cli"}, in.target...), args...)...)
	cmd.Env = append(os.Environ(), in.env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// call is tools/call of tool with key=value arguments (values as JSON
// where they parse as JSON); meta, when given, is _meta's key=value.
func (in inspector) call(t *testing.T, tool string, meta []string, args ...string) toolResult {
	t.Helper()
	argv := []string{"--method", "tools/call", "--tool-name", tool}
	for _, a := range args {
		argv = append(argv, "--tool-arg", a)
	}
	for _, m := range meta {
		argv = append(argv, "--tool-metadata", m)
	}
	out, err := in.run(t, argv...)
	if err != nil {
		t.Fatalf("inspector tools/call %s: %v", tool, err)
	}
	var r toolResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("inspector tools/call %s: %v\n%s", tool, err, out)
	}
	return r
}

func (in inspector) ok(t *testing.T, tool string, meta []string, args ...string) toolResult {
	t.Helper()
	r := in.call(t, tool, meta, args...)
	if r.IsError {
		t.Fatalf("%s %v: error: %s", tool, args, r.text())
	}
	return r
}

// TestMCP drives `airlock mcp` with a real MCP client, the MCP Inspector's
// CLI mode, over stdio and over streamable HTTP: an agent's session from
// create to finish, retries, job output as data, and the boundaries (no
// token, another tenant's session, deciding its own approval).
func TestMCP(t *testing.T) {
	launcher := mcpInspector(t)
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.restartService(t, "authority")
	stdio := inspector{launcher: launcher, env: s.env(), target: []string{bin("airlock"), "mcp"}}

	// The tools, over stdio; none approves, publishes or changes a policy.
	out, err := stdio.run(t, "--method", "tools/list")
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var list struct {
		Tools []struct {
			Name        string `json:"name"`
			Description string `json:"description"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("tools/list: %v\n%s", err, out)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		if tool.Name == "run" && (!strings.Contains(tool.Description, "exec_id") || !strings.Contains(tool.Description, "16 KiB")) {
			t.Errorf("run's description does not state its retry rule and bounds: %s", tool.Description)
		}
	}
	slices.Sort(names)
	if want := []string{"create_session", "finish_session", "list_files", "read_file", "run", "session_status", "write_file"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	// The HTTP transport, on loopback with a token.
	tokenFile := filepath.Join(t.TempDir(), "token")
	token := "mcp-test-token-0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := s.airlock(t, "mcp", "--http", "0.0.0.0:0", "--token-file", tokenFile); r.code != 2 || !strings.Contains(r.stderr, "--http") || !strings.Contains(r.stderr, "loopback") {
		t.Errorf("mcp --http 0.0.0.0:0: exit %d, want 2 naming --http and loopback\n%s", r.code, r.stderr)
	}
	url := startMCPHTTP(t, s, tokenFile)
	for _, auth := range []string{"", "Bearer wrong-token-0123456789abcdef", "Basic " + token, token} {
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /mcp with Authorization %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	noToken := inspector{launcher: launcher, target: []string{url, "--transport", "http"}}
	if out, err := noToken.run(t, "--method", "tools/list"); err == nil {
		t.Errorf("the Inspector listed tools without the token:\n%s", out)
	}
	web := inspector{launcher: launcher, target: []string{url, "--transport", "http", "--header", "Authorization: Bearer " + token}}

	// A session, over HTTP.
	r := web.ok(t, "create_session", nil, "repository=sample", "revision=main", "publish_to=sample:main", "idle_timeout=10m")
	id, _ := r.StructuredContent["session_id"].(string)
	if id == "" || r.StructuredContent["state"] != "running" {
		t.Fatalf("create_session: %+v", r)
	}
	run := func(in inspector, meta []string, args ...string) toolResult {
		t.Helper()
		return in.ok(t, "run", meta, append([]string{"session_id=" + id}, args...)...)
	}
	exitCode := func(r toolResult) int {
		c, _ := r.StructuredContent["exit_code"].(float64)
		return int(c)
	}

	// The failing test, then an edit, then the passing test (that one over stdio).
	if r := run(web, nil, `argv=["./test.sh"]`); exitCode(r) != 3 || !strings.Contains(r.StructuredContent["stdout"].(string), "FAIL: greeting is 'hello'") ||
		!strings.Contains(r.text(), "exited with status 3") {
		t.Fatalf("the unedited test: %+v", r)
	}
	web.ok(t, "write_file", nil, "session_id="+id, "path=/work/lib/greet.txt", `content="hello, airlock\n"`)
	if r := web.ok(t, "read_file", nil, "session_id="+id, "path=/work/lib/greet.txt"); !strings.Contains(r.text(), "hello, airlock\n") {
		t.Errorf("read_file after write_file: %q", r.text())
	}
	if r := run(web, nil, "command=cat lib/greet.txt"); r.StructuredContent["stdout"] != "hello, airlock\n" {
		t.Errorf("an exec after write_file reads %q", r.StructuredContent["stdout"])
	}
	if r := run(stdio, nil, `argv=["./test.sh"]`); exitCode(r) != 0 || !strings.Contains(r.StructuredContent["stdout"].(string), "PASS") {
		t.Fatalf("the edited test: %+v", r)
	}
	if r := web.ok(t, "list_files", nil, "session_id="+id, "path=/work/lib"); !strings.Contains(r.text(), "/work/lib/greet.txt") {
		t.Errorf("list_files /work/lib: %s", r.text())
	}

	// Retries run once: the same call with the same progress token (over
	// both transports: a new connection each time), and with the same
	// exec_id; a new call (a new token) runs again.
	appendOnce := "command=echo once >> /work/count.txt"
	first := run(web, []string{"progressToken=retry-1"}, appendOnce)
	again := run(stdio, []string{"progressToken=retry-1"}, appendOnce)
	if first.StructuredContent["exec_id"] != again.StructuredContent["exec_id"] || first.StructuredContent["attached"] != false || again.StructuredContent["attached"] != true ||
		!strings.Contains(again.text(), "not run again") {
		t.Errorf("a retried call: first %+v, retry %+v", first.StructuredContent, again.StructuredContent)
	}
	for range 2 {
		run(web, nil, "exec_id=append-by-id", appendOnce)
	}
	fresh := run(web, []string{"progressToken=retry-2"}, appendOnce)
	if fresh.StructuredContent["exec_id"] == first.StructuredContent["exec_id"] {
		t.Errorf("a new call with a new progress token took the first call's exec %v", fresh.StructuredContent["exec_id"])
	}
	if r := run(web, nil, "command=wc -l < /work/count.txt"); strings.TrimSpace(r.StructuredContent["stdout"].(string)) != "3" {
		t.Errorf("count.txt has %q lines, want 3 (each retried call ran once)", r.StructuredContent["stdout"])
	}

	// Job output is data: no escape sequence or bidi override reaches the
	// model, and a cut is said.
	hostile := run(web, nil, `command=printf '\033[31mred\033]0;title\007 \342\200\256evil\n'; head -c 200000 /dev/zero | tr '\0' x`)
	for _, field := range []string{hostile.StructuredContent["stdout"].(string), hostile.text()} {
		if strings.ContainsAny(field, "\x1b\x07\u202e") || !strings.Contains(field, `⟦\x1b⟧[31mred`) || !strings.Contains(field, `⟦\u202e⟧evil`) {
			t.Errorf("hostile output reached the model as %q", field[:min(len(field), 300)])
		}
	}
	if hostile.StructuredContent["stdout_cut"] != true || !regexp.MustCompile(`\d+ bytes cut here`).MatchString(hostile.text()) {
		t.Errorf("200 KB of output: not cut, or the cut not said: %+v", hostile.StructuredContent["stdout_bytes"])
	}

	// Status with the execs.
	if r := web.ok(t, "session_status", nil, "session_id="+id); !strings.Contains(r.text(), id) || !strings.Contains(r.text(), "append-by-id") || !strings.Contains(r.text(), "egress") {
		t.Errorf("session_status: %s", r.text())
	}

	// Another tenant's session: every tool refuses it, and it ran nothing.
	res := s.airlock(t, "--as", "client/other", "session", "create", "--tenant", "other", "--repo", "sample", "--rev", "main", "-o", "json")
	if res.code != 0 {
		t.Fatalf("other's session create: exit %d\n%s", res.code, res.stderr)
	}
	theirs := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), theirs); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"run", "session_id=" + theirs.GetJobId(), "command=echo intruder > /work/x"},
		{"read_file", "session_id=" + theirs.GetJobId(), "path=/work/README.md"},
		{"write_file", "session_id=" + theirs.GetJobId(), "path=/work/x", "content=intruder"},
		{"list_files", "session_id=" + theirs.GetJobId()},
		{"session_status", "session_id=" + theirs.GetJobId()},
		{"finish_session", "session_id=" + theirs.GetJobId()},
	} {
		if r := web.call(t, c[0], nil, c[1:]...); !r.IsError || strings.Contains(r.text(), "README") {
			t.Errorf("%s on tenant other's session: %+v", c[0], r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/other", "authority"))
	if g, err := other.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: theirs.GetJobId()}); err != nil || g.GetExecsTotal() != 0 || g.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Errorf("tenant other's session after dev's MCP tried it: %v execs, %v, %v", g.GetExecsTotal(), g.GetSession().GetState(), err)
	}

	// Finish: the approval is open, an approver sees it, and the agent's
	// identity cannot decide it.
	r = web.ok(t, "finish_session", nil, "session_id="+id)
	approvalID, _ := r.StructuredContent["approval_id"].(string)
	if approvalID == "" || r.StructuredContent["state"] != "finished" {
		t.Fatalf("finish_session: %+v %s", r.StructuredContent, r.text())
	}
	if again := web.ok(t, "finish_session", nil, "session_id="+id); again.StructuredContent["approval_id"] != approvalID {
		t.Errorf("finish_session again: %+v, want approval %s", again.StructuredContent, approvalID)
	}
	approver := authorityv1.NewAuthorityServiceClient(s.dial(t, "approver/alice", "authority"))
	a, err := approver.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: approvalID})
	if err != nil || a.GetApproval().GetJobId() != id || a.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING {
		t.Fatalf("the approval as approver/alice: %v, %v", a, err)
	}
	agent := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	_, err = agent.DecideApproval(ctx, &authorityv1.DecideApprovalRequest{ApprovalId: approvalID, Decision: authorityv1.Decision_DECISION_APPROVE,
		BundleDigest: a.GetApproval().GetBundleDigest()})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("DecideApproval as the MCP server's identity (client/dev): %v, want PERMISSION_DENIED", err)
	}
	if a, err := approver.GetApproval(ctx, &authorityv1.GetApprovalRequest{ApprovalId: approvalID}); err != nil || a.GetApproval().GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING {
		t.Errorf("the approval after the agent tried to decide it: %v, %v", a.GetApproval().GetState(), err)
	}
}

// startMCPHTTP starts `airlock mcp --http 127.0.0.1:0` and returns its URL.
func startMCPHTTP(t *testing.T, s *stack, tokenFile string) string {
	t.Helper()
	cmd := exec.Command(bin("airlock"), "mcp", "--http", "127.0.0.1:0", "--token-file", tokenFile)
	cmd.Env = append(os.Environ(), s.env()...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stderr)
	}()
	re := regexp.MustCompile(`serving (http://127\.0\.0\.1:\d+/mcp) as client/dev`)
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("airlock mcp --http exited before serving")
			}
			if m := re.FindStringSubmatch(l); m != nil {
				go func() {
					for range lines {
					}
				}()
				return m[1]
			}
		case <-timeout:
			t.Fatal("airlock mcp --http did not say where it serves within 30s")
		}
	}
}
