package source

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/githistory"
	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

// MaxHistoryBytes bounds the history a job's .git gets beyond its base
// tree: the objects of its ancestor commits that the base tree does not
// hold, counted at their full (uncompressed) size, so the rule gives the
// same answer however the repository happens to be packed. A history
// above it is cut to half its depth, and again, until it fits; the base
// commit alone (depth 1, sent with the tree) always does.
const MaxHistoryBytes = 256 << 20

// History is the part of a job's git history the tree archive does not
// carry: the base commit's ancestors within Depth, with their trees and
// blobs.
type History struct {
	// Depth is the depth the history was taken at: the one asked for, or
	// less where MaxHistoryBytes cut it.
	Depth int
	// Commits counts the ancestors; Bytes is their objects' full size.
	Commits int
	Bytes   int64

	gitDir string
	// objects are rev-list --objects lines (an id, and a path for trees
	// and blobs, which pack-objects uses to find good deltas).
	objects []string
}

// PlanHistory chooses the history of commit that a job of a tenant whose
// policy says depth gets: the ancestors git clone --depth would take
// (package githistory), read from the tenant's own repository or mirror
// only, cut by MaxHistoryBytes.
func (s *Source) PlanHistory(ctx context.Context, repo policy.Repository, commit string, depth int) (History, error) {
	if !isFullSHA(commit) {
		return History{}, fmt.Errorf("%w: commit %q is not a full SHA", errdefs.ErrInvalidArgument, commit)
	}
	if depth < 1 || depth > policy.MaxGitHistoryDepth {
		return History{}, fmt.Errorf("%w: history depth %d: must be between 1 and %d", errdefs.ErrInvalidArgument, depth, policy.MaxGitHistoryDepth)
	}
	gitDir, err := s.commitDir(ctx, repo, commit)
	if err != nil {
		return History{}, err
	}
	// What the archive already carries is never sent twice.
	inTree, err := s.objectIDs(ctx, repo, gitDir, nil, "rev-list", "--objects", "--end-of-options", commit+"^{tree}")
	if err != nil {
		return History{}, err
	}
	base := map[string]bool{}
	for _, line := range inTree {
		base[objectID(line)] = true
	}
	for d := depth; ; d = max(1, d/2) {
		h, err := s.historyAt(ctx, repo, gitDir, commit, d, base)
		if err != nil {
			return History{}, err
		}
		if h.Bytes <= s.maxHistory || d == 1 {
			return h, nil
		}
		s.logger.Warn("git history cut: too large for a job's .git", "tenant", repo.Tenant, "repository", repo.Name, "commit", commit,
			"depth", d, "bytes", h.Bytes, "max_bytes", s.maxHistory)
	}
}

func (s *Source) historyAt(ctx context.Context, repo policy.Repository, gitDir, commit string, depth int, base map[string]bool) (History, error) {
	h := History{Depth: depth, gitDir: gitDir}
	if depth == 1 {
		return h, nil
	}
	g, err := githistory.WalkBatch(ctx, s.command(ctx, repo, gitDir, nil, "cat-file", "--batch"), commit, depth)
	if err != nil {
		return History{}, fmt.Errorf("source: history of %s in repository %q: %w", commit, repo.Name, err)
	}
	ancestors := g.Ancestors()
	h.Commits = len(ancestors)
	if len(ancestors) == 0 {
		return h, nil
	}
	// --no-walk: the ancestors' own trees, not their parents beyond.
	lines, err := s.objectIDs(ctx, repo, gitDir, strings.NewReader(strings.Join(ancestors, "\n")+"\n"), "rev-list", "--objects", "--no-walk", "--stdin")
	if err != nil {
		return History{}, err
	}
	var ids bytes.Buffer
	for _, line := range lines {
		if !base[objectID(line)] {
			h.objects = append(h.objects, line)
			ids.WriteString(objectID(line) + "\n")
		}
	}
	out, err := s.gitInput(ctx, repo, gitDir, nil, &ids, nil, "cat-file", "--batch-check=%(objectsize)")
	if err != nil {
		return History{}, err
	}
	for line := range strings.Lines(string(out)) {
		n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil {
			return History{}, fmt.Errorf("source: cat-file printed %q", line)
		}
		h.Bytes += n
	}
	return h, nil
}

// WritePack writes h's objects to w as one self-contained git pack (no
// deltas against objects outside it): what the executor indexes and checks.
func (s *Source) WritePack(ctx context.Context, repo policy.Repository, h History, w io.Writer) error {
	var in bytes.Buffer
	for _, line := range h.objects {
		in.WriteString(line + "\n")
	}
	_, err := s.gitInput(ctx, repo, h.gitDir, nil, &in, w, "pack-objects", "--stdout", "--quiet")
	return err
}

// objectIDs runs a rev-list and returns its lines.
func (s *Source) objectIDs(ctx context.Context, repo policy.Repository, gitDir string, stdin io.Reader, args ...string) ([]string, error) {
	var out bytes.Buffer
	if _, err := s.gitInput(ctx, repo, gitDir, nil, stdin, &out, args...); err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines, sc.Err()
}

func objectID(line string) string {
	id, _, _ := strings.Cut(line, " ")
	return id
}
