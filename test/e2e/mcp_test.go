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

	"github.com/modelcontextprotocol/go-sdk/mcp"
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

// TestMCP drives `airlock mcp` with real MCP clients nobody here wrote:
// the MCP Inspector's CLI mode (one process per call) through the issue's
// flow, list-tools, a session, a failing and a passing test run, a file
// edit, finish, and a retry on a new connection; and the Go SDK's client
// (one MCP session over HTTP) for the rest: the edit read back, exec_id
// retries, job output as data, status, and the boundaries (no token,
// another tenant's session, deciding its own approval). No fixed sleeps:
// each step waits for what it needs.
func TestMCP(t *testing.T) {
	began := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	launcher := mcpInspector(t)
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.restartService(t, "authority")
	step("stack up, tenant other added")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Tenant other's session, created meanwhile, tried later.
	theirsCmd := exec.CommandContext(ctx, bin("airlock"), "--as", "client/other", "session", "create", "--tenant", "other", "--repo", "sample", "--rev", "main", "-o", "json")
	theirsCmd.Env = append(os.Environ(), s.env()...)
	var theirsOut, theirsErr strings.Builder
	theirsCmd.Stdout, theirsCmd.Stderr = &theirsOut, &theirsErr
	if err := theirsCmd.Start(); err != nil {
		t.Fatal(err)
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
	for _, h := range []map[string]string{
		{}, {"Authorization": "Bearer wrong-token-0123456789abcdef"}, {"Authorization": "Basic " + token}, {"Authorization": token},
		// A page on another site, even one that knew the token.
		{"Authorization": "Bearer " + token, "Origin": "https://evil.example"},
	} {
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusUnauthorized
		if h["Origin"] != "" {
			want = http.StatusForbidden
		}
		if resp.StatusCode != want {
			t.Errorf("POST /mcp with %v: %d, want %d", h, resp.StatusCode, want)
		}
	}
	web := inspector{launcher: launcher, target: []string{url, "--transport", "http", "--header", "Authorization: Bearer " + token}}
	stdio := inspector{launcher: launcher, env: s.env(), target: []string{bin("airlock"), "mcp"}}

	// The tools, through the Inspector over stdio; none approves,
	// publishes or changes a policy.
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
		if tool.Name == "run" && (!strings.Contains(tool.Description, "exec_id") || !strings.Contains(tool.Description, "progressToken") || !strings.Contains(tool.Description, "16 KiB")) {
			t.Errorf("run's description does not state its retry rule and bounds: %s", tool.Description)
		}
	}
	slices.Sort(names)
	if want := []string{"create_session", "finish_session", "list_files", "read_file", "run", "session_status", "write_file"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	step("tools/list over stdio")

	// A session, through the Inspector over HTTP.
	r := web.ok(t, "create_session", nil, "repository=sample", "revision=main", "publish_to=sample:main", "idle_timeout=10m")
	id, _ := r.StructuredContent["session_id"].(string)
	if id == "" || r.StructuredContent["state"] != "running" {
		t.Fatalf("create_session: %+v", r)
	}
	step("create_session")
	exitCode := func(r toolResult) int {
		c, _ := r.StructuredContent["exit_code"].(float64)
		return int(c)
	}

	// The failing test, the edit, the passing test (that one over stdio),
	// through the Inspector.
	if r := web.ok(t, "run", nil, "session_id="+id, `argv=["./test.sh"]`); exitCode(r) != 3 || !strings.Contains(r.StructuredContent["stdout"].(string), "FAIL: greeting is 'hello'") ||
		!strings.Contains(r.text(), "exited with status 3") {
		t.Fatalf("the unedited test: %+v", r)
	}
	web.ok(t, "write_file", nil, "session_id="+id, "path=/work/lib/greet.txt", `content="hello, airlock\n"`)
	if r := stdio.ok(t, "run", nil, "session_id="+id, `argv=["./test.sh"]`); exitCode(r) != 0 || !strings.Contains(r.StructuredContent["stdout"].(string), "PASS") {
		t.Fatalf("the edited test: %+v", r)
	}
	step("failing run, write_file, passing run")

	// A retry on a new connection: the same call with the same progress
	// token, first over HTTP, then over stdio, runs once.
	appendOnce := "command=echo once >> /work/count.txt"
	first := web.ok(t, "run", []string{"progressToken=retry-1"}, "session_id="+id, appendOnce)
	again := stdio.ok(t, "run", []string{"progressToken=retry-1"}, "session_id="+id, appendOnce)
	if first.StructuredContent["exec_id"] != again.StructuredContent["exec_id"] || first.StructuredContent["attached"] != false || again.StructuredContent["attached"] != true ||
		!strings.Contains(again.text(), "not run again") {
		t.Errorf("a retried call: first %+v, retry %+v", first.StructuredContent, again.StructuredContent)
	}
	step("a retried call through the Inspector")

	// The rest through one session of the Go SDK's client over HTTP.
	cs := mcpClient(t, ctx, url, token)
	call := func(tool string, meta mcp.Meta, args map[string]any) (*mcp.CallToolResult, string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Meta: meta, Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s %v: %v", tool, args, err)
		}
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return res, b.String()
	}
	run := func(meta mcp.Meta, args map[string]any) (map[string]any, string) {
		t.Helper()
		args["session_id"] = id
		res, text := call("run", meta, args)
		if res.IsError {
			t.Fatalf("run %v: %s", args, text)
		}
		sc, _ := res.StructuredContent.(map[string]any)
		return sc, text
	}
	if res, text := call("read_file", nil, map[string]any{"session_id": id, "path": "/work/lib/greet.txt"}); res.IsError || !strings.Contains(text, "hello, airlock\n") {
		t.Errorf("read_file after write_file: %q", text)
	}
	if res, text := call("list_files", nil, map[string]any{"session_id": id, "path": "/work/lib"}); res.IsError || !strings.Contains(text, "/work/lib/greet.txt") {
		t.Errorf("list_files /work/lib: %s", text)
	}
	for range 2 {
		run(nil, map[string]any{"exec_id": "append-by-id", "command": "echo once >> /work/count.txt"})
	}
	if fresh, _ := run(mcp.Meta{"progressToken": "retry-2"}, map[string]any{"command": "echo once >> /work/count.txt"}); fresh["exec_id"] == first.StructuredContent["exec_id"] {
		t.Errorf("a new call with a new progress token took the first call's exec %v", fresh["exec_id"])
	}
	if sc, _ := run(nil, map[string]any{"command": "wc -l < /work/count.txt"}); strings.TrimSpace(sc["stdout"].(string)) != "3" {
		t.Errorf("count.txt has %q lines, want 3 (each retried call ran once)", sc["stdout"])
	}

	// Job output is data: no escape sequence or bidi override reaches the
	// model, and a cut is said.
	hostile, text := run(nil, map[string]any{"command": `printf '\033[31mred\033]0;title\007 \342\200\256evil\n'; head -c 200000 /dev/zero | tr '\0' x`})
	for _, field := range []string{hostile["stdout"].(string), text} {
		if strings.ContainsAny(field, "\x1b\x07\u202e") || !strings.Contains(field, `⟦\x1b⟧[31mred`) || !strings.Contains(field, `⟦\u202e⟧evil`) {
			t.Errorf("hostile output reached the model as %q", field[:min(len(field), 300)])
		}
	}
	if hostile["stdout_cut"] != true || !regexp.MustCompile(`\d+ bytes cut here`).MatchString(text) {
		t.Errorf("200 KB of output: not cut, or the cut not said: %v", hostile["stdout_bytes"])
	}
	if res, text := call("session_status", nil, map[string]any{"session_id": id}); res.IsError || !strings.Contains(text, id) || !strings.Contains(text, "append-by-id") || !strings.Contains(text, "egress") {
		t.Errorf("session_status: %s", text)
	}
	step("read, list, exec_id retries, hostile output, status")

	// Another tenant's session: every tool refuses it, and it ran nothing.
	if err := theirsCmd.Wait(); err != nil {
		t.Fatalf("other's session create: %v\n%s", err, theirsErr.String())
	}
	theirs := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(theirsOut.String()), theirs); err != nil {
		t.Fatal(err)
	}
	tid := theirs.GetJobId()
	for tool, args := range map[string]map[string]any{
		"run":            {"session_id": tid, "command": "echo intruder > /work/x"},
		"read_file":      {"session_id": tid, "path": "/work/README.md"},
		"write_file":     {"session_id": tid, "path": "/work/x", "content": "intruder"},
		"list_files":     {"session_id": tid},
		"session_status": {"session_id": tid},
		"finish_session": {"session_id": tid},
	} {
		if res, text := call(tool, nil, args); !res.IsError || strings.Contains(text, "README") {
			t.Errorf("%s on tenant other's session: %s", tool, text)
		}
	}
	// Nor can the agent open a session in tenant other, or one whose
	// network reaches past the dev tenant's policy (no egress domains).
	for what, args := range map[string]map[string]any{
		"a session in tenant other":          {"repository": "sample", "tenant": "other"},
		"a domain outside the tenant policy": {"repository": "sample", "allow_domains": []string{"evil.example"}},
	} {
		if res, text := call("create_session", nil, args); !res.IsError {
			t.Errorf("create_session of %s: not refused: %s", what, text)
		}
	}
	other := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/other", "authority"))
	if g, err := other.GetSession(ctx, &authorityv1.GetSessionRequest{SessionId: tid}); err != nil || g.GetExecsTotal() != 0 || g.GetSession().GetState() != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Errorf("tenant other's session after dev's MCP tried it: %v execs, %v, %v", g.GetExecsTotal(), g.GetSession().GetState(), err)
	}
	step("tenant other's session refused")

	// Finish, through the Inspector: the approval is open, an approver
	// sees it, and the agent's identity cannot decide it.
	r = web.ok(t, "finish_session", nil, "session_id="+id)
	approvalID, _ := r.StructuredContent["approval_id"].(string)
	if approvalID == "" || r.StructuredContent["state"] != "finished" {
		t.Fatalf("finish_session: %+v %s", r.StructuredContent, r.text())
	}
	if res, _ := call("finish_session", nil, map[string]any{"session_id": id}); res.IsError || res.StructuredContent.(map[string]any)["approval_id"] != approvalID {
		t.Errorf("finish_session again: %+v, want approval %s", res.StructuredContent, approvalID)
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
	step("finish, the approval pending and not the agent's to decide")

	// Without the token the Inspector gets nothing.
	noToken := inspector{launcher: launcher, target: []string{url, "--transport", "http"}}
	if out, err := noToken.run(t, "--method", "tools/list"); err == nil {
		t.Errorf("the Inspector listed tools without the token:\n%s", out)
	}
	step("no token refused")
}

// mcpClient is one session of the Go SDK's MCP client on url with the
// bearer token, closed when the test ends.
func mcpClient(t *testing.T, ctx context.Context, url, token string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultTransport.RoundTrip(r)
	})}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "airlock-e2e", Version: "v0"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("the Go SDK's MCP client on %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

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
