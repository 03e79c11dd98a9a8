// Package publish is the publisher's domain: it turns an approved result
// bundle into one commit on a protected branch. This file is its first
// step, which spends nothing: checking that the bundle is exactly the one
// approved, that the executor signed it, and that the authority granted
// the run it came from. Only the publisher's api and server packages import
// it.
package publish

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/provenance"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// Trust is what a bundle is checked against.
type Trust struct {
	// Roots are the CA certificates an executor's signing certificate must
	// chain to.
	Roots *x509.CertPool
	// Grants verifies grants against the authority's grant keys.
	Grants *grant.Verifier
}

// Want is what the approval is bound to.
type Want struct {
	// Digest is the approved bundle's, "sha256:<hex>".
	Digest string
	JobID  string
	Tenant string
	// Executor is the executor the job ran on, as the authority recorded
	// it: the provenance must be signed by exactly it.
	Executor identity.ID
}

// Verified is what a checked bundle proves.
type Verified struct {
	Digest     string
	Size       int64
	Grant      *typesv1.Grant
	Provenance provenance.Statement
}

// ErrBundle is what every refusal of a bundle wraps (with
// errdefs.ErrFailedPrecondition): nothing has been spent when it is
// returned.
var ErrBundle = errors.New("bundle refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", errdefs.ErrFailedPrecondition, ErrBundle, fmt.Sprintf(format, args...))
}

// VerifyBundle checks the bundle file at path, in this order, before
// anything is spent: its sha256 is the approved digest (re-hashed here,
// never taken from a header); the provenance envelope is a DSSE envelope
// of an in-toto v1 statement about exactly that digest, signed by a
// certificate chaining to Roots whose SPIFFE ID is the executor's; the
// grant inside the bundle carries the authority's signature, names the
// approved job and tenant, and is the grant the provenance names. Each
// refusal says what failed.
func VerifyBundle(path string, envelope []byte, want Want, trust Trust) (*Verified, error) {
	digest, size, err := bundle.Digest(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: bundle: %v", errdefs.ErrNotFound, err)
		}
		return nil, err
	}
	if digest != want.Digest {
		return nil, refuse("its digest is %s, the approval is for %s", digest, want.Digest)
	}
	pv, err := provenance.Verify(envelope, digest, trust.Roots, want.Executor)
	if err != nil {
		return nil, refuse("provenance: %v", err)
	}
	raw, err := bundle.ReadEntry(path, bundle.GrantFile)
	if err != nil {
		return nil, refuse("grant: %v", err)
	}
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(raw, sg); err != nil {
		return nil, refuse("grant: not a signed grant: %v", err)
	}
	g, err := trust.Grants.VerifyRecord(sg)
	if err != nil {
		return nil, refuse("grant: %v", err)
	}
	switch {
	case g.GetJobId() != want.JobID:
		return nil, refuse("grant: for job %q, the approval is for job %q", g.GetJobId(), want.JobID)
	case g.GetTenant() != want.Tenant:
		return nil, refuse("grant: for tenant %q, the approval is for tenant %q", g.GetTenant(), want.Tenant)
	case g.GetExecutor() != want.Executor.String():
		return nil, refuse("grant: for executor %q, the job ran on %s", g.GetExecutor(), want.Executor)
	case pv.Statement.Predicate.GrantDigest != grant.Digest(sg):
		return nil, refuse("provenance names grant %s, the bundle holds %s", pv.Statement.Predicate.GrantDigest, grant.Digest(sg))
	case pv.Statement.Predicate.JobID != want.JobID:
		return nil, refuse("provenance: for job %q, the approval is for job %q", pv.Statement.Predicate.JobID, want.JobID)
	}
	return &Verified{Digest: digest, Size: size, Grant: g, Provenance: pv.Statement}, nil
}
