package mcp

import (
	"fmt"
	"unicode/utf8"

	"github.com/airlockhq/airlock/pkg/termtext"
)

// Size bounds of what a tool hands the model. The tool descriptions state
// them; every cut is said in the text where it happened.
const (
	// outputHead and outputTail are how much of one exec stream (stdout or
	// stderr) a run result keeps: its first outputHead bytes and its last
	// outputTail bytes, the middle cut.
	outputHead = 16 << 10
	outputTail = 48 << 10
	// readMax is the most of a file read_file returns by default, and
	// readMaxLimit the most it returns when asked for more.
	readMax      = 256 << 10
	readMaxLimit = 1 << 20
	// writeMax is the largest file write_file takes, and stdinMax the
	// largest stdin run takes (the authority's bound on an exec's stdin
	// sent whole).
	writeMax = 1 << 20
	stdinMax = 1 << 20
	// listMax is how many entries list_files shows.
	listMax = 1000
)

// Data is text from a job, a repository or a server made safe to hand a
// model as data: every control sequence (ESC, the C0 and C1 controls but
// newline and tab, a lone carriage return, DEL), every bidi override or
// isolate and every invisible rune is written as a visible escape between
// ⟦ and ⟧, and bytes that are not UTF-8 as ⟦\xHH⟧. It is termtext.Block,
// the escaping the CLI uses for the same text on a terminal.
func Data(b []byte) string { return termtext.Block(string(b)) }

// Line is Data for one field: newline and tab are escaped too.
func Line(s string) string { return termtext.Line(s) }

// capture keeps the first head and the last tail bytes of a stream and
// counts the whole.
type capture struct {
	headMax, tailMax int
	head, tail       []byte
	total            int64
	// capped is set when the server said it cut the stream at its own
	// size cap.
	capped bool
}

func newCapture(head, tail int) *capture { return &capture{headMax: head, tailMax: tail} }

func (c *capture) Write(p []byte) {
	c.total += int64(len(p))
	if n := min(len(p), c.headMax-len(c.head)); n > 0 {
		c.head = append(c.head, p[:n]...)
		p = p[n:]
	}
	if len(p) == 0 {
		return
	}
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*c.tailMax {
		c.tail = append(c.tail[:0:0], c.tail[len(c.tail)-c.tailMax:]...)
	}
}

// Text is the stream as data, its cut said where it is: "[airlock: N
// bytes cut here ...]" between the head and the tail. The cut ends fall on
// whole runes.
func (c *capture) Text() (string, bool) {
	tail := c.tail
	if len(tail) > c.tailMax {
		tail = tail[len(tail)-c.tailMax:]
	}
	cut := c.total - int64(len(c.head)) - int64(len(tail))
	if cut <= 0 {
		return Data(append(append([]byte{}, c.head...), tail...)), c.capped
	}
	head := trimRuneEnd(c.head)
	tail = trimRuneStart(tail)
	cut = c.total - int64(len(head)) - int64(len(tail))
	return fmt.Sprintf("%s\n[airlock: %d bytes cut here: this stream had %d bytes; shown are its first %d and its last %d]\n%s",
		Data(head), cut, c.total, len(head), len(tail), Data(tail)), true
}

// trimRuneEnd drops an incomplete UTF-8 sequence at the end of b (at most
// three bytes).
func trimRuneEnd(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		if r := b[len(b)-i]; utf8.RuneStart(r) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

// trimRuneStart drops the continuation bytes that open b (at most three).
func trimRuneStart(b []byte) []byte {
	for i := 0; i < utf8.UTFMax-1 && i < len(b); i++ {
		if utf8.RuneStart(b[i]) {
			return b[i:]
		}
	}
	return b
}
