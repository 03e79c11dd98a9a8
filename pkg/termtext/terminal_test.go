package termtext

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
)

// forgeries are inputs that try to pass for an escape, or to end or start
// a highlight: the marks themselves, SGR sequences as bytes, as a C1 CSI
// byte and rune, and text spelled like the terminal form.
var forgeries = []string{
	"\u27e6\\x1b\u27e7",
	"ok\u27e7 rm -rf / \u27e6",
	"\u27e6\u27e6\u27e7\u27e7",
	"\x1b[27m\x1b[0m\x1bc",
	"\x9b27m\xc2\x9b27m\u009b0m",
	"\u27e6\x1b[27m\u27e7",
	"\xe2\x9f\xa6\xe2\x9f",
	"\\x1b[7m\\x1b[27m",
}

// highlighted matches one escape as a Terminal shows it.
var highlighted = regexp.MustCompile(`^\x1b\[7m(\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8})\x1b\[27m`)

// checkTerminal reports the first thing in out, a Terminal's output, that
// a terminal would act on other than a whole highlight around one escape.
func checkTerminal(out string, multiline bool) error {
	var plain strings.Builder
	for i := 0; i < len(out); {
		if m := highlighted.FindString(out[i:]); m != "" {
			i += len(m)
			continue
		}
		if out[i] == 0x1b {
			return fmt.Errorf("ESC at byte %d is not a highlight around one escape: %q", i, out[i:])
		}
		plain.WriteByte(out[i])
		i++
	}
	return checkSafe(plain.String(), multiline)
}

// terminalForm is s, escaped, as a Terminal writes it.
func terminalForm(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	tw := NewTerminal(&b)
	if _, err := io.WriteString(tw, s); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestTerminalShowsEscapesHighlighted(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"+\x1b[8mrm -rf /\x1b[0m", "+\x1b[7m\\x1b\x1b[27m[8mrm -rf /\x1b[7m\\x1b\x1b[27m[0m"},
		{`"Hello airlock!\n" exit\.`, `"Hello airlock!\n" exit\.`},
		{"a\u27e6b", "a\x1b[7m\\u27e6\x1b[27mb"},
		{"a\u202eb\r\n", "a\x1b[7m\\u202e\x1b[27mb\x1b[7m\\x0d\x1b[27m\x1b[7m\\x0a\x1b[27m"},
	} {
		if got := terminalForm(t, Line(tc.in)); got != tc.want {
			t.Errorf("Line(%q) through a Terminal = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestMarksCannotBeForged: text holding the marks, or spelled like an
// escape, never reads back as an escape, in either form.
func TestMarksCannotBeForged(t *testing.T) {
	for _, in := range forgeries {
		for _, out := range []string{Line(in), Block(in), Patch(in)} {
			if back, err := unescape(out); err != nil || back != in {
				t.Errorf("%q escaped as %q reads back as %q, %v", in, out, back, err)
			}
			if err := checkTerminal(terminalForm(t, out), true); err != nil {
				t.Errorf("%q escaped as %q: %v", in, out, err)
			}
		}
	}
	// The text's own marks are escaped, so there are exactly as many
	// escapes as the text has marks and other unsafe runes.
	if got, want := strings.Count(Line("\u27e6\\x1b\u27e7"), Open), 2; got != want {
		t.Errorf("%d escapes in %q, want %d", got, Line("\u27e6\\x1b\u27e7"), want)
	}
}

func TestTerminalWithSplitWrites(t *testing.T) {
	in := Line("a\x1b\u27e6b\u202e") + "é—" + Line("\x9b")
	want := terminalForm(t, in)
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			var b bytes.Buffer
			tw := NewTerminal(&b)
			for _, chunk := range []string{in[:i], in[i:j], in[j:]} {
				if n, err := io.WriteString(tw, chunk); n != len(chunk) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", chunk, n, err)
				}
			}
			if err := tw.Flush(); err != nil {
				t.Fatal(err)
			}
			if b.String() != want {
				t.Errorf("written as %q, %q, %q: %q, want %q", in[:i], in[i:j], in[j:], b.String(), want)
			}
		}
	}
}

func TestUnwrap(t *testing.T) {
	var b bytes.Buffer
	if Unwrap(NewWatcher(NewTerminal(&b))) != io.Writer(&b) || Unwrap(&b) != io.Writer(&b) {
		t.Error("Unwrap does not return the writer under a Terminal, or a writer itself")
	}
}

func TestWatcher(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{{`plain \x1b text`, false}, {"a\x1bb", true}, {"\u27e6", true}} {
		var b bytes.Buffer
		v := NewWatcher(&b)
		io.WriteString(v, Block(tc.in))
		if v.Escaped() != tc.want || b.String() != Block(tc.in) {
			t.Errorf("%q: Escaped %v, wrote %q; want %v, %q", tc.in, v.Escaped(), b.String(), tc.want, Block(tc.in))
		}
	}
}

// FuzzTerminal checks, for any input, that a Terminal's output of it
// escaped holds no escape sequence but whole highlights around one escape
// each: nothing the input holds can end a highlight early or begin one.
func FuzzTerminal(f *testing.F) {
	for _, s := range append(forgeries, writes...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for _, esc := range []func(string) string{Line, Block, Patch} {
			out := esc(in)
			if err := checkTerminal(terminalForm(t, out), true); err != nil {
				t.Fatalf("%q escaped as %q: %v", in, out, err)
			}
		}
	})
}
