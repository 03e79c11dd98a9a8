package runs

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/logging/logtest"
	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/services/executor/internal/egressproxy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/test/filescan"
)

// fakeAuthorityLeaser is a test double of the authority's brokered
// credential leases (the CredentialLeaser boundary): it leases the
// credentials it knows, each with its secret, fails the names in fail,
// and records what it leased and revoked.
type fakeAuthorityLeaser struct {
	creds map[string]BrokeredLease
	fail  map[string]bool

	mu      sync.Mutex
	seq     int
	leased  []string // lease ids, in order
	revoked []string
}

func (f *fakeAuthorityLeaser) LeaseBrokered(_ context.Context, jobID, name string) (BrokeredLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.creds[name]
	if !ok || f.fail[name] {
		return BrokeredLease{}, fmt.Errorf("credential %q: permission denied for job %s", name, jobID)
	}
	f.seq++
	l.LeaseID = fmt.Sprintf("lease-%s-%d", name, f.seq)
	l.Secret = slices.Clone(l.Secret) // the manager clears the copy it gets
	f.leased = append(f.leased, l.LeaseID)
	return l, nil
}

func (f *fakeAuthorityLeaser) RevokeLease(_ context.Context, leaseID, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked = append(f.revoked, leaseID)
	return nil
}

func (f *fakeAuthorityLeaser) leases() (leased, revoked []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.leased), slices.Clone(f.revoked)
}

const (
	bearerSecret = "s3cret-bearer-0123456789abcdef"
	basicSecret  = "s3cret-basic-fedcba9876543210"
)

// secretForms are every form of the test's secrets the proxy could hold:
// the values, the header values and the basic one's encoding.
func secretForms() []string {
	basic := base64.StdEncoding.EncodeToString([]byte("bot:" + basicSecret))
	return []string{bearerSecret, basicSecret, "Bearer " + bearerSecret, basic}
}

func testLeaser() *fakeAuthorityLeaser {
	return &fakeAuthorityLeaser{creds: map[string]BrokeredLease{
		"gh-token":  {Name: "gh-token", Hosts: []string{"api.test"}, Header: "Authorization", Format: "Bearer {value}", Secret: []byte(bearerSecret), Expires: time.Now().Add(time.Hour)},
		"npm.basic": {Name: "npm.basic", Hosts: []string{"*.npm.test"}, Header: "Authorization", BasicUser: "bot", Secret: []byte(basicSecret), Expires: time.Now().Add(time.Hour)},
	}}
}

// withCredentials gives h's manager leaser and a log of everything it
// logs.
func withCredentials(t *testing.T, h *harness, leaser CredentialLeaser) *logtest.Buffer {
	t.Helper()
	var logs logtest.Buffer
	h.m.cfg.Credentials = leaser
	h.m.cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &logs
}

// filesHolding lists the regular files under dir holding any of secrets.
func filesHolding(t *testing.T, dir string, secrets []string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil // gone or torn down meanwhile
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		has, err := filescan.Contains(p, secrets)
		if err != nil {
			return nil
		}
		if slices.Contains(has, true) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// credScript prints what the job holds of its credentials and its trust
// store, then waits for the test to have looked at every file while it
// runs (a signal: stepHandler).
const credScript = `env | grep '^AIRLOCK_CREDENTIAL_' | sort
echo "git=$GIT_SSL_CAINFO"
cat /etc/ssl/certs/ca-certificates.crt
` + stepHandler + `
` + "while [ \"$signals\" -lt 1 ]; do sleep 0.05; done"

// A job with brokered credentials, under runc and runsc, holds
// placeholders and never a secret: its environment has one per credential
// and no value; no file the executor keeps while it runs or after (run
// dir, record, output, bundle, egress.jsonl, the sandbox's own files) nor
// its log holds any form of a secret; its trust store holds the proxy's
// CA after the rest, with git pointed at it; every lease is revoked once
// it ended; a narrower grant drops the credential of the host it no
// longer allows. After merge (the real egress proxy), this test also checks
// that a request to api.test reaches the upstream with the header set and
// that egress.jsonl has its request line and the report its uses.
func TestCredentialsNeverReachTheJob(t *testing.T) {
	dns := nettest.StartDNS(t, map[string][]netip.Addr{"api.test": {netip.MustParseAddr("203.0.113.9")}})
	for _, class := range []sandbox.Class{sandbox.ClassRunc, sandbox.ClassRunsc} {
		t.Run(string(class), func(t *testing.T) {
			h, _ := newHarness(t, false)
			withDomainsNetwork(t, h, dns.Addr)
			leaser := testLeaser()
			logs := withCredentials(t, h, leaser)
			g := h.grantFor(credScript)
			g.Class = class
			g.Network = domainsPolicy("api.test", "*.npm.test")
			g.Credentials = []string{"gh-token", "npm.basic"}
			h.start(t, g)
			h.waitRunning(t, g.JobID, "ready")
			e := h.entry(g.JobID)
			e.updateMu.Lock()
			caPEM := e.egress.proxy.CACertPEM()
			e.updateMu.Unlock()
			if len(caPEM) == 0 {
				t.Fatal("the job's egress proxy has no CA")
			}

			// While it runs: its sandbox's files (its OCI config among
			// them) and the executor's.
			if got := filesHolding(t, h.base, secretForms()); len(got) > 0 {
				t.Errorf("while the job runs, files hold a secret: %v", got)
			}
			// A grant that no longer allows api.test drops gh-token from
			// the proxy and keeps npm.basic.
			g2 := next(g, func(g *Grant) {
				g.Network = domainsPolicy("*.npm.test")
				g.NetworkGeneration = 2
			})
			if _, err := h.m.Update(context.Background(), h.seal(t, g2)); err != nil {
				t.Fatal(err)
			}
			e.updateMu.Lock()
			var kept []string
			for _, c := range e.egress.creds {
				kept = append(kept, c.Name)
			}
			e.updateMu.Unlock()
			if !slices.Equal(kept, []string{"npm.basic"}) {
				t.Errorf("after narrowing, the proxy has %v; want npm.basic alone", kept)
			}
			h.signal(t, g.JobID)
			run := h.waitEnd(t, g.JobID)
			if run.State != Finished || run.Result.ExitCode != 0 {
				t.Fatalf("run %s, %+v", run.State, run.Result)
			}
			out := stdoutOf(t, h, run)
			for _, want := range []*regexp.Regexp{
				regexp.MustCompile(`(?m)^AIRLOCK_CREDENTIAL_GH_TOKEN=airlock-cred:gh-token:[A-Za-z0-9_-]{32}$`),
				regexp.MustCompile(`(?m)^AIRLOCK_CREDENTIAL_NPM_BASIC=airlock-cred:npm\.basic:[A-Za-z0-9_-]{32}$`),
				regexp.MustCompile(`(?m)^git=/etc/ssl/certs/ca-certificates\.crt$`),
			} {
				if !want.MatchString(out) {
					t.Errorf("stdout lacks %s", want)
				}
			}
			if !strings.Contains(out, string(caPEM)+"ready\n") {
				t.Errorf("the job's trust store does not end with the proxy's CA")
			}
			if c := strings.Count(out, "-----BEGIN CERTIFICATE-----"); c < 2 {
				t.Errorf("the job's trust store holds %d certificates; want the executor's and the proxy's", c)
			}
			h.waitReports(t, 1)
			if got := filesHolding(t, h.base, secretForms()); len(got) > 0 {
				t.Errorf("after the job, files hold a secret: %v", got)
			}
			if _, err := os.Stat(filepath.Join(h.m.runDir(g.JobID), "egress.jsonl")); err != nil {
				t.Errorf("egress.jsonl: %v", err)
			}
			l := logs.String()
			for _, s := range secretForms() {
				if strings.Contains(l, s) {
					t.Errorf("the executor's log holds a secret (%q)", s[:8])
				}
			}
			if !strings.Contains(l, "brokered credential leased") || !strings.Contains(l, "brokered credential revoked") {
				t.Errorf("the log does not say the credentials were leased and revoked")
			}
			leased, revoked := leaser.leases()
			slices.Sort(leased)
			slices.Sort(revoked)
			if len(leased) != 2 || !slices.Equal(leased, revoked) {
				t.Errorf("leased %v, revoked %v; want both leases revoked", leased, revoked)
			}
		})
	}
}

// A credential that cannot be leased fails the start: the run ends
// credential_unavailable, naming it, never having run, and the lease
// already taken is revoked.
func TestCredentialLeaseFailsTheStart(t *testing.T) {
	dns := nettest.StartDNS(t, map[string][]netip.Addr{})
	h, _ := newHarness(t, false)
	withDomainsNetwork(t, h, dns.Addr)
	leaser := testLeaser()
	leaser.fail = map[string]bool{"npm.basic": true}
	withCredentials(t, h, leaser)
	g := h.grantFor("echo ran")
	g.Network = domainsPolicy("api.test", "*.npm.test")
	g.Credentials = []string{"gh-token", "npm.basic"}
	h.start(t, g)
	run := h.waitEnd(t, g.JobID)
	if run.State != Failed || run.Result == nil || run.Result.Reason != ReasonCredentialUnavailable || !strings.Contains(run.Result.Message, `"npm.basic"`) {
		t.Fatalf("run %s, %+v; want failed, credential_unavailable, naming npm.basic", run.State, run.Result)
	}
	if out := stdoutOf(t, h, run); out != "" {
		t.Errorf("the job ran: %q", out)
	}
	if leased, revoked := leaser.leases(); len(leased) != 1 || !slices.Equal(leased, revoked) {
		t.Errorf("leased %v, revoked %v; want the one lease revoked", leased, revoked)
	}
}

// Start refuses credentials this executor cannot give a job: none to
// lease them with, no domains policy, the vm class, two names that would
// share a variable.
func TestCredentialsRefusedAtStart(t *testing.T) {
	h, _ := newHarness(t, false)
	withDomainsNetwork(t, h, netip.MustParseAddrPort("127.0.0.1:53"))
	for _, tc := range []struct {
		name   string
		leaser bool
		edit   func(g *Grant)
		want   string
	}{
		{"no leaser", false, func(*Grant) {}, "leases no brokered credentials"},
		{"no domains", true, func(g *Grant) { g.Network = NetworkPolicy{} }, "domains network policy"},
		{"vm", true, func(g *Grant) { g.Class = sandbox.ClassVM }, "egress proxy's CA"},
		{"one variable", true, func(g *Grant) { g.Credentials = []string{"a-b", "a.b"} }, "both would be AIRLOCK_CREDENTIAL_A_B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.m.cfg.Credentials = nil
			if tc.leaser {
				h.m.cfg.Credentials = testLeaser()
			}
			g := h.grantFor("true")
			g.Network = domainsPolicy("api.test")
			g.Credentials = []string{"gh-token"}
			tc.edit(g)
			if err := h.m.checkCredentials(h.seal(t, g)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkCredentials = %v, want %q", err, tc.want)
			}
		})
	}
}

// The proxy's credential: the header's value from the format or the basic
// user, a placeholder naming it, the lease's own CA when it has one; a
// lease that is not what was asked for, or names a host the policy does
// not allow, is refused.
func TestProxyCredential(t *testing.T) {
	m := &Manager{}
	pol := domainsPolicy("api.test", "*.npm.test").Names
	leaser := testLeaser()
	gh, npm := leaser.creds["gh-token"], leaser.creds["npm.basic"]
	gh.LeaseID, npm.LeaseID = "l1", "l2"
	c, err := m.proxyCredential(gh, "gh-token", pol)
	if err != nil || c.Value != "Bearer "+bearerSecret || c.Secret != bearerSecret || c.Header != "Authorization" {
		t.Errorf("bearer: %+v, %v", c, err)
	}
	if !regexp.MustCompile(`^airlock-cred:gh-token:[A-Za-z0-9_-]{32}$`).MatchString(c.Placeholder) {
		t.Errorf("placeholder %q", c.Placeholder)
	}
	c2, _ := m.proxyCredential(gh, "gh-token", pol)
	if c2.Placeholder == c.Placeholder {
		t.Errorf("two leases share a placeholder")
	}
	c, err = m.proxyCredential(npm, "npm.basic", pol)
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:"+basicSecret)); err != nil || c.Value != want {
		t.Errorf("basic: %q, %v; want %q", c.Value, err, want)
	}
	own, err := pki.NewCA("upstream.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	withCA := gh
	withCA.UpstreamCA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: own.Cert.Raw})
	if c, err := m.proxyCredential(withCA, "gh-token", pol); err != nil || c.Roots == nil {
		t.Errorf("upstream CA: roots %v, %v", c.Roots, err)
	}
	for _, tc := range []struct {
		name string
		edit func(l *BrokeredLease)
		want string
	}{
		{"other name", func(l *BrokeredLease) { l.Name = "other" }, `leased "other"`},
		{"host outside", func(l *BrokeredLease) { l.Hosts = []string{"evil.test"} }, `host "evil.test"`},
		{"no value slot", func(l *BrokeredLease) { l.Format = "Bearer" }, "no {value}"},
		{"no header", func(l *BrokeredLease) { l.Header = "" }, "no header"},
		{"bad CA", func(l *BrokeredLease) { l.UpstreamCA = []byte("nope") }, "upstream CA"},
	} {
		l := gh
		tc.edit(&l)
		if _, err := m.proxyCredential(l, "gh-token", pol); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if got := credentialEnv("npm.basic-2"); got != "AIRLOCK_CREDENTIAL_NPM_BASIC_2" {
		t.Errorf("credentialEnv = %q", got)
	}
}

// A narrower policy drops the credentials of the hosts it no longer
// allows, and keeps the rest.
func TestCredentialsDroppedWithTheirHosts(t *testing.T) {
	pol := domainsPolicy("api.test", "*.npm.test").Names
	creds := []egressproxy.Credential{
		{Name: "gh-token", Hosts: []string{"api.test"}, Header: "Authorization", Value: "Bearer x"},
		{Name: "npm.basic", Hosts: []string{"*.npm.test"}, Header: "Authorization", Value: "Basic eA=="},
	}
	p, err := egressproxy.New(egressproxy.Config{Policy: pol, Resolver: HostResolver(), Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e := &jobEgress{proxy: p, log: slog.New(slog.DiscardHandler), creds: creds}
	if err := e.dropCredentials(domainsPolicy("*.npm.test").Names); err != nil {
		t.Fatal(err)
	}
	if len(e.creds) != 1 || e.creds[0].Name != "npm.basic" {
		t.Errorf("kept %+v, want npm.basic alone", e.creds)
	}
	if err := e.dropCredentials(egress.Policy{}); err != nil || len(e.creds) != 0 {
		t.Errorf("deny-all kept %+v, %v", e.creds, err)
	}
}
