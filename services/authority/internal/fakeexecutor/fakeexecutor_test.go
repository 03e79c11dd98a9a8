package fakeexecutor_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/services/authority/internal/fakeexecutor"
	"github.com/airlockhq/airlock/test/executorcontract"
)

// TestContract: the fake answers as the real executor does
// (test/executorcontract; the executor's api tests run the same).
func TestContract(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	executorcontract.Run(t, executorcontract.Env{Server: fakeexecutor.New(grant.NewVerifier(pub)), Signer: grant.NewSigner(key)})
}
