package contentcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/rs/zerolog"
	"github.com/spf13/viper"
	"github.com/zricethezav/gitleaks/v8/config"
	"github.com/zricethezav/gitleaks/v8/detect"
	"github.com/zricethezav/gitleaks/v8/logging"
	gitleaksreport "github.com/zricethezav/gitleaks/v8/report"
)

// Checker validates bundle content. It holds one gitleaks detector, built
// once. Its DetectContext only reads the detector (the rules, their
// compiled regexps, the keyword trie) and makes its own decoder for each
// call, so one detector serves concurrent checks; what is not safe to
// share — AddFinding's list, DetectSource — is never called.
type Checker struct {
	det *detect.Detector
}

// New builds a Checker.
func New(cfg Config) (*Checker, error) {
	depth := cfg.DecodeDepth
	if depth == 0 {
		depth = DefaultDecodeDepth
	}
	if depth < 0 || depth > MaxDecodeDepth {
		return nil, fmt.Errorf("%w: decode depth %d: must be between 1 and %d", errdefs.ErrInvalidArgument, depth, MaxDecodeDepth)
	}
	return newChecker(depth)
}

// newChecker allows any depth, 0 (no decoding) included, for benchmarks.
func newChecker(depth int) (*Checker, error) {
	cfg, err := gitleaksConfig()
	if err != nil {
		return nil, err
	}
	d := detect.NewDetector(cfg)
	d.MaxDecodeDepth = depth
	// The job wrote the content: a "gitleaks:allow" beside a secret is
	// the adversary asking to be let through.
	d.IgnoreGitleaksAllow = true
	// Sizes are bounded here (fragments of fragmentBytes); a size limit
	// in the detector would skip content instead.
	d.MaxTargetMegaBytes = 0
	return &Checker{det: d}, nil
}

// gitleaksConfig is the detector's default configuration (~220 rules),
// loaded once: its loading goes through viper and package globals, which
// are not safe to use concurrently.
var gitleaksConfig = sync.OnceValues(func() (config.Config, error) {
	// The detector logs what it decodes and the secrets it skips at
	// debug and trace level; nothing of a scan may reach a log.
	logging.Logger = zerolog.Nop()
	v := viper.New()
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(config.DefaultConfig)); err != nil {
		return config.Config{}, fmt.Errorf("contentcheck: gitleaks default config: %w", err)
	}
	var vc config.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		return config.Config{}, fmt.Errorf("contentcheck: gitleaks default config: %w", err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		return config.Config{}, fmt.Errorf("contentcheck: gitleaks default config: %w", err)
	}
	cfg.Path = ""
	cfg.Allowlists = authorProof(cfg.Allowlists)
	for id, rule := range cfg.Rules {
		rule.Allowlists = authorProof(rule.Allowlists)
		cfg.Rules[id] = rule
	}
	return cfg, nil
})

// authorProof keeps of allowlists only the checks the content's author
// cannot meet without changing the secret itself. Gone: every path check
// (the job chooses its paths: vendor/, lock files, image names), every
// commit check, every check on the line around the secret (the job can
// write anything beside it), and whole AND-allowlists that had a path
// (dropping the path would widen them). Kept: checks on the secret or the
// rule's match (placeholders such as "${VAR}", stop words), which filter
// out what is not a secret.
func authorProof(lists []*config.Allowlist) []*config.Allowlist {
	var out []*config.Allowlist
	for _, a := range lists {
		if a.RegexTarget == "line" {
			continue
		}
		if a.MatchCondition == config.AllowlistMatchAnd && (len(a.Paths) > 0 || len(a.Commits) > 0) {
			continue
		}
		if len(a.Regexes) == 0 && len(a.StopWords) == 0 {
			continue
		}
		// A fresh Allowlist: Validate compiles the checks it has, so the
		// old one's compiled path pattern does not come along.
		b := &config.Allowlist{
			Description:    a.Description,
			MatchCondition: a.MatchCondition,
			RegexTarget:    a.RegexTarget,
			Regexes:        a.Regexes,
			StopWords:      a.StopWords,
		}
		if err := b.Validate(); err != nil {
			continue
		}
		out = append(out, b)
	}
	return out
}

// Fragments handed to the detector are at most fragmentBytes (plus one
// line), and consecutive ones share overlapBytes, so a secret across a
// boundary (a PEM key is a few KiB) is still whole in one of them. A
// line longer than maxLineBytes is scanned in overlapping pieces.
const (
	fragmentBytes = 256 << 10
	overlapBytes  = 16 << 10
	maxLineBytes  = 64 << 10
)

// detect runs the detector on one fragment, and on what undecoded finds
// in it when decoding is on; found gets each finding with the 0-based
// line of the fragment it starts on.
func (c *Checker) detect(ctx context.Context, path, text string, found func(f gitleaksreport.Finding, line int)) error {
	for _, f := range c.det.DetectContext(ctx, detect.Fragment{Raw: text, FilePath: path}) {
		found(f, f.StartLine)
	}
	if c.det.MaxDecodeDepth > 0 {
		if extra, from := undecoded(text); extra != "" {
			for _, f := range c.det.DetectContext(ctx, detect.Fragment{Raw: extra, FilePath: path}) {
				if f.Secret == "" || f.StartLine < 0 || f.StartLine >= len(from) {
					continue // a rule on the path alone, reported above
				}
				s := from[f.StartLine]
				f.Tags = append(slices.Clone(f.Tags), "decoded:"+s.kind)
				found(f, s.line)
			}
		}
	}
	return ctxErr(ctx) // the detector stops quietly when ctx ends
}

// scanLines scans added lines in bounded fragments; found gets each
// finding with the line it starts on.
func (c *Checker) scanLines(ctx context.Context, path string, lines []Line, found func(gitleaksreport.Finding, Line)) error {
	lines = splitLong(lines)
	var b strings.Builder
	for i := 0; i < len(lines); {
		j, size := i, 0
		for j < len(lines) && size < fragmentBytes {
			size += len(lines[j].Text) + 1
			j++
		}
		b.Reset()
		b.Grow(size)
		for _, l := range lines[i:j] {
			b.Write(l.Text)
			b.WriteByte('\n')
		}
		chunk := lines[i:j]
		err := c.detect(ctx, path, b.String(), func(f gitleaksreport.Finding, at int) {
			if at >= 0 && at < len(chunk) {
				found(f, chunk[at])
			} else {
				found(f, Line{})
			}
		})
		if err != nil || j == len(lines) {
			return err
		}
		// Start the next fragment overlapBytes back, but move on by at
		// least one line.
		k, back := j, 0
		for k > i+1 && back < overlapBytes {
			k--
			back += len(lines[k].Text) + 1
		}
		i = k
	}
	return nil
}

// splitLong cuts lines longer than maxLineBytes into pieces that overlap
// by overlapBytes, each keeping the line's number.
func splitLong(lines []Line) []Line {
	long := false
	for _, l := range lines {
		if len(l.Text) > maxLineBytes {
			long = true
			break
		}
	}
	if !long {
		return lines
	}
	var out []Line
	for _, l := range lines {
		t := l.Text
		for len(t) > maxLineBytes {
			out = append(out, Line{Num: l.Num, Text: t[:maxLineBytes]})
			t = t[maxLineBytes-overlapBytes:]
		}
		out = append(out, Line{Num: l.Num, Text: t})
	}
	return out
}

// scanStream scans what r yields, at most limit bytes, in bounded
// fragments that overlap; found gets each finding with its 1-based line.
// It returns whether r held more than limit.
func (c *Checker) scanStream(ctx context.Context, path string, r io.Reader, limit int64, found func(gitleaksreport.Finding, int)) (more bool, err error) {
	r = truncation{r}
	buf := make([]byte, 0, fragmentBytes+overlapBytes)
	line := 1 // the line buf starts on
	left := limit
	for {
		want := min(int64(cap(buf)-len(buf)), left)
		n, rerr := io.ReadFull(r, buf[len(buf):len(buf)+int(want)])
		buf = buf[:len(buf)+n]
		left -= int64(n)
		eof := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !eof {
			return false, rerr
		}
		if left == 0 && !eof {
			var one [1]byte
			m, perr := io.ReadFull(r, one[:])
			if perr != nil && perr != io.EOF {
				return false, perr
			}
			more, eof = m > 0, true
		}
		start := line
		if err := c.detect(ctx, path, string(buf), func(f gitleaksreport.Finding, at int) { found(f, start+at) }); err != nil {
			return false, err
		}
		if eof {
			return more, nil
		}
		// Keep the last overlapBytes, from a line start where there is one.
		cut := len(buf) - overlapBytes
		if i := bytes.IndexByte(buf[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		line += bytes.Count(buf[:cut], []byte("\n"))
		buf = buf[:copy(buf, buf[cut:])]
	}
}

// truncation keeps a source's io.ErrUnexpectedEOF (zlib's word for a
// stream cut short) apart from io.ReadFull's.
type truncation struct{ r io.Reader }

var errTruncated = errors.New("the content ends early")

func (t truncation) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = errTruncated
	}
	return n, err
}

// scanPatch scans the new content of every file of the patch, and the
// new paths themselves (a token can be a file name).
func (c *Checker) scanPatch(ctx context.Context, pol Policy, patch *Patch, r *report) error {
	var names []Line
	for i := range patch.Files {
		fp := &patch.Files[i]
		if fp.NewPath == "" || fp.NewMode == ModeGitlink {
			continue
		}
		names = append(names, Line{Num: i, Text: []byte(fp.NewPath)})
		if fp.Size > pol.MaxFileBytes || fp.AddedBytes > pol.MaxFileBytes {
			continue // refused as too large (fileRules), and not scanned
		}
		p := fp.NewPath
		secret := func(f gitleaksreport.Finding, line int) {
			r.add(secretFinding(f, p, line, ""))
		}
		switch {
		case fp.bin != nil:
			// Line numbers mean something in a literal, not in what a
			// delta inserts.
			lines := !fp.bin.delta
			_, err := c.scanStream(ctx, p, fp.bin.content(), pol.MaxFileBytes, func(f gitleaksreport.Finding, line int) {
				if !lines {
					line = 0
				}
				secret(f, line)
			})
			if err := ctxErr(ctx); err != nil {
				return err
			}
			if err != nil {
				r.add(Finding{Rule: RulePatchMalformed, Path: p, Message: "binary data that does not decode: " + err.Error()})
			}
		case len(fp.Added) > 0:
			if err := c.scanLines(ctx, p, fp.Added, func(f gitleaksreport.Finding, l Line) {
				secret(f, l.Num)
			}); err != nil {
				return err
			}
		default:
			// No content: the detector still runs its rules on the path
			// alone (a .p12 file).
			if err := c.detect(ctx, p, "", func(f gitleaksreport.Finding, _ int) { secret(f, 0) }); err != nil {
				return err
			}
		}
	}
	return c.scanLines(ctx, "", names, func(f gitleaksreport.Finding, l Line) {
		r.add(secretFinding(f, patch.Files[l.Num].NewPath, 0, " (in the file's name)"))
	})
}

// scanOut scans one /out file, its name, and what it unpacks to
// (archive.go), and checks its size.
func (c *Checker) scanOut(ctx context.Context, pol Policy, o OutFile, r *report) error {
	if o.Content == nil {
		return errNilContent
	}
	p := "/out/" + o.Name
	u := &unpacker{c: c, r: r, budget: pol.MaxFileBytes, left: pol.MaxFileBytes}
	// A token can be a file's name.
	if err := u.name(ctx, p, o.Name, " (in the file's name)"); err != nil {
		return err
	}
	tooLarge := Finding{Rule: RuleFileTooLarge, Path: p,
		Message: fmt.Sprintf("more than the %d bytes allowed (not scanned past them)", pol.MaxFileBytes)}
	if o.Size > pol.MaxFileBytes {
		tooLarge.Message = fmt.Sprintf("%d bytes, more than the %d allowed (not scanned)", o.Size, pol.MaxFileBytes)
		r.add(tooLarge)
		return nil
	}
	more, err := u.scan(ctx, p, sourceReader{o.Content}, pol.MaxFileBytes, 0)
	if un := (*unscannable)(nil); errors.As(err, &un) {
		r.add(Finding{Rule: RuleArchiveUnscannable, Path: p, Message: un.reason + "; what it holds was not scanned"})
		err = nil
	}
	if err != nil {
		if cerr := ctxErr(ctx); cerr != nil {
			return cerr
		}
		return fmt.Errorf("contentcheck: read %s: %w", p, err)
	}
	if more {
		r.add(tooLarge)
	}
	return nil
}

// secretFinding turns a detector finding into ours, keeping nothing of
// the secret but its redaction.
func secretFinding(f gitleaksreport.Finding, path string, line int, where string) Finding {
	if f.Secret == "" {
		line = 0 // a rule on the path alone ("file detected")
	}
	msg := f.Description + where
	for _, t := range f.Tags {
		if enc, ok := strings.CutPrefix(t, "decoded:"); ok {
			msg += " (found after decoding " + enc + ")"
		}
	}
	return Finding{Rule: RuleSecretPrefix + f.RuleID, Path: path, Line: line, Message: msg, Redacted: redact(f.Secret)}
}

// redact stands for a secret: its first four characters and its length
// when it has at least 16 bytes and those four are printable ASCII, stars
// and its length otherwise.
func redact(s string) string {
	if s == "" {
		return ""
	}
	if len(s) >= 16 {
		head := s[:4]
		printable := true
		for i := 0; i < len(head); i++ {
			if head[i] < 0x21 || head[i] > 0x7e {
				printable = false
			}
		}
		if printable {
			return fmt.Sprintf("%s…(%d bytes)", head, len(s))
		}
	}
	return fmt.Sprintf("****…(%d bytes)", len(s))
}
