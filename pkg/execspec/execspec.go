// Package execspec owns the rules both ends of a session apply to an exec
// request: whether a request under a used exec id is the same request
// (Differs, naming the first field that is not, in the same words at the
// authority and the executor) and how much of an exec's argv and env a
// record, a listing or a review keeps (Cut). The form of an exec id is
// pkg/runspec's. It imports no grpc or proto; anything may import it.
package execspec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"time"
)

// Spec is an exec request as the rules read it: stdin by its size and
// SHA-256 (hex), or as a stream whose bytes are not known up front.
type Spec struct {
	Argv        []string
	Env         map[string]string
	Cwd         string
	Timeout     time.Duration
	StdinStream bool
	StdinSize   int64
	StdinSHA256 string
}

// fields are a spec's fields in the order a difference is named.
var fields = []string{"argv", "env", "cwd", "timeout", "stdin_stream", "stdin"}

// wholeFields are the fields the whole request's digest covers, in order:
// a streamed stdin's digest stands for the stream flag too. Records keep
// this digest, so it never changes.
var wholeFields = []string{"argv", "env", "cwd", "timeout", "stdin"}

// Digests returns a digest of each field of x and one of the whole
// request. No environment and an empty one are the same.
func (x Spec) Digests() (map[string]string, string) {
	env := x.Env
	if len(env) == 0 {
		env = nil
	}
	sum := func(v any) string {
		b, _ := json.Marshal(v) // strings, maps of strings and numbers: never fails
		h := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(h[:])
	}
	d := map[string]string{
		"argv": sum(x.Argv), "env": sum(env), "cwd": sum(x.Cwd), "timeout": sum(int64(x.Timeout)),
		"stdin_stream": sum(x.StdinStream), "stdin": sum([]any{x.StdinSize, x.StdinSHA256}),
	}
	if x.StdinStream {
		d["stdin"] = sum("stream")
	}
	all := make([]string, 0, len(wholeFields))
	for _, f := range wholeFields {
		all = append(all, d[f])
	}
	return d, sum(all)
}

// Differs names the first field ("spec.argv", "spec.env", "spec.cwd",
// "spec.timeout", "spec.stdin_stream", "spec.stdin") in which x differs
// from the request whose field digests (Digests) were recorded, or ""
// when none does. A field the record has no digest of is not compared.
func Differs(recorded map[string]string, x Spec) string {
	d, _ := x.Digests()
	for _, f := range fields {
		if r, ok := recorded[f]; ok && r != d[f] {
			return "spec." + f
		}
	}
	return ""
}

// CutBytes is how much of an exec's argv and env together a record, a
// listing or a review keeps.
const CutBytes = 4 << 10

// Cut returns the whole arguments of argv that fit max bytes, then the
// variables of env, in the order of their names, that fit what is left,
// and whether anything was left out. Each list stops at its first element
// that does not fit. The env returned is nil when none fits.
func Cut(argv []string, env map[string]string, max int) (keptArgv []string, keptEnv map[string]string, cut bool) {
	left := max
	for _, a := range argv {
		if len(a) > left {
			cut = true
			break
		}
		keptArgv, left = append(keptArgv, a), left-len(a)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if len(k)+len(v) > left {
			cut = true
			break
		}
		if keptEnv == nil {
			keptEnv = map[string]string{}
		}
		keptEnv[k], left = v, left-len(k)-len(v)
	}
	return keptArgv, keptEnv, cut
}
