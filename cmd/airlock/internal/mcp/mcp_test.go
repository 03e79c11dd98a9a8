package mcp

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// execIDForm is the authority's form of an exec id.
var execIDForm = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func TestDerivedID(t *testing.T) {
	args := RunArgs{SessionID: "s1", Command: "go test ./...", Env: map[string]string{"B": "2", "A": "1"}}
	id, derived, err := derivedID("mcp-", "run", "s1", args, "tok-1")
	if err != nil || !derived || !execIDForm.MatchString(id) {
		t.Fatalf("derivedID = %q, %v, %v", id, derived, err)
	}
	// A retry: the same session, arguments (a map built in another order)
	// and progress token give the same id.
	retry := RunArgs{SessionID: "s1", Command: "go test ./...", Env: map[string]string{"A": "1", "B": "2"}}
	if again, _, _ := derivedID("mcp-", "run", "s1", retry, "tok-1"); again != id {
		t.Errorf("the same call again: %q, want %q", again, id)
	}
	// Anything else differing is another exec.
	for name, tc := range map[string]struct {
		scope string
		args  RunArgs
		tok   any
	}{
		"another token":        {"s1", args, "tok-2"},
		"a number token":       {"s1", args, 1},
		"another session":      {"s2", args, "tok-1"},
		"another command":      {"s1", RunArgs{SessionID: "s1", Command: "go test ./pkg", Env: args.Env}, "tok-1"},
		"another cwd":          {"s1", RunArgs{SessionID: "s1", Command: args.Command, Env: args.Env, Cwd: "/work/x"}, "tok-1"},
		"stdin":                {"s1", RunArgs{SessionID: "s1", Command: args.Command, Env: args.Env, Stdin: "y"}, "tok-1"},
		"the token as a scope": {"s1tok-1", args, ""},
	} {
		if other, _, _ := derivedID("mcp-", "run", tc.scope, tc.args, tc.tok); other == id {
			t.Errorf("%s: the same id %q", name, other)
		}
	}
	if a, _, _ := derivedID("mcp-", "create_session", "s1", args, "tok-1"); a == id {
		t.Error("create_session and run share an id for the same arguments")
	}
	// No progress token: a fresh id each call, never one derived.
	a, derivedA, _ := derivedID("mcp-", "run", "s1", args, nil)
	b, _, _ := derivedID("mcp-", "run", "s1", args, nil)
	if derivedA || a == b || !execIDForm.MatchString(a) {
		t.Errorf("without a progress token: %q, %q (derived %v), want two fresh ids", a, b, derivedA)
	}
}

func TestDataEscapesControlSequences(t *testing.T) {
	in := "ok\tgo\n\x1b[31mred\x1b[0m \x1b]0;title\x07 \x9b2J \u202eevil\u202c \u2066x\u2069 zero\u200bwidth \x00 \r over\n"
	out := Data([]byte(in))
	for _, r := range out {
		if r == '\n' || r == '\t' {
			continue
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200b {
			t.Errorf("Data left %U in %q", r, out)
		}
	}
	for _, want := range []string{"ok\tgo\n", `⟦\x1b⟧[31mred`, `⟦\u202e⟧evil`, `⟦\x07⟧`, `⟦\x00⟧`, `⟦\x0d⟧ over`} {
		if !strings.Contains(out, want) {
			t.Errorf("Data(%q) = %q, want it to hold %q", in, out, want)
		}
	}
	if l := Line("a\nb\tc"); strings.ContainsAny(l, "\n\t") {
		t.Errorf("Line kept a newline or tab: %q", l)
	}
}

func TestCaptureCutsAndSaysSo(t *testing.T) {
	small := newCapture(8, 8)
	small.Write([]byte("hello"))
	if s, cut := small.Text(); s != "hello" || cut {
		t.Errorf("a small stream: %q, cut %v", s, cut)
	}
	c := newCapture(10, 10)
	body := "0123456789" + strings.Repeat("é", 50) + "abcdefghij"
	for i := 0; i < len(body); i += 7 {
		c.Write([]byte(body[i:min(i+7, len(body))]))
	}
	s, cut := c.Text()
	if !cut || !strings.HasPrefix(s, "0123456789\n") || !strings.HasSuffix(s, "\nabcdefghij") {
		t.Fatalf("a long stream: %q, cut %v", s, cut)
	}
	if !strings.Contains(s, "[airlock: 100 bytes cut here: this stream had 120 bytes; shown are its first 10 and its last 10]") {
		t.Errorf("the cut is not said exactly: %q", s)
	}
	// Cut inside runes: the ends fall on whole runes, never an escape of
	// half a rune.
	r := newCapture(3, 3)
	r.Write([]byte("ééééé"))
	s, _ = r.Text()
	if !utf8.ValidString(s) || strings.Contains(s, `\x`) || !strings.HasPrefix(s, "é\n") || !strings.HasSuffix(s, "\né") {
		t.Errorf("a cut inside runes: %q", s)
	}
	// The executor's own cap is said too.
	capped := newCapture(8, 8)
	capped.capped = true
	if _, cut := capped.Text(); !cut {
		t.Error("a stream the executor capped is not reported cut")
	}
}

func TestCheckLoopback(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:0", "127.0.0.1:8080", "[::1]:0"} {
		if err := CheckLoopback(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"0.0.0.0:80", ":8080", "[::]:0", "10.0.0.1:80", "localhost:80", "127.0.0.2:80", "example.com:80", "127.0.0.1"} {
		err := CheckLoopback(bad)
		if err == nil || !strings.Contains(err.Error(), "--http") {
			t.Errorf("%s: %v, want a refusal naming --http", bad, err)
		}
	}
}

func TestToken(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(TokenEnv, "")
	file := filepath.Join(dir, "tok")
	os.WriteFile(file, []byte("  from-file-0123456789  \nsecond line\n"), 0o600)
	if tok, gen, err := Token(file); err != nil || gen || tok != "from-file-0123456789" {
		t.Errorf("Token(file) = %q, %v, %v", tok, gen, err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, _, err := Token(short); err == nil {
		t.Error("a 3-character token was taken")
	}
	if _, _, err := Token(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("a missing file: %v", err)
	}
	t.Setenv(TokenEnv, "from-env-0123456789")
	if tok, gen, err := Token(""); err != nil || gen || tok != "from-env-0123456789" {
		t.Errorf("Token from $%s = %q, %v, %v", TokenEnv, tok, gen, err)
	}
	t.Setenv(TokenEnv, "")
	a, genA, _ := Token("")
	b, _, _ := Token("")
	if !genA || a == b || len(a) < 32 {
		t.Errorf("generated tokens %q, %q", a, b)
	}
}

// TestHTTPRequiresToken: the HTTP transport answers 401 to a request
// without the bearer token, or with any other, before MCP sees it; with it,
// a real MCP client lists the tools.
func TestHTTPRequiresToken(t *testing.T) {
	const token = "the-token-0123456789abcdef"
	s := New(Options{})
	srv := httptest.NewServer(Handler(s, token))
	defer srv.Close()
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "bearer " + token, "Basic " + token, token, "Bearer " + token + "x", "Bearer " + token[:len(token)-1]} {
		req, _ := http.NewRequest("POST", srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
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
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d, want 401 with WWW-Authenticate", auth, resp.StatusCode)
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	ctx := context.Background()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{token}}}, nil)
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 7 {
		t.Fatalf("ListTools with the token: %v, %v", tools, err)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestRunRefusesBadArguments: each is refused, naming the argument, before
// any call to the authority (the tools here have none).
func TestRunRefusesBadArguments(t *testing.T) {
	tl := &tools{}
	for want, a := range map[string]RunArgs{
		"session_id":      {Command: "ls"},
		"give one":        {SessionID: "s", Command: "ls", Argv: []string{"ls"}},
		"command or argv": {SessionID: "s"},
		"stdin":           {SessionID: "s", Command: "cat", Stdin: strings.Repeat("x", stdinMax+1)},
		"timeout_seconds": {SessionID: "s", Argv: []string{"ls"}, TimeoutSeconds: -1},
	} {
		if _, _, err := tl.run(context.Background(), nil, a); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}

// TestHTTPRefusesWebPages: a browser page on another site (its Origin, or
// Sec-Fetch-Site cross-site), or one reaching the loopback port through a
// DNS-rebound name (its Host), is refused with 403 even with the token; a
// body over the bound gets 413; a local client without Origin is served.
func TestHTTPRefusesWebPages(t *testing.T) {
	const token = "the-token-0123456789abcdef"
	srv := httptest.NewServer(Handler(New(Options{}), token))
	defer srv.Close()
	hostport := strings.TrimPrefix(srv.URL, "http://")
	post := func(body string, h map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		for k, v := range h {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for name, h := range map[string]map[string]string{
		"another site's Origin":        {"Origin": "https://evil.example"},
		"a rebound name as Origin":     {"Origin": "http://evil.example:" + strings.Split(hostport, ":")[1]},
		"Origin null":                  {"Origin": "null"},
		"Origin https on the port":     {"Origin": "https://" + hostport},
		"Sec-Fetch-Site cross-site":    {"Sec-Fetch-Site": "cross-site"},
		"Sec-Fetch-Site same-site":     {"Sec-Fetch-Site": "same-site"},
		"a DNS-rebound Host":           {"Host": "evil.example:" + strings.Split(hostport, ":")[1]},
		"a rebound Host and Origin":    {"Host": "evil.example", "Origin": "http://evil.example"},
		"Origin of another local port": {"Origin": "http://127.0.0.1:1"},
	} {
		if code := post(initialize, h); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
	}
	for name, h := range map[string]map[string]string{
		"no Origin":       nil,
		"its own Origin":  {"Origin": "http://" + hostport},
		"same-origin":     {"Sec-Fetch-Site": "same-origin"},
		"a user's direct": {"Sec-Fetch-Site": "none"},
	} {
		if code := post(initialize, h); code != http.StatusOK {
			t.Errorf("%s: %d, want 200", name, code)
		}
	}
	big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"` + strings.Repeat("x", maxBody) + `"}}`
	if code := post(big, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over %d bytes: %d, want 413", maxBody, code)
	}
}

// refusing is an authority that refuses every call a tool makes
// (NotFound, its message carrying an escape sequence as a job's text
// could).
type refusing struct {
	authorityv1.AuthorityServiceClient
}

var errRefused = status.Error(codes.NotFound, "session \x1b[2Jnot found")

func (refusing) CreateSession(context.Context, *authorityv1.CreateSessionRequest, ...grpc.CallOption) (*authorityv1.CreateSessionResponse, error) {
	return nil, errRefused
}
func (refusing) GetSession(context.Context, *authorityv1.GetSessionRequest, ...grpc.CallOption) (*authorityv1.GetSessionResponse, error) {
	return nil, errRefused
}
func (refusing) FinishSession(context.Context, *authorityv1.FinishSessionRequest, ...grpc.CallOption) (*authorityv1.FinishSessionResponse, error) {
	return nil, errRefused
}
func (refusing) ListFiles(context.Context, *authorityv1.ListFilesRequest, ...grpc.CallOption) (*authorityv1.ListFilesResponse, error) {
	return nil, errRefused
}
func (refusing) ReadFile(context.Context, *authorityv1.ReadFileRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[authorityv1.ReadFileResponse], error) {
	return nil, errRefused
}
func (refusing) WriteFile(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[authorityv1.WriteFileRequest, authorityv1.WriteFileResponse], error) {
	return nil, errRefused
}
func (refusing) RunExec(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[authorityv1.RunExecRequest, authorityv1.RunExecResponse], error) {
	return nil, errRefused
}

// TestToolsTakeAnyArguments calls every tool through a real MCP client
// with arguments of every JSON shape (missing, null, wrong types, huge and
// negative numbers, control characters, nested junk): none panics, each
// call ends in an error result or a protocol error with a message, and no
// escape sequence reaches the client.
func TestToolsTakeAnyArguments(t *testing.T) {
	s := New(Options{
		Authority: refusing{},
		Tenant:    func(arg string) (string, error) { return cmp.Or(arg, "dev"), nil },
		SessionSpec: func(a CreateSessionArgs) (*authorityv1.JobSpec, error) {
			return &authorityv1.JobSpec{Repository: a.Repository}, nil
		},
		SessionText: func(context.Context, string) (string, error) { return "", errRefused },
	})
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fuzz", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	values := []any{nil, "", "s1", "\x1b[31m\u202e\x00", strings.Repeat("é", 5000), -1, 0, 1.5, 1e308, -1e308, int64(math.MaxInt64), true,
		[]any{}, []any{nil, 1, "x"}, map[string]any{}, map[string]any{"a": []any{map[string]any{}}}}
	rng := rand.New(rand.NewPCG(26, 1))
	for _, tool := range tools.Tools {
		schema, _ := tool.InputSchema.(map[string]any)
		props, _ := schema["properties"].(map[string]any)
		var names []string
		for n := range props {
			names = append(names, n)
		}
		slices.Sort(names)
		names = append(names, "unknown_argument")
		for i := range 60 {
			args := map[string]any{}
			for _, n := range names {
				if rng.IntN(3) > 0 {
					args[n] = values[rng.IntN(len(values))]
				}
			}
			if i == 0 {
				args = nil
			}
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool.Name, Arguments: args})
			if err != nil {
				if err.Error() == "" {
					t.Errorf("%s %v: an empty error", tool.Name, args)
				}
				continue
			}
			var text strings.Builder
			for _, c := range r.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					text.WriteString(tc.Text)
				}
			}
			if !r.IsError || text.Len() == 0 {
				t.Errorf("%s %v: not an error with a message (the authority refuses everything): %+v", tool.Name, args, r)
			}
			if strings.ContainsAny(text.String(), "\x1b\u202e\x00") {
				t.Errorf("%s %v: a control sequence in %q", tool.Name, args, text.String())
			}
		}
	}
}

// TestToolErrorsNameTheArgument: a missing or out-of-range argument is
// refused naming it, before any call to the authority.
func TestToolErrorsNameTheArgument(t *testing.T) {
	tl := &tools{}
	ctx := context.Background()
	for want, call := range map[string]func() error{
		"read_file session_id": func() error { _, _, err := tl.readFile(ctx, nil, ReadFileArgs{Path: "/work/x"}); return err },
		"read_file path":       func() error { _, _, err := tl.readFile(ctx, nil, ReadFileArgs{SessionID: "s"}); return err },
		"read_file max_bytes": func() error {
			_, _, err := tl.readFile(ctx, nil, ReadFileArgs{SessionID: "s", Path: "/work/x", MaxBytes: -1})
			return err
		},
		"write_file path": func() error { _, _, err := tl.writeFile(ctx, nil, WriteFileArgs{SessionID: "s"}); return err },
		"write_file mode": func() error {
			_, _, err := tl.writeFile(ctx, nil, WriteFileArgs{SessionID: "s", Path: "/work/x", Mode: 0o10000})
			return err
		},
		"list_files session_id":     func() error { _, _, err := tl.listFiles(ctx, nil, ListFilesArgs{}); return err },
		"session_status session_id": func() error { _, _, err := tl.sessionStatus(ctx, nil, SessionIDArgs{}); return err },
		"finish_session session_id": func() error { _, _, err := tl.finishSession(ctx, nil, SessionIDArgs{}); return err },
		"run timeout_seconds": func() error {
			_, _, err := tl.run(ctx, nil, RunArgs{SessionID: "s", Command: "ls", TimeoutSeconds: math.MaxInt64})
			return err
		},
	} {
		arg := want[strings.IndexByte(want, ' ')+1:]
		if err := call(); err == nil || !strings.Contains(err.Error(), arg) {
			t.Errorf("%s: %v, want an error naming %s", want, err, arg)
		}
	}
}

// TestSessionStatusIsData: a status text holding a raw escape sequence (a
// field the CLI's writers missed) reaches the model escaped; an escaped
// one passes unchanged.
func TestSessionStatusIsData(t *testing.T) {
	for in, want := range map[string]string{
		"egress\tevil.example\x1b]0;t\x07\n": "egress\tevil.example⟦\\x1b⟧]0;t⟦\\x07⟧\n",
		"name ⟦\\x1b⟧ kept\n":                "name ⟦\\x1b⟧ kept\n",
	} {
		tl := &tools{o: Options{SessionText: func(context.Context, string) (string, error) { return in, nil }}}
		r, _, err := tl.sessionStatus(context.Background(), nil, SessionIDArgs{SessionID: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Content[0].(*mcp.TextContent).Text; got != want {
			t.Errorf("session_status of %q: %q, want %q", in, got, want)
		}
	}
}
