package nettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// Web is a test host serving the web on all its addresses: HTTPS on 443
// (a self-signed certificate for any name: jobs use curl -k, since what is
// tested is where a connection goes, not whom the job trusts) and HTTP on
// 80. Each answers "hello NAME" with the SNI or Host it got; /stream sends
// "tick N" every 100 ms for a minute; /bytes/N sends N zero bytes. Its UDP
// and TCP port 53 count what reaches them (DNSHits): no job may talk to a
// resolver directly.
type Web struct {
	*Host
	dnsHits atomic.Int64
}

// DNSHits is how many datagrams and connections reached port 53.
func (w *Web) DNSHits() int64 { return w.dnsHits.Load() }

// StartWeb makes a test host (Start) and serves the web on it.
func StartWeb(t testing.TB, cfg Config) *Web {
	t.Helper()
	w := &Web{Host: Start(t, cfg)}
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		name := r.Host
		if r.TLS != nil {
			name = r.TLS.ServerName
		}
		var n int64
		if _, err := fmt.Sscanf(r.URL.Path, "/bytes/%d", &n); err != nil {
			n = 0
		}
		switch {
		case r.URL.Path == "/stream":
			fl := rw.(http.Flusher)
			for i := 0; i < 600 && r.Context().Err() == nil; i++ {
				fmt.Fprintf(rw, "tick %d\n", i)
				fl.Flush()
				time.Sleep(100 * time.Millisecond)
			}
		case n > 0:
			rw.Header().Set("Content-Length", fmt.Sprint(n))
			zero := make([]byte, 64<<10)
			for n > 0 && r.Context().Err() == nil {
				k := min(n, int64(len(zero)))
				if _, err := rw.Write(zero[:k]); err != nil {
					return
				}
				n -= k
			}
		default:
			fmt.Fprintf(rw, "hello %s\n", name)
		}
	})
	for _, s := range []struct {
		port string
		tls  bool
	}{{"80", false}, {"443", true}} {
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		t.Cleanup(func() { srv.Close() })
		ln := w.Listen(t, "tcp", ":"+s.port)
		if s.tls {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
		}
		go srv.Serve(ln)
	}
	var pc net.PacketConn
	if err := w.Do(func() (err error) { pc, err = net.ListenPacket("udp", ":53"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			w.dnsHits.Add(1)
		}
	}()
	ln := w.Listen(t, "tcp", ":53")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			w.dnsHits.Add(1)
			c.Close()
		}
	}()
	return w
}

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nettest web host"},
		DNSNames: []string{"*.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
