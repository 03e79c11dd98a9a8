package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/pkg/nettest"
	"github.com/airlockhq/airlock/pkg/pki"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/test/filescan"
)

// The names of the brokered-credential test: a private API, a private
// npm registry, and another host every job may reach but no credential
// is for.
const (
	privAPI      = "api.private.test"
	privRegistry = "registry.private.test"
	privOther    = "other.private.test"
)

// privateHosts is the private API, registry and other host, served over
// TLS (HTTP/1.1 and HTTP/2) by a CA of the test's own, on one test host
// in a network namespace the test makes. It records what each request
// carried.
type privateHosts struct {
	*nettest.Host
	apiSecret, regSecret string

	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	host, path, proto, auth, token string
}

func (p *privateHosts) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

func startPrivateHosts(t *testing.T, ca *pki.CA, apiSecret, regSecret string) *privateHosts {
	t.Helper()
	leaf, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{privAPI, privRegistry, privOther}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	n := int(time.Now().UnixNano() & 0xff)
	p := &privateHosts{apiSecret: apiSecret, regSecret: regSecret, Host: nettest.Start(t, nettest.Config{
		Name:    fmt.Sprintf("bc%04x%02x", os.Getpid()&0xffff, n),
		Prefix:  nettest.Subnet(netip.MustParsePrefix("203.0.113.0/25"), 30, (os.Getpid()+n)%32),
		Prefix6: nettest.Subnet(netip.MustParsePrefix("2001:db8:7c00::/40"), 64, (os.Getpid()&0xffff)<<8|n),
	})}
	tgz, doc := npmPackage(t, "https://"+privRegistry)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.seen = append(p.seen, seenRequest{host: r.Host, path: r.URL.Path, proto: r.Proto, auth: r.Header.Get("Authorization"), token: r.Header.Get("X-Token")})
		p.mu.Unlock()
		host := strings.TrimSuffix(r.Host, ":443")
		switch {
		case host == privAPI && r.URL.Path == "/whoami":
			if r.Header.Get("Authorization") != "Bearer "+p.apiSecret {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			fmt.Fprintf(w, "authorized over %s\n", r.Proto)
		case host == privAPI && r.URL.Path == "/xtoken":
			if r.Header.Get("X-Token") == p.apiSecret {
				fmt.Fprintln(w, "token swapped")
			} else {
				fmt.Fprintln(w, "token not swapped")
			}
		case host == privAPI && r.URL.Path == "/redirect":
			http.Redirect(w, r, "https://"+privOther+"/collect", http.StatusFound)
		case host == privOther:
			fmt.Fprintln(w, "collected")
		case host == privRegistry:
			if r.Header.Get("Authorization") != "Bearer "+p.regSecret {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			switch r.URL.Path {
			case "/" + probePackage:
				w.Header().Set("Content-Type", "application/json")
				w.Write(doc)
			case "/" + probePackage + "/-/" + probePackage + "-1.0.0.tgz":
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Write(tgz)
			default:
				http.NotFound(w, r)
			}
		default:
			http.NotFound(w, r)
		}
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	t.Cleanup(func() { srv.Close() })
	ln := p.Listen(t, "tcp", ":443")
	go srv.ServeTLS(ln, "", "")
	return p
}

// randomSecret is a value that cannot appear anywhere by chance.
func randomSecret(t *testing.T, prefix string) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// credentialScript is the job: it uses both credentials through stock
// tools without holding them, tries to carry them elsewhere, and dumps
// everything of the sandbox a value could hide in into /work/dump.txt,
// which the bundle's patch carries out for the test to search.
const credentialScript = `cd /work
echo "placeholder=$AIRLOCK_CREDENTIAL_API"
echo "h2: $(curl -sS --max-time 20 --http2 -w ' job=%{http_version}' https://` + privAPI + `/whoami 2>&1)"
echo "h1: $(curl -sS --max-time 20 --http1.1 -w ' job=%{http_version}' https://` + privAPI + `/whoami 2>&1)"
echo "forged: $(curl -sS --max-time 20 -H 'Authorization: Bearer forged' https://` + privAPI + `/whoami 2>&1)"
echo "direct: $(curl -sS --max-time 20 --noproxy '*' https://` + privAPI + `/whoami 2>&1)"
echo "xtoken: $(curl -sS --max-time 20 -H "X-Token: $AIRLOCK_CREDENTIAL_API" https://` + privAPI + `/xtoken 2>&1)"
echo "other: $(curl -sS --max-time 20 -H "X-Token: $AIRLOCK_CREDENTIAL_API" -H "Authorization: Bearer $AIRLOCK_CREDENTIAL_API" https://` + privOther + `/collect 2>&1)"
echo "redirect: $(curl -sS --max-time 20 -L https://` + privAPI + `/redirect 2>&1)"
echo "sni: $(curl -sS --max-time 20 --connect-to ` + privOther + `:443:` + privAPI + `:443 https://` + privOther + `/whoami 2>&1)"
npm install --registry https://` + privRegistry + `/ --cache /tmp/npm-cache --no-audit --no-fund --no-update-notifier --loglevel=error ` + probePackage + ` >/tmp/npm.log 2>&1; echo "npm rc=$?"
test -f node_modules/` + probePackage + `/index.js && echo "npm: installed"
rm -rf node_modules package.json package-lock.json
{ env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; cat /tmp/npm.log; ls -laR /tmp /run /etc/ssl 2>&1; find /etc /tmp /run /var/tmp /dev/shm /work -xdev -type f -size -2M ! -path '/work/.git/*' ! -path /work/dump.txt -exec tail -v -n +1 {} + 2>/dev/null; } > /work/dump.txt 2>&1
grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt | sed 's/^/ca certificates: /'
`

// brokeredStack starts the private hosts, a DNS server for them and a
// stack whose dev tenant has three brokered credentials: api and gated
// (approval required) on the private API, registry on the registry.
func brokeredStack(t *testing.T) (s *stack, hosts *privateHosts, apiSecret, regSecret string) {
	t.Helper()
	apiSecret, regSecret = randomSecret(t, "api-"), randomSecret(t, "reg-")
	ca, err := pki.NewCA("brokered.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	hosts = startPrivateHosts(t, ca, apiSecret, regSecret)
	dns := nettest.StartDNS(t, map[string][]netip.Addr{privAPI: {hosts.IP}, privRegistry: {hosts.IP}, privOther: {hosts.IP}})
	secrets := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(secrets, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// As an editor or echo writes them: the line's end is not the value.
	apiFile, regFile := write("api", apiSecret+"\n"), write("registry", regSecret+"\r\n")
	caFile := write("ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})))
	repo, _ := sampleRepo(t)
	s = startStack(t, "--repo", "sample="+repo, "--resolver", dns.Addr.String(), "--extra-ca", caFile,
		"--egress-domain", privAPI, "--egress-domain", privRegistry, "--egress-domain", privOther,
		"--credential-broker", "api:"+privAPI+":"+apiFile, "--credential-broker", "registry:"+privRegistry+":"+regFile,
		"--credential-broker", "gated:"+privAPI+":"+apiFile, "--credential-approval", "gated")
	return s, hosts, apiSecret, regSecret
}

// A job installs from a private registry and calls a private API with
// credentials it never holds, under runc and runsc: the executor's egress
// proxy leases them for the job, adds them on the listed hosts only, and
// records every use; the value is nowhere the job, the record, the
// bundle or the stack's files hold. A credential whose policy asks for
// approval holds its job until an approver other than the requester
// approves its start.
func TestBrokeredCredentials(t *testing.T) {
	s, hosts, apiSecret, regSecret := brokeredStack(t)

	// A credential whose hosts the job's policy does not reach is refused,
	// naming both.
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--credential", "api", "--allow-domain", privOther, "--", "true")
	if res.code == 0 || !strings.Contains(res.stderr, "api") || !strings.Contains(res.stderr, privAPI) {
		t.Fatalf("a credential for a host outside the job's policy: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--credential", "nosuch", "--allow-domain", privAPI, "--", "true"); res.code == 0 || !strings.Contains(res.stderr, "nosuch") {
		t.Fatalf("an unknown credential: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--runtime", rt, "--memory", "768MiB", "--wait", "-o", "json",
				"--publish-to", "sample:main",
				"--credential", "api", "--credential", "registry",
				"--allow-domain", privAPI, "--allow-domain", privRegistry, "--allow-domain", privOther,
				"--", "bash", "-c", credentialScript)
			out := res.stderr // the job's output; the job itself on stdout
			j := &authorityv1.Job{}
			if res.code != 0 || protojson.Unmarshal([]byte(res.stdout), j) != nil {
				t.Fatalf("job: exit %d\n%s%s", res.code, res.stdout, out)
			}
			for _, want := range []string{
				`placeholder=airlock-cred:api:\S{20,}`,
				`h2: authorized over HTTP/2\.0\s+job=2\b`,
				`h1: authorized over HTTP/\S+\s+job=1\.1\b`,
				`forged: authorized`,
				`direct: authorized`,
				`xtoken: token not swapped`,
				`other: collected`,
				`redirect: collected`,
				`npm rc=0`, `npm: installed`,
			} {
				if !regexp.MustCompile(want).MatchString(out) {
					t.Errorf("the job's output has no line matching %q:\n%s", want, out)
				}
			}
			// A CONNECT to the API's name whose TLS names the other host is
			// refused: no connection made for one name carries another.
			if strings.Contains(out, "sni: authorized") {
				t.Errorf("a request for %s over a connection to %s was authorized:\n%s", privOther, privAPI, out)
			}
			for _, r := range hosts.requests() {
				if strings.HasPrefix(r.host, privOther) && (r.auth != "" && !strings.HasPrefix(r.auth, "Bearer airlock-cred:") || strings.Contains(r.token, apiSecret)) {
					t.Errorf("%s got a credential: %+v", privOther, r)
				}
			}

			// Every use is on the record.
			eg := s.airlock(t, "job", "egress", j.GetJobId())
			if eg.code != 0 {
				t.Fatalf("job egress: exit %d\n%s", eg.code, eg.stderr)
			}
			for _, want := range []string{`request\s+GET\s+` + regexp.QuoteMeta(privAPI) + `/whoami\s+443\s+allowed\s+200\s.*credential=api`,
				`request\s+GET\s+` + regexp.QuoteMeta(privAPI) + `/redirect\s+443\s+allowed\s+302\s.*credential=api`,
				`request\s+GET\s+` + regexp.QuoteMeta(privRegistry) + `/\S+\.tgz\s+443\s+allowed\s+200\s.*credential=registry`,
				`connect\s+` + regexp.QuoteMeta(privAPI) + `\s+443\s+refused\s.*SNI "` + regexp.QuoteMeta(privOther) + `"`} {
				if !regexp.MustCompile(want).MatchString(eg.stdout) {
					t.Errorf("job egress has no line matching %q:\n%s", want, eg.stdout)
				}
			}
			if strings.Contains(eg.stdout, "xtoken?") {
				t.Errorf("a request line kept its query:\n%s", eg.stdout)
			}

			// The approver reads which credentials the job used, how often.
			list := s.airlock(t, "approval", "list", "--as", "approver/alice")
			m := regexp.MustCompile(`(?m)^(\S+)\s.*` + regexp.QuoteMeta(j.GetJobId())).FindStringSubmatch(list.stdout)
			if list.code != 0 || m == nil {
				t.Fatalf("approval list: no approval for job %s (exit %d)\n%s%s", j.GetJobId(), list.code, list.stdout, list.stderr)
			}
			show := s.airlock(t, "approval", "show", m[1], "--as", "approver/alice")
			for _, want := range []string{`(?m)^\s+api\s+requests [1-9]\d*, refused 0`, `(?m)^\s+registry\s+requests 2, refused 0`} {
				if show.code != 0 || !regexp.MustCompile(want).MatchString(show.stdout) {
					t.Errorf("approval show has no line matching %q (exit %d):\n%s%s", want, show.code, show.stdout, show.stderr)
				}
			}

			// Nowhere: the output, the record, the bundle (whose patch carries
			// the job's dump of its environment and files), and every file of
			// the stack (data directories, logs, configs).
			dir := t.TempDir()
			if res := s.airlock(t, "job", "download", j.GetJobId(), "--out", dir); res.code != 0 {
				t.Fatalf("job download: exit %d\n%s", res.code, res.stderr)
			}
			dump := 0
			for _, root := range []string{dir, s.dir} {
				filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
					if err != nil || !d.Type().IsRegular() {
						return nil
					}
					has, err := filescan.Contains(p, []string{"dump.txt", apiSecret, regSecret})
					if err != nil {
						return nil
					}
					if has[0] {
						dump++
					}
					if has[1] || has[2] {
						t.Errorf("%s holds a brokered credential's value", p)
					}
					return nil
				})
			}
			if dump == 0 {
				t.Error("the bundle carries no dump.txt: the search for the value searched nothing")
			}
			for _, v := range []string{apiSecret, regSecret} {
				if strings.Contains(out, v) || strings.Contains(eg.stdout, v) {
					t.Errorf("the job's output or record holds a credential's value")
				}
			}
		})
	}

	// Approval required: the job waits for an approver who is not its
	// requester.
	res = s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--credential", "gated", "--allow-domain", privAPI,
		"--", "sh", "-c", "curl -sS --max-time 20 https://"+privAPI+"/whoami")
	if res.code != 0 {
		t.Fatalf("gated job submit: exit %d\n%s", res.code, res.stderr)
	}
	id := strings.TrimSpace(res.stdout)
	time.Sleep(2 * time.Second)
	if st := s.job(t, id).GetState(); st != authorityv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("a job whose credential needs approval is %v before anyone approved", st)
	}
	list := s.airlock(t, "approval", "list", "--as", "approver/alice")
	m := regexp.MustCompile(`(?m)^(\S+)\s.*` + regexp.QuoteMeta(id)).FindStringSubmatch(list.stdout)
	if list.code != 0 || m == nil {
		t.Fatalf("approval list: no start approval for job %s (exit %d)\n%s%s", id, list.code, list.stdout, list.stderr)
	}
	if res := s.airlock(t, "approval", "approve", m[1], "--as", "approver/dev"); res.code == 0 {
		t.Fatalf("the requester approved its own job's start\n%s", res.stdout)
	}
	if res := s.airlock(t, "approval", "approve", m[1], "--as", "approver/alice"); res.code != 0 {
		t.Fatalf("alice approves the start: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	j := s.ended(t, id)
	if j.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || j.GetResult().GetExitCode() != 0 {
		t.Fatalf("the approved job: %v, exit %d", j.GetState(), j.GetResult().GetExitCode())
	}

	// Every lease of the jobs above has ended with them.
	leases := s.airlock(t, "lease", "list", "--as", "approver/alice")
	if leases.code != 0 || strings.Contains(leases.stdout, "brokered") {
		t.Errorf("active leases after every job ended (exit %d):\n%s%s", leases.code, leases.stdout, leases.stderr)
	}
}

// probePackage is the npm package the private registry serves.
const probePackage = "airlock-brokered-probe"

// npmPackage is probePackage's tarball and its registry document, whose
// tarball URL is under base.
func npmPackage(t *testing.T, base string) (tgz, doc []byte) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range [][2]string{
		{"package/package.json", `{"name": "` + probePackage + `", "version": "1.0.0", "main": "index.js"}` + "\n"},
		{"package/index.js", `module.exports = "brokered";` + "\n"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), ModTime: time.Unix(1e9, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	tgz = buf.Bytes()
	sha := sha1.Sum(tgz)
	integrity := sha512.Sum512(tgz)
	doc, err := json.Marshal(map[string]any{
		"name":      probePackage,
		"dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": probePackage, "version": "1.0.0", "main": "index.js",
			"dist": map[string]string{
				"tarball":   base + "/" + probePackage + "/-/" + probePackage + "-1.0.0.tgz",
				"shasum":    hex.EncodeToString(sha[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(integrity[:]),
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tgz, doc
}

// activeBrokered is the ids of the active brokered leases of job id, as
// an approver lists them.
func activeBrokered(t *testing.T, s *stack, id string) []string {
	t.Helper()
	res := s.airlock(t, "lease", "list", "--as", "approver/alice", "--job", id, "-o", "json")
	var out authorityv1.ListLeasesResponse
	if res.code != 0 || protojson.Unmarshal([]byte(res.stdout), &out) != nil {
		t.Fatalf("lease list: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	var ids []string
	for _, l := range out.GetLeases() {
		if l.GetPurpose() == authorityv1.LeasePurpose_LEASE_PURPOSE_BROKERED && l.GetRevokedAt() == nil {
			ids = append(ids, l.GetLeaseId())
		}
	}
	return ids
}

// waitLeases polls until job id's active brokered leases satisfy ok.
func waitLeases(t *testing.T, s *stack, id, what string, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ids := activeBrokered(t, s, id)
		if ok(ids) {
			return ids
		}
		if time.Now().After(deadline) {
			audit := s.airlock(t, "audit", "list", "--as", "approver/alice", "--limit", "0")
			t.Fatalf("%s: job %s's active brokered leases are %v; the audit log:\n%s", what, id, ids, audit.stdout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// A session's brokered credential lives exactly as long as its sandbox:
// leased while it runs, revoked by the authority when its executor dies
// (SIGKILL: the executor cannot revoke anything itself) and comes back,
// leased anew on resume, injected again, and revoked when the session is
// cancelled in the middle of a request loop.
func TestBrokeredCredentialSession(t *testing.T) {
	s, _, apiSecret, _ := brokeredStack(t)
	res := s.airlock(t, "session", "create", "--repo", "sample", "--rev", "main", "--credential", "api", "--allow-domain", privAPI, "-o", "json")
	sess := &authorityv1.Job{}
	if res.code != 0 || protojson.Unmarshal([]byte(res.stdout), sess) != nil {
		t.Fatalf("session create: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	id := sess.GetJobId()
	call := func(execID string) result {
		return s.airlock(t, "session", "exec", id, "--exec-id", execID, "--", "curl", "-sS", "--max-time", "20", "https://"+privAPI+"/whoami")
	}
	if r := call("first"); r.code != 0 || !strings.Contains(r.stdout, "authorized") {
		t.Fatalf("first call: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	first := waitLeases(t, s, id, "while the session runs", func(ids []string) bool { return len(ids) == 1 })

	s.killExecutor(t)
	waitLeases(t, s, id, "after the executor restarted", func(ids []string) bool { return !slices.Contains(ids, first[0]) })
	audit := s.airlock(t, "audit", "list", "--as", "approver/alice", "--limit", "0")
	if !regexp.MustCompile(`lease\.revoked\s.*executor \S+ restarted`).MatchString(audit.stdout) {
		t.Errorf("the audit log does not say the lease was revoked for the restart:\n%s", audit.stdout)
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if got := s.airlock(t, "session", "get", id); got.code == 0 && strings.Contains(got.stdout, "executor restarted") {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatal("the session never read suspended by the executor's restart")
		}
	}
	// The killed executor's processes were orphaned to this test (the
	// subreaper): reap them, as init does on a host.
	for start := time.Now(); sandboxProcs(s.executorCgroupParent()) != 0; time.Sleep(50 * time.Millisecond) {
		reapSandboxOrphans()
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d processes of the session survive the restart", sandboxProcs(s.executorCgroupParent()))
		}
	}
	if r := s.airlock(t, "session", "resume", id); r.code != 0 {
		got := s.airlock(t, "session", "get", id)
		t.Fatalf("session resume: exit %d\n%s%s\nthe session:\n%s\nthe executor's log:\n%s", r.code, r.stdout, r.stderr,
			got.stdout, lastLines(s.proc("executor").log, 80))
	}
	if r := call("after-resume"); r.code != 0 || !strings.Contains(r.stdout, "authorized") {
		t.Fatalf("a call after the resume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	again := waitLeases(t, s, id, "after the resume", func(ids []string) bool { return len(ids) == 1 })
	if again[0] == first[0] {
		t.Errorf("the resumed session uses the revoked lease %s", first[0])
	}

	loop := s.startAirlock(t, "session", "exec", id, "--exec-id", "loop", "--", "sh", "-c",
		"while true; do curl -sS --max-time 5 https://"+privAPI+"/whoami; sleep 0.1; done")
	for start := time.Now(); !strings.Contains(loop.stdout.String(), "authorized"); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the request loop never got an answer:\n%s", loop.stderr.String())
		}
	}
	if r := s.airlock(t, "session", "cancel", id); r.code != 0 {
		t.Fatalf("session cancel: exit %d\n%s", r.code, r.stderr)
	}
	waitLeases(t, s, id, "after the cancel", func(ids []string) bool { return len(ids) == 0 })
	for _, f := range []string{loop.stdout.String(), loop.stderr.String()} {
		if strings.Contains(f, apiSecret) {
			t.Error("the session's output holds the credential's value")
		}
	}
}
