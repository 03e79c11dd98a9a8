//go:build linux

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/test/filescan"
	"github.com/airlockhq/airlock/test/registrytest"
)

// registryPassword is the tenant's pull credential: it must never reach
// the executor.
const registryPassword = "e2e-pull-secret-7f3a9c"

// imageStack is a dev stack whose dev tenant may run images of
// REGISTRY/team/* from a real registry (distribution, on loopback over
// TLS) that only its credential opens.
func imageStack(t *testing.T) (*stack, *registrytest.Registry) {
	t.Helper()
	reg := registrytest.Start(t, registrytest.Options{Users: map[string]string{"robot": registryPassword}})
	repo, _ := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	cred := filepath.Join(s.dir, "registry.cred")
	if err := os.WriteFile(cred, []byte("robot:"+registryPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.editTenants(t, func(tenants, dev map[string]any) {
		dev["images"] = map[string]any{
			"allowed":    []string{reg.Host + "/team/*"},
			"registries": map[string]any{reg.Host: map[string]any{"credential": cred, "ca": reg.CAFile}},
		}
	})
	s.restartService(t, "authority")
	return s, reg
}

// toolsImage is a runnable image of the host's sh and cat (with their
// libraries) whose /etc/os-release says id, and whose config sets
// IMAGE_VAR.
func toolsImage(t *testing.T, id string) v1.Image {
	files := registrytest.HostPrograms(t, "ID="+id+"\nNAME=\"Airlock test image\"\n", "cat", "sleep")
	return registrytest.Image(t, registrytest.OCI, registrytest.Config{Env: []string{"PATH=/usr/bin:/bin", "IMAGE_VAR=from-" + id}},
		registrytest.LayerFromFiles(t, files, compression.GZip),
		registrytest.LayerFromFiles(t, []registrytest.File{{Path: "opt/marker", Mode: 0o644, Content: []byte(id + "\n")}}, compression.ZStd))
}

func blobGets(t *testing.T, reg *registrytest.Registry, repo string) int {
	return registrytest.Count(reg.Requests(t), "GET", "/v2/"+repo+"/blobs/")
}

// TestImageEndToEnd: through the real services and a real registry, a job
// runs on an image the tenant's policy allows, by the digest its tag had
// at submission, under runc and runsc; its result and provenance record
// the digest; the second job on the image makes no blob request; the
// registry credential is nowhere on the executor; an image outside the
// policy is refused at submission naming the field; a tampered layer
// fails the job.
func TestImageEndToEnd(t *testing.T) {
	s, reg := imageStack(t)
	v1img := toolsImage(t, "airlock-one")
	d1 := reg.Push(t, "team/tools", "v1", v1img)
	ref := reg.Host + "/team/tools:v1"
	cmd := []string{"--", "sh", "-c", `cat /etc/os-release /opt/marker; echo "var=$IMAGE_VAR"; test -e /usr/bin/git && echo host-usr || echo no-host-usr`}

	for _, class := range []string{"runc", "runsc"} {
		res := s.airlock(t, append([]string{"job", "submit", "--repo", "sample", "--image", ref, "--runtime", class, "--wait", "-o", "json"}, cmd...)...)
		if res.code != 0 {
			t.Fatalf("%s: exit %d\n%s", class, res.code, res.stderr)
		}
		for _, want := range []string{"ID=airlock-one", "var=from-airlock-one", "no-host-usr"} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("%s: output lacks %q:\n%s", class, want, res.stderr)
			}
		}
		job := &authorityv1.Job{}
		if err := protojson.Unmarshal([]byte(res.stdout), job); err != nil {
			t.Fatal(err)
		}
		want := reg.Host + "/team/tools@" + d1
		if got := job.GetResult().GetImage(); got != want {
			t.Errorf("%s: result image %q, want %q", class, got, want)
		}
		if job.GetImage().GetDigest() != d1 || job.GetImage().GetName() != ref {
			t.Errorf("%s: job image %+v", class, job.GetImage())
		}
		if job.GetResult().GetTemplateVersion() != d1 {
			t.Errorf("%s: template version %q, want the image digest", class, job.GetResult().GetTemplateVersion())
		}
		dir := t.TempDir()
		if dl := s.airlock(t, "job", "download", job.GetJobId(), "--out", dir); dl.code != 0 {
			t.Fatalf("download: %s", dl.stderr)
		}
		if prov := provenancePayload(t, filepath.Join(dir, "provenance.json")); !strings.Contains(prov, `"image":"`+want+`"`) {
			t.Errorf("%s: provenance lacks the image:\n%s", class, prov)
		}
	}

	// The image is cached now: a job on it makes no blob request.
	before := blobGets(t, reg, "team/tools")
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/team/tools@"+d1, "--wait", "--", "cat", "/opt/marker")
	if res.code != 0 || !strings.Contains(res.stdout, "airlock-one") {
		t.Fatalf("cached job: exit %d\n%s", res.code, res.stderr)
	}
	if after := blobGets(t, reg, "team/tools"); after != before {
		t.Errorf("the job on a cached image made %d blob requests", after-before)
	}

	// A tag is resolved once, at submission.
	queued := s.airlock(t, "job", "submit", "--repo", "sample", "--image", ref, "-o", "json", "--", "cat", "/opt/marker")
	if queued.code != 0 {
		t.Fatalf("submit: %s", queued.stderr)
	}
	qjob := &authorityv1.Job{}
	if err := protojson.Unmarshal([]byte(queued.stdout), qjob); err != nil {
		t.Fatal(err)
	}
	d2 := reg.Push(t, "team/tools", "v1", toolsImage(t, "airlock-two"))
	final := s.ended(t, qjob.GetJobId())
	if final.GetResult().GetImage() != reg.Host+"/team/tools@"+d1 {
		t.Errorf("the job submitted before the tag moved ran on %q, want %s", final.GetResult().GetImage(), d1)
	}
	moved := s.airlock(t, "job", "submit", "--repo", "sample", "--image", ref, "--wait", "--", "cat", "/opt/marker")
	if moved.code != 0 || !strings.Contains(moved.stdout, "airlock-two") {
		t.Errorf("after the tag moved to %s: exit %d\n%s", d2, moved.code, moved.stderr)
	}

	// Outside the policy: refused at submission, naming the field.
	reg.Push(t, "other/tools", "v1", v1img)
	out := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/other/tools:v1", "--", "true")
	if out.code == 0 || !strings.Contains(out.stderr, "spec.image") || !strings.Contains(out.stderr, "not allowed") {
		t.Errorf("an image outside the policy: exit %d\n%s", out.code, out.stderr)
	}

	// A tampered layer never runs.
	bad := toolsImage(t, "airlock-bad")
	bd := reg.Push(t, "team/bad", "v1", bad)
	layers, _ := bad.Layers()
	ld, _ := layers[1].Digest()
	reg.CorruptBlob(t, "team/bad", ld.String())
	tampered := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/team/bad@"+bd, "--wait", "--", "cat", "/opt/marker")
	if tampered.code == 0 || strings.Contains(tampered.stdout, "airlock-bad") {
		t.Errorf("a job on a tampered layer: exit %d\n%s", tampered.code, tampered.stderr)
	}

	// Jobs that want a new image at once pull each layer once.
	conc := toolsImage(t, "airlock-conc")
	cd := reg.Push(t, "team/conc", "v1", conc)
	var ids []string
	for i := range 3 {
		r := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/team/conc@"+cd, "-o", "json",
			"--idempotency-key", fmt.Sprintf("conc-%d", i), "--", "cat", "/opt/marker")
		j := &authorityv1.Job{}
		if r.code != 0 || protojson.Unmarshal([]byte(r.stdout), j) != nil {
			t.Fatalf("submit: exit %d\n%s", r.code, r.stderr)
		}
		ids = append(ids, j.GetJobId())
	}
	for _, id := range ids {
		if j := s.ended(t, id); j.GetResult().GetExitCode() != 0 || j.GetState() != authorityv1.JobState_JOB_STATE_FINISHED {
			t.Errorf("concurrent job %s: %v %s", id, j.GetState(), j.GetMessage())
		}
	}
	cl, _ := conc.Layers()
	reqs := reg.Requests(t)
	for _, l := range cl {
		ld, _ := l.Digest()
		if n := registrytest.Count(reqs, "GET", "/v2/team/conc/blobs/"+ld.String()); n != 1 {
			t.Errorf("layer %s: %d GETs for 3 concurrent jobs, want 1", ld, n)
		}
	}

	// A manifest that does not hash to its digest is refused at submission.
	forged := toolsImage(t, "airlock-forged")
	fd := reg.Push(t, "team/forged", "", forged)
	other, _ := toolsImage(t, "airlock-other").RawManifest()
	reg.ReplaceBlob(t, "team/forged", fd, other)
	if r := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/team/forged@"+fd, "--", "true"); r.code == 0 {
		t.Errorf("a job on a manifest that does not hash to its digest was accepted\n%s", r.stdout)
	}

	// A hostile layer is refused by the executor, which names the entry.
	hostile := registrytest.Image(t, registrytest.OCI, registrytest.Config{},
		registrytest.LayerFromFiles(t, registrytest.HostPrograms(t, "ID=hostile\n"), compression.GZip),
		registrytest.LayerFromFiles(t, []registrytest.File{{Path: "../../escape", Mode: 0o644, Content: []byte("out")}}, compression.GZip))
	hd := reg.Push(t, "team/hostile", "v1", hostile)
	hr := s.airlock(t, "job", "submit", "--repo", "sample", "--image", reg.Host+"/team/hostile@"+hd, "--wait", "-o", "json", "--", "true")
	hj := &authorityv1.Job{}
	protojson.Unmarshal([]byte(hr.stdout), hj)
	if hr.code == 0 || !strings.Contains(hj.GetMessage()+hj.GetResult().GetMessage(), `"../../escape"`) {
		t.Errorf("a hostile layer: exit %d, message %q %q\n%s", hr.code, hj.GetMessage(), hj.GetResult().GetMessage(), hr.stderr)
	}

	// A session runs on an image too.
	cr := s.airlock(t, "session", "create", "--repo", "sample", "--image", ref, "-o", "json")
	sess := &authorityv1.Job{}
	if cr.code != 0 || protojson.Unmarshal([]byte(cr.stdout), sess) != nil {
		t.Fatalf("session create on an image: exit %d\n%s", cr.code, cr.stderr)
	}
	if r := s.airlock(t, "session", "exec", sess.GetJobId(), "--exec-id", "e1", "--", "cat", "/opt/marker"); r.code != 0 || !strings.Contains(r.stdout, "airlock-two") {
		t.Errorf("session exec on the image: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// FetchImageBlob from the attacker's side, while the session runs:
	// the executor gets only the blobs of the session's own image, and a
	// client nothing at all.
	fetch := func(as, d string) error {
		c := authorityv1.NewAuthorityServiceClient(s.dial(t, as, "authority"))
		st, err := c.FetchImageBlob(t.Context(), &authorityv1.FetchImageBlobRequest{JobId: sess.GetJobId(), Digest: d})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	if err := fetch("service/executor", d2); err != nil {
		t.Errorf("the executor fetching its session's manifest: %v", err)
	}
	cl0, _ := cl[0].Digest()
	for _, c := range []struct{ as, digest, why string }{
		{"service/executor", cl0.String(), "a layer of another image"},
		{"service/executor", "sha256:" + strings.Repeat("a", 64), "a digest of no image"},
		{"client/dev", d2, "a client"},
		{"service/publisher", d2, "the publisher"},
	} {
		if err := fetch(c.as, c.digest); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s fetching %s: %v, want permission denied", c.as, c.why, err)
		}
	}
	if r := s.airlock(t, "session", "finish", sess.GetJobId()); r.code != 0 {
		t.Errorf("session finish: exit %d\n%s", r.code, r.stderr)
	}

	// The credential stayed in the authority: nothing under the
	// executor's data directory, environment or command line holds it.
	ex := s.services["executor"]
	secret := []byte(registryPassword)
	filepath.WalkDir(ex.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if has, err := filescan.Contains(p, []string{string(secret)}); err == nil && has[0] {
			t.Errorf("the registry credential is in the executor's %s", p)
		}
		return nil
	})
	pid := strconv.Itoa(s.proc("executor").pid)
	for _, f := range []string{"environ", "cmdline"} {
		if data, err := os.ReadFile(filepath.Join("/proc", pid, f)); err == nil && bytes.Contains(data, secret) {
			t.Errorf("the registry credential is in the executor's %s", f)
		}
	}
	if l := s.airlock(t, "image", "list"); l.code != 0 || !strings.Contains(l.stdout, d1) || !strings.Contains(l.stdout, "executor image cache") {
		t.Errorf("image list: exit %d\n%s%s", l.code, l.stdout, l.stderr)
	}
	if l := s.airlock(t, "image", "inspect", d1); l.code != 0 || !strings.Contains(l.stdout, ld.String()[:19]) && !strings.Contains(l.stdout, "LAYER") {
		t.Errorf("image inspect: exit %d\n%s%s", l.code, l.stdout, l.stderr)
	}
	if p := s.airlock(t, "image", "prune"); p.code != 0 || !strings.Contains(p.stdout, "pruned") {
		t.Errorf("image prune: exit %d\n%s%s", p.code, p.stdout, p.stderr)
	}
}

// ended polls job id until it has ended.
func (s *stack) ended(t *testing.T, id string) *authorityv1.Job {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		j := s.job(t, id)
		switch j.GetState() {
		case authorityv1.JobState_JOB_STATE_FINISHED, authorityv1.JobState_JOB_STATE_FAILED, authorityv1.JobState_JOB_STATE_CANCELLED:
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %v", id, j.GetState())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// provenancePayload is the in-toto statement of a DSSE envelope file.
func provenancePayload(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		t.Fatal(err)
	}
	p, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return string(p)
}
