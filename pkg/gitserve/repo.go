package gitserve

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/pkg/gitcmd"
)

// protection is the branch protection git itself enforces in receive-pack:
// no update that is not a fast-forward, no deletion (of any ref, not only
// the current branch), every object checked, and the pack bounded.
func protection(maxPush int64) [][2]string {
	return [][2]string{
		{"receive.denyNonFastForwards", "true"},
		{"receive.denyDeletes", "true"},
		{"receive.denyDeleteCurrent", "true"},
		{"receive.fsckObjects", "true"},
		{"receive.maxInputSize", strconv.FormatInt(maxPush, 10)},
		{"receive.advertisePushOptions", "false"},
		// No gc behind a push: the server's work is what the client asked.
		{"receive.autogc", "false"},
	}
}

// Protect writes the branch protection into the bare repository's own
// config, so that git run on it directly, not only through the server,
// keeps it. The server also passes it to every request through the
// environment, which outranks the file.
func Protect(ctx context.Context, git, dir string) error {
	git, err := lookGit(git)
	if err != nil {
		return err
	}
	for _, kv := range protection(DefaultMaxPush) {
		if kv[0] == "receive.maxInputSize" {
			continue // the server's own bound applies
		}
		if err := run(ctx, git, "", "config", "--file", filepath.Join(dir, "config"), kv[0], kv[1]); err != nil {
			return fmt.Errorf("gitserve: protect %s: %w", dir, err)
		}
	}
	return nil
}

// CloneBare makes dst a bare clone of the local repository src, with every
// branch and tag and HEAD naming the same branch as src's, and protects it.
func CloneBare(ctx context.Context, git, src, dst string) error {
	git, err := lookGit(git)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("gitserve: %w", err)
	}
	// No hook samples: nothing in the served repository runs.
	if err := run(ctx, git, filepath.Dir(dst), "clone", "--quiet", "--bare", "--template=", "--", src, dst); err != nil {
		return fmt.Errorf("gitserve: clone %s: %w", src, err)
	}
	return Protect(ctx, git, dst)
}

// isBare reports whether dir looks like a bare repository, without git's
// discovery, which would walk up into parent directories.
func isBare(dir string) bool {
	for _, p := range []string{"HEAD", "objects", "refs"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(dir, ".git"))
	return os.IsNotExist(err)
}

// sealedEnv is git's whole environment (gitcmd.Env) with cfg as
// configuration that outranks every file.
func sealedEnv(home string, cfg [][2]string) []string {
	return append(gitcmd.Env(home), gitcmd.ConfigEnv(cfg)...)
}

// run runs git in dir (default: the current directory) in the sealed
// environment, with only local transports allowed.
func run(ctx context.Context, git, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, git, args...)
	cmd.Dir = dir
	cmd.Env = sealedEnv(os.TempDir(), [][2]string{
		{"protocol.allow", "never"},
		{"protocol.file.allow", "always"},
		{"core.hooksPath", os.DevNull},
	})
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
