package egressproxy

import (
	"fmt"
	"io"
	"net/http"
	"testing"
)

// The cost of interception: a download, and many small requests over
// kept-alive connections, spliced (other.example.com) and with a brokered
// credential added (api.example.com), by the explicit proxy over HTTP/1.1.
var benchHosts = []struct{ name, host string }{
	{"spliced", "other.example.com"},
	{"injecting", "api.example.com"},
}

func BenchmarkDownload100MB(b *testing.B) {
	const size = 100 << 20
	for _, bh := range benchHosts {
		b.Run(bh.name, func(b *testing.B) {
			h := newHarness(b, withCredentials(apiToken()))
			c := h.jobClient(false, false)
			u := fmt.Sprintf("https://%s/zeros?n=%d", bh.host, size)
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				benchGet(b, c, u, size)
			}
		})
	}
}

func BenchmarkSmallRequests(b *testing.B) {
	for _, bh := range benchHosts {
		b.Run(bh.name, func(b *testing.B) {
			h := newHarness(b, withCredentials(apiToken()))
			c := h.jobClient(false, false)
			u := "https://" + bh.host + "/small"
			benchGet(b, c, u, -1) // the connection, made once
			b.ResetTimer()
			for range b.N {
				benchGet(b, c, u, -1)
			}
		})
	}
}

// benchGet GETs u and reads the body, which must be size bytes (any,
// when size is -1).
func benchGet(b *testing.B, c *http.Client, u string, size int64) {
	resp, err := c.Get(u)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || (size >= 0 && n != size) {
		b.Fatalf("GET %s: %s, %d bytes, %v", u, resp.Status, n, err)
	}
}
