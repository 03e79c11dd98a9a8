package contentcheck

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// binaryDelta is a section changing a binary file by a delta that
// inserts inserted after copying nothing from the old file.
func binaryDelta(t testing.TB, p string, inserted []byte) string {
	t.Helper()
	var delta bytes.Buffer
	delta.Write([]byte{10, byte(len(inserted))}) // old size 10, new size (< 128)
	for rest := inserted; len(rest) > 0; {
		n := min(len(rest), 127)
		delta.WriteByte(byte(n))
		delta.Write(rest[:n])
		rest = rest[n:]
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(delta.Bytes())
	zw.Close()
	h, _, _ := names(p)
	return fmt.Sprintf("diff --git %s\nindex %s..%s 100644\nGIT binary patch\ndelta %d\n%s\n\ndelta %d\n%s\n\n",
		h, someID, zeroID, delta.Len(), encodeBase85Lines(z.Bytes()), delta.Len(), encodeBase85Lines(z.Bytes()))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// percentAll percent-encodes every byte.
func percentAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

type secretWant struct {
	rule, path string
	line       int
}

// Each secret, wherever and however the job put it, is found; none of it
// but the redaction is in a finding.
func TestSecretsFound(t *testing.T) {
	aws, ghp, pem := awsKeyID(1), githubToken(2), pemKey(3)
	// The detector's own decoder skips base64 without a digit or +/-_.
	var noDigitKey string
	for seed := uint64(100); noDigitKey == ""; seed++ {
		if k := awsKeyID(seed); !strings.ContainsAny(b64("aws "+k), "0123456789+/-_") {
			noDigitKey = k
		}
	}
	generic := "api_key = \"" + randomString(4, alnum, 32) + "\""
	filler := func(n int) []string {
		lines := make([]string, n)
		for i := range lines {
			lines[i] = fmt.Sprintf("// line %d of ordinary text that pads the file out to a length", i)
		}
		return lines
	}
	// A PEM block straddling the first fragment boundary (256 KiB).
	straddle := append(filler(4000), pem...)
	minified := strings.Repeat("var a=1;", 20000) + "t='" + ghp + "';" + strings.Repeat("var b=2;", 20000)
	for _, tc := range []struct {
		name   string
		patch  []byte
		out    []OutFile
		pol    Policy
		secret string
		want   secretWant
	}{
		{name: "AWS key in an added line", patch: patchOf(addFile("config.py", ModeFile, "import os", "KEY = '"+aws+"'")),
			secret: aws, want: secretWant{"secret.aws-access-token", "config.py", 2}},
		{name: "private key", patch: patchOf(addFile("deploy/id_rsa", ModeFile, pem...)),
			secret: pem[3], want: secretWant{"secret.private-key", "deploy/id_rsa", 1}},
		{name: "GitHub token in a changed file", patch: patchOf(modifyFile("main.go", 40, []string{"\ttoken := \"\""}, []string{"\ttoken := \"" + ghp + "\""})),
			secret: ghp, want: secretWant{"secret.github-pat", "main.go", 40}},
		{name: "GitHub token in an /out file", out: []OutFile{{Name: "report.txt", Content: strings.NewReader("ok\nused " + ghp + "\n")}},
			secret: ghp, want: secretWant{"secret.github-pat", "/out/report.txt", 2}},
		{name: "base64-wrapped token", patch: patchOf(addFile("blob.txt", ModeFile, "data: "+b64("token="+ghp))),
			secret: ghp, want: secretWant{"secret.github-pat", "blob.txt", 1}},
		{name: "base64-wrapped token in /out", out: []OutFile{{Name: "x.b64", Content: strings.NewReader(b64("aws " + aws))}},
			secret: aws, want: secretWant{"secret.aws-access-token", "/out/x.b64", 1}},
		{name: "token base64-wrapped twice", patch: patchOf(addFile("blob.txt", ModeFile, "data: "+b64(b64("token="+ghp)))),
			secret: ghp, want: secretWant{"secret.github-pat", "blob.txt", 1}},
		{name: "base64 with no digit or +/-_ in it", patch: patchOf(addFile("n.txt", ModeFile, "d: "+b64("aws "+noDigitKey))),
			secret: noDigitKey, want: secretWant{"secret.aws-access-token", "n.txt", 1}},
		{name: "base64 of a stray byte and the token", patch: patchOf(addFile("s.txt", ModeFile, "d: "+b64("\x80"+ghp))),
			secret: ghp, want: secretWant{"secret.github-pat", "s.txt", 1}},
		{name: "base64 off its 4-character boundary", patch: patchOf(addFile("o.txt", ModeFile, "d: x"+b64(ghp))),
			secret: ghp, want: secretWant{"secret.github-pat", "o.txt", 1}},
		{name: "hex of a stray byte and the token", patch: patchOf(addFile("x.txt", ModeFile, hex.EncodeToString([]byte("\x00"+ghp)))),
			secret: ghp, want: secretWant{"secret.github-pat", "x.txt", 1}},
		{name: "hex-encoded token", patch: patchOf(addFile("h.txt", ModeFile, hex.EncodeToString([]byte(ghp)))),
			secret: ghp, want: secretWant{"secret.github-pat", "h.txt", 1}},
		{name: "percent-encoded token", patch: patchOf(addFile("u.txt", ModeFile, "q="+percentAll(ghp))),
			secret: ghp, want: secretWant{"secret.github-pat", "u.txt", 1}},
		{name: "gitleaks:allow beside it", patch: patchOf(addFile("a.go", ModeFile, "var t = \""+ghp+"\" // gitleaks:allow")),
			secret: ghp, want: secretWant{"secret.github-pat", "a.go", 1}},
		{name: "under vendor/", patch: patchOf(addFile("vendor/github.com/x/y/z.go", ModeFile, "var k = \""+aws+"\"")),
			secret: aws, want: secretWant{"secret.aws-access-token", "vendor/github.com/x/y/z.go", 1}},
		{name: "in a lock file", patch: patchOf(addFile("package-lock.json", ModeFile, "{", "\"t\": \""+ghp+"\"", "}")),
			secret: ghp, want: secretWant{"secret.github-pat", "package-lock.json", 2}},
		{name: "in go.sum", patch: patchOf(addFile("go.sum", ModeFile, "x v1 h1:"+ghp)),
			secret: ghp, want: secretWant{"secret.github-pat", "go.sum", 1}},
		{name: "generic key with a line allowlist's marker beside it", patch: patchOf(addFile("Dockerfile", ModeFile, "RUN --mount=type=secret, "+generic)),
			secret: generic[11 : len(generic)-1], want: secretWant{"secret.generic-api-key", "Dockerfile", 1}},
		{name: "in a file name", patch: patchOf(addFile("keys/"+ghp+".txt", ModeFile, "x")),
			secret: ghp, want: secretWant{"secret.github-pat", "keys/" + ghp + ".txt", 0}},
		{name: "in a binary file", patch: patchOf(binaryFile(t, "data.bin", 200, io.MultiReader(strings.NewReader("\x00\x01\nk="+ghp+"\n"), zeros{}))),
			pol: Policy{AllowBinary: true}, secret: ghp, want: secretWant{"secret.github-pat", "data.bin", 2}},
		{name: "inserted by a binary delta", patch: patchOf(binaryDelta(t, "data.bin", []byte("\x00k="+aws))),
			pol: Policy{AllowBinary: true}, secret: aws, want: secretWant{"secret.aws-access-token", "data.bin", 0}},
		{name: "across a fragment boundary", patch: patchOf(addFile("big.txt", ModeFile, straddle...)),
			secret: pem[3], want: secretWant{"secret.private-key", "big.txt", 4001}},
		{name: "across a fragment boundary in /out", out: []OutFile{{Name: "big.txt", Content: strings.NewReader(strings.Join(straddle, "\n"))}},
			secret: pem[3], want: secretWant{"secret.private-key", "/out/big.txt", 4001}},
		{name: "inside a very long line", patch: patchOf(addFile("app.min.js", ModeFile, minified)),
			secret: ghp, want: secretWant{"secret.github-pat", "app.min.js", 1}},
		{name: "at the start of an /out file over the cap", out: []OutFile{{Name: "huge.log", Content: io.MultiReader(strings.NewReader(ghp+"\n"), io.LimitReader(zeros{}, 200<<10))}},
			pol: Policy{MaxFileBytes: 64 << 10}, secret: ghp, want: secretWant{"secret.github-pat", "/out/huge.log", 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := check(t, tc.pol, Input{Patch: tc.patch, Out: tc.out})
			n := 0
			for _, f := range fs {
				if f.Rule == tc.want.rule && f.Path == tc.want.path {
					n++
					if f.Line != tc.want.line {
						t.Errorf("%s at line %d, want %d", f.Rule, f.Line, tc.want.line)
					}
					if f.Redacted == "" {
						t.Errorf("%s without a redaction", f.Rule)
					}
				}
			}
			if n != 1 {
				t.Errorf("%d %s findings on %q, want 1; got%s", n, tc.want.rule, tc.want.path, show(fs))
			}
			for _, f := range fs {
				// A path may hold the secret when the secret is the name.
				for _, v := range []string{f.Message, f.Redacted, f.Rule} {
					if strings.Contains(v, tc.secret) || strings.Contains(v, tc.secret[4:12]) {
						t.Errorf("a finding holds (part of) the secret: %s", f.Rule)
					}
				}
			}
		})
	}
}

// The decode depth is what finds wrapped tokens: with none, a
// base64-wrapped token passes; one round finds one wrapping, not two.
func TestDecodeDepth(t *testing.T) {
	ghp := githubToken(5)
	once := patchOf(addFile("a.txt", ModeFile, "data: "+b64("token="+ghp)))
	twice := patchOf(addFile("a.txt", ModeFile, "data: "+b64(b64("token="+ghp))))
	for _, tc := range []struct {
		depth int
		patch []byte
		found bool
	}{
		{0, once, false}, {1, once, true}, {1, twice, false}, {2, twice, true},
	} {
		fs, err := checkerAt(t, tc.depth).Check(context.Background(), Policy{}, Input{Patch: tc.patch})
		if err != nil {
			t.Fatal(err)
		}
		if got := hasFinding(fs, "secret.github-pat", "a.txt"); got != tc.found {
			t.Errorf("depth %d: found = %v, want %v;%s", tc.depth, got, tc.found, show(fs))
		}
	}
	if _, err := New(Config{DecodeDepth: MaxDecodeDepth + 1}); err == nil {
		t.Error("New accepted a decode depth above MaxDecodeDepth")
	}
	if _, err := New(Config{DecodeDepth: -1}); err == nil {
		t.Error("New accepted a negative decode depth")
	}
}

// What the patch removes, and context it keeps, is not the job's
// writing: a secret there is no finding.
func TestRemovedSecretsAreNotFindings(t *testing.T) {
	ghp, aws := githubToken(6), awsKeyID(7)
	fs := check(t, Policy{}, Input{Patch: patchOf(
		deleteFile("old/creds.txt", "token="+ghp, "aws="+aws),
		modifyFile("main.go", 12, []string{"const token = \"" + ghp + "\""}, []string{"const token = os.Getenv(\"TOKEN\")"}),
		"diff --git a/ctx.go b/ctx.go\nindex "+someID+".."+zeroID+" 100644\n--- a/ctx.go\n+++ b/ctx.go\n@@ -1,2 +1,2 @@\n const k = \""+aws+"\"\n-x\n+y\n",
	)})
	if len(fs) != 0 {
		t.Errorf("findings for removed lines or context:%s", show(fs))
	}
}

// An /out file is read no further than the cap (and one byte to tell
// that there is more), however large it is, and not at all when its size
// is known to be over it.
func TestOutFileTooLargeIsNotReadInFull(t *testing.T) {
	declared := &countingReader{r: io.LimitReader(zeros{}, 50<<20)}
	fs := check(t, Policy{}, Input{Out: []OutFile{{Name: "dump.bin", Content: declared, Size: 50 << 20}}})
	if !hasFinding(fs, RuleFileTooLarge, "/out/dump.bin") || declared.n != 0 {
		t.Errorf("a 50 MB /out file of known size: read %d bytes;%s", declared.n, show(fs))
	}
	const limit = 1 << 20
	streamed := &countingReader{r: io.LimitReader(zeros{}, 50<<20)}
	fs = check(t, Policy{MaxFileBytes: limit}, Input{Out: []OutFile{{Name: "dump.bin", Content: streamed}}})
	if !hasFinding(fs, RuleFileTooLarge, "/out/dump.bin") {
		t.Errorf("no %s finding for a 50 MB /out file of unknown size;%s", RuleFileTooLarge, show(fs))
	}
	if streamed.n > limit+1 {
		t.Errorf("read %d bytes of a 50 MB /out file, more than the cap %d and one", streamed.n, limit)
	}
	one, err := checkerAt(t, 2).CheckOut(context.Background(), Policy{}, OutFile{Name: "k", Content: strings.NewReader("t=" + githubToken(15))})
	if err != nil || len(one) != 1 || one[0].Rule != "secret.github-pat" || one[0].Path != "/out/k" {
		t.Errorf("CheckOut: %v;%s", err, show(one))
	}
	lying := strings.NewReader(strings.Repeat("x", 2000))
	if fs := check(t, Policy{MaxFileBytes: 1000}, Input{Out: []OutFile{{Name: "l", Content: lying, Size: 10}}}); !hasFinding(fs, RuleFileTooLarge, "/out/l") {
		t.Errorf("a size below the cap was trusted;%s", show(fs))
	}
	exact := &countingReader{r: io.LimitReader(zeros{}, 1000)}
	if fs := check(t, Policy{MaxFileBytes: 1000}, Input{Out: []OutFile{{Name: "x", Content: exact}}}); len(fs) != 0 {
		t.Errorf("a file exactly at the cap is refused:%s", show(fs))
	}
	if _, err := checkerAt(t, 2).Check(context.Background(), Policy{}, Input{Out: []OutFile{{Name: "nil"}}}); err == nil {
		t.Error("an /out file without content was accepted")
	}
	bad := errors.New("disk on fire")
	if _, err := checkerAt(t, 2).Check(context.Background(), Policy{}, Input{Out: []OutFile{{Name: "r", Content: errReader{bad}}}}); !errors.Is(err, bad) {
		t.Errorf("a read error = %v, want it passed on", err)
	}
}

// The deadline is honoured: a check that cannot finish in time returns
// the context's error, not a partial list of findings.
func TestCheckHonoursContext(t *testing.T) {
	c := checkerAt(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	patch := patchOf(addFile("a.txt", ModeFile, "x"))
	if _, err := c.Check(ctx, Policy{}, Input{Patch: patch}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}
	big := benchPatch(4 << 20)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Check(ctx, Policy{}, Input{Patch: big})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a check with a 20ms deadline took %v", d)
	}
}

// One Checker serves concurrent checks (run with -race), each with the
// same findings as alone.
func TestCheckConcurrent(t *testing.T) {
	c := checkerAt(t, 2)
	patch := patchOf(
		addFile("a.go", ModeFile, "k := \""+githubToken(8)+"\"", "d := \""+b64("aws "+awsKeyID(9))+"\""),
		addFile(".git/x", ModeFile, "x"),
	)
	alone, err := c.Check(context.Background(), Policy{}, Input{Patch: patch})
	if err != nil || len(alone) != 3 {
		t.Fatalf("alone: %v;%s", err, show(alone))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				fs, err := c.Check(context.Background(), Policy{}, Input{Patch: patch,
					Out: []OutFile{{Name: "o", Content: strings.NewReader(pemKeyText(10))}}})
				if err != nil {
					t.Error(err)
					return
				}
				if len(fs) != len(alone)+1 || !hasFinding(fs, "secret.private-key", "/out/o") {
					t.Errorf("concurrent check:%s", show(fs))
					return
				}
			}
		}()
	}
	wg.Wait()
}

func pemKeyText(seed uint64) string { return strings.Join(pemKey(seed), "\n") + "\n" }

// A job cannot bury a refusal under findings: past MaxFindings the list
// ends with one that says so.
func TestFindingsAreBounded(t *testing.T) {
	var sections []string
	for i := range MaxFindings + 50 {
		sections = append(sections, addFile(fmt.Sprintf(".git/%d", i), ModeFile, "x"))
	}
	fs := check(t, Policy{}, Input{Patch: patchOf(sections...)})
	if len(fs) != MaxFindings+1 || fs[len(fs)-1].Rule != RuleFindingsTruncated {
		t.Errorf("%d findings, the last %q; want %d and %s last", len(fs), fs[len(fs)-1].Rule, MaxFindings+1, RuleFindingsTruncated)
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"short", "****…(5 bytes)"},
		{"ghp_0123456789abcdef", "ghp_…(20 bytes)"},
		{"\x1b[2J0123456789abcdef", "****…(20 bytes)"},
		{"é123456789abcdefgh", "****…(19 bytes)"},
	} {
		if got := redact(tc.in); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Binary data that does not decode (cut short, longer than its header
// says, a bad delta) is a malformed patch, not a clean file.
func TestBadBinaryDataIsMalformed(t *testing.T) {
	good := binaryFile(t, "b.bin", 5000, strings.NewReader(randomString(11, alnum, 5000)))
	lines := strings.Split(good, "\n")
	// lines[5] is the first data line of the literal; drop the rest of
	// its data so the zlib stream ends early.
	end := slices.Index(lines[5:], "") + 5
	cut := strings.Join(append(slices.Clone(lines[:6]), lines[end:]...), "\n")
	longer := strings.Replace(good, "literal 5000\n", "literal 4000\n", 1)
	for name, patch := range map[string]string{"cut short": cut, "longer than said": longer} {
		fs := check(t, Policy{AllowBinary: true}, Input{Patch: []byte(patch)})
		if !hasFinding(fs, RulePatchMalformed, "b.bin") {
			t.Errorf("%s: no %s finding;%s", name, RulePatchMalformed, show(fs))
		}
	}
	if fs := check(t, Policy{AllowBinary: true}, Input{Patch: []byte(good)}); len(fs) != 0 {
		t.Errorf("the unaltered binary patch:%s", show(fs))
	}
	// A rule on the path alone is one finding, whatever the content's size.
	p12 := binaryFile(t, "certs/client.p12", 600<<10, zeros{})
	fs := check(t, Policy{AllowBinary: true}, Input{Patch: []byte(p12)})
	if len(fs) != 1 || fs[0].Rule != "secret.pkcs12-file" || fs[0].Line != 0 {
		t.Errorf("a .p12 file:%s", show(fs))
	}
}

// Secrets scans one value alone, as the authority's check of a job's
// environment at submit could.
func TestSecretsInText(t *testing.T) {
	c := checkerAt(t, DefaultDecodeDepth)
	ghp := githubToken(12)
	for _, tc := range []struct {
		text string
		rule string
	}{
		{ghp, "secret.github-pat"},
		{b64("x " + awsKeyID(13)), "secret.aws-access-token"},
		{pemKeyText(14), "secret.private-key"},
		{"an ordinary value, /usr/local/bin:/usr/bin", ""},
	} {
		fs, err := c.Secrets(context.Background(), "spec.env.X", tc.text)
		if err != nil {
			t.Fatal(err)
		}
		if tc.rule == "" && len(fs) != 0 || tc.rule != "" && !hasFinding(fs, tc.rule, "spec.env.X") {
			t.Errorf("Secrets: want %q;%s", tc.rule, show(fs))
		}
	}
}
