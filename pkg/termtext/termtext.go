// Package termtext owns how text that came from somewhere else (a job's
// output and patch, a caller's comment or reason, a repository's file
// names, a server's error message) is shown on a person's terminal: every
// byte a terminal would act on rather than display, and every rune that is
// invisible or reorders what is around it, is written as a visible escape,
// so such text can neither hide itself, move the cursor, rewrite what is
// already on the screen nor reach the clipboard. Everything else, a
// backslash included, is shown as it is: a reviewer reads code as it
// lands. Anything that prints such text for people goes through it (today
// the airlock CLI); it needs nothing but the standard library, so any
// package may import it.
//
// An escape is marked so that no text can pass for one: it stands between
// the marks ⟦ and ⟧ (U+27E6 and U+27E7), and those two runes, where the
// text has them, are themselves escaped. So every ⟦ in the result opens
// an escape and the next ⟧ closes it, and the result maps back to exactly
// the text. Inside the marks:
//
//	\xHH        a byte: a C0 control (U+0000-U+001F), DEL, or a byte that is
//	            not part of valid UTF-8 (so a raw C1 byte 0x9b is ⟦\x9b⟧)
//	\uHHHH      a rune (\UHHHHHHHH above U+FFFF): a C1 control (U+0080-U+009F),
//	            a format character (Unicode category Cf: bidi embeddings,
//	            overrides and isolates, zero-width characters, the soft
//	            hyphen, the byte order mark, tags), a variation selector or
//	            other default-ignorable rune (U+034F, Hangul fillers such
//	            as U+3164), the line and paragraph separators U+2028
//	            and U+2029, or one of the marks
//
// That is the form for files and pipes. A [Terminal] shows the same text
// on a terminal with each escape in reverse video instead of between the
// marks: the highlight is switched on and off by escape sequences only it
// writes, and the text can hold no escape sequence, so no text can end a
// highlight early or start one.
//
// [Block] keeps newline, tab and CRLF, which belong in a multi-line body;
// [Line] escapes them too, so one field cannot start another line or
// table column. A carriage return not followed by a newline is always
// escaped: it would return the cursor over what a line showed so far.
// [Patch] keeps newline and tab but escapes every carriage return, CRLF's
// too: in a patch, a line that changes only its line end must not look
// like the line it replaces. For the same reason [Patch] escapes the
// spaces, tabs and other space characters (Unicode category Zs) that end
// a line: "+x \t" shows as "+x⟦\x20⟧⟦\x09⟧", and a no-break space there
// as ⟦\u00a0⟧. The space that opens a context line is the diff's, not the
// text's, and stays; so does git's "\ No newline at end of file", which
// is how a change that only removes a file's last newline shows.
package termtext

import (
	"bytes"
	"io"
	"unicode"
	"unicode/utf8"
)

// The marks around an escape in the form for files and pipes.
const (
	Open  = "\u27e6" // ⟦
	Close = "\u27e7" // ⟧
)

// Legend explains the escapes to a reader, in the form for files and
// pipes; through a [Terminal] its example is highlighted as the escapes
// are. A printer shows it after text it escaped, when anything was
// ([Watcher]).
const Legend = Open + `\x1b` + Close + ` is a byte or character shown escaped; everything else, a backslash too, is shown as it is`

// Line returns s escaped for a single-line field: a name, id, comment,
// reason, path, command argument or table cell.
func Line(s string) string {
	out, _ := escape(nil, []byte(s), line, true, true)
	return string(out)
}

// mode is what a text keeps of its line structure.
type mode int

const (
	line  mode = iota // one line: newline and tab escaped
	block             // a body: newline, tab and CRLF kept
	patch             // a patch: newline and tab kept, every CR escaped
)

// Block returns s escaped for a multi-line body such as a patch or a
// program's output: newlines, tabs and CRLF line ends are kept.
func Block(s string) string {
	out, _ := escape(nil, []byte(s), block, true, true)
	return string(out)
}

// Patch returns a patch (or any diff) escaped for a terminal as [Block]
// does, except that a carriage return is shown as \x0d before a newline
// too, so "-line\x0d" and "+line" differ on the screen as in the file.
func Patch(s string) string {
	out, _ := escape(nil, []byte(s), patch, true, true)
	return string(out)
}

// Writer escapes a stream as [Block] does and writes it to an underlying
// writer. A rune split between two writes is decoded whole, and a carriage
// return at the end of a write waits for the next byte: it holds back at
// most utf8.UTFMax-1 bytes between writes. Call Flush when the stream ends
// to write what it still holds. A Writer is not safe for concurrent use.
type Writer struct {
	w         io.Writer
	mode      mode
	carry     []byte // the held-back tail of the last write
	lineStart bool   // the next byte starts a line
	in        []byte // the tail joined to the next write
	out       []byte
}

// maxHeld bounds the run of spaces at the end of a write that a patch
// Writer holds back until it knows whether the line ends there; a longer
// one is written as escapes, visible whichever way the line goes on.
const maxHeld = 4096

// NewWriter returns a Writer that writes escaped text to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, mode: block, lineStart: true}
}

// NewPatchWriter returns a Writer that escapes a patch as [Patch] does.
func NewPatchWriter(w io.Writer) *Writer {
	return &Writer{w: w, mode: patch, lineStart: true}
}

// Write escapes p and writes the result, less any held-back tail. It
// reports len(p) when the underlying write succeeds.
func (w *Writer) Write(p []byte) (int, error) {
	src := p
	if len(w.carry) > 0 {
		w.in = append(append(w.in[:0], w.carry...), p...)
		src = w.in
	}
	var n int
	w.out, n = escape(w.out[:0], src, w.mode, false, w.lineStart)
	w.consumed(src[:n])
	w.carry = append(w.carry[:0], src[n:]...)
	if len(w.carry) > maxHeld {
		// Only a run of spaces is held back this long.
		end := spaceRunEnd(w.carry)
		w.out = appendSpaces(w.out, w.carry[:end], true)
		w.consumed(w.carry[:end])
		w.carry = append(w.carry[:0], w.carry[end:]...)
	}
	if len(w.out) == 0 {
		return len(p), nil
	}
	if _, err := w.w.Write(w.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// consumed notes where what was written leaves the line.
func (w *Writer) consumed(b []byte) {
	if len(b) > 0 {
		w.lineStart = b[len(b)-1] == '\n'
	}
}

// Flush writes the held-back tail, escaped as the end of the stream.
func (w *Writer) Flush() error {
	if len(w.carry) == 0 {
		return nil
	}
	w.out, _ = escape(w.out[:0], w.carry, w.mode, true, w.lineStart)
	w.consumed(w.carry)
	w.carry = w.carry[:0]
	_, err := w.w.Write(w.out)
	return err
}

// escape appends src to dst with every unsafe byte and rune escaped,
// keeping what m keeps. Unless atEOF it stops before a tail that more input
// could change (an incomplete rune, a final carriage return) and reports
// how much of src it consumed. lineStart says whether src starts a line.
func escape(dst, src []byte, m mode, atEOF, lineStart bool) ([]byte, int) {
	multiline := m != line
	for i := 0; i < len(src); {
		c := src[i]
		if m == patch && (c == ' ' || c == '\t' || c >= utf8.RuneSelf) && !(c == ' ' && (i == 0 && lineStart || i > 0 && src[i-1] == '\n')) {
			if j := i + spaceRunEnd(src[i:]); j > i {
				switch {
				case j == len(src) && !atEOF, j+utf8.UTFMax > len(src) && !atEOF && !utf8.FullRune(src[j:]):
					return dst, i // where the line goes on is not known yet
				}
				dst = appendSpaces(dst, src[i:j], j == len(src) || src[j] == '\n')
				i = j
				continue
			}
		}
		if c < utf8.RuneSelf {
			switch {
			case multiline && (c == '\n' || c == '\t'):
				dst = append(dst, c)
			case m == block && c == '\r' && i+1 == len(src) && !atEOF:
				return dst, i
			case m == block && c == '\r' && i+1 < len(src) && src[i+1] == '\n':
				dst = append(dst, '\r', '\n')
				i++
			case c < 0x20 || c == 0x7f:
				dst = appendHex(dst, 'x', uint32(c), 2)
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		if !atEOF && !utf8.FullRune(src[i:]) {
			return dst, i
		}
		r, size := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = appendHex(dst, 'x', uint32(c), 2)
		case r == markOpen || r == markClose:
			dst = appendHex(dst, 'u', uint32(r), 4)
		case hidden(r) && r > 0xffff:
			dst = appendHex(dst, 'U', uint32(r), 8)
		case hidden(r):
			dst = appendHex(dst, 'u', uint32(r), 4)
		default:
			dst = append(dst, src[i:i+size]...)
		}
		i += size
	}
	return dst, len(src)
}

// hidden reports whether a terminal would act on r, or show it as nothing
// or as a change to the text around it, rather than as a glyph.
func hidden(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Cf, r) ||
		// Shown as nothing by most terminals although not format
		// characters: variation selectors, the combining grapheme
		// joiner, Hangul fillers and the rest of Unicode's default
		// ignorables.
		unicode.In(r, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

const (
	markOpen  = '\u27e6'
	markClose = '\u27e7'
)

// appendHex appends an escape: a backslash, verb and v as digits lowercase
// hex digits, between the marks.
func appendHex(dst []byte, verb byte, v uint32, digits int) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, Open...)
	dst = append(dst, '\\', verb)
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		dst = append(dst, hex[v>>uint(shift)&0xf])
	}
	return append(dst, Close...)
}

// spaceRunEnd is the length of the run of spaces, tabs and other space
// characters (Zs) that b starts with.
func spaceRunEnd(b []byte) int {
	i := 0
	for i < len(b) {
		if b[i] == ' ' || b[i] == '\t' {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if b[i] < utf8.RuneSelf || r == utf8.RuneError || !unicode.Is(unicode.Zs, r) {
			break
		}
		i += size
	}
	return i
}

// appendSpaces appends a run of spaces as it is, or escaped where it
// ends a line (and would show as nothing).
func appendSpaces(dst, run []byte, trailing bool) []byte {
	if !trailing {
		return append(dst, run...)
	}
	for _, r := range string(run) {
		if r < utf8.RuneSelf {
			dst = appendHex(dst, 'x', uint32(r), 2)
		} else {
			dst = appendHex(dst, 'u', uint32(r), 4)
		}
	}
	return dst
}

// The terminal's own escape sequences that show an escape in reverse
// video: SGR 7 on, SGR 27 off (which leaves any other attribute as it was).
const (
	sgrReverse   = "\x1b[7m"
	sgrNoReverse = "\x1b[27m"
)

// Terminal writes escaped text (what [Line], [Block], [Patch] and a
// [Writer] produce, and text of the printer's own) to a terminal, with
// each escape shown in reverse video rather than between the marks: it
// writes SGR 7 for each ⟦ and SGR 27 for each ⟧, and everything else as
// it is. Since escaped text has no ESC byte, those two sequences are the
// only ones that reach the terminal. A mark split between two writes is
// held back until the next; call Flush when the output ends. A Terminal
// is not safe for concurrent use.
type Terminal struct {
	w     io.Writer
	carry []byte // the first bytes of a mark, or of another rune, at the end of the last write
	buf   []byte
}

// NewTerminal returns a Terminal that writes to w.
func NewTerminal(w io.Writer) *Terminal { return &Terminal{w: w} }

// Unwrap returns the writer under w's Terminal and Watcher wrappers, for
// bytes that are data rather than text for people (JSON, --raw output),
// or w itself.
func Unwrap(w io.Writer) io.Writer {
	for {
		switch t := w.(type) {
		case *Terminal:
			w = t.w
		case *Watcher:
			w = t.w
		default:
			return w
		}
	}
}

// Write writes p with its marks turned into the highlight, less a tail
// that may be the start of a mark. It reports len(p) when the underlying
// write succeeds.
func (t *Terminal) Write(p []byte) (int, error) {
	src := p
	if len(t.carry) > 0 {
		src = append(t.carry, p...)
		t.carry = nil
	}
	out := t.buf[:0]
	for len(src) > 0 {
		i := bytes.IndexByte(src, Open[0])
		if i < 0 {
			out = append(out, src...)
			break
		}
		out = append(out, src[:i]...)
		src = src[i:]
		switch {
		case bytes.HasPrefix(src, []byte(Open)):
			out = append(out, sgrReverse...)
			src = src[len(Open):]
		case bytes.HasPrefix(src, []byte(Close)):
			out = append(out, sgrNoReverse...)
			src = src[len(Close):]
		case len(src) < len(Open) && bytes.HasPrefix([]byte(Open), src):
			// Perhaps a mark's first bytes: wait for the rest.
			t.carry = append([]byte(nil), src...)
			src = nil
		default:
			out = append(out, src[0])
			src = src[1:]
		}
	}
	t.buf = out
	if len(out) > 0 {
		if _, err := t.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes a held-back tail as it is.
func (t *Terminal) Flush() error {
	if len(t.carry) == 0 {
		return nil
	}
	c := t.carry
	t.carry = nil
	_, err := t.w.Write(c)
	return err
}

// Watcher passes writes on to w and records whether an escape went
// through, so a printer shows the [Legend] only where it explains
// something. Escaped text never splits a mark, so one write holds all of
// it.
type Watcher struct {
	w    io.Writer
	seen bool
}

// NewWatcher returns a Watcher that writes to w.
func NewWatcher(w io.Writer) *Watcher { return &Watcher{w: w} }

func (v *Watcher) Write(p []byte) (int, error) {
	if !v.seen && bytes.Contains(p, []byte(Open)) {
		v.seen = true
	}
	return v.w.Write(p)
}

// Escaped reports whether an escape was written.
func (v *Watcher) Escaped() bool { return v.seen }
