package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/nettest"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// unrelatedCA is a CA certificate that signed nothing the test serves: a
// client that trusts it alone refuses every server here.
func unrelatedCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unrelated CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestEgressFollowShowsTLSFailure: a job whose client does not trust the
// server it reaches through an allowed name (curl with a CA that signed
// nothing here, as a sandbox without the right roots) leaves a record that
// says the handshake failed and that the job sent the alert, not a plain
// "closed"; a trusting connection's record says the handshake completed;
// `airlock job egress --follow` shows both while the job still runs (it
// sleeps after them) and ends when the job ends; and a client of no tenant
// the job belongs to cannot follow it.
func TestEgressFollowShowsTLSFailure(t *testing.T) {
	repo, _ := sampleRepo(t)
	n := int(time.Now().UnixNano() & 0xff)
	web := nettest.StartWeb(t, nettest.Config{
		Name:    fmt.Sprintf("ef%04x%02x", os.Getpid()&0xffff, n),
		Prefix:  nettest.Subnet(netip.MustParsePrefix("203.0.113.128/25"), 30, (os.Getpid()+n+7)%32),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("2001:db8:7c00::/40"), 64, (os.Getpid()&0xffff)<<8|n),
	})
	dns := nettest.StartDNS(t, map[string][]netip.Addr{"allowed.test": {web.IP, web.IP6}})
	s := startStack(t, "--repo", "sample="+repo, "--resolver", dns.Addr.String(), "--egress-domain", "allowed.test")

	script := fmt.Sprintf(`printf '%%s' '%s' > /tmp/unrelated.pem
curl -sS --max-time 10 --cacert /tmp/unrelated.pem -o /dev/null https://allowed.test/ 2>&1; echo "distrusting curl: $?"
curl -sSk --max-time 10 -o /dev/null https://allowed.test/; echo "trusting curl: $?"
sleep 300
`, unrelatedCA(t))
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--memory", "256MiB", "--allow-domain", "allowed.test", "--", "bash", "-c", script)
	if res.code != 0 {
		t.Fatalf("job submit: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)
	defer s.airlock(t, "job", "cancel", id)
	follow := s.startAirlock(t, "job", "egress", id, "--follow")

	failed := regexp.MustCompile(`connect\s+allowed\.test\s+443\s+allowed\s.*tls handshake failed: the job sent an alert after \S+ from the server`)
	completed := regexp.MustCompile(`connect\s+allowed\.test\s+443\s+allowed\s.*tls handshake completed`)
	deadline := time.Now().Add(90 * time.Second)
	for !failed.MatchString(follow.stdout.String()) || !completed.MatchString(follow.stdout.String()) {
		if follow.exitCode(0) != -1 || time.Now().After(deadline) {
			t.Fatalf("job egress --follow (exit %d) never showed both connections' TLS outcomes:\n%s%s", follow.exitCode(0), follow.stdout.String(), follow.stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := s.job(t, id).GetState(); st != authorityv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("the records arrived with the job %v; want them while it runs", st)
	}
	if follow.exitCode(time.Second) != -1 {
		t.Fatalf("job egress --follow ended while the job runs:\n%s%s", follow.stdout.String(), follow.stderr.String())
	}

	// A client that acts for no tenant of the job's is told the job does
	// not exist, as by job egress without --follow.
	if r := s.airlock(t, "pki", "issue", "--dir", s.pkiDir, "--id", "client/outsider"); r.code != 0 {
		t.Fatalf("pki issue client/outsider: exit %d\n%s", r.code, r.stderr)
	}
	for _, args := range [][]string{{"job", "egress", id, "--follow"}, {"job", "egress", id}} {
		r := s.airlock(t, append([]string{"--as", "client/outsider"}, args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, "not found") || strings.Contains(r.stdout, "allowed.test") {
			t.Errorf("client/outsider %v: exit %d, want not found\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}

	if r := s.airlock(t, "job", "cancel", id); r.code != 0 {
		t.Fatalf("job cancel: exit %d\n%s", r.code, r.stderr)
	}
	if code := follow.exitCode(30 * time.Second); code != 0 {
		t.Fatalf("job egress --follow after the job ended: exit %d\n%s%s", code, follow.stdout.String(), follow.stderr.String())
	}

	// The record that comes with the result says the same.
	deadline = time.Now().Add(30 * time.Second)
	for {
		text := s.airlock(t, "job", "egress", id)
		if text.code == 0 && failed.MatchString(text.stdout) && completed.MatchString(text.stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job egress after the job: exit %d\n%s%s", text.code, text.stdout, text.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
