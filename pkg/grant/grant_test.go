package grant_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/pkg/grant"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

var now = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const commit = "0123456789abcdef0123456789abcdef01234567"

// validGrant is a grant every check accepts at now.
func validGrant() *typesv1.Grant {
	issued, expires := grant.Timestamps(now, time.Hour)
	return &typesv1.Grant{
		JobId:      "job-1",
		Tenant:     "acme",
		Requester:  "spiffe://airlock.test/client/dev",
		Repository: "widgets",
		Commit:     commit,
		Command:    []string{"make", "test"},
		Env:        map[string]string{"B": "2", "A": "1", "C": "3"},
		Limits: &typesv1.ResourceLimits{
			CpuMillis: 1000, MemoryBytes: 1 << 30, Pids: 256, DiskBytes: 1 << 30,
			Deadline: durationpb.New(10 * time.Minute),
		},
		NetworkPolicy: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		RuntimeClass:  typesv1.RuntimeClass_RUNTIME_CLASS_RUNSC,
		IssuedAt:      issued,
		ExpiresAt:     expires,
	}
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pubOf(key ed25519.PrivateKey) ed25519.PublicKey { return key.Public().(ed25519.PublicKey) }

func mustSign(t *testing.T, s *grant.Signer, g *typesv1.Grant) *typesv1.SignedGrant {
	t.Helper()
	sg, err := s.Sign(g)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return sg
}

// signRaw signs arbitrary body bytes with key the way an authority would,
// bypassing Signer's own shape check, so Verify's checks stand alone.
func signRaw(key ed25519.PrivateKey, body []byte) *typesv1.SignedGrant {
	return &typesv1.SignedGrant{Body: body, Signature: ed25519.Sign(key, body), KeyId: grant.KeyID(pubOf(key))}
}

func wantErr(t *testing.T, err, sentinel error, msg string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error = %v, want %v", err, sentinel)
	}
	if msg != "" && !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q does not mention %q", err, msg)
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	key := newKey(t)
	s := grant.NewSigner(key)
	g := validGrant()
	sg := mustSign(t, s, g)

	if g.GetVersion() != grant.FormatVersion {
		t.Errorf("Sign left version %d, want %d", g.GetVersion(), grant.FormatVersion)
	}
	if sg.GetKeyId() != grant.KeyID(pubOf(key)) || sg.GetKeyId() != s.KeyID() {
		t.Errorf("key id = %q, want %q", sg.GetKeyId(), grant.KeyID(pubOf(key)))
	}
	if !s.PublicKey().Equal(pubOf(key)) {
		t.Error("PublicKey is not the signing key's public half")
	}
	got, err := grant.NewVerifier(s.PublicKey()).Verify(sg, now)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !proto.Equal(got, g) {
		t.Errorf("Verify returned %v, want %v", got, g)
	}

	// Deterministic: signing the same grant again gives the same body (and,
	// Ed25519 being deterministic, the same signature).
	again := mustSign(t, s, validGrant())
	if !bytes.Equal(again.GetBody(), sg.GetBody()) || !bytes.Equal(again.GetSignature(), sg.GetSignature()) {
		t.Error("signing the same grant twice gave different bytes")
	}
}

func TestVerifyDuringKeyRotation(t *testing.T) {
	oldKey, newKey := newKey(t), newKey(t)
	v := grant.NewVerifier(pubOf(oldKey), pubOf(newKey))
	for name, key := range map[string]ed25519.PrivateKey{"old": oldKey, "new": newKey} {
		if _, err := v.Verify(mustSign(t, grant.NewSigner(key), validGrant()), now); err != nil {
			t.Errorf("%s key: Verify: %v", name, err)
		}
	}
}

func TestVerifyRejectsEveryTamperedBodyByte(t *testing.T) {
	key := newKey(t)
	sg := mustSign(t, grant.NewSigner(key), validGrant())
	v := grant.NewVerifier(pubOf(key))
	for i := range sg.GetBody() {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			forged := proto.Clone(sg).(*typesv1.SignedGrant)
			forged.Body[i] ^= mask
			if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
				t.Fatalf("body byte %d ^ %#x: error = %v, want ErrBadSignature", i, mask, err)
			}
		}
	}
	for name, body := range map[string][]byte{
		"truncated":          sg.GetBody()[:len(sg.GetBody())-1],
		"appended byte":      append(bytes.Clone(sg.GetBody()), 0),
		"appended job_id":    protowireString(sg.GetBody(), 2, "job-2"),
		"appended tenant":    protowireString(sg.GetBody(), 3, "other-tenant"),
		"appended commit":    protowireString(sg.GetBody(), 6, strings.Repeat("f", 40)),
		"prepended field 99": append(protowireString(nil, 99, "x"), sg.GetBody()...),
	} {
		forged := proto.Clone(sg).(*typesv1.SignedGrant)
		forged.Body = body
		if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
			t.Errorf("%s: error = %v, want ErrBadSignature", name, err)
		}
	}
}

// protowireString appends a length-delimited field to b: protobuf's "last
// one wins" rule makes a field appended to a signed body override the
// signed value if anything parsed the body before checking the signature.
func protowireString(b []byte, field int, s string) []byte {
	out := append(bytes.Clone(b), byte(field<<3|2))
	if field >= 16 {
		out = append(out[:len(out)-1], byte(field<<3|2)|0x80, byte(field>>4))
	}
	out = append(out, byte(len(s)))
	return append(out, s...)
}

func TestVerifyRejectsTamperedSignature(t *testing.T) {
	key := newKey(t)
	sg := mustSign(t, grant.NewSigner(key), validGrant())
	v := grant.NewVerifier(pubOf(key))
	for i := range sg.GetSignature() {
		forged := proto.Clone(sg).(*typesv1.SignedGrant)
		forged.Signature[i] ^= 0x01
		if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
			t.Fatalf("signature byte %d flipped: error = %v, want ErrBadSignature", i, err)
		}
	}
	for name, sig := range map[string][]byte{
		"truncated":  sg.GetSignature()[:ed25519.SignatureSize-1],
		"too long":   append(bytes.Clone(sg.GetSignature()), 0),
		"all zeroes": make([]byte, ed25519.SignatureSize),
	} {
		forged := proto.Clone(sg).(*typesv1.SignedGrant)
		forged.Signature = sig
		if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
			t.Errorf("%s: error = %v, want ErrBadSignature", name, err)
		}
	}
}

func TestVerifyRejectsOtherKeys(t *testing.T) {
	trusted, attacker := newKey(t), newKey(t)
	v := grant.NewVerifier(pubOf(trusted))
	sg := mustSign(t, grant.NewSigner(attacker), validGrant())

	_, err := v.Verify(sg, now)
	wantErr(t, err, grant.ErrUnknownKey, grant.KeyID(pubOf(attacker)))

	// Claiming the trusted key's id does not make the attacker's signature
	// verify under it.
	forged := proto.Clone(sg).(*typesv1.SignedGrant)
	forged.KeyId = grant.KeyID(pubOf(trusted))
	if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
		t.Errorf("forged key id: error = %v, want ErrBadSignature", err)
	}

	for _, id := range []string{"", strings.ToUpper(grant.KeyID(pubOf(trusted))), grant.KeyID(pubOf(trusted)) + " "} {
		forged := mustSign(t, grant.NewSigner(trusted), validGrant())
		forged.KeyId = id
		if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrUnknownKey) {
			t.Errorf("key id %q: error = %v, want ErrUnknownKey", id, err)
		}
	}

	if _, err := grant.NewVerifier().Verify(mustSign(t, grant.NewSigner(trusted), validGrant()), now); !errors.Is(err, grant.ErrUnknownKey) {
		t.Errorf("verifier with no keys: error = %v, want ErrUnknownKey", err)
	}
}

func TestVerifyExpiry(t *testing.T) {
	key := newKey(t)
	sg := mustSign(t, grant.NewSigner(key), validGrant())
	expires := now.Add(time.Hour)
	v := grant.NewVerifier(pubOf(key))
	for _, tc := range []struct {
		name string
		at   time.Time
		err  error
	}{
		{"at issue", now, nil},
		{"a nanosecond before expiry", expires.Add(-time.Nanosecond), nil},
		{"exactly at expiry", expires, grant.ErrExpired},
		{"after expiry", expires.Add(time.Second), grant.ErrExpired},
		{"years later", expires.AddDate(5, 0, 0), grant.ErrExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(sg, tc.at)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error = %v, want %v", err, tc.err)
			}
		})
	}
}

func TestVerifyRejectsWidenedGrant(t *testing.T) {
	key := newKey(t)
	sg := mustSign(t, grant.NewSigner(key), validGrant())
	v := grant.NewVerifier(pubOf(key))
	for _, tc := range []struct {
		name  string
		widen func(*typesv1.Grant)
	}{
		{"memory", func(g *typesv1.Grant) { g.Limits.MemoryBytes *= 64 }},
		{"deadline", func(g *typesv1.Grant) { g.Limits.Deadline = durationpb.New(100 * time.Hour) }},
		{"cpu", func(g *typesv1.Grant) { g.Limits.CpuMillis = 64000 }},
		{"network", func(g *typesv1.Grant) {
			g.NetworkPolicy = &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_Allow{Allow: &typesv1.AllowList{
				Rules: []*typesv1.AllowRule{{Cidr: "0.0.0.0/0"}},
			}}}
		}},
		{"expiry", func(g *typesv1.Grant) { g.ExpiresAt = timestamppb.New(now.AddDate(1, 0, 0)) }},
		{"tenant", func(g *typesv1.Grant) { g.Tenant = "other" }},
		{"env", func(g *typesv1.Grant) { g.Env["LD_PRELOAD"] = "/tmp/x.so" }},
		{"publish target", func(g *typesv1.Grant) {
			g.PublishTarget = &typesv1.PublishTarget{Repository: "widgets", Branch: "main"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := v.Verify(sg, now)
			if err != nil {
				t.Fatal(err)
			}
			tc.widen(g)
			for _, det := range []bool{true, false} {
				body, err := proto.MarshalOptions{Deterministic: det}.Marshal(g)
				if err != nil {
					t.Fatal(err)
				}
				forged := &typesv1.SignedGrant{Body: body, Signature: sg.GetSignature(), KeyId: sg.GetKeyId()}
				if _, err := v.Verify(forged, now); !errors.Is(err, grant.ErrBadSignature) {
					t.Fatalf("deterministic=%v: error = %v, want ErrBadSignature", det, err)
				}
			}
		})
	}
}

// shapeCases are grants missing something every run needs; msg is what the
// error must name.
var shapeCases = []struct {
	name   string
	mutate func(*typesv1.Grant)
	msg    string
}{
	{"no job_id", func(g *typesv1.Grant) { g.JobId = "" }, "job_id"},
	{"no tenant", func(g *typesv1.Grant) { g.Tenant = "" }, "tenant"},
	{"no commit", func(g *typesv1.Grant) { g.Commit = "" }, "commit"},
	{"short commit", func(g *typesv1.Grant) { g.Commit = commit[:12] }, "commit"},
	{"commit 39 hex", func(g *typesv1.Grant) { g.Commit = commit[:39] }, "commit"},
	{"commit 41 hex", func(g *typesv1.Grant) { g.Commit = commit + "0" }, "commit"},
	{"no command", func(g *typesv1.Grant) { g.Command = nil }, "command"},
	{"no limits", func(g *typesv1.Grant) { g.Limits = nil }, "limits"},
	{"no network policy", func(g *typesv1.Grant) { g.NetworkPolicy = nil }, "network_policy"},
	{"no issued_at", func(g *typesv1.Grant) { g.IssuedAt = nil }, "issued_at"},
	{"no expires_at", func(g *typesv1.Grant) { g.ExpiresAt = nil }, "expires_at"},
}

// bugCases were refusals the package promised but did not make until they
// were reported by these tests and fixed; they stay as regression cases.
var bugCases = []struct {
	name   string
	mutate func(*typesv1.Grant)
	msg    string
}{
	// checkShape only measures the commit's length: 40 characters that are
	// not hex pass as a "full SHA".
	{"commit of 40 non-hex characters", func(g *typesv1.Grant) { g.Commit = strings.Repeat("z", 40) }, "commit"},
	{"commit of 40 characters with a path", func(g *typesv1.Grant) { g.Commit = "../../../../../../../../../../etc/passwd" }, "commit"},
	// NetworkPolicy says "exactly one mode is required"; an empty one passes.
	{"network policy with no mode", func(g *typesv1.Grant) { g.NetworkPolicy = &typesv1.NetworkPolicy{} }, "network_policy"},
}

func TestSignRejectsIncompleteGrants(t *testing.T) {
	s := grant.NewSigner(newKey(t))
	for _, tc := range shapeCases {
		t.Run(tc.name, func(t *testing.T) {
			g := validGrant()
			tc.mutate(g)
			sg, err := s.Sign(g)
			if sg != nil {
				t.Errorf("Sign returned a signed grant along with error %v", err)
			}
			wantErr(t, err, grant.ErrMalformed, tc.msg)
		})
	}
	for _, tc := range bugCases {
		t.Run("bug/"+tc.name, func(t *testing.T) {
			g := validGrant()
			tc.mutate(g)
			_, err := s.Sign(g)
			wantErr(t, err, grant.ErrMalformed, tc.msg)
		})
	}
}

// TestVerifyRejectsIncompleteGrants signs incomplete bodies with the real key
// directly, so only Verify's own shape check stands between them and a run.
func TestVerifyRejectsIncompleteGrants(t *testing.T) {
	key := newKey(t)
	v := grant.NewVerifier(pubOf(key))
	for _, tc := range shapeCases {
		t.Run(tc.name, func(t *testing.T) {
			g := validGrant()
			g.Version = grant.FormatVersion
			tc.mutate(g)
			body, err := proto.Marshal(g)
			if err != nil {
				t.Fatal(err)
			}
			got, err := v.Verify(signRaw(key, body), now)
			if got != nil {
				t.Errorf("Verify returned a grant along with error %v", err)
			}
			wantErr(t, err, grant.ErrMalformed, tc.msg)
		})
	}
	for _, tc := range bugCases {
		t.Run("bug/"+tc.name, func(t *testing.T) {
			g := validGrant()
			g.Version = grant.FormatVersion
			tc.mutate(g)
			body, err := proto.Marshal(g)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Verify(signRaw(key, body), now)
			wantErr(t, err, grant.ErrMalformed, tc.msg)
		})
	}
}

func TestVerifyAcceptsSHA256Commit(t *testing.T) {
	key := newKey(t)
	g := validGrant()
	g.Commit = strings.Repeat("ab", 32)
	if _, err := grant.NewVerifier(pubOf(key)).Verify(mustSign(t, grant.NewSigner(key), g), now); err != nil {
		t.Fatalf("64-hex commit: %v", err)
	}
}

func TestVerifyRejectsOtherVersions(t *testing.T) {
	key := newKey(t)
	v := grant.NewVerifier(pubOf(key))
	for _, version := range []uint32{0, grant.FormatVersion + 1, 1 << 31} {
		g := validGrant()
		g.Version = version
		body, err := proto.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(signRaw(key, body), now)
		wantErr(t, err, grant.ErrMalformed, "version")
	}

	// A future-version grant from the real Signer is refused the same way.
	g := validGrant()
	g.Version = grant.FormatVersion + 1
	sg := mustSign(t, grant.NewSigner(key), g)
	_, err := v.Verify(sg, now)
	wantErr(t, err, grant.ErrMalformed, "version 2")
}

func TestVerifyRejectsMalformedEnvelopes(t *testing.T) {
	key := newKey(t)
	v := grant.NewVerifier(pubOf(key))
	good := mustSign(t, grant.NewSigner(key), validGrant())
	for _, tc := range []struct {
		name string
		sg   *typesv1.SignedGrant
		err  error
		msg  string
	}{
		{"nil", nil, grant.ErrMalformed, "body"},
		{"empty", &typesv1.SignedGrant{}, grant.ErrMalformed, "body"},
		{"no body", &typesv1.SignedGrant{Signature: good.GetSignature(), KeyId: good.GetKeyId()}, grant.ErrMalformed, "body"},
		{"no signature", &typesv1.SignedGrant{Body: good.GetBody(), KeyId: good.GetKeyId()}, grant.ErrMalformed, "signature"},
		// Signed garbage: authentic bytes that are not a Grant.
		{"signed garbage", signRaw(key, []byte{0xff, 0xff, 0xff}), grant.ErrMalformed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := v.Verify(tc.sg, now)
			if g != nil {
				t.Errorf("Verify returned a grant along with error %v", err)
			}
			wantErr(t, err, tc.err, tc.msg)
		})
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("mode of %s = %#o, want %#o", path, got, want)
	}
}

func TestLoadOrCreateSigner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "keys")
	path := filepath.Join(dir, "grant.key")
	s1, err := grant.LoadOrCreateSigner(path)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	checkMode(t, path, 0o600)
	checkMode(t, path+".pub", 0o644)
	checkMode(t, dir, 0o700)
	keyPEM, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	s2, err := grant.LoadOrCreateSigner(path)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if !s1.PublicKey().Equal(s2.PublicKey()) || s1.KeyID() != s2.KeyID() {
		t.Fatal("reloading gave a different key")
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(keyPEM, after) {
		t.Error("reloading rewrote the key file")
	}

	pub, err := grant.LoadPublicKey(path + ".pub")
	if err != nil {
		t.Fatalf("LoadPublicKey: %v", err)
	}
	if !pub.Equal(s1.PublicKey()) {
		t.Fatal("the .pub file is not the signer's public key")
	}
	// A grant signed before the reload verifies with the published key.
	if _, err := grant.NewVerifier(pub).Verify(mustSign(t, s1, validGrant()), now); err != nil {
		t.Errorf("verify with the published key: %v", err)
	}
	if _, err := grant.NewVerifier(pub).Verify(mustSign(t, s2, validGrant()), now); err != nil {
		t.Errorf("verify the reloaded signer's grant: %v", err)
	}
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func TestLoadOrCreateSignerRefusesOtherKeys(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKCS8PrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	edPubDER, err := x509.MarshalPKIXPublicKey(pubOf(newKey(t)))
	if err != nil {
		t.Fatal(err)
	}
	edDER, err := x509.MarshalPKCS8PrivateKey(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		msg  string
	}{
		{"empty file", nil, "not a PEM PRIVATE KEY"},
		{"not PEM", []byte("just some bytes\n"), "not a PEM PRIVATE KEY"},
		{"raw Ed25519 seed", newKey(t).Seed(), "not a PEM PRIVATE KEY"},
		{"public key PEM", pemBlock("PUBLIC KEY", edPubDER), "not a PEM PRIVATE KEY"},
		{"Ed25519 under another PEM type", pemBlock("ED25519 PRIVATE KEY", edDER), "not a PEM PRIVATE KEY"},
		{"ECDSA PKCS#8", pemBlock("PRIVATE KEY", ecDER), "want an Ed25519 key"},
		{"corrupt PKCS#8", pemBlock("PRIVATE KEY", edDER[:len(edDER)-4]), "grant key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "grant.key")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := grant.LoadOrCreateSigner(path)
			if err == nil {
				t.Fatalf("loaded %q as a signer with key id %s", tc.data, s.KeyID())
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %q and the path", err, tc.msg)
			}
			// The unusable file is reported, never silently replaced by a
			// fresh key that no executor trusts.
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Error("the existing key file was overwritten")
			}
			if _, err := os.Stat(path + ".pub"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a .pub appeared beside a refused key: %v", err)
			}
		})
	}

	t.Run("path is a directory", func(t *testing.T) {
		if _, err := grant.LoadOrCreateSigner(t.TempDir()); err == nil {
			t.Fatal("a directory loaded as a key")
		}
	})
}

func TestLoadPublicKey(t *testing.T) {
	key := newKey(t)
	pubPEM, err := grant.MarshalPublicKey(pubOf(key))
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecPubDER, err := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	got, err := grant.LoadPublicKey(write("good.pub", pubPEM))
	if err != nil {
		t.Fatalf("LoadPublicKey: %v", err)
	}
	if !got.Equal(pubOf(key)) {
		t.Fatal("round trip changed the key")
	}

	for _, tc := range []struct {
		name string
		path string
		msg  string
	}{
		{"missing", filepath.Join(dir, "missing.pub"), "grant public key"},
		{"not PEM", write("junk.pub", []byte("junk")), "not a PEM PUBLIC KEY"},
		{"private key", write("priv.pub", pemBlock("PRIVATE KEY", privDER)), "not a PEM PUBLIC KEY"},
		{"ECDSA", write("ec.pub", pemBlock("PUBLIC KEY", ecPubDER)), "want Ed25519"},
		{"corrupt", write("bad.pub", pemBlock("PUBLIC KEY", []byte{1, 2, 3})), "grant public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := grant.LoadPublicKey(tc.path); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error = %v, want one mentioning %q", err, tc.msg)
			}
		})
	}
}

func TestDigest(t *testing.T) {
	s := grant.NewSigner(newKey(t))
	sg := mustSign(t, s, validGrant())
	d := grant.Digest(sg)
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(d) {
		t.Fatalf("digest %q is not sha256:<64 hex>", d)
	}
	sum := sha256.Sum256(sg.GetBody())
	if want := "sha256:" + hex.EncodeToString(sum[:]); d != want {
		t.Errorf("Digest = %s, want %s", d, want)
	}
	if again := grant.Digest(mustSign(t, s, validGrant())); again != d {
		t.Errorf("Digest of the same grant signed again = %s, want %s", again, d)
	}
	// The digest names the body only: a different signature or key id over
	// the same body does not change it, a different body does.
	other := proto.Clone(sg).(*typesv1.SignedGrant)
	other.Signature, other.KeyId = []byte("x"), "y"
	if grant.Digest(other) != d {
		t.Error("Digest depends on more than the body")
	}
	g := validGrant()
	g.Limits.MemoryBytes++
	if grant.Digest(mustSign(t, s, g)) == d {
		t.Error("different grants have the same digest")
	}
}

func TestKeyID(t *testing.T) {
	a, b := pubOf(newKey(t)), pubOf(newKey(t))
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(grant.KeyID(a)) {
		t.Errorf("KeyID = %q, want 16 hex", grant.KeyID(a))
	}
	if grant.KeyID(a) == grant.KeyID(b) {
		t.Error("two keys share a key id")
	}
	if grant.KeyID(a) != grant.KeyID(bytes.Clone(a)) {
		t.Error("KeyID is not a function of the key bytes")
	}
}
