//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/grant"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestReviewShowsEveryFile is the hidden-change attack on review: a job
// writes one large binary, then many small files (and names a terminal
// would misread). approval show lists every one of them first, with the
// totals the bundle has; it marks where the patch is cut and which files'
// diffs it does not show; approval show --full streams the whole patch and
// file list from the bundle through the authority, byte for byte the
// bundle's, verified against the approval's digest; and a bundle altered
// on the executor's disk is never shown as the approved one.
func TestReviewShowsEveryFile(t *testing.T) {
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	const small = 1500
	script := fmt.Sprintf(`set -e
head -c 3000000 /dev/urandom > a-big.bin
mkdir z
i=0; while [ $i -lt %d ]; do echo "small $i" > z/f$i.txt; i=$((i+1)); done
printf 'x\n' > "$(printf 'evil\342\200\256txt.sh')"
printf 'y\n' > "$(printf 'c1-\302\233-name')"`, small)
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--publish-to", "sample:main", "--wait", "-o", "json", "--", "sh", "-c", script)
	if res.code != 0 {
		t.Fatalf("job: exit %d\n%s", res.code, res.stderr)
	}
	var job struct {
		JobID  string `json:"jobId"`
		Result struct {
			BundleDigest string `json:"bundleDigest"`
		} `json:"result"`
		ApprovalID string `json:"approvalId"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &job); err != nil {
		t.Fatalf("job JSON: %v\n%s", err, res.stdout)
	}
	if job.ApprovalID = s.job(t, job.JobID).GetApprovalId(); job.ApprovalID == "" {
		t.Fatalf("no approval for job %s", job.JobID)
	}
	bundlePath := filepath.Join(s.dir, "executor", "data", "runs", job.JobID, "bundle.tar")
	filesJSON, err := bundle.ReadEntry(bundlePath, bundle.FilesFile)
	if err != nil {
		t.Fatalf("the bundle: %v", err)
	}
	files, err := bundle.ParseFiles(filesJSON)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := bundle.ReadEntry(bundlePath, bundle.PatchFile)
	if err != nil {
		t.Fatal(err)
	}
	// The bundle carries the signed grant its run came from, which the
	// authority's grant key verifies (the publisher checks it so).
	rawGrant, err := bundle.ReadEntry(bundlePath, bundle.GrantFile)
	if err != nil {
		t.Fatal(err)
	}
	sg := &typesv1.SignedGrant{}
	if err := proto.Unmarshal(rawGrant, sg); err != nil {
		t.Fatalf("the bundle's grant is not a signed grant: %v", err)
	}
	pub, err := grant.LoadPublicKey(filepath.Join(s.dir, "authority", "grant.key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if g, err := grant.NewVerifier(pub).VerifyRecord(sg); err != nil || g.GetJobId() != job.JobID {
		t.Fatalf("the bundle's grant: %v (job %q)", err, g.GetJobId())
	}
	wantFiles := small + 3
	if len(files) != wantFiles {
		t.Fatalf("the bundle lists %d files, want %d", len(files), wantFiles)
	}

	show := s.airlock(t, "approval", "show", job.ApprovalID, "--as", "approver/alice")
	if show.code != 0 {
		t.Fatalf("approval show: exit %d\n%s", show.code, show.stderr)
	}
	out := show.stdout
	// Every file is listed, the small ones written after the large one too.
	listed := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "  added ") {
			listed++
		}
	}
	if !regexp.MustCompile(`\n  added +100644 +binary +3000000 +a-big\.bin +\(patch shown in part\)\n`).MatchString(out) {
		t.Error("approval show does not list a-big.bin as a binary shown in part")
	}
	if listed != wantFiles {
		t.Errorf("approval show lists %d added files, want %d", listed, wantFiles)
	}
	for _, want := range []string{
		fmt.Sprintf("files      %d changed, %d insertions(+), 0 deletions(-); patch %d bytes\n", wantFiles, small+2, len(patch)),
		"z/f1499.txt", "(patch not shown)",
		"evil⟦\\u202e⟧txt.sh", "c1-⟦\\u009b⟧-name",
		fmt.Sprintf("--- patch: the first %d of %d bytes;", 1<<20, len(patch)),
		fmt.Sprintf("--- patch cut here: %d bytes not shown; airlock approval show --full %s shows every byte ---", len(patch)-(1<<20), job.ApprovalID),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("approval show lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("approval show (first 3000 bytes):\n%s", out[:min(len(out), 3000)])
	}

	// The whole of it, from the bundle, as JSON lines.
	full := s.airlock(t, "approval", "show", job.ApprovalID, "--full", "-o", "json", "--as", "approver/alice")
	if full.code != 0 {
		t.Fatalf("approval show --full: exit %d\n%s", full.code, full.stderr)
	}
	var gotPatch, gotOut bytes.Buffer
	var gotFiles []*authorityv1.FileChange
	var part authorityv1.ReviewPart
	verified := ""
	for _, line := range strings.Split(strings.TrimSpace(full.stdout), "\n") {
		msg := &authorityv1.ReadReviewResponse{}
		if err := protojson.Unmarshal([]byte(line), msg); err != nil {
			t.Fatalf("--full line %q: %v", line[:min(len(line), 200)], err)
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.ReadReviewResponse_Start:
			part = m.Start.GetPart()
		case *authorityv1.ReadReviewResponse_Files:
			gotFiles = append(gotFiles, m.Files.GetFiles()...)
		case *authorityv1.ReadReviewResponse_Chunk:
			switch part {
			case authorityv1.ReviewPart_REVIEW_PART_PATCH:
				gotPatch.Write(m.Chunk)
			case authorityv1.ReviewPart_REVIEW_PART_STDOUT:
				gotOut.Write(m.Chunk)
			}
		case *authorityv1.ReadReviewResponse_VerifiedDigest:
			verified = m.VerifiedDigest
		}
	}
	if !bytes.Equal(gotPatch.Bytes(), patch) {
		t.Errorf("--full streamed a patch of %d bytes that is not the bundle's %d", gotPatch.Len(), len(patch))
	}
	if len(gotFiles) != len(files) {
		t.Errorf("--full streamed %d files, the bundle lists %d", len(gotFiles), len(files))
	}
	for i := range min(len(gotFiles), len(files)) {
		if p := gotFiles[i].GetPath(); p != files[i].Path && string(gotFiles[i].GetPathBytes()) != files[i].Path {
			t.Fatalf("file %d: streamed %q, the bundle has %q", i, p, files[i].Path)
		}
	}
	if verified != job.Result.BundleDigest {
		t.Errorf("--full verified %q, want the approval's digest %s", verified, job.Result.BundleDigest)
	}

	// The text form ends by saying what it verified.
	text := s.airlock(t, "approval", "show", job.ApprovalID, "--full", "--as", "approver/alice")
	if text.code != 0 || !strings.Contains(text.stdout, "verified: everything above is bundle "+job.Result.BundleDigest) ||
		!strings.Contains(text.stdout, fmt.Sprintf("--- files: %d ---", wantFiles)) || !strings.Contains(text.stdout, "evil⟦\\u202e⟧txt.sh") {
		t.Errorf("approval show --full (text): exit %d\n%s", text.code, text.stderr)
	}

	// The patch alone, as bytes, applies to the base commit as it is.
	rawPatch := s.airlock(t, "approval", "show", job.ApprovalID, "--full", "--raw", "--part", "patch", "--as", "approver/alice")
	if rawPatch.code != 0 || rawPatch.stdout != string(patch) || !strings.Contains(rawPatch.stderr, "verified: what was written is from bundle "+job.Result.BundleDigest) {
		t.Errorf("--full --raw --part patch: exit %d, %d bytes (the bundle's patch has %d)\n%s", rawPatch.code, len(rawPatch.stdout), len(patch), rawPatch.stderr)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, filepath.Dir(clone), "clone", "-q", repo, clone)
	applyCmd := exec.Command("git", "apply", "--check", "-")
	applyCmd.Dir, applyCmd.Stdin = clone, strings.NewReader(rawPatch.stdout)
	if out, err := applyCmd.CombinedOutput(); err != nil {
		t.Errorf("git apply --check of the streamed patch: %v\n%s", err, out)
	}

	// Someone with the executor's disk alters the bundle: it is never
	// shown as the approved bundle.
	data, err := os.ReadFile(bundlePath)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte("small 7\n"))
	if i < 0 {
		t.Fatal("the bundle does not hold the small files' content")
	}
	data[i] = 'S'
	if err := os.WriteFile(bundlePath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := s.airlock(t, "approval", "show", job.ApprovalID, "--full", "--as", "approver/alice")
	if bad.code == 0 || strings.Contains(bad.stdout, "verified:") {
		t.Errorf("approval show --full of an altered bundle: exit %d\nstdout tail: %s\nstderr: %s", bad.code, bad.stdout[max(0, len(bad.stdout)-500):], bad.stderr)
	}
	if !strings.Contains(bad.stderr, "data loss") || !strings.Contains(bad.stderr, "altered") {
		t.Errorf("approval show --full of an altered bundle says: %s", bad.stderr)
	}
}
