package contentcheck

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// TreeEntry is one entry of the tree the patch applies to (`git ls-tree
// -r` at the base). Target is a symlink's target; a symlink given without
// one is taken to lead anywhere.
type TreeEntry struct {
	Path   string
	Mode   uint32
	Target string
}

// hfsIgnored are the code points HFS+ drops when it compares names, so
// ".g\u200cit" is ".git" on a Mac (git's utf8.c next_hfs_char).
func hfsIgnored(r rune) bool {
	switch {
	case r >= 0x200c && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x206a && r <= 0x206f, r == 0xfeff:
		return true
	}
	return false
}

// folder normalises path components for comparison the way the most
// forgiving file system a checkout may land on would: HFS+-ignored code
// points removed, decomposed (HFS+ stores NFD), Unicode case-folded
// (NTFS, APFS and HFS+ ignore case). A Caser is not safe for concurrent
// use, so each check makes its own.
type folder struct{ fold cases.Caser }

func newFolder() *folder { return &folder{fold: cases.Fold()} }

func (f *folder) component(c string) string {
	if strings.IndexFunc(c, hfsIgnored) >= 0 {
		c = strings.Map(func(r rune) rune {
			if hfsIgnored(r) {
				return -1
			}
			return r
		}, c)
	}
	if !utf8.ValidString(c) {
		return c // invalid UTF-8 compares as bytes
	}
	return f.fold.String(norm.NFD.String(c))
}

// ntfsName is a normalised component as NTFS resolves it: trailing dots
// and spaces dropped, and an alternate data stream (":stream",
// "::$INDEX_ALLOCATION") cut off.
func ntfsName(n string) string {
	if i := strings.IndexByte(n, ':'); i >= 0 {
		n = n[:i]
	}
	return strings.TrimRight(n, ". ")
}

// isDotGit reports whether a component is, or would be on NTFS or HFS+,
// the repository's .git (git's is_ntfs_dotgit and is_hfs_dotgit, and
// their 8.3 short name GIT~1).
func (f *folder) isDotGit(c string) bool {
	n := ntfsName(f.component(c))
	return n == ".git" || n == "git~1"
}

// gitMetaFiles are the dotfiles git opens with O_NOFOLLOW and refuses as
// symlinks, with the 8.3 short-name prefixes NTFS may give them (the
// name's first six letters, or git's fixed hash-based fallback).
var gitMetaFiles = []struct{ name, short, hashed string }{
	{".gitmodules", "gitmod", "gi7eba"},
	{".gitattributes", "gitatt", "gi7d29"},
	{".gitignore", "gitign", "gi250a"},
	{".mailmap", "mailma", "maba30"},
}

var shortNameSuffix = regexp.MustCompile(`^~[1-9]$`)

// gitMeta returns which of gitMetaFiles a component is, on any file
// system, or "".
func (f *folder) gitMeta(c string) string {
	n := ntfsName(f.component(c))
	for _, m := range gitMetaFiles {
		if n == m.name {
			return m.name
		}
		for _, prefix := range []string{m.short, m.hashed} {
			if rest, ok := strings.CutPrefix(n, prefix); ok && shortNameSuffix.MatchString(rest) {
				return m.name
			}
		}
	}
	return ""
}

// pathChecks holds what the path rules read about one check.
type pathChecks struct {
	pol        Policy // effective
	f          *folder
	r          *report
	prot, allw []glob // Protected and AllowProtected
	// The symlinks before and after the patch, by exact path, with their
	// targets (nil where not known).
	baseLinks, resultLinks map[string]*string
}

// checkPaths runs every rule about paths, modes and symlinks.
func checkPaths(pol Policy, patch *Patch, base []TreeEntry, r *report) {
	c := &pathChecks{pol: pol, f: newFolder(), r: r}
	c.prot = parseGlobs(pol.Protected, c.f.component)
	c.allw = parseGlobs(pol.AllowProtected, c.f.component)

	result := map[string]TreeEntry{}
	c.baseLinks = map[string]*string{}
	for _, e := range base {
		result[e.Path] = e
		if e.Mode == ModeSymlink {
			c.baseLinks[e.Path] = targetOf(e)
		}
	}
	touched := map[string]bool{} // paths the patch leaves in the result
	for i := range patch.Files {
		fp := &patch.Files[i]
		if fp.OldPath != "" {
			if fp.OldMode == ModeSymlink {
				if _, ok := c.baseLinks[fp.OldPath]; !ok {
					c.baseLinks[fp.OldPath] = nil
				}
			}
			delete(result, fp.OldPath)
		}
		if fp.NewPath != "" {
			e := TreeEntry{Path: fp.NewPath, Mode: fp.NewMode}
			if fp.TargetKnown {
				e.Target = fp.Target
			}
			result[fp.NewPath] = e
			touched[fp.NewPath] = true
		}
	}
	c.resultLinks = map[string]*string{}
	for p, e := range result {
		if e.Mode == ModeSymlink {
			c.resultLinks[p] = targetOf(e)
		}
	}

	for i := range patch.Files {
		fp := &patch.Files[i]
		if fp.NewPath != "" {
			c.pathRules(fp.NewPath, fp.NewMode)
		}
		if fp.OldPath != "" && fp.OldPath != fp.NewPath {
			c.pathRules(fp.OldPath, 0) // deleted: no rule about what it is
		}
		c.fileRules(fp)
	}
	c.collisions(result, touched)
}

func targetOf(e TreeEntry) *string {
	if e.Target == "" {
		return nil
	}
	t := e.Target
	return &t
}

// pathRules are git's verify_path and the protected-path rule, for one
// path on one side of the patch.
func (c *pathChecks) pathRules(p string, mode uint32) {
	add := func(rule, format string, args ...any) {
		c.r.add(Finding{Rule: rule, Path: p, Message: fmt.Sprintf(format, args...)})
	}
	if p == "" {
		add(RulePathEmpty, "an empty path")
		return
	}
	if p[0] == '/' || len(p) >= 2 && p[1] == ':' && (p[0]|0x20 >= 'a' && p[0]|0x20 <= 'z') {
		add(RulePathAbsolute, "an absolute path")
	}
	if strings.IndexByte(p, '\\') >= 0 {
		add(RulePathBackslash, "a backslash, which Windows reads as a directory separator")
	}
	if b, ok := firstControl(p); ok {
		add(RulePathControl, "a control character (0x%02x) in the path", b)
	}
	if len(p) > c.pol.MaxPathBytes {
		add(RulePathTooLong, "%d bytes, more than the %d allowed", len(p), c.pol.MaxPathBytes)
	}
	comps := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for _, comp := range comps {
		switch {
		case comp == "":
			add(RulePathEmpty, "an empty component (a doubled or trailing /)")
		case comp == "." || comp == "..":
			add(RulePathTraversal, "a %q component", comp)
		case c.f.isDotGit(comp):
			add(RulePathDotGit, "a component that is the repository's .git on some file system")
		}
		if len(comp) > c.pol.MaxComponentBytes {
			add(RulePathTooLong, "a component of %d bytes, more than the %d allowed", len(comp), c.pol.MaxComponentBytes)
		}
	}
	if mode == ModeSymlink {
		if m := c.f.gitMeta(comps[len(comps)-1]); m != "" {
			add(RuleSymlinkGitMeta, "%s as a symlink (git refuses it: it would read a file outside the repository)", m)
		}
	}
	norm := make([]string, len(comps))
	for i, comp := range comps {
		norm[i] = c.f.component(comp)
	}
	prot := anyMatch(c.prot, norm)
	if !prot && mode == ModeSymlink {
		for _, g := range c.prot {
			if g.ancestorOf(norm) {
				prot = true
				break
			}
		}
	}
	if prot && !anyMatch(c.allw, norm) {
		add(RulePathProtected, "a protected path this target's policy does not allow")
	}
}

// firstControl finds the first C0 control, DEL or C1 control in s, as a
// code point or as a lone byte that is not UTF-8 (a terminal may act on a
// raw 0x9b as on U+009B).
func firstControl(s string) (rune, bool) {
	for i, r := range s {
		if r == utf8.RuneError && s[i] >= 0x80 {
			r = rune(s[i])
		}
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f {
			return r, true
		}
	}
	return 0, false
}

// fileRules are the rules about one file's mode, size, kind and place.
func (c *pathChecks) fileRules(fp *FilePatch) {
	p := fp.NewPath
	if p == "" {
		p = fp.OldPath
	}
	add := func(rule string, line int, format string, args ...any) {
		c.r.add(Finding{Rule: rule, Path: p, Line: line, Message: fmt.Sprintf(format, args...)})
	}
	if top := strings.Split(p, "/"); len(top) == 1 && c.f.gitMeta(top[0]) == ".gitmodules" {
		c.gitmodules(fp, p)
	}
	// A deleted path is checked against the symlinks it was reached
	// through before the patch, a new one against those after it.
	links := c.resultLinks
	if fp.NewPath == "" {
		links = c.baseLinks
	}
	comps := strings.Split(p, "/")
	for i := 1; i < len(comps); i++ {
		if dir := strings.Join(comps[:i], "/"); hasKey(links, dir) {
			add(RuleBeneathSymlink, 0, "beneath %q, which is a symlink: writing here would write where it points", dir)
			break
		}
	}
	if fp.NewPath == "" {
		return
	}
	switch fp.NewMode {
	case ModeGitlink:
		add(RuleGitlink, 0, "a gitlink (submodule commit); submodules are refused")
		return
	case ModeSymlink:
		c.symlink(fp)
		return
	}
	size := fp.Size
	if fp.AddedBytes > size {
		size = fp.AddedBytes
	}
	if size > c.pol.MaxFileBytes {
		add(RuleFileTooLarge, 0, "%d bytes, more than the %d allowed", size, c.pol.MaxFileBytes)
	}
	if fp.Binary && !fp.HasContent() {
		add(RuleFileBinary, 0, "a binary file whose content the patch does not carry (made without --binary), so it cannot be checked")
	} else if fp.Binary && !c.pol.AllowBinary {
		add(RuleFileBinary, 0, "a binary file; this target's policy does not allow them")
	}
}

func hasKey(m map[string]*string, k string) bool { _, ok := m[k]; return ok }

// dashOption is a .gitmodules value that git or ssh would read as an
// option (CVE-2018-17456), or an update command ("!cmd").
var dashOption = regexp.MustCompile(`^\s*(url|path|update|branch)\s*=\s*["']?\s*([-!])`)

func (c *pathChecks) gitmodules(fp *FilePatch, p string) {
	for _, l := range fp.Added {
		if m := dashOption.FindSubmatch(l.Text); m != nil {
			what := "starts with '-', which git or ssh would read as an option"
			if m[2][0] == '!' {
				what = "starts with '!', a command git would run"
			}
			c.r.add(Finding{Rule: RuleGitmodules, Path: p, Line: l.Num,
				Message: fmt.Sprintf("changes .gitmodules (submodules are refused); a %s value %s", m[1], what)})
			return
		}
	}
	c.r.add(Finding{Rule: RuleGitmodules, Path: p, Message: "changes .gitmodules; submodules are refused"})
}

// maxHops bounds how many symlinks one resolution follows (Linux's
// MAXSYMLINKS is 40).
const maxHops = 40

// symlink checks where a new symlink leads, following the result's
// symlinks as the kernel would.
func (c *pathChecks) symlink(fp *FilePatch) {
	p := fp.NewPath
	add := func(rule, format string, args ...any) {
		c.r.add(Finding{Rule: rule, Path: p, Message: fmt.Sprintf(format, args...)})
	}
	if !fp.TargetKnown {
		add(RuleSymlinkEscapes, "a symlink whose whole target the patch does not carry, so where it leads cannot be checked")
		return
	}
	dir := strings.Split(p, "/")
	dir = dir[:len(dir)-1]
	rule, why := c.resolve(dir, fp.Target)
	if rule != "" {
		add(rule, "a symlink that %s", why)
	}
}

// resolve walks target from the directory dir inside the result tree, as
// the kernel would (a symlink on the way is replaced by where it leads
// before a following ".." applies), and says which rule, if any, where it
// leads breaks.
func (c *pathChecks) resolve(dir []string, target string) (rule, why string) {
	cur := slices.Clone(dir)
	var todo []string // components still to walk, in order
	push := func(t string) string {
		switch {
		case t == "":
			return "has an empty target"
		case t[0] == '/' || t[0] == '\\' || len(t) >= 2 && t[1] == ':':
			return "leads to an absolute path"
		case strings.IndexByte(t, '\\') >= 0:
			return "has a backslash in its target, which Windows reads as a directory separator"
		}
		if _, ok := firstControl(t); ok {
			return "has a control character in its target"
		}
		todo = append(strings.Split(t, "/"), todo...)
		return ""
	}
	if why := push(target); why != "" {
		return RuleSymlinkEscapes, why
	}
	for hops := 0; len(todo) > 0; {
		comp := todo[0]
		todo = todo[1:]
		switch {
		case comp == "" || comp == ".":
			continue
		case comp == "..":
			if len(cur) == 0 {
				return RuleSymlinkEscapes, "leads out of the repository"
			}
			cur = cur[:len(cur)-1]
			continue
		case c.f.isDotGit(comp):
			return RuleSymlinkIntoGit, "leads into .git"
		}
		cur = append(cur, comp)
		at := strings.Join(cur, "/")
		next, isLink := c.resultLinks[at]
		if !isLink {
			continue
		}
		if next == nil {
			return RuleSymlinkEscapes, fmt.Sprintf("passes through %q, a symlink whose target is not known", at)
		}
		if hops++; hops > maxHops {
			return RuleSymlinkEscapes, "passes through too many symlinks (a loop?)"
		}
		cur = cur[:len(cur)-1]
		if why := push(*next); why != "" {
			return RuleSymlinkEscapes, fmt.Sprintf("passes through %q, which %s", at, why)
		}
	}
	return "", ""
}

// collisions reports paths of the result that a case-insensitive (or
// Unicode-normalising) file system would take for one another, the
// directories on the way included, where the patch touches one of them.
func (c *pathChecks) collisions(result map[string]TreeEntry, touched map[string]bool) {
	// key -> the exact paths (and directories) with that key -> whether
	// the patch touches it or something beneath it.
	byKey := map[string]map[string]bool{}
	var kb strings.Builder
	for p := range result {
		t := touched[p]
		kb.Reset()
		start := 0
		for start <= len(p) {
			end := strings.IndexByte(p[start:], '/')
			if end < 0 {
				end = len(p)
			} else {
				end += start
			}
			if start > 0 {
				kb.WriteByte('/')
			}
			kb.WriteString(strings.TrimRight(c.f.component(p[start:end]), ". "))
			k := kb.String()
			m := byKey[k]
			if m == nil {
				m = map[string]bool{}
				byKey[k] = m
			}
			m[p[:end]] = m[p[:end]] || t
			start = end + 1
		}
	}
	for _, m := range byKey {
		if len(m) < 2 {
			continue
		}
		paths := slices.Sorted(maps.Keys(m))
		for _, p := range paths {
			if !m[p] {
				continue
			}
			other := paths[0]
			if other == p {
				other = paths[1]
			}
			c.r.add(Finding{Rule: RulePathCaseCollision, Path: p,
				Message: fmt.Sprintf("the same path as %q on a case-insensitive file system", other)})
		}
	}
}
