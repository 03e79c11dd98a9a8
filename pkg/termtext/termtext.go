// Package termtext owns how text that came from somewhere else (a job's
// output and patch, a caller's comment or reason, a repository's file
// names, a server's error message) is shown on a person's terminal: every
// byte a terminal would act on rather than display, and every rune that is
// invisible or reorders what is around it, is written as a visible escape,
// so such text can neither hide itself, move the cursor, rewrite what is
// already on the screen nor reach the clipboard. Anything that prints such
// text for people goes through it (today the airlock CLI); it needs nothing
// but the standard library, so any package may import it.
//
// The escapes, each starting with a backslash, so a reader (or a program)
// can always tell them apart from the text:
//
//	\\          a backslash
//	\xHH        a byte: a C0 control (U+0000-U+001F), DEL, or a byte that is
//	            not part of valid UTF-8 (so a raw C1 byte 0x9b is \x9b)
//	\uHHHH      a rune (\UHHHHHHHH above U+FFFF): a C1 control (U+0080-U+009F),
//	            a format character (Unicode category Cf: bidi embeddings,
//	            overrides and isolates, zero-width characters, the soft
//	            hyphen, the byte order mark, tags), a variation selector or
//	            other default-ignorable rune (U+034F, Hangul fillers such
//	            as U+3164), or the line and paragraph separators U+2028
//	            and U+2029
//
// Everything else passes unchanged. [Block] keeps newline, tab and CRLF,
// which belong in a multi-line body; [Line] escapes them too, so one field
// cannot start another line or table column. A carriage return not followed
// by a newline is always escaped: it would return the cursor over what a
// line showed so far. [Patch] keeps newline and tab but escapes every
// carriage return, CRLF's too: in a patch, a line that changes only its
// line end must not look like the line it replaces.
package termtext

import (
	"io"
	"unicode"
	"unicode/utf8"
)

// Line returns s escaped for a single-line field: a name, id, comment,
// reason, path, command argument or table cell.
func Line(s string) string {
	out, _ := escape(nil, []byte(s), line, true)
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
	out, _ := escape(nil, []byte(s), block, true)
	return string(out)
}

// Patch returns a patch (or any diff) escaped for a terminal as [Block]
// does, except that a carriage return is shown as \x0d before a newline
// too, so "-line\x0d" and "+line" differ on the screen as in the file.
func Patch(s string) string {
	out, _ := escape(nil, []byte(s), patch, true)
	return string(out)
}

// Writer escapes a stream as [Block] does and writes it to an underlying
// writer. A rune split between two writes is decoded whole, and a carriage
// return at the end of a write waits for the next byte: it holds back at
// most utf8.UTFMax-1 bytes between writes. Call Flush when the stream ends
// to write what it still holds. A Writer is not safe for concurrent use.
type Writer struct {
	w      io.Writer
	mode   mode
	carry  [utf8.UTFMax - 1]byte // the held-back tail of the last write
	ncarry int
	in     []byte // the tail joined to the next write
	out    []byte
}

// NewWriter returns a Writer that writes escaped text to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, mode: block}
}

// NewPatchWriter returns a Writer that escapes a patch as [Patch] does.
func NewPatchWriter(w io.Writer) *Writer {
	return &Writer{w: w, mode: patch}
}

// Write escapes p and writes the result, less any held-back tail. It
// reports len(p) when the underlying write succeeds.
func (w *Writer) Write(p []byte) (int, error) {
	src := p
	if w.ncarry > 0 {
		w.in = append(append(w.in[:0], w.carry[:w.ncarry]...), p...)
		src = w.in
	}
	var n int
	w.out, n = escape(w.out[:0], src, w.mode, false)
	w.ncarry = copy(w.carry[:], src[n:])
	if len(w.out) == 0 {
		return len(p), nil
	}
	if _, err := w.w.Write(w.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes the held-back tail, escaped as the end of the stream.
func (w *Writer) Flush() error {
	if w.ncarry == 0 {
		return nil
	}
	w.out, _ = escape(w.out[:0], w.carry[:w.ncarry], w.mode, true)
	w.ncarry = 0
	_, err := w.w.Write(w.out)
	return err
}

// escape appends src to dst with every unsafe byte and rune escaped,
// keeping what m keeps. Unless atEOF it stops before a tail that more input
// could change (an incomplete rune, a final carriage return) and reports
// how much of src it consumed.
func escape(dst, src []byte, m mode, atEOF bool) ([]byte, int) {
	multiline := m != line
	for i := 0; i < len(src); {
		c := src[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\':
				dst = append(dst, '\\', '\\')
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

// appendHex appends a backslash, verb and v as digits lowercase hex digits.
func appendHex(dst []byte, verb byte, v uint32, digits int) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '\\', verb)
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		dst = append(dst, hex[v>>uint(shift)&0xf])
	}
	return dst
}
