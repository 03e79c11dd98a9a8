// Package gitservetest runs a gitserve.Server for a test: on loopback,
// over TLS with a certificate from a throwaway CA, stopped when the test
// ends. Only tests import it.
package gitservetest

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/pkg/gitserve"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/pkg/pki"
)

// Remote is a running server.
type Remote struct {
	// Addr is the server's host:port, on 127.0.0.1.
	Addr string
	// CAFile is the PEM file of the CA its certificate chains to.
	CAFile string
	// Logs is the server's log, JSON lines.
	Logs *logtest.Buffer
}

// URL is where the named repository is served.
func (r *Remote) URL(name string) string { return "https://" + r.Addr + "/" + name + ".git" }

// Start serves cfg until the test ends; an unset Logger writes to
// Remote.Logs and an unset SpoolDir is a temporary directory.
func Start(t testing.TB, cfg gitserve.Config) *Remote {
	t.Helper()
	r := &Remote{Logs: &logtest.Buffer{}, CAFile: filepath.Join(t.TempDir(), "ca.crt")}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(r.Logs, nil))
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = t.TempDir()
	}
	ca, err := pki.NewCA("airlock.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueHost(pki.IssueOptions{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := kp.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitserve.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.Addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, &tls.Config{Certificates: []tls.Certificate{cert}}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("git server: %v", err)
		}
	})
	return r
}
