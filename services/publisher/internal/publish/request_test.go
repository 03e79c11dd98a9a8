package publish

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

func TestRequestCheckNamesTheField(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	ok := Request{ApprovalID: "a1", IdempotencyKey: "k1"}
	if err := ok.check(); err != nil {
		t.Fatalf("approval and key alone: %v", err)
	}
	full := Request{JobID: "j", ApprovalID: "a", BundleDigest: digest, Repo: "r", Branch: "main", IdempotencyKey: "k"}
	if err := full.check(); err != nil {
		t.Fatalf("a full request: %v", err)
	}
	for _, tc := range []struct {
		name string
		r    Request
		want string
	}{
		{"no approval", Request{IdempotencyKey: "k"}, "approval_id: required"},
		{"no key", Request{ApprovalID: "a"}, "idempotency_key: required"},
		{"long key", Request{ApprovalID: "a", IdempotencyKey: strings.Repeat("k", 257)}, "idempotency_key: at most 256 bytes"},
		{"long approval", Request{ApprovalID: strings.Repeat("a", 129), IdempotencyKey: "k"}, "approval_id: at most 128 bytes"},
		{"escape in the key", Request{ApprovalID: "a", IdempotencyKey: "k\x1b[2J"}, "idempotency_key: control characters"},
		{"newline in the job", Request{JobID: "j\nforged", ApprovalID: "a", IdempotencyKey: "k"}, "job_id: control characters"},
		{"branch without repository", Request{ApprovalID: "a", IdempotencyKey: "k", Branch: "main"}, "target: give both"},
		{"digest of another kind", Request{ApprovalID: "a", IdempotencyKey: "k", BundleDigest: "md5:abc"}, "bundle_digest: want sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.check()
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check() = %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
}

// The idempotency key is bound to what the pipeline asked: a field it
// named, changed, is another request.
func TestRequestDigest(t *testing.T) {
	a := Request{JobID: "j", ApprovalID: "a", Repo: "r", Branch: "b", IdempotencyKey: "k"}
	b := a
	b.Branch = "other"
	c := a
	c.IdempotencyKey = "k2"
	if a.digest() == b.digest() {
		t.Error("a request to another branch has the same digest")
	}
	if a.digest() != c.digest() {
		t.Error("the key itself changed the request's digest")
	}
	// Fields are separated: moving a byte across a boundary changes it.
	d := Request{JobID: "jx", ApprovalID: "a", Repo: "r", Branch: "b"}
	e := Request{JobID: "j", ApprovalID: "xa", Repo: "r", Branch: "b"}
	if d.digest() == e.digest() {
		t.Error("fields run together in the digest")
	}
}

func TestFilesDigestOf(t *testing.T) {
	if FilesDigestOf([]string{"a", "b"}) == FilesDigestOf([]string{"ab"}) {
		t.Error("paths run together in the file-list digest")
	}
	if FilesDigestOf([]string{"a", "b"}) != FilesDigestOf([]string{"a", "b"}) {
		t.Error("the digest is not stable")
	}
}
