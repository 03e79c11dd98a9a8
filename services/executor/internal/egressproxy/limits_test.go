package egressproxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A connection nothing moves on for IdleTimeout is closed; one where bytes
// move only one way (a download the job sends nothing during) is not idle.
func TestIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	h := newHarness(t, withConfig(func(c *Config) { c.IdleTimeout = idle }))

	status, body := get(t, h.proxyClient(), "https://api.example.com/ticks?n=8&every=100ms")
	if status != http.StatusOK || body != strings.Repeat("tick\n", 8) {
		t.Fatalf("a one-way stream longer than the idle timeout: %d %q", status, body)
	}
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
		Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(1))

	tu := h.openStream("api.example.com", "/stream")
	if line, err := tu.readLine(); err != nil || line != "first" {
		t.Fatalf("stream: %q %v", line, err)
	}
	start := time.Now()
	if line, err := tu.readLine(); err == nil {
		t.Fatalf("an idle connection still reads: %q", line)
	}
	if d := time.Since(start); d < idle/2 || d > 3*time.Second {
		t.Errorf("closed after %s idle, want about %s", d, idle)
	}
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
		Addr: "203.0.113.10:443", End: "idle for 300ms"}.check(t, h.nth(2))
}

// A job that reads a download slowly but steadily, slower than the proxy
// could send it, is not idle: only a direction where nothing moves for
// IdleTimeout is.
func TestSlowReaderIsNotIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	h := newHarness(t, withConfig(func(c *Config) { c.IdleTimeout = idle }))
	const size = 6 << 20
	resp, err := h.proxyClient().Get(fmt.Sprintf("http://api.example.com/zeros?n=%d", size))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// 6 MiB at about 1 MiB/s: 64 KiB every 60 ms, the whole well past
	// the idle timeout.
	buf := make([]byte, 64<<10)
	got := 0
	for {
		n, err := io.ReadFull(resp.Body, buf)
		got += n
		if err != nil {
			break
		}
		time.Sleep(60 * time.Millisecond)
	}
	if got != size {
		t.Fatalf("read %d of %d bytes: the slow reader was cut", got, size)
	}
	if d := h.nth(1); !d.Allowed || strings.HasPrefix(d.End, "idle") {
		t.Errorf("decision %+v", d)
	}
}

// A job that stops reading a download is cut once nothing has moved for
// IdleTimeout, though bytes wait for it.
func TestStalledReaderIsCut(t *testing.T) {
	// Long enough that a loaded machine's client reads the response head
	// before the cut.
	const idle = time.Second
	h := newHarness(t, withConfig(func(c *Config) { c.IdleTimeout = idle }))
	resp, err := h.proxyClient().Get(fmt.Sprintf("http://api.example.com/zeros?n=%d", 256<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	d := h.nth(1) // waits for the decision, which comes when the proxy ends the connection
	if !d.Allowed || d.End != "idle for 1s" {
		t.Errorf("decision %+v, want allowed and ended idle", d)
	}
	if d.BytesIn >= 256<<20 {
		t.Errorf("all %d bytes went to a job that read none", d.BytesIn)
	}
}

// Past MaxConns open connections, the next is refused at once, and
// recorded.
func TestMaxConns(t *testing.T) {
	h := newHarness(t, withConfig(func(c *Config) { c.MaxConns = 1 }))
	tu := h.openStream("api.example.com", "/stream")
	if line, err := tu.readLine(); err != nil || line != "first" {
		t.Fatalf("stream: %q %v", line, err)
	}
	c, err := dialTimeout(h.explicit)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("the connection past the limit read %d bytes", n)
	}
	d := h.nth(1)
	if d.Mode != ModeHTTP || d.Allowed || d.Reason != "refused: the proxy has as many connections open as it takes (1)" {
		t.Errorf("decision %+v", d)
	}
	tu.conn.Close()
	want{Mode: ModeConnect, Name: "api.example.com", Port: 443, Allowed: true, Reason: "allowed by api.example.com",
		Addr: "203.0.113.10:443", End: endedByPeers}.check(t, h.nth(2))
	// Room again.
	if status, _ := get(t, h.proxyClient(), "https://api.example.com/"); status != http.StatusOK {
		t.Errorf("after the first closed: %d", status)
	}
}

// Refusals of one name past DenialsPerMinute are counted, not recorded one
// by one, and summarised when the minute ends; other names keep their own
// count, and allowed connections are never held back.
func TestFloodCap(t *testing.T) {
	const window = 700 * time.Millisecond
	h := newHarness(t, withConfig(func(c *Config) { c.DenialsPerMinute = 3 }), withFloodWindow(window))
	start := time.Now()
	for i := range 5 {
		if _, _, status, _ := h.connect("denied.example.com:443"); status != http.StatusForbidden {
			t.Fatalf("CONNECT denied: %d", status)
		}
		if i < 3 {
			h.waitDecisions(i + 1)
		}
	}
	h.connect("elsewhere.example.com:443")
	h.waitDecisions(4)
	if status, _ := get(t, h.proxyClient(), "https://api.example.com/"); status != http.StatusOK {
		t.Fatalf("allowed: %d", status)
	}
	if time.Since(start) > window/2 {
		t.Skipf("too slow for a %s window (%s)", window, time.Since(start))
	}
	h.waitDecisions(5)
	time.Sleep(50 * time.Millisecond) // nothing more comes before the window ends
	h.mu.Lock()
	got := append([]Decision(nil), h.decisions...)
	h.mu.Unlock()
	var names []string
	for _, d := range got {
		names = append(names, fmt.Sprintf("%s/%v/%d", d.Name, d.Allowed, d.Suppressed))
	}
	wantNames := "denied.example.com/false/0 denied.example.com/false/0 denied.example.com/false/0 elsewhere.example.com/false/0 api.example.com/true/0"
	if strings.Join(names, " ") != wantNames {
		t.Fatalf("recorded %v\nwant %s", names, wantNames)
	}

	summary := h.nth(6)
	if summary.Name != "denied.example.com" || summary.Suppressed != 2 || summary.Allowed || summary.Mode != ModeConnect ||
		!strings.HasPrefix(summary.Reason, "2 more refusals of denied.example.com in the 700ms from ") ||
		!strings.HasSuffix(summary.Reason, "not recorded one by one (the cap is 3)") {
		t.Errorf("summary %+v", summary)
	}
	if d := time.Since(start); d < window {
		t.Errorf("summary after %s, before the window ended", d)
	}

	// A new window records one by one again.
	h.connect("denied.example.com:443")
	want{Mode: ModeConnect, Name: "denied.example.com", Port: 443, Reason: "denied.example.com is not in the policy"}.check(t, h.nth(7))
}

// Close records the summaries of windows still counting.
func TestFloodCapClose(t *testing.T) {
	h := newHarness(t, withConfig(func(c *Config) { c.DenialsPerMinute = 2 }))
	for range 6 {
		raw(t, h.explicit, "GET http://denied.example.com/ HTTP/1.1\r\nHost: denied.example.com\r\n\r\n")
	}
	h.waitDecisions(2)
	h.p.Close()
	got := h.waitDecisions(3)
	if len(got) != 3 {
		t.Fatalf("recorded %d decisions, want 3: %+v", len(got), got)
	}
	if s := got[2]; s.Name != "denied.example.com" || s.Suppressed != 4 || s.Mode != ModeHTTP || !strings.HasPrefix(s.Reason, "4 more refusals of denied.example.com in the 1m0s") {
		t.Errorf("summary %+v", s)
	}
}

// A job refused ever new names is capped over all of them too.
func TestFloodCapOverall(t *testing.T) {
	h := newHarness(t, withConfig(func(c *Config) { c.DenialsPerMinute = 1 }))
	for i := range 13 {
		c, err := dialTimeout(h.explicit)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT n%d.denied.example.com:443 HTTP/1.1\r\n\r\n", i)
		io.ReadAll(c)
		c.Close()
		if i < 10 {
			h.waitDecisions(i + 1) // in order, then past the cap
		}
	}
	h.p.Close()
	got := h.waitDecisions(11)
	if len(got) != 11 {
		t.Fatalf("recorded %d decisions, want 11", len(got))
	}
	for i, d := range got[:10] {
		if want := fmt.Sprintf("n%d.denied.example.com", i); d.Name != want || d.Suppressed != 0 {
			t.Errorf("decision %d: %+v, want %s", i, d, want)
		}
	}
	if s := got[10]; s.Name != "" || s.Suppressed != 3 || !strings.HasPrefix(s.Reason, "3 more refusals over all names in the 1m0s") || !strings.HasSuffix(s.Reason, "(the cap is 10)") {
		t.Errorf("summary %+v", s)
	}
}
