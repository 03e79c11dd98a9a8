// Package gitcmd runs git on content nobody trusts: a job's tree, a patch
// an agent wrote, a repository's own attributes. Every run has the whole
// environment chosen here (no system or global config, no prompts, no
// pager, C locale, nothing of the caller's environment but what it passes)
// and configuration that turns off what would run code or change bytes:
// hooks, fsmonitor, external diff drivers, line-ending conversion. Callers
// add what their command needs (a GIT_DIR, an index file, a credential
// header by GIT_CONFIG_* variables, never in arguments).
package gitcmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// hardening is the configuration every run gets.
var hardening = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "core.symlinks=true",
	"-c", "core.autocrlf=false",
	"-c", "core.quotePath=false",
	"-c", "safe.directory=*",
	"-c", "diff.external=",
}

// Env is git's whole base environment, the one every Airlock process that
// runs git starts from: nothing of the caller's own environment reaches git,
// so no GIT_* variable set around a service can redirect or trace it. No
// system or global config, no prompt, no replace objects, C locale; home is
// HOME and XDG_CONFIG_HOME (git reads nothing there, the global config
// being /dev/null, but some commands want one). PATH is fixed; it finds
// no git: Run runs the one at Path, and git finds its helpers in its own
// exec path.
func Env(home string) []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + home,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"LC_ALL=C",
	}
}

// Cmd is one git run.
type Cmd struct {
	// Dir is the working directory.
	Dir string
	// Env is the whole environment (start from Env).
	Env []string
	// Stdin, when set, is the command's input.
	Stdin io.Reader
	// Cgroups, when set, are the cgroup.procs files of the cgroups git runs
	// in (one per v1 hierarchy, or one v2 cgroup): a shell moves itself
	// into each, then becomes git, so everything git allocates is charged
	// there from its first page. A move that fails fails the run before git
	// starts.
	Cgroups []string
	// MaxOutput, when positive, bounds the standard output Run keeps:
	// past it, git's output pipe is closed (git ends on it) and Run
	// returns an *Error wrapping ErrOutputLimit.
	MaxOutput int64
	// DieWithParent has git killed if the thread that started it ends
	// (Linux's parent-death signal): a git left working after its
	// process crashed would race the next life's git over the same
	// repository. Only for a process that never ends its threads (one
	// that locks goroutines to threads to change their namespaces does).
	DieWithParent bool
}

// Path is the absolute path of the git every Run runs, looked up once in
// this process's PATH at first use: a run in cgroups (through a shell,
// whose PATH is Env's) and one without run the same git.
var Path = sync.OnceValues(func() (string, error) { return exec.LookPath("git") })

// Run runs git with args and returns its standard output; an error carries
// git's standard error.
func (c Cmd) Run(ctx context.Context, args ...string) ([]byte, error) {
	git, err := Path()
	if err != nil {
		return nil, &Error{Command: firstCommand(args), Err: err}
	}
	argv := append(append([]string{git}, hardening...), args...)
	if len(c.Cgroups) > 0 {
		argv = append(append(append([]string{"/bin/sh", "-c", joinCgroups, "airlock-git"}, c.Cgroups...), "--"), argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = c.Env
	cmd.Dir = c.Dir
	cmd.Stdin = c.Stdin
	if c.DieWithParent {
		cmd.SysProcAttr = dieWithParent()
	}
	stdout := &capped{max: c.MaxOutput, fail: true}
	stderr := &capped{max: maxStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err = cmd.Run()
	if stdout.over {
		return nil, &Error{Command: firstCommand(args), Err: ErrOutputLimit, Stderr: strings.TrimSpace(stderr.buf.String())}
	}
	if err != nil {
		return stdout.buf.Bytes(), &Error{Command: firstCommand(args), Err: err, Stderr: strings.TrimSpace(stderr.buf.String())}
	}
	return stdout.buf.Bytes(), nil
}

// joinCgroups is the shell that moves itself into each cgroup.procs file
// named before "--" (writing 0 moves the writer) and then becomes the
// command after it.
const joinCgroups = `for f in "$@"; do [ "$f" = -- ] && break; echo 0 >"$f" || exit 125; shift; done; shift; exec "$@"`

// ErrOutputLimit is wrapped when git printed more than Cmd.MaxOutput.
var ErrOutputLimit = errors.New("the output passed its bound")

// maxStderr is how much of git's standard error a run keeps for its error.
const maxStderr = 64 << 10

// capped is a buffer that keeps at most max bytes (max <= 0: all). Past
// it, a failing one refuses the write (closing the pipe it is fed from)
// and says so in over; another drops the rest. It has no ReadFrom, which
// io.Copy would call instead of Write.
type capped struct {
	buf  bytes.Buffer
	max  int64
	fail bool
	over bool
}

func (w *capped) Write(p []byte) (int, error) {
	if w.max > 0 && int64(w.buf.Len())+int64(len(p)) > w.max {
		if w.fail {
			w.over = true
			return 0, ErrOutputLimit
		}
		w.buf.Write(p[:max(0, w.max-int64(w.buf.Len()))])
		return len(p), nil
	}
	return w.buf.Write(p)
}

// Error is a failed git run.
type Error struct {
	Command string
	Err     error
	Stderr  string
}

func (e *Error) Error() string { return fmt.Sprintf("git %s: %v: %s", e.Command, e.Err, e.Stderr) }

// Unwrap returns the process error.
func (e *Error) Unwrap() error { return e.Err }

// firstCommand is the git subcommand among args (after any -c pairs or
// --options before it).
func firstCommand(args []string) string {
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "-c" || args[i] == "-C" || args[i] == "--work-tree" || args[i] == "--git-dir":
			i++
		case !strings.HasPrefix(args[i], "-"):
			return args[i]
		}
	}
	return "?"
}

// ConfigEnv passes configuration to git in the environment
// (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n, GIT_CONFIG_VALUE_n), where no other
// process's arguments show it: the way a credential header reaches git.
func ConfigEnv(kv [][2]string) []string {
	env := []string{"GIT_CONFIG_COUNT=" + strconv.Itoa(len(kv))}
	for i, p := range kv {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, p[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, p[1]))
	}
	return env
}

// RemoteConfig is the configuration for talking to a remote nobody vouches
// for: only the https and file transports, no credential helper, no
// redirect that could carry a credential to another host, the server's
// certificate always checked (against caFile when it is set).
func RemoteConfig(caFile string) [][2]string {
	kv := [][2]string{
		{"http.sslVerify", "true"},
		{"protocol.allow", "never"},
		{"protocol.file.allow", "always"},
		{"protocol.https.allow", "always"},
		{"credential.helper", ""},
		{"http.followRedirects", "false"},
	}
	if caFile != "" {
		kv = append(kv, [2]string{"http.sslCAInfo", caFile})
	}
	return kv
}

// AuthHeader turns a credential (one line: "user:password", or a bare
// token) into the http.extraHeader value git sends: HTTP Basic, a bare
// token with the user x-access-token, which GitHub and GitLab accept.
func AuthHeader(credential []byte) (string, error) {
	secret := strings.TrimSpace(string(credential))
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		return "", errors.New("the credential must be one line: a token, or user:password")
	}
	if !strings.Contains(secret, ":") {
		secret = "x-access-token:" + secret
	}
	return "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(secret)), nil
}

// PlainAttributes is the info/attributes of every git directory Airlock
// runs git in over a repository's or a job's files. info/attributes
// outranks every .gitattributes, so no attribute the files set can make
// git's bytes differ from the tree's (export-ignore, export-subst, ident,
// text and eol conversion, working-tree-encoding) or run a filter: an
// archive is the commit's tree exactly, a staged tree hashes as the
// commit's, and a patch holds exactly what a job left.
const PlainAttributes = "* -export-ignore -export-subst -ident -text -eol -filter -working-tree-encoding\n"

// Initialized reports whether git init finished in the bare git directory
// dir. git init writes HEAD before it makes objects/, and a kill between
// leaves a directory git refuses as "not a git repository": all four of
// its parts must be there, or the directory is to be made again.
func Initialized(dir string) bool {
	for _, name := range []string{"HEAD", "config", "objects", "refs"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}
