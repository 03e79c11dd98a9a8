package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlockhq/airlock/pkg/grant"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// TestGrantKeyRotation follows README "Rotating the grant key" on a live
// stack: the executor is never restarted, the authority once, and jobs run
// before, during and after; a grant signed with the retired key is then
// refused, naming its key id.
func TestGrantKeyRotation(t *testing.T) {
	repo, commit := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	executorPID := s.services["executor"].PID
	executorStart := procStart(executorPID)
	runs := func(step string) {
		t.Helper()
		res := s.airlock(t, "job", "submit", "--repo", "sample", "--rev", "main", "--wait", "--", "true")
		if res.code != 0 {
			t.Fatalf("%s: job exit %d\nstdout:\n%s\nstderr:\n%s", step, res.code, res.stdout, res.stderr)
		}
	}
	runs("under key 1")

	authDir := filepath.Join(s.dir, "authority")
	trusted := filepath.Join(authDir, "grant.key.pub") // the executor's authority.grant_public_key
	key1, err := grant.LoadOrCreateSigner(filepath.Join(authDir, "grant.key"))
	if err != nil {
		t.Fatal(err)
	}
	// 1. The authority's keys move into a directory: the old key first, the new one sorting last.
	keys := filepath.Join(authDir, "grant-keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(authDir, "grant.key"), filepath.Join(keys, "1.key")); err != nil {
		t.Fatal(err)
	}
	_, priv2, err := ed25519Key()
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "2.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	key2 := grant.NewSigner(priv2)
	pub1, _ := grant.MarshalPublicKey(key1.PublicKey())
	pub2, _ := grant.MarshalPublicKey(key2.PublicKey())

	// 2. Key 2 joins the executor's trusted set, with no restart.
	if err := os.WriteFile(trusted, append(append([]byte{}, pub1...), pub2...), 0o644); err != nil {
		t.Fatal(err)
	}
	runs("key 2 trusted, the authority still on key 1")

	// 3. The authority switches to the directory: it signs with 2.key.
	s.editConfig(t, "authority", func(_ string, cfg map[string]any) { cfg["grant_key"] = keys })
	s.restartService(t, "authority")
	published, err := grant.LoadPublicKeys(keys + ".pub")
	if err != nil || len(published) != 2 {
		t.Fatalf("the authority published %d keys in %s.pub (%v), want both", len(published), keys, err)
	}

	// 4. Key 1 leaves the executor's set: the authority's jobs still run,
	// so they are signed with key 2, and key 1's grants are refused.
	if err := os.WriteFile(trusted, pub2, 0o644); err != nil {
		t.Fatal(err)
	}
	runs("under key 2 alone")
	exec := executorv1.NewExecutorServiceClient(s.dial(t, "service/authority", "executor"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := key1.Sign(testGrant("signed-with-key-1", commit, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_, err = exec.StartJob(ctx, &executorv1.StartJobRequest{Grant: old})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), key1.KeyID()) {
		t.Errorf("a grant signed with the removed key 1: %v, want PermissionDenied naming key id %s", err, key1.KeyID())
	}
	fresh, err := key2.Sign(testGrant("signed-with-key-2", commit, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.StartJob(ctx, &executorv1.StartJobRequest{Grant: fresh}); err != nil {
		t.Errorf("a grant signed with key 2: %v", err)
	}
	if procStart(executorPID) != executorStart {
		t.Errorf("the executor (pid %d) did not run throughout", executorPID)
	}
}
