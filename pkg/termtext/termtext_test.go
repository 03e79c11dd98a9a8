package termtext

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          string
		line, block string // block "" means the same as line
		patch       string // "" means the same as block
	}{
		{name: "hidden patch line", in: "+\x1b[8mrm -rf /\x1b[0m", line: `+⟦\x1b⟧[8mrm -rf /⟦\x1b⟧[0m`},
		{name: "cursor up, erase line", in: "\x1b[1A\x1b[2K", line: `⟦\x1b⟧[1A⟦\x1b⟧[2K`},
		{name: "clear screen, home", in: "\x1b[2J\x1b[H", line: `⟦\x1b⟧[2J⟦\x1b⟧[H`},
		{name: "OSC 52 clipboard write", in: "\x1b]52;c;aGVsbG8=\x07", line: `⟦\x1b⟧]52;c;aGVsbG8=⟦\x07⟧`},
		{name: "C1 CSI rune in a file name", in: "a\u009b2Jb.go", line: `a⟦\u009b⟧2Jb.go`},
		{name: "right-to-left override in a file name", in: "invoice\u202egpj.exe", line: `invoice⟦\u202e⟧gpj.exe`},
		{name: "raw C1 byte", in: "a\x9b2Jb", line: `a⟦\x9b⟧2Jb`},
		{name: "raw C1 OSC byte", in: "\x9d52;c;aGk=\x9c", line: `⟦\x9d⟧52;c;aGk=⟦\x9c⟧`},
		{name: "DEL", in: "a\x7fb", line: `a⟦\x7f⟧b`},
		{name: "lone carriage return", in: "ok\rFAIL", line: `ok⟦\x0d⟧FAIL`},
		{name: "carriage return at the end", in: "ok\r", line: `ok⟦\x0d⟧`},
		{name: "CRLF", in: "a\r\nb", line: `a⟦\x0d⟧⟦\x0a⟧b`, block: "a\r\nb", patch: "a⟦\\x0d⟧\nb"},
		{name: "CR CR LF", in: "a\r\r\nb", line: `a⟦\x0d⟧⟦\x0d⟧⟦\x0a⟧b`, block: "a⟦\\x0d⟧\r\nb", patch: "a⟦\\x0d⟧⟦\\x0d⟧\nb"},
		{name: "a line whose CRLF end became LF", in: "-line1\r\n+line1\n", line: `-line1⟦\x0d⟧⟦\x0a⟧+line1⟦\x0a⟧`, block: "-line1\r\n+line1\n", patch: "-line1⟦\\x0d⟧\n+line1\n"},
		{name: "newline and tab", in: "a\nb\tc\n", line: `a⟦\x0a⟧b⟦\x09⟧c⟦\x0a⟧`, block: "a\nb\tc\n"},
		{name: "other C0 controls", in: "\x00\x07\x08\x0b\x0c\x1b\x1f", line: `⟦\x00⟧⟦\x07⟧⟦\x08⟧⟦\x0b⟧⟦\x0c⟧⟦\x1b⟧⟦\x1f⟧`},
		{name: "invalid UTF-8", in: "\xff\xfeok", line: `⟦\xff⟧⟦\xfe⟧ok`},
		{name: "truncated rune at the end", in: "ok\xe2\x80", line: `ok⟦\xe2⟧⟦\x80⟧`},
		{name: "truncated rune before ASCII", in: "\xe2\x80ok", line: `⟦\xe2⟧⟦\x80⟧ok`},
		{name: "overlong encoding", in: "\xc0\xaf", line: `⟦\xc0⟧⟦\xaf⟧`},
		{name: "encoded surrogate", in: "\xed\xa0\x80", line: `⟦\xed⟧⟦\xa0⟧⟦\x80⟧`},
		{name: "backslash shown as itself", in: `"Hello airlock!\n" exit\.`, line: `"Hello airlock!\n" exit\.`},
		{name: "text that looks like an escape", in: `\x1b[2J`, line: `\x1b[2J`},
		{name: "text that looks like a marked escape", in: "\u27e6\\x1b\u27e7[2J", line: `⟦\u27e6⟧\x1b⟦\u27e7⟧[2J`},
		{name: "a lone closing mark", in: "a\u27e7b", line: `a⟦\u27e7⟧b`},
		{name: "tag character above U+FFFF", in: "a\U000e0001b", line: `a⟦\U000e0001⟧b`},
		{name: "kept as is", in: "héllo wörld ✓ 日本語 🙂 \ufffd ~", line: "héllo wörld ✓ 日本語 🙂 \ufffd ~"},
		{name: "empty", in: "", line: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			block := tc.block
			if block == "" {
				block = tc.line
			}
			if got := Line(tc.in); got != tc.line {
				t.Errorf("Line(%q) = %q, want %q", tc.in, got, tc.line)
			}
			if got := Block(tc.in); got != block {
				t.Errorf("Block(%q) = %q, want %q", tc.in, got, block)
			}
			patch := tc.patch
			if patch == "" {
				patch = block
			}
			if got := Patch(tc.in); got != patch {
				t.Errorf("Patch(%q) = %q, want %q", tc.in, got, patch)
			}
		})
	}
}

// TestHiddenRunes covers the invisible and reordering runes one by one.
func TestHiddenRunes(t *testing.T) {
	var runes []rune
	for _, span := range [][2]rune{
		{0x80, 0x9f}, {0x00ad, 0x00ad}, {0x061c, 0x061c}, {0x200b, 0x200f}, {0x2028, 0x202e},
		{0x2060, 0x2064}, {0x2066, 0x2069}, {0xfeff, 0xfeff}, {0xfff9, 0xfffb}, {0xe0001, 0xe0001}, {0xe0020, 0xe007f},
		{0x034f, 0x034f}, {0x115f, 0x1160}, {0x3164, 0x3164}, {0xffa0, 0xffa0}, {0xfe00, 0xfe0f}, {0xe0100, 0xe0100},
	} {
		for r := span[0]; r <= span[1]; r++ {
			runes = append(runes, r)
		}
	}
	for _, r := range runes {
		want := fmt.Sprintf(`x⟦\u%04x⟧y`, r)
		if r > 0xffff {
			want = fmt.Sprintf(`x⟦\U%08x⟧y`, r)
		}
		in := "x" + string(r) + "y"
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
		if got := Block(in); got != want {
			t.Errorf("Block(%q) = %q, want %q", in, got, want)
		}
	}
}

// writes are the inputs the stream tests split at every position.
var writes = []string{
	"+\x1b[8mrm -rf /\x1b[0m\n",
	"\x1b]52;c;aGVsbG8=\x07done\n",
	"a\u009bb\u202ec🙂d\xe2\x80e",
	"line\r\nover\rwrite\r",
	"\x9b\xff\\x1b\r",
	"é\r\n日本🙂",
}

func TestWriterSplitAnywhere(t *testing.T) {
	for _, in := range writes {
		for _, m := range []struct {
			escape    func(string) string
			newWriter func(io.Writer) *Writer
		}{{Block, NewWriter}, {Patch, NewPatchWriter}} {
			splitAnywhere(t, in, m.escape(in), m.newWriter)
		}
	}
}

// splitAnywhere checks that in, written in three chunks split anywhere,
// comes out as want.
func splitAnywhere(t *testing.T, in, want string, newWriter func(io.Writer) *Writer) {
	t.Helper()
	{
		for i := 0; i <= len(in); i++ {
			for j := i; j <= len(in); j++ {
				var out bytes.Buffer
				w := newWriter(&out)
				for _, chunk := range []string{in[:i], in[i:j], in[j:]} {
					if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
						t.Fatalf("Write(%q) = %d, %v", chunk, n, err)
					}
				}
				if err := w.Flush(); err != nil {
					t.Fatal(err)
				}
				if out.String() != want {
					t.Errorf("%q written as %q, %q, %q: got %q, want %q", in, in[:i], in[i:j], in[j:], out.String(), want)
				}
			}
		}
	}
}

func TestWriterHoldsBackOnlyAnIncompleteTail(t *testing.T) {
	for _, tc := range []struct {
		name, write, before, after string
	}{
		{name: "escape split after ESC", write: "a\x1b", before: `a⟦\x1b⟧`, after: `a⟦\x1b⟧`},
		{name: "rune split after its first byte", write: "a\xe2", before: "a", after: `a⟦\xe2⟧`},
		{name: "4-byte rune split after 3 bytes", write: "a\xf0\x9f\x99", before: "a", after: `a⟦\xf0⟧⟦\x9f⟧⟦\x99⟧`},
		{name: "C1 rune split", write: "a\xc2", before: "a", after: `a⟦\xc2⟧`},
		{name: "carriage return last", write: "a\r", before: "a", after: `a⟦\x0d⟧`},
		{name: "complete", write: "a\u202e", before: `a⟦\u202e⟧`, after: `a⟦\u202e⟧`},
		{name: "a mark split after its first byte", write: "a\xe2\x9f", before: "a", after: `a⟦\xe2⟧⟦\x9f⟧`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out)
			if _, err := w.Write([]byte(tc.write)); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.before {
				t.Errorf("after Write: %q, want %q", out.String(), tc.before)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.after {
				t.Errorf("after Flush: %q, want %q", out.String(), tc.after)
			}
		})
	}
}

type failingWriter struct{}

var errWrite = errors.New("disk full")

func (failingWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestWriterReportsWriteErrors(t *testing.T) {
	w := NewWriter(failingWriter{})
	if n, err := w.Write([]byte("x")); n != 0 || !errors.Is(err, errWrite) {
		t.Errorf("Write = %d, %v; want 0, %v", n, err, errWrite)
	}
	w.Write([]byte("\xe2"))
	if err := w.Flush(); !errors.Is(err, errWrite) {
		t.Errorf("Flush = %v, want %v", err, errWrite)
	}
}

// FuzzEscape checks, for any input, that the result is safe and that it
// decodes back to exactly the input: no escape can be mistaken for text.
func FuzzEscape(f *testing.F) {
	for _, s := range writes {
		f.Add(s)
	}
	f.Add(`\\x1b\u202e\`)
	f.Add("\u27e6\\x1b\u27e7")
	f.Fuzz(func(t *testing.T, in string) {
		if out := Patch(in); strings.Contains(out, "\r") {
			t.Fatalf("Patch(%q) = %q, which keeps a carriage return", in, out)
		}
		for _, multiline := range []bool{false, true} {
			out := Line(in)
			if multiline {
				out = Block(in)
			}
			if err := checkSafe(out, multiline); err != nil {
				t.Fatalf("escape(%q, multiline %v) = %q: %v", in, multiline, out, err)
			}
			back, err := unescape(out)
			if err != nil {
				t.Fatalf("escape(%q, multiline %v) = %q: %v", in, multiline, out, err)
			}
			if back != in {
				t.Fatalf("escape(%q, multiline %v) = %q, which decodes to %q", in, multiline, out, back)
			}
		}
	})
}

// checkSafe reports the first thing in s a terminal would act on or hide.
func checkSafe(s string, multiline bool) error {
	if !utf8.ValidString(s) {
		return errors.New("invalid UTF-8")
	}
	for i, r := range s {
		switch {
		case multiline && (r == '\n' || r == '\t'):
		case multiline && r == '\r' && strings.HasPrefix(s[i+1:], "\n"):
		case r < 0x20 || r == 0x7f || hidden(r):
			return fmt.Errorf("%U at byte %d", r, i)
		}
	}
	return nil
}

// unescape reverses the escaping described in the package comment: every
// ⟦ opens one escape, which the next ⟧ closes; all else is the text.
func unescape(s string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, Open)
		if i < 0 {
			if strings.Contains(s, Close) {
				return "", errors.New("a closing mark with no escape")
			}
			b.WriteString(s)
			return b.String(), nil
		}
		if strings.Contains(s[:i], Close) {
			return "", errors.New("a closing mark with no escape")
		}
		b.WriteString(s[:i])
		s = s[i+len(Open):]
		j := strings.Index(s, Close)
		if j < 0 {
			return "", errors.New("an escape that is not closed")
		}
		esc := s[:j]
		s = s[j+len(Close):]
		digits := map[string]int{`\x`: 2, `\u`: 4, `\U`: 8}[esc[:min(2, len(esc))]]
		if digits == 0 || len(esc) != 2+digits {
			return "", fmt.Errorf("unknown escape %q", esc)
		}
		v, err := strconv.ParseUint(esc[2:], 16, 32)
		if err != nil {
			return "", err
		}
		if esc[1] == 'x' {
			b.WriteByte(byte(v))
		} else {
			b.WriteRune(rune(v))
		}
	}
}

// shown is what a terminal shows of text: each line without what ends it
// unseen (spaces, tabs and other space characters).
func shown(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		out = append(out, strings.TrimRightFunc(l, unicode.IsSpace))
	}
	return out
}

// A change an approver reads in a patch must look like a change: one that
// only adds or removes whitespace at the end of a line, or only removes
// the newline at the end of the file, is visible, and a context line
// stays as it was.
func TestPatchShowsWhitespaceOnlyChanges(t *testing.T) {
	for _, tc := range []struct {
		name, old, new string
	}{
		{"trailing spaces added", "\tx := 1", "\tx := 1   "},
		{"trailing tab added", "x := 1", "x := 1\t"},
		{"trailing spaces removed", "x := 1  ", "x := 1"},
		{"a space changed to a tab", "x := 1 ", "x := 1\t"},
		{"trailing no-break space", "x := 1", "x := 1\u00a0"},
		{"trailing ideographic space", "x := 1", "x := 1\u3000"},
		{"blank line gains spaces", "", "    "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := "@@ -1 +1 @@\n-" + tc.old + "\n+" + tc.new + "\n"
			for _, got := range []string{Patch(p), writeAll(t, NewPatchWriter, p)} {
				lines := shown(got)
				if strings.TrimPrefix(lines[1], "-") == strings.TrimPrefix(lines[2], "+") {
					t.Errorf("%q shows as %q: the two lines look the same", p, got)
				}
			}
		})
	}
	// The final newline removed: git's marker stays, visibly.
	p := "@@ -1 +1 @@\n-last\n+last\n\\ No newline at end of file\n"
	if got := Patch(p); !strings.Contains(got, "\n\\ No newline at end of file\n") {
		t.Errorf("%q shows as %q: the marker is gone", p, got)
	}
	// Unchanged: a context line of an empty line (its space is the
	// diff's), whitespace inside a line, CRLF as before.
	for in, want := range map[string]string{
		"@@ -1,3 +1,3 @@\n \n a\tb c\n-x\n+y\n": "@@ -1,3 +1,3 @@\n \n a\tb c\n-x\n+y\n",
		" x \n":                                 " x⟦\\x20⟧\n",
		"+\t\n":                                 "+⟦\\x09⟧\n",
		"+a \r\n":                               "+a ⟦\\x0d⟧\n",
		" x  ":                                  " x⟦\\x20⟧⟦\\x20⟧",
	} {
		if got := Patch(in); got != want {
			t.Errorf("Patch(%q) = %q, want %q", in, got, want)
		}
		if got := writeAll(t, NewPatchWriter, in); got != want {
			t.Errorf("patch Writer(%q) = %q, want %q", in, got, want)
		}
	}
	// A long run of spaces split between writes is held back up to a
	// bound, then shown as escapes: never left unseen at a line's end.
	long := "+x" + strings.Repeat(" ", 10000)
	var out bytes.Buffer
	w := NewPatchWriter(&out)
	w.Write([]byte(long))
	w.Write([]byte("\n"))
	w.Flush()
	if l := shown(out.String())[0]; len(l) < 10000 {
		t.Errorf("a 10,000-space tail written before its newline shows as %d bytes", len(l))
	}
}

// writeAll writes in through a new Writer one byte at a time.
func writeAll(t *testing.T, newWriter func(io.Writer) *Writer, in string) string {
	t.Helper()
	var out bytes.Buffer
	w := newWriter(&out)
	for i := 0; i < len(in); i++ {
		if _, err := w.Write([]byte{in[i]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
