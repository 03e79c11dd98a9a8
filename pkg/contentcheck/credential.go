package contentcheck

import (
	"context"
	"math"
	"regexp"
	"strings"
	"unicode"
)

// CredentialValue says what kind of credential v looks like ("" when it
// looks like none), for a value that should never hold one: a job's
// environment variable. It is stricter than the scan of a patch, where a
// long random string may be a test fixture: beyond every gitleaks rule
// (with the same decoding), any PEM block, a URL with a password, the
// common token prefixes and any long random string count. The answer
// never quotes v.
func (c *Checker) CredentialValue(ctx context.Context, v string) (string, error) {
	if what := credentialShape(v); what != "" {
		return what, nil
	}
	found, err := c.Secrets(ctx, "value", v)
	if err != nil || len(found) == 0 {
		return "", err
	}
	return "a secret of the kind " + strings.TrimPrefix(found[0].Rule, RuleSecretPrefix), nil
}

var (
	awsKeyIDShape = regexp.MustCompile(`\b(AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}\b`)
	jwtShape      = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.`)
	urlPassword   = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:[^/\s@]+@`)
	tokenPattern  = []struct {
		re   *regexp.Regexp
		what string
	}{
		{regexp.MustCompile(`\b(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}`), "a GitHub token"},
		{regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{20,}`), "a GitHub token"},
		{regexp.MustCompile(`\bglpat-[A-Za-z0-9_-]{16,}`), "a GitLab token"},
		{regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`), "a Slack token"},
		{regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{16,}`), "an API secret key"},
		{regexp.MustCompile(`\b(sk|rk)_live_[A-Za-z0-9]{16,}`), "a Stripe key"},
		{regexp.MustCompile(`\bAIza[A-Za-z0-9_-]{30,}`), "a Google API key"},
		{regexp.MustCompile(`\bnpm_[A-Za-z0-9]{30,}`), "an npm token"},
	}
)

// credentialShape is the checks of CredentialValue beyond gitleaks.
func credentialShape(v string) string {
	switch {
	case strings.Contains(v, "-----BEGIN"):
		return "a PEM block"
	case awsKeyIDShape.MatchString(v):
		return "an AWS access key id"
	case jwtShape.MatchString(v):
		return "a JSON web token"
	case urlPassword.MatchString(v):
		return "a URL with a password"
	}
	for _, p := range tokenPattern {
		if p.re.MatchString(v) {
			return p.what
		}
	}
	for _, word := range strings.FieldsFunc(v, func(r rune) bool { return unicode.IsSpace(r) || r == ',' || r == ';' || r == '"' || r == '\'' }) {
		if highEntropy(word) {
			return "a long random string"
		}
	}
	return ""
}

// highEntropy reports a long run of base64-alphabet characters mixing
// upper case, lower case and digits with the character spread of random
// data. Hex strings (commit SHAs, digests) and UUIDs lack upper case and
// pass; real words and paths lack the spread.
func highEntropy(s string) bool {
	if len(s) < 32 {
		return false
	}
	var upper, lower, digit bool
	counts := map[rune]int{}
	for _, r := range s {
		switch {
		case 'A' <= r && r <= 'Z':
			upper = true
		case 'a' <= r && r <= 'z':
			lower = true
		case '0' <= r && r <= '9':
			digit = true
		case r == '+' || r == '/' || r == '=' || r == '_' || r == '-':
		default:
			return false
		}
		counts[r]++
	}
	if !upper || !lower || !digit {
		return false
	}
	var bits float64
	n := float64(len(s))
	for _, c := range counts {
		p := float64(c) / n
		bits -= p * math.Log2(p)
	}
	return bits >= 4.2
}
