// Package contentcheck owns the validation of a bundle's content before
// anything of it is written to a repository: the patch's paths, modes and
// symlinks checked the way git itself refuses them (verify_path and
// more), the tenant's size, binary and protected-path policy, and secrets
// found by the gitleaks detector in every added line of the patch and
// every /out file. Each broken rule is a Finding; a secret is never in
// one, only a redaction of it. The publisher calls it between verifying a
// bundle and spending its approval (Check, or CheckOut for /out files met
// one at a time in a stream); Secrets scans one value alone, for checks
// such as the authority's of a job's environment. It imports no grpc or
// proto, so any Airlock package may use it.
//
// It also parses git patches (ParsePatch), strictly: a line it does not
// understand refuses the patch, since `git apply` might act on it.
package contentcheck

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/errdefs"
	gitleaksreport "github.com/zricethezav/gitleaks/v8/report"
)

// Rule ids. A secret's rule is RuleSecretPrefix + the gitleaks rule id
// ("secret.github-pat").
const (
	RulePatchMalformed    = "patch.malformed"
	RulePathDotGit        = "path.dotgit"
	RulePathTraversal     = "path.traversal"
	RulePathAbsolute      = "path.absolute"
	RulePathBackslash     = "path.backslash"
	RulePathControl       = "path.control"
	RulePathEmpty         = "path.empty"
	RulePathTooLong       = "path.too-long"
	RulePathCaseCollision = "path.case-collision"
	RulePathProtected     = "path.protected"
	RuleBeneathSymlink    = "path.beneath-symlink"
	RuleSymlinkEscapes    = "symlink.escapes"
	RuleSymlinkIntoGit    = "symlink.into-git"
	RuleSymlinkGitMeta    = "symlink.gitmeta"
	RuleGitlink           = "gitlink"
	RuleGitmodules        = "gitmodules"
	RuleFileTooLarge      = "file.too-large"
	RuleFileBinary        = "file.binary"
	RuleSecretPrefix      = "secret."
	RuleFindingsTruncated = "findings.truncated"
)

// Finding is one broken rule.
type Finding struct {
	Rule string
	// Path is the repository path, or "/out/NAME" for an /out file.
	Path string
	// Line is the 1-based line in the new file, 0 where the rule is not
	// about a line.
	Line    int
	Message string
	// Redacted stands for a secret: its first four characters when it is
	// long enough for that to give little away, and its length.
	Redacted string
}

// MaxFindings bounds how many findings one check returns; past it the
// last is a RuleFindingsTruncated finding.
const MaxFindings = 1000

// Config configures a Checker.
type Config struct {
	// DecodeDepth is how many rounds of base64, hex and percent decoding
	// the secret scan makes (0: DefaultDecodeDepth, at most MaxDecodeDepth).
	// Without decoding a base64-wrapped token passes unseen.
	DecodeDepth int
}

const (
	DefaultDecodeDepth = 2
	MaxDecodeDepth     = 8
)

// Input is one bundle's content.
type Input struct {
	// Patch is the bundle's patch.diff.
	Patch []byte
	// Base is the tree the patch applies to (optional). Without it, case
	// collisions with and writes beneath paths the patch does not name
	// are not seen.
	Base []TreeEntry
	// Files is the bundle's files.json (optional): the sizes of files
	// whose size the patch does not carry (a changed text file).
	Files []bundle.FileChange
	// Out are the /out files, read in order, each once.
	Out []OutFile
}

// OutFile is one /out file: its name below /out and its content.
type OutFile struct {
	Name    string
	Content io.Reader
	// Size is the content's length where it is known (a tar header's):
	// above the cap, the file is reported too large without being read.
	// Below it, it is not trusted: the content is read to its end.
	Size int64
}

// Check validates in under policy p. It returns every finding (none when
// the content may land), sorted by path, line and rule; an error only for
// an invalid policy (errdefs.ErrInvalidArgument), an /out file that could
// not be read, or ctx ending (its error). It is safe for concurrent use.
func (c *Checker) Check(ctx context.Context, p Policy, in Input) ([]Finding, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	pol := p.effective()
	r := newReport()
	patch, err := ParsePatch(in.Patch)
	if err != nil {
		r.add(Finding{Rule: RulePatchMalformed, Message: err.Error()})
	} else {
		applySizes(patch, in.Files)
		checkPaths(pol, patch, in.Base, r)
		if err := c.scanPatch(ctx, pol, patch, r); err != nil {
			return nil, err
		}
	}
	for _, o := range in.Out {
		if err := c.scanOut(ctx, pol, o, r); err != nil {
			return nil, err
		}
	}
	return r.list(), nil
}

// CheckOut checks one /out file alone, for a caller that streams a bundle
// and meets its /out files one at a time.
func (c *Checker) CheckOut(ctx context.Context, p Policy, o OutFile) ([]Finding, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	r := newReport()
	if err := c.scanOut(ctx, p.effective(), o, r); err != nil {
		return nil, err
	}
	return r.list(), nil
}

// Secrets scans one text alone (an environment value, a comment) with the
// same detector and decoding as Check, and no other rule; findings name
// it as path. The caller bounds its size.
func (c *Checker) Secrets(ctx context.Context, path, text string) ([]Finding, error) {
	r := newReport()
	if _, err := c.scanStream(ctx, path, strings.NewReader(text), int64(len(text)), func(f gitleaksreport.Finding, line int) {
		r.add(secretFinding(f, path, line, ""))
	}); err != nil {
		return nil, err
	}
	return r.list(), nil
}

// applySizes takes a file's size from files.json where the patch does
// not say it (or says less).
func applySizes(patch *Patch, files []bundle.FileChange) {
	sizes := map[string]int64{}
	for _, f := range files {
		if f.Status != bundle.FileDeleted {
			sizes[f.Path] = max(sizes[f.Path], f.Size)
		}
	}
	for i := range patch.Files {
		fp := &patch.Files[i]
		if s, ok := sizes[fp.NewPath]; ok && fp.NewPath != "" && s > fp.Size {
			fp.Size = s
		}
	}
}

// report collects findings once each, at most MaxFindings of them.
type report struct {
	findings  []Finding
	seen      map[Finding]bool
	truncated bool
}

func newReport() *report { return &report{seen: map[Finding]bool{}} }

func (r *report) add(f Finding) {
	if r.seen[f] {
		return
	}
	if len(r.findings) == MaxFindings {
		r.truncated = true
		return
	}
	r.seen[f] = true
	r.findings = append(r.findings, f)
}

func (r *report) list() []Finding {
	out := slices.Clone(r.findings)
	slices.SortFunc(out, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(a.Message, b.Message), cmp.Compare(a.Redacted, b.Redacted))
	})
	if r.truncated {
		out = append(out, Finding{Rule: RuleFindingsTruncated,
			Message: fmt.Sprintf("more than %d findings; the rest are not listed", MaxFindings)})
	}
	return out
}

// ctxErr is ctx's error once it has ended, for loops that stop on it.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("contentcheck: %w", err)
	}
	return nil
}

var errNilContent = fmt.Errorf("%w: an /out file without content", errdefs.ErrInvalidArgument)
