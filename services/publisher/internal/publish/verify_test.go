package publish_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/provenance"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
	"github.com/airlockhq/airlock/services/publisher/internal/publish"
)

const td = "airlock.test"

var executorID = identity.Service(td, identity.ServiceExecutor)

// world is a real CA, an executor certificate from it, an authority grant
// key, and one bundle written and signed as the executor does.
type world struct {
	t        *testing.T
	ca       *pki.CA
	roots    *x509.CertPool
	grantKey ed25519.PrivateKey
	path     string
	envelope []byte
	digest   string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ca, err := pki.NewCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, gk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ca: ca, roots: roots, grantKey: gk}
	w.path, w.digest, w.envelope = w.bundle(ca, executorID, gk, "job-1", "acme")
	return w
}

// signedGrant is a grant for job of tenant, for executorID unless one is
// named.
func signedGrant(t *testing.T, key ed25519.PrivateKey, job, tenant string, executor ...identity.ID) *typesv1.SignedGrant {
	t.Helper()
	issued, expires := grant.Timestamps(time.Now().Add(-2*time.Hour), time.Hour) // long expired: a record
	sg, err := grant.NewSigner(key).Sign(&typesv1.Grant{
		JobId: job, Tenant: tenant, Requester: "spiffe://" + td + "/client/dev", Repository: "demo",
		Commit: strings.Repeat("a", 40), Command: []string{"true"},
		Limits:        &typesv1.ResourceLimits{CpuMillis: 1000, MemoryBytes: 64 << 20, Pids: 32, DiskBytes: 16 << 20, Deadline: durationpb.New(time.Minute)},
		NetworkPolicy: &typesv1.NetworkPolicy{Mode: &typesv1.NetworkPolicy_DenyAll{DenyAll: &typesv1.DenyAll{}}},
		IssuedAt:      issued, ExpiresAt: expires, Executor: append(executor, executorID)[0].String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

// bundle writes a bundle for job of tenant with a grant signed by grantKey
// and provenance signed as signer by a certificate of ca.
func (w *world) bundle(ca *pki.CA, signer identity.ID, grantKey ed25519.PrivateKey, job, tenant string, grantFor ...identity.ID) (path, digest string, envelope []byte) {
	t := w.t
	t.Helper()
	sg := signedGrant(t, grantKey, job, tenant, grantFor...)
	raw, err := proto.Marshal(sg)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "bundle.tar")
	res, err := bundle.Write(path, bundle.Input{Meta: map[string]string{"job_id": job}, Grant: raw,
		Patch: []byte("diff --git a/x b/x\n"), StdoutPath: "/dev/null", StderrPath: "/dev/null"})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(signer, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	env, err := provenance.Sign("bundle.tar", res.Digest, provenance.Run{
		JobID: job, Tenant: tenant, GrantDigest: grant.Digest(sg), Executor: signer.String(),
		StartedOn: time.Now().Add(-time.Second), FinishedOn: time.Now(),
	}, key, []*x509.Certificate{kp.Cert})
	if err != nil {
		t.Fatal(err)
	}
	return path, res.Digest, env
}

func (w *world) trust() publish.Trust {
	return publish.Trust{Roots: w.roots, Grants: grant.NewVerifier(w.grantKey.Public().(ed25519.PublicKey))}
}

func (w *world) want() publish.Want {
	return publish.Want{Digest: w.digest, JobID: "job-1", Tenant: "acme", Executor: executorID}
}

func TestVerifyBundleAcceptsWhatWasApproved(t *testing.T) {
	w := newWorld(t)
	v, err := publish.VerifyBundle(w.path, w.envelope, w.want(), w.trust())
	if err != nil {
		t.Fatalf("the approved bundle: %v", err)
	}
	if v.Digest != w.digest || v.Grant.GetJobId() != "job-1" || v.Provenance.Predicate.JobID != "job-1" {
		t.Errorf("verified %+v", v)
	}
}

// TestVerifyBundleRefusesTampering is issue 10 §6's tampering list: each
// refused, saying what failed, as FailedPrecondition (nothing is spent
// before this step passes).
func TestVerifyBundleRefusesTampering(t *testing.T) {
	w := newWorld(t)

	// One byte changed after it was recorded.
	altered := filepath.Join(t.TempDir(), "altered.tar")
	data, err := os.ReadFile(w.path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(altered, data, 0o600); err != nil {
		t.Fatal(err)
	}

	otherCA, err := pki.NewCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreignPath, foreignDigest, foreignEnv := w.bundle(otherCA, executorID, w.grantKey, "job-1", "acme")
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	keyPath, keyDigest, keyEnv := w.bundle(w.ca, executorID, otherKey, "job-1", "acme")
	clientPath, clientDigest, clientEnv := w.bundle(w.ca, identity.MustParse("spiffe://"+td+"/client/dev"), w.grantKey, "job-1", "acme")
	jobPath, jobDigest, jobEnv := w.bundle(w.ca, executorID, w.grantKey, "job-2", "acme")
	// Another executor of the fleet, with a certificate of the same CA:
	// not the one the job ran on.
	exec2 := identity.MustParse("spiffe://" + td + "/service/executor/exec-2")
	fleetPath, fleetDigest, fleetEnv := w.bundle(w.ca, exec2, w.grantKey, "job-1", "acme")
	// Signed by the job's executor, with a grant for another.
	otherGrantPath, otherGrantDigest, otherGrantEnv := w.bundle(w.ca, executorID, w.grantKey, "job-1", "acme", exec2)

	for _, tc := range []struct {
		name     string
		path     string
		envelope []byte
		want     publish.Want
		says     string
	}{
		{"a byte altered after it was recorded", altered, w.envelope, w.want(), "the approval is for " + w.digest},
		{"an approval for another digest", w.path, w.envelope, publish.Want{Digest: "sha256:" + strings.Repeat("0", 64), JobID: "job-1", Tenant: "acme", Executor: executorID}, "its digest is"},
		{"signed by another CA's service/executor", foreignPath, foreignEnv, publish.Want{Digest: foreignDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, "signing certificate"},
		{"signed by a client's certificate", clientPath, clientEnv, publish.Want{Digest: clientDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, "want " + executorID.String()},
		{"signed by another executor of the fleet", fleetPath, fleetEnv, publish.Want{Digest: fleetDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, "want " + executorID.String()},
		{"a grant for another executor", otherGrantPath, otherGrantEnv, publish.Want{Digest: otherGrantDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, "grant: for executor \"" + exec2.String()},
		{"a grant signed by another key", keyPath, keyEnv, publish.Want{Digest: keyDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, "grant:"},
		{"a grant for another job", jobPath, jobEnv, publish.Want{Digest: jobDigest, JobID: "job-1", Tenant: "acme", Executor: executorID}, `for job "job-2"`},
		{"a grant for another tenant", w.path, w.envelope, publish.Want{Digest: w.digest, JobID: "job-1", Tenant: "other", Executor: executorID}, `for tenant "acme"`},
		{"the provenance of another bundle", w.path, jobEnv, w.want(), "provenance:"},
		{"no provenance", w.path, nil, w.want(), "provenance:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := publish.VerifyBundle(tc.path, tc.envelope, tc.want, w.trust())
			if !errors.Is(err, publish.ErrBundle) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want a refused bundle saying %q", err, tc.says)
			}
		})
	}
}
