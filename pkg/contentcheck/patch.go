package contentcheck

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Git's modes for the entries a tree holds.
const (
	ModeFile       uint32 = 0o100644
	ModeExecutable uint32 = 0o100755
	ModeSymlink    uint32 = 0o120000
	ModeGitlink    uint32 = 0o160000
)

// Patch is a git patch as `git diff --binary --no-renames` writes it (the
// executor's patch.diff), parsed into what the checks read. Its byte
// slices point into the bytes it was parsed from.
type Patch struct {
	Files []FilePatch
}

// FilePatch is one "diff --git" section. A type change (a file becoming a
// symlink) is two sections, as git writes it: the old entry deleted, the
// new one added.
type FilePatch struct {
	// OldPath and NewPath are the file's path before and after the patch,
	// "" on the side where it does not exist. Both sides that exist have
	// the same path: renames and copies are refused.
	OldPath, NewPath string
	// OldMode and NewMode are git's modes, 0 on a side that does not exist.
	OldMode, NewMode uint32
	// Binary is set for a binary patch and for git's bare "Binary files
	// differ" (then the patch carries no content: HasContent is false).
	Binary bool
	// Added holds every added text line in order, with its line number in
	// the new file.
	Added []Line
	// AddedBytes counts the added lines' bytes with their newlines.
	AddedBytes int64
	// Size is the new file's size in bytes where the patch tells it (a new
	// text file, a binary literal, the result size in a binary delta's
	// header); -1 where it does not.
	Size int64
	// Target is a symlink's target (NewMode 120000), when TargetKnown: the
	// patch holds the whole new content.
	Target      string
	TargetKnown bool

	bin *binaryHunk // the forward binary hunk; nil for text and for "Binary files differ"
}

// HasContent reports whether the patch carries the file's new content or
// its added part: false only for git's bare "Binary files differ".
func (f *FilePatch) HasContent() bool { return !f.Binary || f.bin != nil }

// Line is one added line.
type Line struct {
	Num  int    // 1-based line number in the new file
	Text []byte // without the leading '+' and the newline
}

// maxCount bounds the numbers a patch may carry (hunk ranges, sizes), so
// arithmetic on them cannot overflow.
const maxCount = 1 << 40

// ParsePatch parses a git patch. It is strict: a line it does not
// understand is an error rather than skipped, because `git apply` could
// act on what a lenient parser passed over. Errors name a line number and
// never quote the patch (it may hold a secret).
func ParsePatch(data []byte) (*Patch, error) {
	p := &parser{data: data}
	patch := &Patch{}
	for !p.eof() {
		f, err := p.file()
		if err != nil {
			return nil, err
		}
		patch.Files = append(patch.Files, f)
	}
	return patch, nil
}

type parser struct {
	data []byte
	off  int // start of the next line
	num  int // number of the last line read
}

func (p *parser) eof() bool { return p.off >= len(p.data) }

// peek returns the next line without its newline.
func (p *parser) peek() ([]byte, error) {
	rest := p.data[p.off:]
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		return nil, fmt.Errorf("line %d: the patch does not end with a newline", p.num+1)
	}
	return rest[:i], nil
}

func (p *parser) next() ([]byte, error) {
	line, err := p.peek()
	if err != nil {
		return nil, err
	}
	p.off += len(line) + 1
	p.num++
	return line, nil
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: "+format, append([]any{p.num}, args...)...)
}

// file parses one section, from its "diff --git" line to the next.
func (p *parser) file() (FilePatch, error) {
	f := FilePatch{Size: -1}
	line, err := p.next()
	if err != nil {
		return f, err
	}
	rest, ok := bytes.CutPrefix(line, []byte("diff --git "))
	if !ok {
		return f, p.errorf(`expected a "diff --git" header`)
	}
	aName, bName, err := headerNames(rest)
	if err != nil {
		return f, p.errorf("diff --git header: %v", err)
	}
	var created, deleted bool
	var oldMode, newMode, indexMode uint32
headers:
	for !p.eof() {
		line, err := p.peek()
		if err != nil {
			return f, err
		}
		var v []byte
		var dst *uint32
		switch {
		case cut(line, "old mode ", &v):
			dst = &oldMode
		case cut(line, "new mode ", &v):
			dst = &newMode
		case cut(line, "new file mode ", &v):
			dst, created = &newMode, true
		case cut(line, "deleted file mode ", &v):
			dst, deleted = &oldMode, true
		case cut(line, "index ", &v):
			if sp := bytes.IndexByte(v, ' '); sp >= 0 {
				v, dst = v[sp+1:], &indexMode
			} else {
				v = nil
			}
		case cut(line, "similarity index ", &v), cut(line, "dissimilarity index ", &v),
			cut(line, "rename from ", &v), cut(line, "rename to ", &v),
			cut(line, "copy from ", &v), cut(line, "copy to ", &v):
			p.next()
			return f, p.errorf("a rename or copy: the patch must be made with --no-renames")
		default:
			break headers
		}
		p.next()
		if dst != nil {
			m, err := parseMode(v)
			if err != nil {
				return f, p.errorf("%v", err)
			}
			*dst = m
		}
	}
	if created && deleted {
		return f, p.errorf("a file both created and deleted")
	}
	if created && indexMode != 0 || deleted && indexMode != 0 {
		return f, p.errorf("an index line with a mode on a created or deleted file")
	}
	switch {
	case created:
		if oldMode != 0 {
			return f, p.errorf("an old mode on a created file")
		}
		f.NewPath, f.NewMode = bName, newMode
	case deleted:
		if newMode != 0 {
			return f, p.errorf("a new mode on a deleted file")
		}
		f.OldPath, f.OldMode = aName, oldMode
	default:
		if aName != bName {
			return f, p.errorf("old and new paths differ without a rename")
		}
		f.OldPath, f.NewPath = aName, bName
		switch {
		case oldMode != 0 && newMode != 0 && indexMode == 0:
			f.OldMode, f.NewMode = oldMode, newMode
		case oldMode == 0 && newMode == 0 && indexMode != 0:
			f.OldMode, f.NewMode = indexMode, indexMode
		default:
			return f, p.errorf("no mode for a changed file")
		}
	}
	if p.eof() {
		f.finish()
		return f, nil
	}
	line, err = p.peek()
	if err != nil {
		return f, err
	}
	switch {
	case bytes.HasPrefix(line, []byte("diff --git ")):
		f.finish()
		return f, nil
	case bytes.Equal(line, []byte("GIT binary patch")):
		p.next()
		f.Binary = true
		return f, p.binary(&f)
	case bytes.HasPrefix(line, []byte("Binary files ")) && bytes.HasSuffix(line, []byte(" differ")):
		p.next()
		f.Binary = true
		return f, nil
	case bytes.HasPrefix(line, []byte("--- ")):
		return f, p.text(&f)
	}
	p.next()
	return f, p.errorf("unexpected line in a file header")
}

// cut is bytes.CutPrefix for a switch.
func cut(line []byte, prefix string, rest *[]byte) bool {
	r, ok := bytes.CutPrefix(line, []byte(prefix))
	if ok {
		*rest = r
	}
	return ok
}

func parseMode(v []byte) (uint32, error) {
	m, err := strconv.ParseUint(string(v), 8, 32)
	if err != nil {
		return 0, errors.New("a mode that is not an octal number")
	}
	switch uint32(m) {
	case ModeFile, ModeExecutable, ModeSymlink, ModeGitlink:
		return uint32(m), nil
	}
	return 0, fmt.Errorf("mode %o is not one a tree entry can have", m)
}

// headerNames reads "a/X b/Y" from a "diff --git" line: both names quoted
// the way git quotes them, or neither. Unquoted, the line is ambiguous
// when a name holds " b/"; git writes the same name twice when there is no
// rename, so that is how it is read.
func headerNames(rest []byte) (a, b string, err error) {
	if len(rest) > 0 && rest[0] == '"' {
		a, n, err := unquote(rest)
		if err != nil {
			return "", "", err
		}
		rest = rest[n:]
		if len(rest) < 2 || rest[0] != ' ' || rest[1] != '"' {
			return "", "", errors.New("one name quoted and the other not")
		}
		b, n, err := unquote(rest[1:])
		if err != nil {
			return "", "", err
		}
		if 1+n != len(rest) {
			return "", "", errors.New("text after the names")
		}
		return stripPrefixes(a, b)
	}
	if (len(rest)-len(" "))%2 != 0 || len(rest) < len("a/ b/") {
		return "", "", errors.New("not two equal names")
	}
	half := (len(rest) - 1) / 2
	a, b = string(rest[:half]), string(rest[half+1:])
	if rest[half] != ' ' {
		return "", "", errors.New("not two equal names")
	}
	a, b, err = stripPrefixes(a, b)
	if err == nil && a != b {
		err = errors.New("not two equal names")
	}
	return a, b, err
}

func stripPrefixes(a, b string) (string, string, error) {
	if len(a) < 2 || a[:2] != "a/" || len(b) < 2 || b[:2] != "b/" {
		return "", "", errors.New(`names without the "a/" and "b/" prefixes`)
	}
	if len(a) == 2 || len(b) == 2 {
		return "", "", errors.New("an empty path")
	}
	return a[2:], b[2:], nil
}

// unquote reads a C-style quoted name as git writes it (quote_c_style)
// from the start of s and returns it and how many bytes it took.
func unquote(s []byte) (string, int, error) {
	if len(s) == 0 || s[0] != '"' {
		return "", 0, errors.New("not a quoted name")
	}
	var out []byte
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			return string(out), i + 1, nil
		case '\\':
			i++
			if i >= len(s) {
				return "", 0, errors.New("a quoted name ends in a backslash")
			}
			const letters, controls = "abfnrtv", "\a\b\f\n\r\t\v"
			switch e, k := s[i], strings.IndexByte(letters, s[i]); {
			case k >= 0:
				out = append(out, controls[k])
			case e == '\\' || e == '"':
				out = append(out, e)
			case e >= '0' && e <= '3':
				if i+2 >= len(s) || !isOctal(s[i+1]) || !isOctal(s[i+2]) {
					return "", 0, errors.New("a bad octal escape in a quoted name")
				}
				out = append(out, (e-'0')<<6|(s[i+1]-'0')<<3|(s[i+2]-'0'))
				i += 2
			default:
				return "", 0, errors.New("an unknown escape in a quoted name")
			}
		default:
			out = append(out, c)
		}
	}
	return "", 0, errors.New("a quoted name without its closing quote")
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// name reads the name on a "--- " or "+++ " line: "/dev/null" (returned
// as ""), or prefix followed by the path, quoted or not, with the tab git
// adds after a name holding a space.
func name(v []byte, prefix string) (string, bool, error) {
	if string(v) == "/dev/null" {
		return "", false, nil
	}
	var s string
	if len(v) > 0 && v[0] == '"' {
		q, n, err := unquote(v)
		if err != nil {
			return "", false, err
		}
		if rest := v[n:]; len(rest) > 0 && string(rest) != "\t" {
			return "", false, errors.New("text after a quoted name")
		}
		s = q
	} else {
		// An unquoted name never holds a tab (git quotes it), so a tab at
		// the end is the one git adds.
		s = string(bytes.TrimSuffix(v, []byte("\t")))
	}
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false, fmt.Errorf("a name without the %q prefix", prefix)
	}
	if len(s) == len(prefix) {
		return "", false, errors.New("an empty path")
	}
	return s[len(prefix):], true, nil
}

// text parses the "---"/"+++" lines and the hunks of a text patch.
func (p *parser) text(f *FilePatch) error {
	for _, side := range []struct {
		marker, prefix string
		path           string
	}{{"--- ", "a/", f.OldPath}, {"+++ ", "b/", f.NewPath}} {
		line, err := p.next()
		if err != nil {
			return err
		}
		v, ok := bytes.CutPrefix(line, []byte(side.marker))
		if !ok {
			return p.errorf("expected %q", side.marker)
		}
		got, exists, err := name(v, side.prefix)
		if err != nil {
			return p.errorf("%v", err)
		}
		if exists != (side.path != "") || got != side.path {
			return p.errorf("the name does not match the diff --git header")
		}
	}
	var newSide [][]byte // every new-side line, for a symlink's target
	hunks, wholeNew := 0, false
	// A "\ No newline at end of file" marker ends a side: nothing of that
	// side may follow it.
	oldEnded, newEnded := false, false
	nextNew := 1 // lowest line the next hunk may start at
	for !p.eof() {
		line, err := p.peek()
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(line, []byte("@@ ")) {
			break
		}
		p.next()
		if oldEnded || newEnded {
			return p.errorf("a hunk after the end of the file")
		}
		oldCount, newStart, newCount, err := hunkHeader(line)
		if err != nil {
			return p.errorf("hunk header: %v", err)
		}
		num := newStart
		if newCount == 0 {
			num = newStart + 1 // an empty range names the line before it
		}
		if num < nextNew {
			return p.errorf("hunks out of order")
		}
		if hunks == 0 {
			wholeNew = num == 1
		}
		hunks++
		var prev byte // kind of the last line read in this hunk
		for {
			if p.eof() {
				if oldCount != 0 || newCount != 0 {
					return p.errorf("the patch ends inside a hunk")
				}
				break
			}
			line, err := p.peek()
			if err != nil {
				return err
			}
			if len(line) > 0 && line[0] == '\\' {
				p.next()
				switch {
				case prev == '-' && !oldEnded:
					oldEnded = true
				case prev == '+' && !newEnded:
					newEnded = true
					f.AddedBytes--
				case prev == ' ' && !oldEnded && !newEnded:
					oldEnded, newEnded = true, true
				default:
					return p.errorf("a misplaced no-newline marker")
				}
				prev = '\\'
				continue
			}
			if oldCount == 0 && newCount == 0 {
				break
			}
			p.next()
			kind, text := byte(' '), line // git apply reads an empty line as empty context
			if len(line) > 0 {
				kind, text = line[0], line[1:]
			}
			if (kind == ' ' || kind == '-') && oldEnded || (kind == ' ' || kind == '+') && newEnded {
				return p.errorf("a line after the no-newline marker of its side")
			}
			switch kind {
			case ' ':
				if oldCount == 0 || newCount == 0 {
					return p.errorf("more lines than the hunk header says")
				}
				oldCount--
				newCount--
				newSide = append(newSide, text)
				num++
			case '-':
				if oldCount == 0 {
					return p.errorf("more removed lines than the hunk header says")
				}
				oldCount--
			case '+':
				if newCount == 0 {
					return p.errorf("more added lines than the hunk header says")
				}
				newCount--
				f.Added = append(f.Added, Line{Num: num, Text: text})
				f.AddedBytes += int64(len(text)) + 1
				newSide = append(newSide, text)
				num++
			default:
				return p.errorf("a line in a hunk that is not context, added or removed")
			}
			prev = kind
		}
		nextNew = num
	}
	if hunks == 0 {
		return p.errorf(`"---" and "+++" lines without a hunk`)
	}
	if f.OldMode == 0 {
		f.Size = f.AddedBytes
	}
	// A symlink's blob is its target with no newline after it, so the patch
	// holds it all when one hunk covers the new side from line 1 to a
	// no-newline marker.
	if f.NewMode == ModeSymlink && hunks == 1 && wholeNew && newEnded {
		f.Target = string(bytes.Join(newSide, []byte("\n")))
		f.TargetKnown = true
	}
	return nil
}

// finish completes a section with no hunks: a mode change, or an empty
// file created or deleted.
func (f *FilePatch) finish() {
	if f.OldMode == 0 {
		f.Size = 0
	}
}

// hunkHeader reads "@@ -a[,b] +c[,d] @@[ text]".
func hunkHeader(line []byte) (oldCount, newStart, newCount int, err error) {
	rest := line[len("@@ "):]
	end := bytes.Index(rest, []byte(" @@"))
	if end < 0 {
		return 0, 0, 0, errors.New(`no closing "@@"`)
	}
	if tail := rest[end+3:]; len(tail) > 0 && tail[0] != ' ' {
		return 0, 0, 0, errors.New(`text right after "@@"`)
	}
	old, nw, ok := bytes.Cut(rest[:end], []byte(" "))
	if !ok || len(old) < 2 || old[0] != '-' || len(nw) < 2 || nw[0] != '+' {
		return 0, 0, 0, errors.New("not two ranges")
	}
	_, oldCount, err = hunkRange(old[1:])
	if err != nil {
		return 0, 0, 0, err
	}
	newStart, newCount, err = hunkRange(nw[1:])
	return oldCount, newStart, newCount, err
}

func hunkRange(r []byte) (start, count int, err error) {
	s, c, hasCount := bytes.Cut(r, []byte(","))
	start, err = count64(s)
	if err != nil {
		return 0, 0, err
	}
	count = 1
	if hasCount {
		if count, err = count64(c); err != nil {
			return 0, 0, err
		}
	}
	if count > 0 && start == 0 {
		return 0, 0, errors.New("a range with lines starting at line 0")
	}
	return start, count, nil
}

// count64 parses a decimal number no greater than maxCount.
func count64(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 13 {
		return 0, errors.New("not a number")
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
		n = n*10 + int(c-'0')
	}
	if n > maxCount {
		return 0, errors.New("a number too large")
	}
	return n, nil
}
