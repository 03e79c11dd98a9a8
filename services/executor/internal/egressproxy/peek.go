package egressproxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"time"
)

// readRequest reads one HTTP/1 request head from br (at most maxHead
// bytes; a body stays in br, for the request's Body), with its Host header
// lines, which http.ReadRequest drops when the target is an absolute URI.
func readRequest(br *bufio.Reader) (*http.Request, []string, error) {
	n, err := headLen(br)
	if err != nil {
		return nil, nil, err
	}
	head, err := br.Peek(n)
	if err != nil {
		return nil, nil, err
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return nil, nil, err
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, nil, fmt.Errorf("malformed header: %v", err)
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	return req, h.Values("Host"), nil
}

// headLen waits until br holds a whole request head and returns its
// length (through the empty line that ends it).
func headLen(br *bufio.Reader) (int, error) {
	from := 0
	for {
		buf, _ := br.Peek(br.Buffered())
		for i := max(from-2, 0); i < len(buf); i++ {
			if buf[i] != '\n' {
				continue
			}
			// An empty line: "\n\n" or "\n\r\n" (textproto takes both).
			if i+1 < len(buf) && buf[i+1] == '\n' {
				return i + 2, nil
			}
			if i+2 < len(buf) && buf[i+1] == '\r' && buf[i+2] == '\n' {
				return i + 3, nil
			}
		}
		from = len(buf)
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return 0, fmt.Errorf("the request head is longer than %d bytes", maxHead)
			}
			if len(buf) > 0 && errors.Is(err, io.EOF) {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
}

// maxHello bounds what the proxy reads looking for a ClientHello (a
// handshake message is at most 64 KiB to crypto/tls, plus record headers).
const maxHello = 70 << 10

// readHello reads a TLS ClientHello from r and returns its SNI ("" when it
// has none) and every byte read, which the upstream must get first.
// crypto/tls parses it, as it would for a server of ours, and is stopped
// before it answers anything.
func readHello(r io.Reader) (string, []byte, error) {
	hc := &helloConn{r: r}
	var sni string
	var seen bool
	stop := errors.New("ClientHello read")
	err := tls.Server(hc, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, stop
		},
	}).Handshake()
	if !seen {
		if hc.err != nil {
			err = hc.err
		}
		return "", hc.read, fmt.Errorf("no TLS ClientHello: %v", err)
	}
	return sni, hc.read, nil
}

// helloConn is the client, read-only and recorded, as crypto/tls sees it
// while it parses a ClientHello.
type helloConn struct {
	r    io.Reader
	read []byte
	err  error // the reader's own error, rather than crypto/tls's wrapping
}

func (h *helloConn) Read(p []byte) (int, error) {
	if len(h.read) >= maxHello {
		h.err = fmt.Errorf("more than %d bytes without a whole ClientHello", maxHello)
		return 0, h.err
	}
	p = p[:min(len(p), maxHello-len(h.read))]
	n, err := h.r.Read(p)
	h.read = append(h.read, p[:n]...)
	if err != nil && !errors.Is(err, io.EOF) {
		h.err = err
	}
	return n, err
}

func (h *helloConn) Write([]byte) (int, error) {
	return 0, errors.New("the proxy answers no handshake")
}
func (h *helloConn) Close() error                     { return nil }
func (h *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (h *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (h *helloConn) SetDeadline(time.Time) error      { return nil }
func (h *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (h *helloConn) SetWriteDeadline(time.Time) error { return nil }
