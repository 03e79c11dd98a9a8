package dev

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/gitserve"
	"github.com/airlockhq/airlock/pkg/logging"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// devGitName is the dev stack's git server, beside the three services:
// DIR/git/config.yaml, DIR/git/git.log, DIR/git/git.pid, and the bare
// repositories it serves in DIR/git/data.
const devGitName = "git"

// gitServeFile is the git server's config file.
type gitServeFile struct {
	Version int    `yaml:"version"`
	Listen  string `yaml:"listen"`
	// TLS is the server's certificate (a host certificate from the dev CA)
	// and key.
	TLS struct {
		Cert string `yaml:"cert"`
		Key  string `yaml:"key"`
	} `yaml:"tls"`
	// Root holds the bare repositories, NAME.git each.
	Root string `yaml:"root"`
	// Repositories maps a name, served at /NAME.git, to its token files.
	Repositories map[string]gitServeRepo `yaml:"repositories"`
	// MaxPush bounds one push; default 512MiB.
	MaxPush config.ByteSize `yaml:"max_push"`
	// SpoolDir holds chunked request bodies while they are read; default
	// spool beside the config file.
	SpoolDir string     `yaml:"spool_dir"`
	Log      config.Log `yaml:"log"`
}

// gitServeRepo names the files holding a repository's tokens, one line
// each: the tenant's source credential, which may fetch, and the deploy
// credential, which may fetch and push.
type gitServeRepo struct {
	ReadCredential string `yaml:"read_credential"`
	PushCredential string `yaml:"push_credential"`
}

func newDevGitServe(g *cmdutil.Globals) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:    "git-serve --config FILE",
		Short:  "Serve the dev stack's bare repositories over HTTPS (dev up runs it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runGitServe(ctx, path)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "the git server's config file, written by dev up (required)")
	cmdutil.Required(cmd, "config")
	return cmd
}

// loadGitServe reads and checks the git server's config file and the
// token files it names.
func loadGitServe(path string) (*gitServeFile, []gitserve.Repository, error) {
	var f gitServeFile
	if err := config.Load(path, &f); err != nil {
		return nil, nil, err
	}
	base, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, nil, err
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(base, p)
	}
	var errs []error
	if err := config.CheckAddress(f.Listen); err != nil {
		errs = append(errs, config.Field("listen", "%v", err))
	} else if host, _, _ := net.SplitHostPort(f.Listen); net.ParseIP(host) == nil || !net.ParseIP(host).IsLoopback() {
		errs = append(errs, config.Field("listen", "%q: the dev git server listens on a loopback address only", f.Listen))
	}
	for _, p := range []struct {
		field string
		path  *string
	}{{"tls.cert", &f.TLS.Cert}, {"tls.key", &f.TLS.Key}, {"root", &f.Root}} {
		if *p.path == "" {
			errs = append(errs, config.Field(p.field, "required"))
		}
		*p.path = abs(*p.path)
	}
	if f.SpoolDir = abs(f.SpoolDir); f.SpoolDir == "" {
		f.SpoolDir = filepath.Join(base, "spool")
	}
	if err := f.MaxPush.Check("max_push"); err != nil {
		errs = append(errs, err)
	}
	if f.Log.Level == "" {
		f.Log.Level = "info"
	}
	if f.Log.Format == "" {
		f.Log.Format = "json"
	}
	if len(f.Repositories) == 0 {
		errs = append(errs, config.Field("repositories", "at least one is required"))
	}
	var repos []gitserve.Repository
	for _, name := range slices.Sorted(maps.Keys(f.Repositories)) {
		r := f.Repositories[name]
		field := "repositories." + name
		read, rerr := readToken(abs(r.ReadCredential))
		push, perr := readToken(abs(r.PushCredential))
		if rerr != nil {
			errs = append(errs, config.Field(field+".read_credential", "%v", rerr))
		}
		if perr != nil {
			errs = append(errs, config.Field(field+".push_credential", "%v", perr))
		}
		repos = append(repos, gitserve.Repository{Name: name, ReadTokens: []string{read}, PushTokens: []string{push}})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &f, repos, nil
}

// readToken reads a one-line token file. Errors name the file, never what
// it holds.
func readToken(path string) (string, error) {
	if path == "" {
		return "", errors.New("required")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("%s must hold one line, the token", path)
	}
	return tok, nil
}

func runGitServe(ctx context.Context, path string) error {
	f, repos, err := loadGitServe(path)
	if err != nil {
		return err
	}
	log, err := logging.New(os.Stderr, devGitName, f.Log)
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(f.TLS.Cert, f.TLS.Key)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if err := os.MkdirAll(f.SpoolDir, 0o700); err != nil {
		return err
	}
	srv, err := gitserve.New(ctx, gitserve.Config{Root: f.Root, Repositories: repos, MaxPush: f.MaxPush.Bytes(), SpoolDir: f.SpoolDir, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.Listen)
	if err != nil {
		return err
	}
	log.Info("serving", "address", ln.Addr().String(), "root", f.Root, "repositories", len(repos))
	err = srv.Serve(ctx, ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	log.Info("stopped", "error", err)
	return err
}

// devGit is the dev stack's git server as dev up sets it up.
type devGit struct {
	server *devService
	// urls maps each repository to where it is served.
	urls map[string]string
	// tenantRepos and deployCredentials are the repositories and deploy
	// credentials as the authority's tenant policy names them.
	tenantRepos, deployCredentials map[string]any
}

// devGitSetup makes everything the git server of a dev stack needs in dir:
// a bare clone of each repository (kept from an earlier dev up, if it was
// cloned from the same path), a read and a deploy token for each, a host
// certificate from the dev CA for 127.0.0.1, and the config file.
func devGitSetup(ctx context.Context, dir, pkiDir, addr string, repos map[string]string, progress io.Writer) (devGit, error) {
	s := devPaths(dir, devGitName)
	s.Address = addr
	git := devGit{server: &s, urls: map[string]string{}, tenantRepos: map[string]any{}, deployCredentials: map[string]any{}}
	creds := filepath.Join(dir, "authority", "credentials")
	served := map[string]gitServeRepo{}
	for _, name := range slices.Sorted(maps.Keys(repos)) {
		if err := devBareRepo(ctx, repos[name], filepath.Join(s.DataDir, name+".git"), progress); err != nil {
			return devGit{}, fmt.Errorf("--repo %s: %w", name, err)
		}
		read, err := devToken(filepath.Join(creds, name+".read"), "dev-read-token-")
		if err != nil {
			return devGit{}, err
		}
		push, err := devToken(filepath.Join(creds, name+".deploy"), "dev-deploy-token-")
		if err != nil {
			return devGit{}, err
		}
		served[name] = gitServeRepo{ReadCredential: read, PushCredential: push}
		git.urls[name] = "https://" + addr + "/" + name + ".git"
		git.tenantRepos[name] = map[string]any{"url": git.urls[name], "credential": read, "ca": pki.CAPath(pkiDir)}
		git.deployCredentials[name] = push
	}
	cert, key, err := devHostPair(dir, devGitName, pkiDir)
	if err != nil {
		return devGit{}, err
	}
	file := map[string]any{
		"version": config.Version, "listen": addr, "tls": map[string]string{"cert": cert, "key": key},
		"root": s.DataDir, "repositories": served, "log": config.Log{Level: "info", Format: "json"},
	}
	return git, writeYAML(s.Config, file)
}

// devBareRepo makes bare a bare clone of src, unless an earlier dev up
// made it from src already: it is the stack's remote, and what was pushed
// to it stays.
func devBareRepo(ctx context.Context, src, bare string, progress io.Writer) error {
	if _, err := os.Stat(bare); errors.Is(err, os.ErrNotExist) {
		return gitserve.CloneBare(ctx, "", src, bare)
	}
	out, err := exec.CommandContext(ctx, "git", "config", "--file", filepath.Join(bare, "config"), "--get", "remote.origin.url").Output()
	if ctx.Err() != nil {
		return fmt.Errorf("reading %s's origin: %w", bare, ctx.Err())
	}
	if got := strings.TrimSpace(string(out)); err != nil || got != src {
		return fmt.Errorf("%s was not cloned from %s (origin %q); remove it to clone again", bare, src, got)
	}
	fmt.Fprintf(progress, "kept %s from an earlier dev up (remove it to clone %s again)\n", bare, src)
	return nil
}

// devGitStart starts the git server as a process of its own, like the
// services, and waits until it answers over TLS with the dev CA's
// certificate.
func devGitStart(ctx context.Context, dir string, s *devService, pkiDir string, r *reservation) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pid, exited, err := startProcess([]string{self, "dev", "git-serve", "--config", s.Config}, nil, s, r)
	if err != nil {
		return err
	}
	s.PID = pid
	if err := writePID(dir, devGitName, pid); err != nil {
		return err
	}
	return waitHTTPS(ctx, "the git server", "https://"+s.Address+"/healthz", s, pkiDir, exited, http.StatusOK)
}

// waitHTTPS waits until url, served by the stack's process s (what names
// it in errors), answers over TLS with the dev CA's certificate: with one
// of the statuses given, or with any status when none is.
func waitHTTPS(ctx context.Context, what, url string, s *devService, pkiDir string, exited <-chan error, statuses ...int) error {
	roots, err := tlsconfig.LoadRoots(pki.CAPath(pkiDir))
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer client.CloseIdleConnections()
	return awaitStart(ctx, what, s, exited, func(ctx context.Context) (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		if len(statuses) > 0 && !slices.Contains(statuses, resp.StatusCode) {
			return false, resp.Status
		}
		s.Status = "SERVING"
		return true, ""
	})
}
