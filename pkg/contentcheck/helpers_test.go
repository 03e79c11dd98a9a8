package contentcheck

import (
	"bytes"
	"compress/zlib"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// Test secrets are built at run time from pieces and a seeded generator,
// so this repository holds none a scanner would flag, and no test prints
// one: failures print findings, which carry only redactions.

const (
	upperDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	alnum       = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b64chars    = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
)

func randomString(seed uint64, alphabet string, n int) string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// awsKeyID is an access key id's shape: "AKIA" and 16 of A-Z2-7.
func awsKeyID(seed uint64) string { return "AK" + "IA" + randomString(seed, upperDigits, 16) }

// githubToken is a classic personal access token's shape.
func githubToken(seed uint64) string { return "gh" + "p_" + randomString(seed, alnum, 36) }

// pemKey is a private key block's shape, one body line a slice element.
func pemKey(seed uint64) []string {
	kind := "RSA " + "PRIVATE" + " KEY"
	lines := []string{"-----BEGIN " + kind + "-----"}
	for i := range 12 {
		lines = append(lines, randomString(seed+uint64(i), b64chars, 64))
	}
	return append(lines, "-----END "+kind+"-----")
}

// quoteGit quotes a path the way git does (quote_c_style with
// core.quotePath=false) when it needs quoting.
func quoteGit(p string) string {
	need := false
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
			need = true
		case '\a', '\b', '\f', '\n', '\r', '\t', '\v':
			b.WriteByte('\\')
			b.WriteByte("abfnrtv"[strings.IndexByte("\a\b\f\n\r\t\v", c)])
			need = true
		default:
			if c < 0x20 || c == 0x7f {
				fmt.Fprintf(&b, "\\%03o", c)
				need = true
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	if !need {
		return p
	}
	return b.String()
}

// names are a section's "diff --git" names and its ---/+++ names.
func names(p string) (header, minus, plus string) {
	a, bn := quoteGit("a/"+p), quoteGit("b/"+p)
	tab := ""
	if strings.Contains(p, " ") {
		tab = "\t"
	}
	return a + " " + bn, a + tab, bn + tab
}

const zeroID = "0000000000000000000000000000000000000000"
const someID = "1111111111111111111111111111111111111111"

// addFile is a patch section creating a file with lines; a symlink's
// target goes in as one line without a newline.
func addFile(p string, mode uint32, lines ...string) string {
	h, _, plus := names(p)
	var b strings.Builder
	fmt.Fprintf(&b, "diff --git %s\nnew file mode %06o\nindex %s..%s\n", h, mode, zeroID, someID)
	if len(lines) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "--- /dev/null\n+++ %s\n", plus)
	if len(lines) == 1 {
		b.WriteString("@@ -0,0 +1 @@\n")
	} else {
		fmt.Fprintf(&b, "@@ -0,0 +1,%d @@\n", len(lines))
	}
	for _, l := range lines {
		b.WriteString("+" + l + "\n")
	}
	if mode == ModeSymlink {
		b.WriteString("\\ No newline at end of file\n")
	}
	return b.String()
}

func symlink(p, target string) string { return addFile(p, ModeSymlink, target) }

// deleteFile is a section deleting a file that held lines.
func deleteFile(p string, lines ...string) string {
	h, minus, _ := names(p)
	var b strings.Builder
	fmt.Fprintf(&b, "diff --git %s\ndeleted file mode 100644\nindex %s..%s\n--- %s\n+++ /dev/null\n@@ -1,%d +0,0 @@\n", h, someID, zeroID, minus, len(lines))
	for _, l := range lines {
		b.WriteString("-" + l + "\n")
	}
	return b.String()
}

// modifyFile is a section replacing line at of a file with removed by
// added, with one line of context before.
func modifyFile(p string, at int, removed, added []string) string {
	h, minus, plus := names(p)
	var b strings.Builder
	fmt.Fprintf(&b, "diff --git %s\nindex %s..%s 100644\n--- %s\n+++ %s\n", h, someID, zeroID, minus, plus)
	fmt.Fprintf(&b, "@@ -%d,%d +%d,%d @@ func f() {\n ctx\n", at-1, len(removed)+1, at-1, len(added)+1)
	for _, l := range removed {
		b.WriteString("-" + l + "\n")
	}
	for _, l := range added {
		b.WriteString("+" + l + "\n")
	}
	return b.String()
}

// binaryFile is a section creating a binary file with content's bytes
// (size of them), deflated and encoded as git does, without holding them
// all in memory.
func binaryFile(t testing.TB, p string, size int64, content io.Reader) string {
	t.Helper()
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	if _, err := io.Copy(zw, io.LimitReader(content, size)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	var empty bytes.Buffer
	ew := zlib.NewWriter(&empty)
	ew.Close()
	h, _, _ := names(p)
	return fmt.Sprintf("diff --git %s\nnew file mode 100644\nindex %s..%s\nGIT binary patch\nliteral %d\n%s\n\nliteral 0\n%s\n\n",
		h, zeroID, someID, size, encodeBase85Lines(z.Bytes()), encodeBase85Lines(empty.Bytes()))
}

// encodeBase85Lines is base85Reader's inverse, 52 bytes a line as git
// writes them.
func encodeBase85Lines(data []byte) []byte {
	var b bytes.Buffer
	for len(data) > 0 {
		n := min(len(data), 52)
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		chunk := make([]byte, (n+3)/4*4)
		copy(chunk, data[:n])
		for g := chunk; len(g) > 0; g = g[4:] {
			acc := uint32(g[0])<<24 | uint32(g[1])<<16 | uint32(g[2])<<8 | uint32(g[3])
			var enc [5]byte
			for i := 4; i >= 0; i-- {
				enc[i] = base85[acc%85]
				acc /= 85
			}
			b.Write(enc[:])
		}
		b.WriteByte('\n')
		data = data[n:]
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// zeros reads as many zero bytes as asked.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

var (
	checkersMu sync.Mutex
	checkers   = map[int]*Checker{}
)

// checkerAt is a Checker decoding to depth, shared by the tests.
func checkerAt(t testing.TB, depth int) *Checker {
	t.Helper()
	checkersMu.Lock()
	defer checkersMu.Unlock()
	if c := checkers[depth]; c != nil {
		return c
	}
	c, err := newChecker(depth)
	if err != nil {
		t.Fatal(err)
	}
	checkers[depth] = c
	return c
}

func check(t testing.TB, pol Policy, in Input) []Finding {
	t.Helper()
	fs, err := checkerAt(t, DefaultDecodeDepth).Check(context.Background(), pol, in)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func patchOf(sections ...string) []byte { return []byte(strings.Join(sections, "")) }

// hasFinding reports whether fs holds one with rule and path (any path
// for "").
func hasFinding(fs []Finding, rule, path string) bool {
	for _, f := range fs {
		if f.Rule == rule && (path == "" || f.Path == path) {
			return true
		}
	}
	return false
}

// show prints findings for a failure message; they hold no secret.
func show(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "\n\t%s %q:%d %s %s", f.Rule, f.Path, f.Line, f.Message, f.Redacted)
	}
	if len(fs) == 0 {
		return " (none)"
	}
	return b.String()
}
