package tlsconfig

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

const td = "airlock.test"

var (
	authorityID = identity.Service(td, identity.ServiceAuthority)
	executorID  = identity.Service(td, identity.ServiceExecutor)
	devID       = identity.MustParse("spiffe://airlock.test/client/dev")
)

// testPKI is a throwaway CA with certificates for the services and client/dev
// on disk, laid out as pkg/pki writes them.
type testPKI struct {
	dir string
	ca  *pki.CA
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.Init(dir, td, []identity.ID{devID})
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{dir: dir, ca: ca}
}

func (p *testPKI) paths(id identity.ID) (caFile, certFile, keyFile string) {
	certFile, keyFile = pki.Paths(p.dir, id)
	return pki.CAPath(p.dir), certFile, keyFile
}

// errorLog collects reload errors reported by a Source.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

func (p *testPKI) source(t *testing.T, id identity.ID) (*Source, *errorLog) {
	t.Helper()
	caFile, certFile, keyFile := p.paths(id)
	log := &errorLog{}
	src, err := NewFileSource(caFile, certFile, keyFile, WithErrorHandler(log.add))
	if err != nil {
		t.Fatal(err)
	}
	return src, log
}

// craft signs a certificate for a fresh key with ca, starting from a
// well-formed client certificate for client/dev that edit may then break.
func craft(t *testing.T, ca *pki.CA, edit func(*x509.Certificate)) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{devID.URL()},
	}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func tlsCert(t *testing.T, kp *pki.KeyPair) *tls.Certificate {
	t.Helper()
	c, err := kp.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// presenting returns a copy of cfg that presents cert instead of its
// source's certificate, keeping the source's verification of the server.
func presenting(cfg *tls.Config, cert *tls.Certificate) *tls.Config {
	cfg = cfg.Clone()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return cert, nil
	}
	return cfg
}

// testServer is a real gRPC server with the standard health service over
// ServerConfig, recording every failed server-side handshake and the
// identity of every caller that got through.
type testServer struct {
	addr          string
	handshakeErrs chan error
	callers       chan identity.ID
}

// recordingCreds passes handshakes through to the real TLS credentials and
// records failures, so a test can tell a refused handshake from any other
// reason an RPC might fail.
type recordingCreds struct {
	credentials.TransportCredentials
	errs chan<- error
}

func (c recordingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		select {
		case c.errs <- err:
		default:
		}
	}
	return out, info, err
}

func startServer(t *testing.T, src *Source) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{
		addr:          lis.Addr().String(),
		handshakeErrs: make(chan error, 64),
		callers:       make(chan identity.ID, 64),
	}
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, err := identity.FromPeer(ctx)
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		select {
		case ts.callers <- id:
		default:
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(
		grpc.Creds(recordingCreds{credentials.NewTLS(ServerConfig(src, td)), ts.handshakeErrs}),
		grpc.UnaryInterceptor(record),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return ts
}

// expectHandshakeError waits for the server to record a failed handshake
// whose error contains want.
func (ts *testServer) expectHandshakeError(t *testing.T, want string) {
	t.Helper()
	select {
	case err := <-ts.handshakeErrs:
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("server handshake error = %q, want it to contain %q", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server recorded no failed handshake; want one containing %q", want)
	}
	select {
	case id := <-ts.callers:
		t.Fatalf("a refused client still reached a handler as %v", id)
	default:
	}
}

func (ts *testServer) drain() {
	for {
		select {
		case <-ts.handshakeErrs:
		case <-ts.callers:
		default:
			return
		}
	}
}

// testClient is one gRPC client connection to a testServer.
type testClient struct {
	conn *grpc.ClientConn
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *testClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testClient{conn: conn}
}

func dialTLS(t *testing.T, addr string, cfg *tls.Config) *testClient {
	t.Helper()
	return dial(t, addr, credentials.NewTLS(cfg))
}

// check calls Health.Check and returns the serial of the certificate the
// server presented on the connection that carried the call.
func (c *testClient) check(t *testing.T) (*big.Int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health status = %v, want SERVING", resp.GetStatus())
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("call carried no TLS peer certificate (auth info %T)", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

func (c *testClient) mustServe(t *testing.T) *big.Int {
	t.Helper()
	serial, err := c.check(t)
	if err != nil {
		t.Fatalf("Health.Check: %v", err)
	}
	return serial
}

func expectUnavailable(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("Health.Check succeeded, want the connection refused")
	}
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("Health.Check error code = %v (%v), want Unavailable", code, err)
	}
}
