package contentcheck

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Defaults for a Policy's zero fields.
const (
	DefaultMaxFileBytes      = 10 << 20
	DefaultMaxPathBytes      = 4096
	DefaultMaxComponentBytes = 255
)

// defaultProtected are protected for every target: what runs with the
// repository's CI secrets, who must review, and the secret scanner's own
// configuration.
var defaultProtected = []string{".github/workflows/**", "CODEOWNERS", ".gitleaks*"}

// Policy is what a tenant's policy says about content for one target. The
// authority owns it; the publisher receives it with the approval and
// records its Digest on the deployment.
//
// A glob is matched against a path's components after the normalisation
// used for case collisions (case-folded, with the code points HFS+ ignores
// removed), so ".GitHub/workflows/x" is protected as ".github/workflows/x"
// is. A glob without "/" matches the last component in any directory
// ("CODEOWNERS"); one with "/" is anchored at the root. "*" and "?" and
// [classes] match within a component (path.Match), "**" alone as a
// component matches any number of components.
type Policy struct {
	// Protected lists globs protected beyond the defaults
	// (".github/workflows/**", "CODEOWNERS", ".gitleaks*"): a patch that
	// creates, changes or deletes a path one matches is refused unless
	// AllowProtected matches the path too.
	Protected []string `json:"protected"`
	// AllowProtected lists globs of protected paths this target may change.
	AllowProtected []string `json:"allow_protected"`
	// MaxFileBytes caps a file's size, in the result and in /out (0:
	// DefaultMaxFileBytes). A file over it is refused and not scanned for
	// secrets; an /out file of unknown size is read no further than it.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// AllowBinary lets the patch hold binary files.
	AllowBinary bool `json:"allow_binary"`
	// MaxPathBytes and MaxComponentBytes cap a path and each of its
	// components (0: DefaultMaxPathBytes, DefaultMaxComponentBytes).
	MaxPathBytes      int `json:"max_path_bytes"`
	MaxComponentBytes int `json:"max_component_bytes"`
}

// effective is p with its defaults filled in and its lists sorted, the
// form checks read and Digest hashes.
func (p Policy) effective() Policy {
	e := p
	e.Protected = sortedSet(append(slices.Clone(defaultProtected), p.Protected...))
	e.AllowProtected = sortedSet(p.AllowProtected)
	e.MaxFileBytes = cmp.Or(e.MaxFileBytes, DefaultMaxFileBytes)
	e.MaxPathBytes = cmp.Or(e.MaxPathBytes, DefaultMaxPathBytes)
	e.MaxComponentBytes = cmp.Or(e.MaxComponentBytes, DefaultMaxComponentBytes)
	return e
}

func sortedSet(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	s = slices.Compact(s)
	if s == nil {
		s = []string{}
	}
	return s
}

// Validate checks the policy; its errors wrap errdefs.ErrInvalidArgument.
func (p Policy) Validate() error {
	invalid := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: policy.%s: %s", errdefs.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	if p.MaxFileBytes < 0 || p.MaxFileBytes > maxCount {
		return invalid("max_file_bytes", "must be between 0 (the default, %d) and %d", DefaultMaxFileBytes, maxCount)
	}
	if p.MaxPathBytes < 0 || p.MaxPathBytes > 1<<20 {
		return invalid("max_path_bytes", "must be between 0 (the default, %d) and %d", DefaultMaxPathBytes, 1<<20)
	}
	if p.MaxComponentBytes < 0 || p.MaxComponentBytes > 1<<20 {
		return invalid("max_component_bytes", "must be between 0 (the default, %d) and %d", DefaultMaxComponentBytes, 1<<20)
	}
	for _, l := range []struct {
		field string
		globs []string
	}{{"protected", p.Protected}, {"allow_protected", p.AllowProtected}} {
		for i, g := range l.globs {
			if err := validGlob(g); err != nil {
				return invalid(fmt.Sprintf("%s[%d]", l.field, i), "%v", err)
			}
		}
	}
	return nil
}

func validGlob(g string) error {
	if g == "" {
		return fmt.Errorf("an empty glob")
	}
	if strings.HasPrefix(g, "/") {
		return fmt.Errorf("%q: globs are relative to the repository root, without a leading /", g)
	}
	for _, c := range strings.Split(g, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			return fmt.Errorf("%q: an empty, . or .. component", g)
		case c != "**" && strings.Contains(c, "**"):
			return fmt.Errorf("%q: ** must be a whole component", g)
		}
		if _, err := path.Match(c, ""); err != nil {
			return fmt.Errorf("%q: %v", g, err)
		}
	}
	return nil
}

// policyEncodingVersion names the canonical encoding Digest hashes; it
// changes whenever that encoding (or the defaults it includes) does.
const policyEncodingVersion = "airlock.contentcheck.policy.v1"

// Digest is "sha256:<hex>" of the policy's canonical encoding: its
// effective form (defaults filled in, the default protected globs
// included, lists sorted and without repeats) as JSON under a version, so
// two policies that check the same way have the same digest.
func (p Policy) Digest() string {
	b, err := json.Marshal(struct {
		Version string `json:"version"`
		Policy
	}{policyEncodingVersion, p.effective()})
	if err != nil {
		panic(err) // strings, ints and bools always encode
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// glob is a parsed Policy glob.
type glob struct {
	anchored bool     // holds a "/": matched from the root
	comps    []string // normalised components
}

func parseGlobs(gs []string, norm func(string) string) []glob {
	out := make([]glob, 0, len(gs))
	for _, g := range gs {
		var comps []string
		for _, c := range strings.Split(g, "/") {
			if c != "**" {
				c = norm(c)
			}
			comps = append(comps, c)
		}
		out = append(out, glob{anchored: strings.Contains(g, "/"), comps: comps})
	}
	return out
}

// match reports whether the normalised components of a path match.
func (g glob) match(comps []string) bool {
	if !g.anchored {
		return len(comps) > 0 && matchComp(g.comps[0], comps[len(comps)-1])
	}
	return matchComps(g.comps, comps)
}

// ancestorOf reports whether something beneath the path could match:
// a symlink there would let the matched paths be reached through it.
func (g glob) ancestorOf(comps []string) bool {
	if !g.anchored {
		return false
	}
	pat := g.comps
	for _, c := range comps {
		if pat[0] == "**" {
			return true
		}
		if len(pat) == 1 || !matchComp(pat[0], c) {
			return false
		}
		pat = pat[1:]
	}
	return true
}

// matchComps matches pattern components against path components. It
// fills a table instead of recursing on "**", so a glob with many of them
// costs len(pat)*len(comps) component matches on any path.
func matchComps(pat, comps []string) bool {
	// next[j] says whether pat[i+1:] matches comps[j:]; cur is for pat[i:].
	next := make([]bool, len(comps)+1)
	next[len(comps)] = true
	cur := make([]bool, len(comps)+1)
	for i := len(pat) - 1; i >= 0; i-- {
		for j := len(comps); j >= 0; j-- {
			switch {
			case pat[i] == "**":
				cur[j] = next[j] || j < len(comps) && cur[j+1]
			case j < len(comps):
				cur[j] = next[j+1] && matchComp(pat[i], comps[j])
			default:
				cur[j] = false
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

func matchComp(pat, c string) bool {
	ok, _ := path.Match(pat, c) // patterns were checked by Validate
	return ok
}

func anyMatch(gs []glob, comps []string) bool {
	for _, g := range gs {
		if g.match(comps) {
			return true
		}
	}
	return false
}
