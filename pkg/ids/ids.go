// Package ids makes the random identifiers Airlock's records carry (jobs,
// approvals, leases, deployments): 26 characters of [a-z2-7] from 128
// random bits, safe in file names, URLs and log lines. It imports no grpc
// or proto, so any package may use it.
package ids

import (
	"crypto/rand"
	"encoding/base32"
)

var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// New returns a new random id.
func New() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return encoding.EncodeToString(b)
}
