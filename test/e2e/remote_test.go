//go:build linux

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDevRemote is the dev stack's git server as the authority and the
// publisher meet it: the authority fetches a job's source from it with the
// tenant's source credential; a push needs the deploy credential and can
// neither rewrite nor delete the branch; dev down stops it.
func TestDevRemote(t *testing.T) {
	t.Parallel()
	repo, base := sampleRepo(t)
	s := startStack(t, "--repo", "sample="+repo)
	url := s.repos["sample"]
	if s.git == nil || s.git.Status != "SERVING" || !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("dev up: git server %+v, sample at %q; want it serving on loopback over https", s.git, url)
	}
	creds := filepath.Join(s.dir, "authority", "credentials")
	read, deploy := readFileTrim(t, filepath.Join(creds, "sample.read")), readFileTrim(t, filepath.Join(creds, "sample.deploy"))

	// HEAD, the default revision, is the remote's default branch.
	res := s.airlock(t, "job", "submit", "--repo", "sample", "--wait", "-o", "json", "--", "true")
	if res.code != 0 || !strings.Contains(res.stdout, base) {
		t.Fatalf("job on the served repository: exit %d, want commit %s\n%s\n%s", res.code, base, res.stdout, res.stderr)
	}
	if logs := readFileTrim(t, s.git.Log); !strings.Contains(logs, `"access":"read","`) {
		t.Errorf("the authority did not fetch from the git server with the source credential:\n%s", logs)
	}

	remote := &gitClient{t: t, ca: filepath.Join(s.pkiDir, "ca.crt")}
	clone := filepath.Join(t.TempDir(), "clone")
	if out, err := remote.run("", read, "clone", "-q", url, clone); err != nil {
		t.Fatalf("clone with the source credential: %v\n%s", err, out)
	}
	if out, err := remote.run("", "", "clone", "-q", url, filepath.Join(t.TempDir(), "anon")); err == nil {
		t.Errorf("clone without a credential succeeded:\n%s", out)
	}
	git(t, clone, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "next")
	next := strings.TrimSpace(git(t, clone, "rev-parse", "HEAD"))
	for _, tc := range []struct{ name, token string }{{"no credential", ""}, {"source credential", read}} {
		if out, err := remote.run(clone, tc.token, "push", url, "HEAD:main"); err == nil {
			t.Errorf("push with %s succeeded:\n%s", tc.name, out)
		}
	}
	if out, err := remote.run(clone, deploy, "push", url, "HEAD:main"); err != nil {
		t.Fatalf("fast-forward push with the deploy credential: %v\n%s", err, out)
	}
	git(t, clone, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--amend", "--allow-empty", "-m", "rewritten")
	if out, err := remote.run(clone, deploy, "push", "--force", url, "HEAD:main"); err == nil || !strings.Contains(out, "non-fast-forward") {
		t.Errorf("force push with the deploy credential: %v, want refused as non-fast-forward\n%s", err, out)
	}
	if out, err := remote.run(clone, deploy, "push", url, ":main"); err == nil || !strings.Contains(out, "deletion prohibited") {
		t.Errorf("deleting main with the deploy credential: %v, want refused\n%s", err, out)
	}
	bare := filepath.Join(s.git.DataDir, "sample.git")
	if got := strings.TrimSpace(git(t, s.dir, "--git-dir="+bare, "rev-parse", "main")); got != next {
		t.Errorf("main on the remote is %s, want the one fast-forward %s", got, next)
	}

	res = runCommand(t, nil, bin("airlock"), "dev", "down", "--dir", s.dir, "-o", "json")
	var down devReport
	if err := json.Unmarshal([]byte(res.stdout), &down); res.code != 0 || err != nil {
		t.Fatalf("dev down: exit %d, %v\n%s\n%s", res.code, err, res.stdout, res.stderr)
	}
	if down.Git == nil || down.Git.Status != "stopped" || down.Git.PID != s.git.PID {
		t.Errorf("dev down: git server %+v, want pid %d stopped", down.Git, s.git.PID)
	}
	reapClean(t, s.git.PID, "git server")
	logs := readFileTrim(t, s.git.Log)
	if !strings.HasSuffix(logs, `"msg":"stopped","service":"git","error":null}`) {
		t.Errorf("the git server's last log line is not a clean stop:\n%s", logs)
	}
	for _, tok := range []string{read, deploy} {
		for _, form := range []string{tok, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + tok))} {
			for _, f := range []string{s.git.Log, s.services["authority"].Log} {
				if strings.Contains(readFileTrim(t, f), form) {
					t.Errorf("%s holds a credential", f)
				}
			}
		}
	}
}

// gitClient runs git against the stack's git server as the publisher will:
// trusting the dev CA, the credential in http.extraHeader through the
// environment, no user config.
type gitClient struct {
	t  *testing.T
	ca string
}

func (g *gitClient) run(dir, token string, args ...string) (string, error) {
	cfg := [][2]string{{"http.sslCAInfo", g.ca}, {"credential.helper", ""}}
	if token != "" {
		cfg = append(cfg, [2]string{"http.extraHeader", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))})
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + g.t.TempDir(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + os.DevNull,
		"GIT_TERMINAL_PROMPT=0", fmt.Sprintf("GIT_CONFIG_COUNT=%d", len(cfg))}
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func readFileTrim(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}
