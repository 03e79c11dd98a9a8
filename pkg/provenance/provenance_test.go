package provenance_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/provenance"
)

const td = "airlock.test"

var (
	executorID  = identity.Service(td, "executor")
	authorityID = identity.Service(td, "authority")
	clientID    = identity.MustParse("spiffe://" + td + "/client/dev")
)

// ca is a throwaway CA on disk with every service and client/dev issued.
type ca struct {
	dir   string
	ca    *pki.CA
	roots *x509.CertPool
}

func newCA(t *testing.T) *ca {
	t.Helper()
	dir := t.TempDir()
	c, err := pki.Init(dir, td, []identity.ID{clientID})
	if err != nil {
		t.Fatalf("pki.Init: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(c.Cert)
	return &ca{dir: dir, ca: c, roots: roots}
}

// pair reads id's key and certificate the way the executor does: from the
// files pki wrote.
func (c *ca) pair(t *testing.T, id identity.ID) (crypto.Signer, *x509.Certificate) {
	t.Helper()
	certFile, keyFile := pki.Paths(c.dir, id)
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ParseCertificatePEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

var (
	bundleDigest = digestOf("bundle bytes")
	started      = time.Now().UTC().Truncate(time.Second).Add(-time.Minute)
	run          = provenance.Run{
		JobID: "job-1", Tenant: "acme", Requester: clientID.String(), Repository: "widgets",
		BaseCommit: strings.Repeat("ab", 20), GrantDigest: digestOf("grant"), Executor: "executor-0",
		RuntimeClass: "runsc", RuntimeVersion: "runsc 2030", TemplateVersion: "t1",
		Reason: "exited", ExitCode: 3, StartedOn: started, FinishedOn: started.Add(time.Minute),
	}
)

func sign(t *testing.T, key crypto.Signer, chain ...*x509.Certificate) []byte {
	t.Helper()
	env, err := provenance.Sign("bundle.tar", bundleDigest, run, key, chain)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return env
}

func decode(t *testing.T, data []byte) provenance.Envelope {
	t.Helper()
	var env provenance.Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		t.Fatal(err)
	}
	return env
}

func encode(t *testing.T, env provenance.Envelope) []byte {
	t.Helper()
	data, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// pae is DSSE's pre-authentication encoding, written here from the DSSE
// specification rather than taken from the package, so a package that drifts
// from the standard fails TestSignFollowsDSSE.
func pae(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
}

// signStatement builds an envelope around any payload with key, as an
// attacker holding that key (or a buggy signer) could.
func signStatement(t *testing.T, payload []byte, key crypto.Signer, chain ...*x509.Certificate) []byte {
	t.Helper()
	sum := sha256.Sum256(pae(provenance.PayloadType, payload))
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	env := provenance.Envelope{
		PayloadType: provenance.PayloadType,
		Payload:     base64.StdEncoding.EncodeToString(payload),
		Signatures:  []provenance.Signature{{KeyID: "whatever", Sig: base64.StdEncoding.EncodeToString(sig)}},
	}
	for _, c := range chain {
		env.Certificates = append(env.Certificates, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
	}
	return encode(t, env)
}

func statementJSON(t *testing.T, st provenance.Statement) []byte {
	t.Helper()
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func goodStatement() provenance.Statement {
	return provenance.Statement{
		Type:          provenance.StatementType,
		Subject:       []provenance.Subject{{Name: "bundle.tar", Digest: map[string]string{"sha256": strings.TrimPrefix(bundleDigest, "sha256:")}}},
		PredicateType: provenance.PredicateType,
		Predicate:     run,
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	data := sign(t, key, cert, c.ca.Cert)

	v, err := provenance.Verify(data, bundleDigest, c.roots, executorID)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if v.Signer != executorID {
		t.Errorf("signer = %s, want %s", v.Signer, executorID)
	}
	st := v.Statement
	if st.Type != provenance.StatementType || st.PredicateType != provenance.PredicateType {
		t.Errorf("statement types = %q, %q", st.Type, st.PredicateType)
	}
	if len(st.Subject) != 1 || st.Subject[0].Name != "bundle.tar" || "sha256:"+st.Subject[0].Digest["sha256"] != bundleDigest {
		t.Errorf("subject = %+v, want bundle.tar at %s", st.Subject, bundleDigest)
	}
	got := st.Predicate
	if !got.StartedOn.Equal(run.StartedOn) || !got.FinishedOn.Equal(run.FinishedOn) {
		t.Errorf("times = %v..%v, want %v..%v", got.StartedOn, got.FinishedOn, run.StartedOn, run.FinishedOn)
	}
	got.StartedOn, got.FinishedOn = run.StartedOn, run.FinishedOn
	if got != run {
		t.Errorf("predicate = %+v, want %+v", got, run)
	}

	env := decode(t, data)
	if env.PayloadType != provenance.PayloadType {
		t.Errorf("payloadType = %q", env.PayloadType)
	}
	if len(env.Signatures) != 1 || env.Signatures[0].KeyID != executorID.String() {
		t.Errorf("signatures = %+v, want one with keyid %s", env.Signatures, executorID)
	}

	// The leaf alone is enough: the CA comes from roots.
	if _, err := provenance.Verify(sign(t, key, cert), bundleDigest, c.roots, executorID); err != nil {
		t.Errorf("leaf-only chain: %v", err)
	}
}

// TestSignFollowsDSSE checks the signature is over the DSSE PAE of the
// payload, so third-party DSSE verifiers agree with ours.
func TestSignFollowsDSSE(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	env := decode(t, sign(t, key, cert))
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pae(provenance.PayloadType, payload))
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		t.Fatalf("leaf key is %T, want ECDSA", cert.PublicKey)
	}
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		t.Fatal("signature is not ECDSA-SHA256 over DSSE PAE(payloadType, payload)")
	}

	// And an envelope built from the specification by hand verifies.
	if _, err := provenance.Verify(signStatement(t, statementJSON(t, goodStatement()), key, cert), bundleDigest, c.roots, executorID); err != nil {
		t.Fatalf("hand-built DSSE envelope: %v", err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	good := sign(t, key, cert, c.ca.Cert)

	// Another CA that issued a certificate with the very same SPIFFE ID.
	rogue := newCA(t)
	rogueKey, rogueCert := rogue.pair(t, executorID)
	// Another identity from the real CA.
	clientKey, clientCert := c.pair(t, clientID)
	_, publisherCert := c.pair(t, identity.Service(td, "publisher"))
	// The executor's certificate after a rotation: same identity, new key.
	rotated, err := pki.IssueInto(c.dir, executorID, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An executor certificate that has expired.
	expired, err := c.ca.Issue(executorID, pki.IssueOptions{NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	expiredKey, err := pki.ParsePrivateKeyPEM(expired.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// A certificate not valid until tomorrow.
	future, err := c.ca.Issue(executorID, pki.IssueOptions{NotBefore: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	futureKey, err := pki.ParsePrivateKeyPEM(future.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}

	mutate := func(f func(*provenance.Envelope)) []byte {
		env := decode(t, good)
		f(&env)
		return encode(t, env)
	}
	withStatement := func(f func(*provenance.Statement)) []byte {
		return mutate(func(env *provenance.Envelope) {
			payload, err := base64.StdEncoding.DecodeString(env.Payload)
			if err != nil {
				t.Fatal(err)
			}
			var st provenance.Statement
			if err := json.Unmarshal(payload, &st); err != nil {
				t.Fatal(err)
			}
			f(&st)
			env.Payload = base64.StdEncoding.EncodeToString(statementJSON(t, st))
		})
	}
	certPEM := func(c *x509.Certificate) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}

	for _, tc := range []struct {
		name     string
		envelope []byte
		digest   string
		signer   identity.ID
		msg      string
	}{
		{name: "wrong digest", envelope: good, digest: digestOf("another bundle"), msg: "not about bundle"},
		{name: "empty digest", envelope: good, digest: "", msg: "sha256:<64 lowercase hex>"},
		{name: "upper-case algorithm", envelope: good, digest: "SHA256:" + strings.TrimPrefix(bundleDigest, "sha256:"), msg: "sha256:<64 lowercase hex>"},
		{name: "exit code rewritten", envelope: withStatement(func(st *provenance.Statement) { st.Predicate.ExitCode = 0 }), msg: "signature does not verify"},
		{name: "subject moved to another bundle", envelope: withStatement(func(st *provenance.Statement) {
			st.Subject[0].Digest["sha256"] = strings.TrimPrefix(digestOf("evil"), "sha256:")
		}), digest: digestOf("evil"), msg: "signature does not verify"},
		{name: "payload with trailing space", envelope: mutate(func(env *provenance.Envelope) {
			p, _ := base64.StdEncoding.DecodeString(env.Payload)
			env.Payload = base64.StdEncoding.EncodeToString(append(p, ' '))
		}), msg: "signature does not verify"},
		{name: "payload not base64", envelope: mutate(func(env *provenance.Envelope) { env.Payload = "!!" + env.Payload }), msg: "payload"},
		{name: "signature bit flipped", envelope: mutate(func(env *provenance.Envelope) {
			sig, _ := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
			sig[len(sig)/2] ^= 1
			env.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
		}), msg: "signature does not verify"},
		{name: "signature of another statement", envelope: mutate(func(env *provenance.Envelope) {
			other := decode(t, withStatementSigned(t, key, cert, func(st *provenance.Statement) { st.Predicate.ExitCode = 0 }))
			env.Signatures[0].Sig = other.Signatures[0].Sig
		}), msg: "signature does not verify"},
		{name: "signature empty", envelope: mutate(func(env *provenance.Envelope) { env.Signatures[0].Sig = "" }), msg: "signature does not verify"},
		{name: "signature not base64", envelope: mutate(func(env *provenance.Envelope) { env.Signatures[0].Sig = "%%%" }), msg: "signature"},
		{name: "payload type changed", envelope: mutate(func(env *provenance.Envelope) { env.PayloadType = "application/json" })},
		{name: "second signature", envelope: mutate(func(env *provenance.Envelope) {
			env.Signatures = append(env.Signatures, env.Signatures[0])
		}), msg: "one"},
		{name: "no signatures", envelope: mutate(func(env *provenance.Envelope) { env.Signatures = nil }), msg: "one"},
		{name: "no certificates", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = nil }), msg: "certificate"},
		{name: "empty certificate list", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = []string{} }), msg: "certificate"},
		{name: "certificate not PEM", envelope: mutate(func(env *provenance.Envelope) { env.Certificates[0] = "not a certificate" }), msg: "PEM"},
		{name: "certificate DER garbage", envelope: mutate(func(env *provenance.Envelope) {
			env.Certificates[0] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}))
		}), msg: "certificate"},
		{name: "another CA, same SPIFFE ID, valid signature", envelope: sign(t, rogueKey, rogueCert), msg: "signing certificate"},
		{name: "another CA shipped as intermediate", envelope: sign(t, rogueKey, rogueCert, rogue.ca.Cert), msg: "signing certificate"},
		{name: "another CA certificate presented as the real CA", envelope: sign(t, rogueKey, rogueCert, c.ca.Cert), msg: "signing certificate"},
		{name: "real envelope with a rogue leaf swapped in", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = []string{certPEM(rogueCert)} }), msg: "signing certificate"},
		{name: "verify expecting the authority", envelope: good, signer: authorityID, msg: "want " + authorityID.String()},
		{name: "signed by client/dev", envelope: sign(t, clientKey, clientCert), msg: "signed by " + clientID.String()},
		{name: "executor's signature with the publisher's certificate", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = []string{certPEM(publisherCert)} }), msg: "signed by"},
		{name: "client key claiming the executor certificate", envelope: sign(t, clientKey, cert), msg: "signature does not verify"},
		{name: "old signature with the rotated certificate", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = []string{string(rotated.CertPEM)} }), msg: "signature does not verify"},
		{name: "expired certificate", envelope: sign(t, expiredKey, expired.Cert), msg: "signing certificate"},
		{name: "certificate not yet valid", envelope: sign(t, futureKey, future.Cert), msg: "signing certificate"},
		{name: "CA certificate as the leaf", envelope: mutate(func(env *provenance.Envelope) { env.Certificates = []string{certPEM(c.ca.Cert)} })},
		{name: "malformed JSON", envelope: []byte(`{"payloadType":`), msg: "envelope"},
		{name: "empty input", envelope: nil, msg: "envelope"},
		{name: "JSON null", envelope: []byte("null")},
		{name: "JSON array", envelope: []byte("[]"), msg: "envelope"},
		{name: "statement type wrong", envelope: signStatement(t, statementJSON(t, func() provenance.Statement {
			st := goodStatement()
			st.Type = "https://in-toto.io/Statement/v0.1"
			return st
		}()), key, cert), msg: "not about bundle"},
		{name: "predicate type wrong", envelope: signStatement(t, statementJSON(t, func() provenance.Statement {
			st := goodStatement()
			st.PredicateType = "https://slsa.dev/provenance/v1"
			return st
		}()), key, cert), msg: "not about bundle"},
		{name: "two subjects", envelope: signStatement(t, statementJSON(t, func() provenance.Statement {
			st := goodStatement()
			st.Subject = append(st.Subject, provenance.Subject{Name: "other", Digest: map[string]string{"sha256": strings.Repeat("0", 64)}})
			return st
		}()), key, cert), msg: "not about bundle"},
		{name: "signed statement not JSON", envelope: signStatement(t, []byte("not json"), key, cert), msg: "statement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			digest := bundleDigest
			if tc.digest != "" || tc.name == "empty digest" {
				digest = tc.digest
			}
			signer := executorID
			if !tc.signer.IsZero() {
				signer = tc.signer
			}
			v, err := provenance.Verify(tc.envelope, digest, c.roots, signer)
			if !errors.Is(err, provenance.ErrInvalid) {
				t.Fatalf("Verify = %+v, %v; want ErrInvalid", v, err)
			}
			if v != nil {
				t.Errorf("Verify returned %+v with its error", v)
			}
			if tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}

	// The good envelope still verifies: every failure above came from the
	// change, not from the setup.
	if _, err := provenance.Verify(good, bundleDigest, c.roots, executorID); err != nil {
		t.Fatalf("unchanged envelope: %v", err)
	}
	if _, err := provenance.Verify(good, bundleDigest, x509.NewCertPool(), executorID); !errors.Is(err, provenance.ErrInvalid) {
		t.Errorf("empty root pool: error = %v, want ErrInvalid", err)
	}
	if _, err := provenance.Verify(good, bundleDigest, rogue.roots, executorID); !errors.Is(err, provenance.ErrInvalid) {
		t.Errorf("rogue CA as the only root: error = %v, want ErrInvalid", err)
	}
}

func withStatementSigned(t *testing.T, key crypto.Signer, cert *x509.Certificate, f func(*provenance.Statement)) []byte {
	t.Helper()
	st := goodStatement()
	f(&st)
	return signStatement(t, statementJSON(t, st), key, cert)
}

// TestVerifyDigestArgument covers digests a caller might pass that are not
// the canonical "sha256:<64 lowercase hex>" of the bundle. A statement whose subject
// has no sha256 at all must not verify against the empty string.
func TestVerifyDigestArgument(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	noSHA256 := goodStatement()
	noSHA256.Subject[0].Digest = map[string]string{"sha512": strings.Repeat("0", 128)}
	for _, tc := range []struct {
		name, digest string
		envelope     []byte
	}{
		{"bare hex", strings.TrimPrefix(bundleDigest, "sha256:"), sign(t, key, cert)},
		{"empty digest, subject without sha256", "", signStatement(t, statementJSON(t, noSHA256), key, cert)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := provenance.Verify(tc.envelope, tc.digest, c.roots, executorID); !errors.Is(err, provenance.ErrInvalid) {
				t.Fatalf("Verify(digest %q) = %v, want ErrInvalid", tc.digest, err)
			}
		})
	}
}

// TestVerifyChecksClaimedSigningTime holds Verify to its doc comment: the
// certificate must be valid "at the time of signing claimed by the
// statement and now".
func TestVerifyChecksClaimedSigningTime(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	st := goodStatement()
	st.Predicate.StartedOn = cert.NotBefore.AddDate(-1, 0, 0)
	st.Predicate.FinishedOn = cert.NotBefore.AddDate(-1, 0, 1)
	if _, err := provenance.Verify(signStatement(t, statementJSON(t, st), key, cert), bundleDigest, c.roots, executorID); !errors.Is(err, provenance.ErrInvalid) {
		t.Fatalf("statement claiming to finish a year before the certificate existed: error = %v, want ErrInvalid", err)
	}
}

func TestSignRefuses(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	hexDigest := strings.TrimPrefix(bundleDigest, "sha256:")
	for _, tc := range []struct {
		name, digest string
		chain        []*x509.Certificate
		msg          string
	}{
		{"empty digest", "", []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"bare hex", hexDigest, []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"prefix only", "sha256:", []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"63 hex", "sha256:" + hexDigest[:63], []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"65 hex", "sha256:" + hexDigest + "0", []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"sha512", "sha512:" + hexDigest + hexDigest, []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"upper-case prefix", "SHA256:" + hexDigest, []*x509.Certificate{cert}, "sha256:<64 lowercase hex>"},
		{"no certificate", bundleDigest, nil, "certificate"},
		{"certificate without an identity", bundleDigest, []*x509.Certificate{c.ca.Cert}, "signing certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, err := provenance.Sign("bundle.tar", tc.digest, run, key, tc.chain)
			if err == nil {
				t.Fatalf("Sign accepted it: %s", env)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

func TestSignRefusesNonHexDigest(t *testing.T) {
	c := newCA(t)
	key, cert := c.pair(t, executorID)
	for _, d := range []string{
		"sha256:" + strings.Repeat("z", 64),
		"sha256:" + strings.Repeat("0", 62) + "/.",
		"sha256:" + strings.ToUpper(strings.TrimPrefix(bundleDigest, "sha256:")),
	} {
		if env, err := provenance.Sign("bundle.tar", d, run, key, []*x509.Certificate{cert}); err == nil {
			t.Errorf("Sign(%q) accepted it: %.80s...", d, env)
		}
	}
}
