package selftest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// counter is the external side the selftest's jobs act on: an HTTP server
// counting the requests to each path, served by the selftest itself at an
// address the sandboxes may reach (--counter-listen, dialled at
// --counter-addr). A retried job or exec that repeats its action shows as
// a second request; a destination a policy refuses shows as none.
//
// It counts only the paths it handed out (path), each holding a random
// nonce of its own that no one outside the run sees before the job that
// uses it runs, at most maxPaths of them; any other request is answered
// 404 and not counted. It also counts every accepted connection, so a
// connection that got through without a whole HTTP request still shows.
type counter struct {
	srv  *http.Server
	ln   net.Listener
	addr string // where jobs dial it, HOST:PORT
	// from, when not empty, are the only source addresses counted (the
	// sandboxes' egress, or a relay's): anyone else is answered 404 and
	// their connections are not counted.
	from []netip.Prefix

	mu    sync.Mutex
	hits  map[string]int // issued paths only
	conns int            // connections accepted
}

// maxPaths bounds how many paths one run may hand out.
const maxPaths = 1024

// countingListener counts what it accepts into c.
type countingListener struct {
	net.Listener
	c *counter
}

func (l countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err == nil && l.c.counts(conn.RemoteAddr().String()) {
		l.c.mu.Lock()
		l.c.conns++
		l.c.mu.Unlock()
	}
	return conn, err
}

// startCounter listens on listen and serves until close; jobs dial addr,
// or the listener's own address when addr is empty. Only requests and
// connections from from are counted (from anyone when from is empty).
func startCounter(listen, addr string, from []netip.Prefix) (*counter, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		addr = ln.Addr().String()
	}
	c := &counter{ln: ln, addr: addr, from: from, hits: map[string]int{}}
	c.srv = &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := c.srv.Serve(countingListener{ln, c}); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.srv.Close()
		}
	}()
	return c, nil
}

// path hands out a new path for what, "/NONCE/what", counted from now
// on; "" once maxPaths were handed out.
func (c *counter) path(what string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hits) >= maxPaths {
		return ""
	}
	p := "/" + token() + token() + "/" + what
	c.hits[p] = 0
	return p
}

// accepted is how many connections the counter has accepted.
func (c *counter) accepted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conns
}

// ServeHTTP counts a request to an issued path and answers "counted N";
// anything else is 404, uncounted.
func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !c.counts(r.RemoteAddr) {
		http.NotFound(w, r)
		return
	}
	c.mu.Lock()
	n, ok := c.hits[r.URL.Path]
	if ok {
		n++
		c.hits[r.URL.Path] = n
	}
	c.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte("selftest-counted " + itoa(n) + "\n"))
}

// counts says whether a peer at remote (IP:PORT) is counted.
func (c *counter) counts(remote string) bool {
	if len(c.from) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	for _, p := range c.from {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// count is how many requests path has had.
func (c *counter) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[path]
}

// host and port split the address jobs dial.
func (c *counter) host() string { h, _, _ := net.SplitHostPort(c.addr); return h }
func (c *counter) port() string { _, p, _ := net.SplitHostPort(c.addr); return p }

// get is a shell command line that asks the counter for path once, with
// bash's /dev/tcp (no curl needed in the sandbox), within secs seconds;
// it prints the counter's answer and fails when there is none.
func (c *counter) get(path string, secs int) string {
	return "timeout " + itoa(secs) + " bash -c 'exec 3<>/dev/tcp/" + c.host() + "/" + c.port() +
		" && printf \"GET " + path + " HTTP/1.0\\r\\nHost: selftest\\r\\n\\r\\n\" >&3 && cat <&3' 2>/dev/null | grep -a selftest-counted"
}

func (c *counter) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.srv.Shutdown(ctx)
}

func itoa(n int) string { return strconv.Itoa(n) }
