//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// chromiumPath is Debian's chromium, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

// The hostile payloads: each, if the page ever treated it as HTML or
// script, would set window.__pwned or open a dialog.
const (
	payloadHTML = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2;alert(2)"><a href="javascript:window.__pwned=3">click me</a>`
	payloadBidi = "\u202eevil\x1b[31mred\x1b]52;c;cHduZWQ=\x07"
	// A file name can hold no slash: the script tag stays unclosed.
	payloadName = `<img src=x onerror=window.__pwned=4>` + "\u202e" + `<script>alert(5)<script>.sh`
)

// console is one running airlock console and the URL it printed.
type consoleProc struct {
	url    string
	origin string
}

// startConsole runs airlock console --as as on the stack until the test ends.
func (s *stack) startConsole(t *testing.T, as string) *consoleProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin("airlock"), "console", "--as", as)
	cmd.Env = append(cmd.Environ(), s.env()...)
	cmd.WaitDelay = 5 * time.Second
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string, 4)
	go func() {
		var buf bytes.Buffer
		io.Copy(&lineSplitter{buf: &buf, out: lines}, out)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	re := regexp.MustCompile(`open (http://127\.0\.0\.1:\d+/\?token=[0-9a-f]{64})\n`)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			if m := re.FindStringSubmatch(l); m != nil {
				u, _ := url.Parse(m[1])
				return &consoleProc{url: m[1], origin: "http://" + u.Host}
			}
		case err := <-done:
			t.Fatalf("airlock console --as %s exited: %v\n%s", as, err, stderr.String())
		case <-deadline:
			t.Fatalf("airlock console --as %s printed no URL in 30s\n%s", as, stderr.String())
		}
	}
}

// lineSplitter sends each complete line written to it on out.
type lineSplitter struct {
	buf *bytes.Buffer
	out chan<- string
}

func (l *lineSplitter) Write(p []byte) (int, error) {
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf.Next(i + 1))
		select {
		case l.out <- line:
		default:
		}
	}
}

// browser starts a headless chromium with a fresh profile; a missing
// chromium skips the test, or fails it under CI.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium: %v (.ci/run installs Debian's chromium)", err)
		}
		t.Skipf("chromium: %v (apt-get install chromium)", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// tab is a browser tab that counts the JavaScript dialogs opened in it.
type tab struct {
	ctx     context.Context
	dialogs atomic.Int32
}

func newTab(t *testing.T, bctx context.Context) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(bctx)
	t.Cleanup(cancel)
	tb := &tab{ctx: ctx}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			tb.dialogs.Add(1)
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return tb
}

// run runs actions with a time limit, failing the test on error.
func (tb *tab) run(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		loc, _ := chromedp.Run(tb.ctx, chromedp.Location())
		body, _ := chromedp.Run(tb.ctx, chromedp.Evaluate[string](`document.body.getAttribute("data-page") + "\n" + document.body.innerText.slice(0, 3000)`))
		t.Fatalf("%s: %v (at %s; the page:\n%s)", what, err, loc, body)
	}
}

// waitFor waits until the JavaScript expression is true.
func waitFor(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr)(ctx, t)
		return err
	})
}

// waitShown waits until the first element sel matches is in the page and
// shown.
func waitShown(sel string) chromedp.Action[chromedp.Void] {
	return waitFor(`(e => !!e && !e.hidden && e.getClientRects().length > 0)(document.querySelector(` + strconv.Quote(sel) + `))`)
}

// goTo moves the page to a route of its own (#/approval/ID, #/audit/JOB)
// as a click on its links does: the page stays, the script renders anew.
func goTo(route string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](`document.body.removeAttribute("data-page"); location.hash = `+strconv.Quote("#"+route)+`; true`)(ctx, t)
		return err
	})
}

// get runs one action that returns a value.
func get[T any](t *testing.T, tb *tab, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// text is the text of the first element sel matches.
func (tb *tab) text(t *testing.T, sel string) string {
	t.Helper()
	return get(t, tb, "the text of "+sel, chromedp.Evaluate[string](`document.querySelector(`+strconv.Quote(sel)+`).innerText`))
}

// untouched checks that nothing the page showed ran: no sentinel set, no
// dialog, no image or script element or javascript: link from the data.
func (tb *tab) untouched(t *testing.T, where string) {
	t.Helper()
	pwned := get(t, tb, where, chromedp.Evaluate[string](`typeof window.__pwned === "undefined" ? "unset" : String(window.__pwned)`))
	imgs := get(t, tb, where, chromedp.Evaluate[int](`document.images.length`))
	scripts := get(t, tb, where, chromedp.Evaluate[int](`document.scripts.length`))
	jsLinks := get(t, tb, where, chromedp.Evaluate[int](`Array.from(document.querySelectorAll("a")).filter(a => !(a.getAttribute("href") || "").startsWith("#/")).length`))
	if pwned != "unset" || tb.dialogs.Load() != 0 || imgs != 0 || scripts != 1 || jsLinks != 0 {
		t.Errorf("%s: window.__pwned %s, %d dialogs, %d images, %d scripts (want 1, the console's), %d links off the page", where, pwned, tb.dialogs.Load(), imgs, scripts, jsLinks)
	}
}

// shot writes a screenshot of the page to the artifacts directory, and to
// docs/console when AIRLOCK_UPDATE_SCREENSHOTS=1.
func (tb *tab) shot(t *testing.T, name string) {
	t.Helper()
	png := get(t, tb, "screenshot "+name, chromedp.FullScreenshot(100))
	dir := os.Getenv("AIRLOCK_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "airlock-artifacts")
	}
	dirs := []string{filepath.Join(dir, "console")}
	if os.Getenv("AIRLOCK_UPDATE_SCREENSHOTS") == "1" {
		dirs = append(dirs, filepath.Join("..", "..", "docs", "console"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshot %s in %s", name, strings.Join(dirs, ", "))
}

// publishApproval runs a job that edits the sample and returns its
// approval's id and job id.
func publishApproval(t *testing.T, s *stack, script string) (approval, job string) {
	t.Helper()
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--publish-to", "sample:main", "--wait", "-o", "json", "--", "sh", "-c", script)
	if res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	var j struct {
		JobID string `json:"jobId"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &j); err != nil {
		t.Fatal(err)
	}
	id := s.job(t, j.JobID).GetApprovalId()
	if id == "" {
		t.Fatalf("no approval for job %s", j.JobID)
	}
	return id, j.JobID
}

// getApproval reads an approval through the API as approver/alice.
func getApproval(t *testing.T, s *stack, id string) *authorityv1.Approval {
	t.Helper()
	res := s.airlock(t, "approval", "show", id, "--as", "approver/alice", "-o", "json")
	resp := &authorityv1.GetApprovalResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), resp); err != nil || res.code != 0 {
		t.Fatalf("approval show %s: exit %d %v\n%s", id, res.code, err, res.stderr)
	}
	return resp.GetApproval()
}

// TestConsole drives airlock console in a real browser against the real
// stack: the approve flow by clicking, the requester's own approval
// refused on the page, a denial with a comment, hostile content shown as
// text and running nothing, and requests without the token, from another
// Host or without the CSRF header refused.
func TestConsole(t *testing.T) {
	bctx := browser(t)
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)

	// A session whose exec argv, output, file name and patch carry the
	// payloads.
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--idle-timeout", "5m", "--publish-to", "sample:main", "-o", "json")
	sess := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(res.stdout), sess); err != nil || res.code != 0 {
		t.Fatalf("session create: exit %d %v\n%s", res.code, err, res.stderr)
	}
	script := `printf '%s\n%s\n' "$1" "$2" > hostile.txt; printf 'x\n' > "$3"; printf 'out: %s %s\n' "$1" "$2"; printf 'err: %s\n' "$2" >&2`
	if r := s.airlock(t, "session", "exec", sess.GetJobId(), "--exec-id", "hostile", "--", "sh", "-c", script, "sh", payloadHTML, payloadBidi, payloadName); r.code != 0 {
		t.Fatalf("hostile exec: exit %d\n%s", r.code, r.stderr)
	}
	if r := s.airlock(t, "session", "finish", sess.GetJobId()); r.code != 0 {
		t.Fatalf("session finish: exit %d\n%s", r.code, r.stderr)
	}
	hostileID := s.job(t, sess.GetJobId()).GetApprovalId()
	if hostileID == "" {
		t.Fatal("the hostile session has no approval")
	}
	approveID, approveJob := publishApproval(t, s, `printf 'hello, console\n' > lib/greet.txt`)
	denyID, _ := publishApproval(t, s, `printf 'deny me\n' > lib/greet.txt`)
	bigID, _ := publishApproval(t, s, `seq 1 20000 > big.txt`)

	alice := s.startConsole(t, "approver/alice")
	dev := s.startConsole(t, "approver/dev")

	t.Run("refused without the token", func(t *testing.T) {
		// Only on loopback, only as an approver.
		if r := s.airlock(t, "console", "--as", "approver/alice", "--listen", "0.0.0.0:0"); r.code != 2 || !strings.Contains(r.stderr, `--listen "0.0.0.0:0": the console listens on loopback only`) {
			t.Errorf("console on 0.0.0.0: exit %d\n%s", r.code, r.stderr)
		}
		if r := s.airlock(t, "console", "--as", "client/dev"); r.code != 2 || !strings.Contains(r.stderr, "pass --as approver/NAME") {
			t.Errorf("console as client/dev: exit %d\n%s", r.code, r.stderr)
		}
		noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
		for _, path := range []string{"/", "/api/approvals", "/api/approvals/" + approveID, "/static/app.js", "/?token=" + strings.Repeat("0", 64)} {
			resp, err := noRedirect.Get(alice.origin + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s without the token: %d, want 401", path, resp.StatusCode)
			}
		}
		// The token buys a cookie and a redirect that drops it.
		resp, err := noRedirect.Get(alice.url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		cookies := resp.Cookies()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(cookies) != 1 ||
			!cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
			t.Fatalf("GET with the token: %d, Location %q, cookies %+v", resp.StatusCode, resp.Header.Get("Location"), cookies)
		}
		with := func(method, path, host string, body io.Reader, hdr map[string]string) int {
			req, _ := http.NewRequest(method, alice.origin+path, body)
			req.AddCookie(cookies[0])
			if host != "" {
				req.Host = host
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if c := with("GET", "/api/approvals", "", nil, nil); c != http.StatusOK {
			t.Errorf("GET with the cookie: %d, want 200", c)
		}
		u, _ := url.Parse(alice.origin)
		if c := with("GET", "/api/approvals", "attacker.example:"+u.Port(), nil, nil); c != http.StatusForbidden {
			t.Errorf("GET with a rebinding Host: %d, want 403", c)
		}
		decide := `{"decision":"approve","digest":"sha256:00","comment":""}`
		if c := with("POST", "/api/approvals/"+approveID+"/decide", "", strings.NewReader(decide), map[string]string{"Content-Type": "application/json"}); c != http.StatusForbidden {
			t.Errorf("POST without the CSRF header: %d, want 403", c)
		}
		if c := with("GET", "/api/approvals/"+approveID+"/decide", "", nil, nil); c != http.StatusMethodNotAllowed {
			t.Errorf("GET of a mutation: %d, want 405", c)
		}
		// In the browser: the page without the token is refused.
		tb := newTab(t, bctx)
		var body string
		tb.run(t, "the page without the token", chromedp.Navigate(alice.origin+"/"))
		body = tb.text(t, "body")
		if !strings.Contains(body, "unauthorized") {
			t.Errorf("the page without the token shows %q", body)
		}
		tb.shot(t, "unauthorized")
	})

	tb := newTab(t, bctx)
	t.Run("list", func(t *testing.T) {
		var loc, text string
		tb.run(t, "the list", chromedp.Navigate(alice.url), waitShown(`body[data-page="list"] #approvals`))
		loc = get(t, tb, "location", chromedp.Location())
		text = tb.text(t, "#approvals")
		if strings.Contains(loc, "token") {
			t.Errorf("the token stays in the URL: %s", loc)
		}
		for _, id := range []string{hostileID, approveID, denyID} {
			if !strings.Contains(text, id) {
				t.Errorf("the list lacks %s:\n%s", id, text)
			}
		}
		tb.untouched(t, "the list")
		tb.shot(t, "approvals")
	})

	t.Run("hostile content", func(t *testing.T) {
		var text string
		tb.run(t, "the hostile review", goTo("/approval/"+hostileID),
			waitShown(`body[data-page="approval"] #full-review`))
		text = tb.text(t, "main")
		for _, want := range []string{
			`<script>window.__pwned=1</script>`, `<img src=x onerror="window.__pwned=2;alert(2)">`, `javascript:window.__pwned=3`,
			`\u202eevil\x1b[31mred\x1b]52;c;cHduZWQ=\x07`, `<img src=x onerror=window.__pwned=4>\u202e<script>alert(5)<script>.sh`,
			"exec 1  hostile", "--- patch:", "files      ",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("the review lacks %q as text", want)
			}
		}
		if strings.ContainsAny(text, "\u202e\x1b\x07") {
			t.Error("the review holds a raw bidi override or control character")
		}
		tb.untouched(t, "the hostile review")
		tb.shot(t, "review")
		// The full review, streamed from the bundle and verified.
		var verdict string
		tb.run(t, "the full review", chromedp.Click(chromedp.CSS("#full-review")),
			waitShown("#full .verdict-good, #full .verdict-bad"))
		verdict = tb.text(t, "#full")
		// The limits come from the grant the bundle holds: an approver
		// may not read the job itself.
		if !strings.Contains(verdict, "verified: everything shown is bundle sha256:") || !strings.Contains(verdict, "hostile.txt") ||
			!strings.Contains(verdict, "limits     cpu ") || !strings.Contains(verdict, "the grant in force at the run's end") ||
			!strings.Contains(verdict, "its provenance is signed by spiffe://") || !strings.Contains(verdict, "provenance signed by spiffe://") {
			t.Errorf("the full review: %q", verdict[:min(len(verdict), 2000)])
		}
		tb.untouched(t, "the full review")
		tb.shot(t, "review-full")
	})

	t.Run("a large patch is virtualized", func(t *testing.T) {
		tb.run(t, "the large review", goTo("/approval/"+bigID), waitShown(`body[data-page="approval"] .text.virtual`))
		lines := get(t, tb, "lines", chromedp.Evaluate[int](`Number(document.querySelector(".text.virtual").dataset.lines)`))
		rows := get(t, tb, "rows", chromedp.Evaluate[int](`document.querySelectorAll(".text.virtual .row").length`))
		if lines < 20000 || rows == 0 || rows > 300 {
			t.Fatalf("the large review: %d lines, %d rows in the document (want only those in view)", lines, rows)
		}
		// Scrolled to its end, the last line of the patch is drawn.
		tb.run(t, "scrolling", chromedp.Func(func(ctx context.Context, tt *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](`(b => { b.scrollTop = b.scrollHeight; b.dispatchEvent(new Event("scroll")); return true })(document.querySelector(".text.virtual"))`)(ctx, tt)
			return err
		}), waitFor(`Array.from(document.querySelectorAll(".text.virtual .row")).some(r => r.textContent === "| +20000")`))
		if rows := get(t, tb, "rows", chromedp.Evaluate[int](`document.querySelectorAll(".text.virtual .row").length`)); rows > 300 {
			t.Errorf("after scrolling: %d rows in the document", rows)
		}
		tb.untouched(t, "the large review")
	})

	t.Run("the requester's own approval refused", func(t *testing.T) {
		td := newTab(t, bctx)
		var errText string
		td.run(t, "approve as approver/dev", chromedp.Navigate(dev.url), waitShown(`body[data-page="list"]`),
			goTo("/approval/"+approveID), waitShown(`body[data-page="approval"] #approve`),
			chromedp.Click(chromedp.CSS("#approve")), waitFor(`document.getElementById("error").textContent !== ""`))
		errText = td.text(t, "#error")
		if !strings.Contains(errText, "may not decide") {
			t.Errorf("the refusal shows %q", errText)
		}
		td.shot(t, "refused")
		if a := getApproval(t, s, approveID); len(a.GetVotes()) != 0 || a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_PENDING {
			t.Errorf("after the refusal: %s with votes %v", a.GetState(), a.GetVotes())
		}
	})

	t.Run("approve by clicking", func(t *testing.T) {
		var done string
		tb.run(t, "approve as approver/alice", goTo("/approval/"+approveID),
			waitShown(`body[data-page="approval"] #approve`),
			chromedp.SendKeys(chromedp.CSS("#comment"), "looks right"),
			chromedp.Click(chromedp.CSS("#approve")), waitShown("#decided"))
		done = tb.text(t, "#decided")
		a := getApproval(t, s, approveID)
		if len(a.GetVotes()) != 1 || a.GetVotes()[0].GetApprover() != "spiffe://"+trustDomain+"/approver/alice" ||
			a.GetVotes()[0].GetDecision() != authorityv1.Decision_DECISION_APPROVE || a.GetVotes()[0].GetComment() != "looks right" {
			t.Fatalf("after approving: votes %v", a.GetVotes())
		}
		if !strings.Contains(done, "approved: the request is now") {
			t.Errorf("the page says %q", done)
		}
		tb.shot(t, "approved")
	})

	t.Run("deny with a comment", func(t *testing.T) {
		comment := "no: " + payloadHTML + payloadBidi
		var shown string
		tb.run(t, "deny as approver/alice", goTo("/approval/"+denyID),
			waitShown(`body[data-page="approval"] #deny`),
			chromedp.SetValue(chromedp.CSS("#comment"), comment),
			chromedp.Click(chromedp.CSS("#deny")), waitShown("#decided"))
		a := getApproval(t, s, denyID)
		if a.GetState() != authorityv1.ApprovalState_APPROVAL_STATE_DENIED || len(a.GetVotes()) != 1 || a.GetVotes()[0].GetComment() != comment {
			t.Fatalf("after denying: %s, votes %v", a.GetState(), a.GetVotes())
		}
		// The comment, a caller's text, shows as text on the review.
		tb.run(t, "the denied review", chromedp.Reload(), waitShown(`body[data-page="approval"] section`))
		shown = tb.text(t, "main")
		if !strings.Contains(shown, `no: <script>window.__pwned=1</script>`) || !strings.Contains(shown, `\u202eevil`) {
			t.Errorf("the denied review does not show the comment as text:\n%s", shown[:min(len(shown), 3000)])
		}
		tb.untouched(t, "the denied review")
		tb.shot(t, "denied")
	})

	t.Run("audit trail", func(t *testing.T) {
		var text string
		tb.run(t, "the audit trail", goTo("/audit/"+approveJob),
			waitShown(`body[data-page="audit"] #audit`))
		text = tb.text(t, "#audit")
		for _, want := range []string{"job.granted", "approval.decided", "approver/alice"} {
			if !strings.Contains(text, want) {
				t.Errorf("the audit trail lacks %q:\n%s", want, text)
			}
		}
		tb.untouched(t, "the audit trail")
		tb.shot(t, "audit")
	})
}
