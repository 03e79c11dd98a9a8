package contentcheck

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// The detector's decoder (gitleaks detect/codec) passes over encoded runs
// an author can make on purpose: base64 with no digit and none of "+/-_"
// in it, base64 that does not start on a 4-character boundary of the run,
// and any base64 or hex whose decoding is not all printable ASCII (one
// stray byte before the token is enough). undecoded decodes those runs
// and hands back the printable stretches of their decodings, for the
// detector to scan (and decode further) too.

// base64Run marks the bytes of a run the detector would take for base64
// (its pattern [\w/+-]{16,}={0,2}); hex runs are among them.
var base64Run = func() (t [256]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_/+-" {
		t[c] = true
	}
	return t
}()

// encodedRuns finds those runs (at least minStretch long, with their
// "=" padding) with a byte loop: a regexp over every fragment costs
// more than the rest of this pass.
func encodedRuns(text string) [][2]int {
	var out [][2]int
	for i := 0; i < len(text); {
		if !base64Run[text[i]] {
			i++
			continue
		}
		j := i
		for j < len(text) && base64Run[text[j]] {
			j++
		}
		if j-i >= minStretch {
			end := j
			for end < len(text) && end-j < 2 && text[end] == '=' {
				end++
			}
			out = append(out, [2]int{i, end})
		}
		i = j
	}
	return out
}

// minStretch is the shortest printable stretch worth scanning: shorter
// than any token a rule looks for.
const minStretch = 16

// stretch is where a line of undecoded's text came from.
type stretch struct {
	line int    // 0-based line of the text its run is on
	kind string // the encoding, as the detector names it
}

// undecoded returns the printable stretches, one a line, and where each
// came from.
func undecoded(text string) (string, []stretch) {
	var out strings.Builder
	var from []stretch
	line, pos := 0, 0
	for _, m := range encodedRuns(text) {
		line += strings.Count(text[pos:m[0]], "\n")
		pos = m[0]
		for _, d := range decodings(text[m[0]:m[1]]) {
			for _, s := range printableStretches(d.data) {
				out.WriteString(s)
				out.WriteByte('\n')
				from = append(from, stretch{line, d.kind})
			}
		}
	}
	return out.String(), from
}

type decoding struct {
	kind string
	data []byte
}

// decodings are the ways run decodes that the detector does not try or
// throws away.
func decodings(run string) []decoding {
	var out []decoding
	if len(run)%2 == 0 && len(run) >= 32 {
		if d, err := hex.DecodeString(run); err == nil && !isPrintable(d) {
			out = append(out, decoding{"hex", d})
		}
	}
	body := strings.TrimRight(run, "=")
	likely := strings.ContainsAny(body, "0123456789+/-_")
	for skip := 0; skip < 4 && len(body)-skip >= minStretch; skip++ {
		b := body[skip:]
		if len(b)%4 == 1 {
			b = b[:len(b)-1] // a lone last character decodes to no byte
		}
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			d, err := enc.DecodeString(b)
			if err != nil {
				continue
			}
			// What the detector decodes itself: the whole run, aligned,
			// with a likely character, to printable text.
			if skip == 0 && len(b) == len(body) && likely && isPrintable(d) {
				continue
			}
			out = append(out, decoding{"base64", d})
		}
	}
	return out
}

// isPrintable is the detector's test (codec.isPrintableASCII).
func isPrintable(b []byte) bool {
	for _, c := range b {
		if c <= 0x08 || c >= 0x7f {
			return false
		}
	}
	return true
}

// printableStretches are the runs of printable ASCII in b at least
// minStretch long.
func printableStretches(b []byte) []string {
	var out []string
	start := -1
	for i := 0; i <= len(b); i++ {
		if i < len(b) && b[i] >= 0x20 && b[i] < 0x7f {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 && i-start >= minStretch {
			out = append(out, string(b[start:i]))
		}
		start = -1
	}
	return out
}
