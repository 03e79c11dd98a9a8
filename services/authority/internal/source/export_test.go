package source

import (
	"context"
	"strings"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// SetMaxHistoryBytes lowers the history size bound, so a test can cross it
// with a small repository.
func SetMaxHistoryBytes(s *Source, n int64) { s.maxHistory = n }

// ResolveWithGit is what Resolve did before it ran in-process (git fetch,
// two rev-parses, an update-ref), kept as BenchmarkResolve's baseline.
func (s *Source) ResolveWithGit(ctx context.Context, repo policy.Repository, rev string) (string, error) {
	dir, unlock, err := s.open(ctx, repo)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := s.fetch(ctx, repo, dir); err != nil {
		return "", err
	}
	commit, err := s.git(ctx, repo, dir, nil, nil, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		return "", err
	}
	c := strings.TrimSpace(string(commit))
	if _, err := s.git(ctx, repo, dir, nil, nil, "rev-parse", "--verify", "--quiet", "--end-of-options", c+"^{tree}"); err != nil {
		return "", err
	}
	if _, err := s.git(ctx, repo, dir, nil, nil, "update-ref", "refs/airlock/keep/"+c, c); err != nil {
		return "", err
	}
	return c, nil
}
