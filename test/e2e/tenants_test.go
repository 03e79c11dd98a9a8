//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// addTenant adds tenant name, acting through client/NAME (issued here from
// the stack's CA) and allowed the given repositories, to the authority's
// config file, keeping the dev tenant's limits and runtime classes. The
// authority reads the file at start: restart it afterwards.
func (s *stack) addTenant(t *testing.T, name string, repos map[string]string) {
	t.Helper()
	res := s.airlock(t, "pki", "issue", "--dir", s.pkiDir, "--id", "client/"+name)
	if res.code != 0 {
		t.Fatalf("pki issue client/%s: exit %d\n%s", name, res.code, res.stderr)
	}
	s.editTenants(t, func(tenants, dev map[string]any) {
		if _, dup := tenants[name]; dup {
			t.Fatalf("tenant %s already exists", name)
		}
		rs := map[string]any{}
		for r, url := range repos {
			rs[r] = map[string]any{"url": url}
		}
		tenants[name] = map[string]any{
			"clients":         []string{"client/" + name},
			"repositories":    rs,
			"limits":          dev["limits"],
			"runtime_classes": dev["runtime_classes"],
		}
	})
}

// editTenants rewrites the tenants of the authority's config file with
// edit, which gets them all and the dev tenant. The authority reads the
// file at start: restart it afterwards.
func (s *stack) editTenants(t testing.TB, edit func(tenants, dev map[string]any)) {
	t.Helper()
	s.editConfig(t, "authority", func(path string, cfg map[string]any) {
		tenants, ok := cfg["tenants"].(map[string]any)
		if !ok {
			t.Fatalf("%s: no tenants map", path)
		}
		dev, ok := tenants["dev"].(map[string]any)
		if !ok {
			t.Fatalf("%s: no dev tenant", path)
		}
		edit(tenants, dev)
	})
}

// editConfig rewrites the config file of service with edit. The services
// read the file at start: restart it afterwards.
func (s *stack) editConfig(t testing.TB, service string, edit func(path string, cfg map[string]any)) {
	t.Helper()
	path := s.services[service].Config
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(path, cfg)
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// hostProcsWith returns the pids of live host processes whose command line
// contains s.
func hostProcsWith(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(s)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil && procState(pid) != "Z" {
			out = append(out, e.Name())
		}
	}
	return out
}

// sourceSums is what `find . -type f | sort | xargs sha256sum` prints in a
// checkout of repo's HEAD.
func sourceSums(t *testing.T, repo string) string {
	t.Helper()
	files := strings.Fields(git(t, repo, "ls-files"))
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  ./%s\n", hex.EncodeToString(sum[:]), f)
	}
	return b.String()
}

// tenantMarkJob writes a token into every place a job can write, leaves a
// background process carrying it, and stays up briefly so the test can see
// that process. Its first line of output names where the writes succeeded.
const tenantMarkJob = `t=%s
wrote=
for d in /work /tmp /out "$HOME" /var/tmp /dev/shm /run /etc /; do
  if printf 'airlock-e2e-mark %%s\n' "$t" > "$d/mark-$t" 2>/dev/null; then wrote="$wrote $d"; fi
done
mkdir -p "$HOME/.cache/$t" && printf '%%s\n' "$t" > "$HOME/.cache/$t/nested"
echo "wrote:$wrote"
sh -c 'sleep 100; :' "bg-$t" &
sleep 2
`

// tenantSearchJob holds no token: it dumps everything a job can read that
// a previous job could have left (file names and contents in every
// writable place, every process's command line and environment) for the
// test to search. First it plants a control of its own, in a file and in a
// process, which the dump must show, so an empty search means something.
const tenantSearchJob = `c=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
echo "control=$c"
printf 'control-file %s\n' "$c" > /tmp/control
sh -c 'sleep 30; :' "control-proc-$c" &
echo "== source"
cd /work && find . -path ./.git -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum
echo "== listings"
echo "git-head=$(cat /work/.git/HEAD)"
for d in /work /tmp /out "$HOME" /var/tmp /dev/shm /run; do echo "-- $d"; ls -laR "$d" 2>&1; done
echo "-- /"; ls -la /
echo "== contents"
grep -r -a -H -n "" /work /tmp /out "$HOME" /var/tmp /dev/shm /run 2>/dev/null
echo "== processes"
ls /proc
for p in /proc/[0-9]*; do
  printf '%s cmdline: ' "$p"; tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo
  printf '%s environ: ' "$p"; tr '\0' ' ' < "$p/environ" 2>/dev/null; echo
done
echo "== end"
`

// TestSecondTenantSeesNothingOfTheFirst: a second tenant's job on the same
// repository and commit sees none of what the first tenant's job left in
// /work, /tmp, /out, $HOME or its processes, sees the source whole, and
// cannot read, watch, cancel or list the first tenant's jobs; the executor
// keeps a separate source tree for each tenant.
func TestSecondTenantSeesNothingOfTheFirst(t *testing.T) {
	repo, commit := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	s.addTenant(t, "other", map[string]string{"sample": repo})
	s.restartService(t, "authority")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The policy change is on the audit log: two starts, two digests, and
	// the second names the new tenant.
	pol := s.airlock(t, "audit", "list", "--as", "approver/alice", "--kind", "policy.loaded", "-o", "json", "--limit", "0")
	var list struct {
		Events []struct {
			Subject string `json:"subject"`
			Reason  string `json:"reason"`
		} `json:"events"`
	}
	err := json.Unmarshal([]byte(pol.stdout), &list)
	loaded := list.Events
	if err != nil || len(loaded) != 2 ||
		loaded[0].Subject == loaded[1].Subject || !strings.Contains(loaded[1].Reason, "other sha256:") || strings.Contains(loaded[0].Reason, "other sha256:") {
		t.Fatalf("policy.loaded events after adding a tenant: %+v (%v)\n%s", loaded, err, pol.stdout)
	}

	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	token := "tok" + hex.EncodeToString(b[:])

	// Tenant dev leaves its marks.
	dev := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/dev", "authority"))
	resp, err := dev.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "marks-" + token,
		Spec: &authorityv1.JobSpec{Repository: "sample", Revision: commit, Command: []string{"sh", "-c", fmt.Sprintf(tenantMarkJob, token)}}})
	if err != nil {
		t.Fatal(err)
	}
	devJob := resp.GetJob().GetJobId()
	for start := time.Now(); len(hostProcsWith("bg-"+token)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the dev job's background process never appeared; the check that it is killed would prove nothing (job %v)", s.job(t, devJob).GetState())
		}
	}
	w, err := watchFrom(ctx, dev, devJob, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if f := w.final; f.GetState() != authorityv1.JobState_JOB_STATE_FINISHED || f.GetResult().GetExitCode() != 0 {
		t.Fatalf("dev job: %v exit %d (%s)\nstdout:\n%s\nstderr:\n%s", f.GetState(), f.GetResult().GetExitCode(), f.GetMessage(), w.stdout, w.stderr)
	}
	wrote := regexp.MustCompile(`(?m)^wrote:(.*)$`).FindSubmatch(w.stdout)
	if wrote == nil {
		t.Fatalf("dev job output lacks its wrote: line:\n%s", w.stdout)
	}
	t.Logf("the dev job could write its mark in:%s", wrote[1])
	for _, d := range []string{"/work", "/tmp", "/out", "/root"} {
		if !strings.Contains(string(wrote[1])+" ", " "+d+" ") {
			t.Errorf("the dev job could not write to %s (wrote:%s); the search below would prove less", d, wrote[1])
		}
	}
	// The job's end killed what it left running.
	if p := hostProcsWith(token); len(p) != 0 {
		t.Errorf("processes of the finished dev job survive: pids %v", p)
	}
	if n := sandboxProcs(s.executorCgroupParent()); n != 0 {
		t.Errorf("%d sandbox processes survive the finished dev job", n)
	}
	devBundle, _ := fetchArtifact(t, s, devJob, w.final.GetResult().GetBundleDigest())
	if !bytes.Contains(devBundle, []byte(token)) {
		t.Errorf("the dev job's own bundle lacks its /work and /out marks; the bundle check below would prove nothing")
	}

	// Tenant other runs on the same repository and commit and searches.
	res := s.airlock(t, "--as", "client/other", "job", "submit", "--tenant", "other", "--repo", "sample", "--rev", commit, "--wait", "--",
		"sh", "-c", tenantSearchJob)
	if res.code != 0 {
		t.Fatalf("other's job: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	dump := res.stdout
	if !strings.HasSuffix(dump, "== end\n") {
		t.Fatalf("other's job did not run to its end:\n%s", dump)
	}
	if strings.Contains(dump+res.stderr, token) {
		var hits []string
		for _, line := range strings.Split(dump+res.stderr, "\n") {
			if strings.Contains(line, token) {
				hits = append(hits, line)
			}
		}
		t.Errorf("tenant other's job saw tenant dev's token:\n%s", strings.Join(hits, "\n"))
	}
	ctrl := regexp.MustCompile(`(?m)^control=([0-9a-f]{16})$`).FindStringSubmatch(dump)
	if ctrl == nil {
		t.Fatalf("other's job printed no control:\n%s", dump)
	}
	for _, want := range []string{"control-file " + ctrl[1], "control-proc-" + ctrl[1]} {
		if !strings.Contains(dump, want) {
			t.Errorf("the search does not find its own control %q; it cannot be trusted to find the token\n%s", want, dump)
		}
	}
	_, src, _ := strings.Cut(dump, "== source\n")
	src, _, _ = strings.Cut(src, "== listings\n")
	if want := sourceSums(t, repo); src != want {
		t.Errorf("tenant other's /work is not the source as committed:\n%s\nwant:\n%s", src, want)
	}
	// Its .git is its own, fresh at the commit: nothing of dev's in it
	// (the token search above covers its files too).
	if !strings.Contains(dump, "git-head="+commit+"\n") {
		t.Errorf("tenant other's /work/.git is not at the commit it ran on:\n%s", dump)
	}
	m := regexp.MustCompile(`job (\S+) submitted`).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatalf("no job id in stderr:\n%s", res.stderr)
	}
	otherJob := m[1]
	other := authorityv1.NewAuthorityServiceClient(s.dial(t, "client/other", "authority"))
	oj, err := other.GetJob(ctx, &authorityv1.GetJobRequest{JobId: otherJob})
	if err != nil {
		t.Fatal(err)
	}
	if oj.GetJob().GetTenant() != "other" || oj.GetJob().GetCommit() != commit {
		t.Errorf("other's job: tenant %q commit %s, want other and %s", oj.GetJob().GetTenant(), oj.GetJob().GetCommit(), commit)
	}
	otherBundle, _ := fetchArtifact(t, s, otherJob, oj.GetJob().GetResult().GetBundleDigest())
	if bytes.Contains(otherBundle, []byte(token)) {
		t.Errorf("tenant other's bundle carries tenant dev's token")
	}

	// The API shows neither tenant the other's jobs.
	devBefore := s.job(t, devJob)
	if _, err := other.GetJob(ctx, &authorityv1.GetJobRequest{JobId: devJob}); status.Code(err) != codes.NotFound {
		t.Errorf("other GetJob(dev's job): %v, want NotFound", err)
	}
	if _, err := dev.GetJob(ctx, &authorityv1.GetJobRequest{JobId: otherJob}); status.Code(err) != codes.NotFound {
		t.Errorf("dev GetJob(other's job): %v, want NotFound", err)
	}
	if _, err := watchFrom(ctx, other, devJob, 0, 0); status.Code(err) != codes.NotFound {
		t.Errorf("other WatchJob(dev's job): %v, want NotFound", err)
	}
	if _, err := other.CancelJob(ctx, &authorityv1.CancelJobRequest{JobId: devJob}); status.Code(err) != codes.NotFound {
		t.Errorf("other CancelJob(dev's job): %v, want NotFound", err)
	}
	_, err = other.ListJobs(ctx, &authorityv1.ListJobsRequest{Tenant: "dev"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `tenant "dev"`) {
		t.Errorf("other ListJobs(dev): %v, want PermissionDenied naming tenant \"dev\"", err)
	}
	if _, err := other.SubmitJob(ctx, &authorityv1.SubmitJobRequest{Tenant: "dev", IdempotencyKey: "intrude",
		Spec: &authorityv1.JobSpec{Repository: "sample", Revision: commit, Command: []string{"true"}}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("other SubmitJob(tenant dev): %v, want PermissionDenied", err)
	}
	for _, tc := range []struct {
		client authorityv1.AuthorityServiceClient
		tenant string
		want   string
	}{{other, "other", otherJob}, {dev, "dev", devJob}} {
		list, err := tc.client.ListJobs(ctx, &authorityv1.ListJobsRequest{Tenant: tc.tenant})
		if err != nil {
			t.Errorf("ListJobs(%s): %v", tc.tenant, err)
			continue
		}
		var ids []string
		for _, j := range list.GetJobs() {
			ids = append(ids, j.GetJobId())
		}
		if len(ids) != 1 || ids[0] != tc.want {
			t.Errorf("ListJobs(%s) = %v, want only %s", tc.tenant, ids, tc.want)
		}
	}
	if after := s.job(t, devJob); after.GetState() != devBefore.GetState() || after.GetMessage() != devBefore.GetMessage() || !after.GetUpdatedAt().AsTime().Equal(devBefore.GetUpdatedAt().AsTime()) {
		t.Errorf("other's attempts changed dev's job: %v %q -> %v %q", devBefore.GetState(), devBefore.GetMessage(), after.GetState(), after.GetMessage())
	}

	// The executor keeps one retained tree per tenant, untouched by jobs.
	sources := filepath.Join(s.services["executor"].DataDir, "sources")
	var trees []os.FileInfo
	for _, tenant := range []string{"dev", "other"} {
		dir := filepath.Join(sources, tenant, "sample", "trees", commit)
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			t.Errorf("no retained tree for tenant %s: %v", tenant, err)
			continue
		}
		if _, err := os.Stat(dir + ".ready"); err != nil {
			t.Errorf("tenant %s's tree is not marked ready: %v", tenant, err)
		}
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.Contains(d.Name(), token) {
				t.Errorf("a job's mark reached tenant %s's retained tree: %s", tenant, p)
			}
			return nil
		})
		trees = append(trees, st)
	}
	if len(trees) == 2 && os.SameFile(trees[0], trees[1]) {
		t.Errorf("tenants dev and other share one retained tree")
	}
}
