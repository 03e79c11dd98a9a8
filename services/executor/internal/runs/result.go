package runs

import (
	"os"
	"path/filepath"
	"slices"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/provenance"
)

// bundleMeta is result.json inside a bundle.
type bundleMeta struct {
	JobID           string   `json:"job_id"`
	Tenant          string   `json:"tenant"`
	Repository      string   `json:"repository"`
	Commit          string   `json:"commit"`
	GrantDigest     string   `json:"grant_digest"`
	Command         []string `json:"command"`
	Result          *Result  `json:"result"`
	StdoutTruncated bool     `json:"stdout_truncated"`
	StderrTruncated bool     `json:"stderr_truncated"`
	SkippedOut      []string `json:"skipped_out,omitempty"`
	// Execs are a session's execs, first to last, each with its output's
	// digest and end.
	Execs []Exec `json:"execs,omitempty"`
	// FileWrites are the files a session's client uploaded, in order,
	// each with how many execs had started before it.
	FileWrites []FileWrite `json:"file_writes,omitempty"`
}

// writeBundle writes the run's bundle, provenance and review patch;
// exported (see export.go) bounds /out on top of the patch's files.
func (m *Manager) writeBundle(e *entry, result *Result, patch []byte, files []bundle.FileChange, outDir string, exported *bundle.Tally) error {
	// The grant in force at the end: the one the run's last limits and
	// network policy came from.
	m.mu.Lock()
	run := e.run
	execs := e.execRecords()
	writes := slices.Clone(e.writes)
	m.mu.Unlock()
	g := run.Grant
	_, outCut := e.stdout.state()
	_, errCut := e.stderr.state()
	dir := m.runDir(e.run.JobID)
	meta := bundleMeta{
		JobID: g.JobID, Tenant: g.Tenant, Repository: g.Repository, Commit: g.Commit,
		GrantDigest: g.Digest, Command: g.Command, Result: result,
		StdoutTruncated: outCut, StderrTruncated: errCut, Execs: execs, FileWrites: writes,
	}
	// The whole signed grant (body, signature, key id), so whoever holds
	// the bundle can check the authority signed what it says.
	in := bundle.Input{
		Meta: &meta, Grant: run.SignedGrant, Files: files, Patch: patch,
		StdoutPath: filepath.Join(dir, "stdout.log"), StderrPath: filepath.Join(dir, "stderr.log"),
		OutDir: outDir, Exported: exported,
	}
	if _, err := os.Stat(filepath.Join(dir, bundle.EgressFile)); err == nil {
		in.EgressPath = filepath.Join(dir, bundle.EgressFile)
	}
	res, err := bundle.Write(filepath.Join(dir, "bundle.tar"), in)
	if err != nil {
		return err
	}
	result.BundleDigest, result.BundleSize = res.Digest, res.Size
	env, err := m.cfg.Sign("bundle.tar", res.Digest, provenance.Run{
		JobID: g.JobID, Tenant: g.Tenant, Requester: g.Requester, Repository: g.Repository,
		BaseCommit: g.Commit, GrantDigest: g.Digest, Executor: m.cfg.Executor,
		RuntimeClass: string(result.Class), RuntimeVersion: result.RuntimeVersion, TemplateVersion: result.TemplateVersion,
		Image: result.Image, Reason: string(result.Reason), ExitCode: result.ExitCode, StartedOn: run.StartedAt, FinishedOn: m.cfg.Now(),
	})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, "provenance.json"), env, 0o600, atomicfile.Durable); err != nil {
		return err
	}
	review := patch
	if int64(len(review)) > m.cfg.ReviewPatchLimit {
		review = review[:m.cfg.ReviewPatchLimit]
	}
	// Derived from the bundle, which is synced: no need to sync it again.
	return atomicfile.Write(filepath.Join(dir, "review.patch"), review, 0o600, atomicfile.Fast)
}
