package mcp

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// How a run gets its exec id, and a create_session its idempotency key,
// when the caller gives none.
//
// A retry of a tool call is a new JSON-RPC request: its request id is new
// (the SDK keeps it in an unexported context key, and clients number
// requests per connection, so it would join unrelated calls), its arguments are the same, and
// a client that retries the same call sends the same params, _meta with
// its progressToken included. The arguments alone cannot tell a retry from
// a second run the agent meant (go test, an edit, go test again), so they
// are not enough: the id is derived from the session, the arguments and
// the call's progress token, and a call without a progress token gets a
// fresh random id, which the result names so the agent can pass it as
// exec_id to retry. So a retry attaches to the first run when the call
// carries its exec_id or the same progress token, and an intended repeat
// (a new call, a new token) runs again.

// derivedID is prefix and 32 hex digits of SHA-256 over what the call
// names: kind, the session (or tenant), the arguments as canonical JSON
// (struct fields in order, map keys sorted) and the progress token. It
// returns false, with a random id, when the call carries no progress
// token.
func derivedID(prefix, kind, scope string, args any, progressToken any) (string, bool, error) {
	if progressToken == nil {
		return randomID(prefix), false, nil
	}
	a, err := json.Marshal(args)
	if err != nil {
		return "", false, fmt.Errorf("arguments: %v", err)
	}
	tok, err := json.Marshal(progressToken)
	if err != nil {
		return "", false, fmt.Errorf("_meta.progressToken: %v", err)
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte("airlock-mcp/" + kind), []byte(scope), a, tok} {
		// Length-prefixed, so no part can run into the next.
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return prefix + hex.EncodeToString(h.Sum(nil)[:16]), true, nil
}

// randomID is prefix and 32 random hex digits.
func randomID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
