// Package dev is `airlock dev`, the local development stack: dev up makes
// a fresh PKI and a config for each service, starts the authority, executor
// and publisher (and a git server for the repositories it is given) as
// detached processes and waits until each serves over mTLS; dev down stops
// them. With --registry it also runs an OCI registry the dev tenant's jobs
// may take images from, and dev image push puts a root filesystem tar in it.
// dev.go holds the commands and the configs, git.go the git server,
// registry.go the registry, image.go dev image, proc.go the processes. Only the airlock command's root (cli) imports it.
package dev

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/delegate"
	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/gitserve"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
)

// The dev stack's fixed choices.
const (
	devTrustDomain = "airlock.local"
	devIdentity    = "client/dev"
	devTenant      = "dev"
)

// devCallers are the caller identities a dev stack issues, so every role in
// the flow can be tried from one terminal with --as.
var devCallers = []string{"client/dev", "approver/alice", "approver/bob", "approver/dev", "pipeline/deploy", "operator/admin"}

// devService is one service of the dev stack and where its files live.
type devService struct {
	Name    string `json:"service"`
	Address string `json:"address,omitempty"`
	PID     int    `json:"pid"`
	Config  string `json:"config"`
	Log     string `json:"log"`
	DataDir string `json:"data_dir"`
	Status  string `json:"status"`
	// logFrom is where in Log this start's lines begin.
	logFrom int64
}

func devPaths(dir, name string) devService {
	sdir := filepath.Join(dir, name)
	config := filepath.Join(sdir, "config.yaml")
	if name == devRegistryName {
		config = filepath.Join(sdir, "config.yml") // the registry's own format
	}
	return devService{
		Name:    name,
		Config:  config,
		Log:     filepath.Join(sdir, name+".log"),
		DataDir: filepath.Join(sdir, "data"),
	}
}

// New returns the dev command group.
func New(g *cmdutil.Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the three services as local processes for development",
	}
	cmd.AddCommand(newDevUp(g), newDevDown(g), newDevGitServe(g), newDevImage(g))
	return cmd
}

func newDevUp(g *cmdutil.Globals) *cobra.Command {
	var dir, binDir, host, sandboxPath string
	var repoFlags, resolvers, domains, brokers, brokerApprovals, extraCAs []string
	var timeout time.Duration
	var registry bool
	var warmPool int
	var otlp string
	cmd := &cobra.Command{
		Use:   "up --dir DIR [--repo NAME=PATH]... [--registry]",
		Short: "Start authority, executor and publisher with a fresh PKI under DIR",
		Long: `Creates a fresh CA and identities in DIR/pki, writes a config for each
service, starts the three services as separate background processes, waits
until each reports SERVING over mTLS, and writes DIR/client.yaml for the CLI:

  export AIRLOCK_CONFIG=DIR/client.yaml
  airlock status

Each process gets a free port, held for it until it starts; one that
loses its port to another program in that moment makes dev up start
the stack again on new ports (at most 3 times in all).

Each --repo NAME=PATH is cloned bare into DIR/git/data/NAME.git (kept from an
earlier dev up) and served by the stack's git server, a process of its own,
at https://127.0.0.1:PORT/NAME.git with a certificate from the dev CA: reads
need the tenant's source credential (DIR/authority/credentials/NAME.read),
pushes the deploy credential (NAME.deploy), and no push may rewrite or delete
a branch. The authority fetches the dev tenant's sources from it.

With --registry the stack also runs the reference OCI registry (bin/registry,
built by make build) at https://127.0.0.1:PORT with a certificate from the
dev CA and one account, dev, whose random password is kept in
DIR/authority/credentials/registry.cred (dev:PASSWORD), the credential the
authority pulls with. The dev tenant may run jobs on 127.0.0.1:PORT/dev/*:

  airlock dev image push --dir DIR --rootfs rootfs.tar --name dev/python:3
  airlock job submit --repo demo --image 127.0.0.1:PORT/dev/python:3 -- python3 -V

To try a domains policy, name what the dev tenant may reach and, if the
host's resolver will not do, the DNS server the executor asks:

  airlock dev up --dir DIR --egress-domain proxy.golang.org --resolver 192.0.2.53
  airlock job submit --repo demo --allow-domain proxy.golang.org -- curl -sI https://proxy.golang.org/

To try a brokered credential, name it with its hosts and the file holding
it; its jobs use it without ever holding it (--credential-approval makes
each such job wait for an approver's start approval):

  airlock dev up --dir DIR --credential-broker github:api.github.com:gh.token
  airlock job submit --repo demo --allow-domain api.github.com --credential github -- curl -s https://api.github.com/user

Logs go to DIR/SERVICE/SERVICE.log, DIR/git/git.log and
DIR/registry/registry.log. Stop everything with
airlock dev down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			bins, err := findServiceBinaries(binDir)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			repos := map[string]string{}
			for _, r := range repoFlags {
				name, path, ok := strings.Cut(r, "=")
				if !ok || name == "" || path == "" {
					return cmdutil.UsageError{Err: fmt.Errorf("--repo %q: want NAME=PATH", r)}
				}
				if err := gitserve.CheckName(name); err != nil {
					return cmdutil.UsageError{Err: fmt.Errorf("--repo %s: %w", name, err)}
				}
				abs, err := filepath.Abs(path)
				if err != nil {
					return err
				}
				if _, err := os.Stat(filepath.Join(abs, ".git")); err != nil {
					if _, berr := os.Stat(filepath.Join(abs, "HEAD")); berr != nil {
						return cmdutil.UsageError{Err: fmt.Errorf("--repo %s: %s is not a git repository", name, abs)}
					}
				}
				repos[name] = abs
			}
			for _, r := range resolvers {
				if _, err := config.ParseResolver(r); err != nil {
					return cmdutil.UsageError{Err: fmt.Errorf("--resolver %q: %v", r, err)}
				}
			}
			if len(resolvers) > 3 {
				return cmdutil.UsageError{Err: fmt.Errorf("--resolver: %d given, at most 3", len(resolvers))}
			}
			if sandboxPath != "" {
				if err := runspec.ValidPath(sandboxPath); err != nil {
					return cmdutil.UsageError{Err: fmt.Errorf("--sandbox-path: %v", err)}
				}
			}
			for _, d := range domains {
				if _, err := egress.NormalizeName(d); err != nil {
					return cmdutil.UsageError{Err: fmt.Errorf("--egress-domain %q: %v", d, err)}
				}
			}
			creds, err := parseCredentialBrokers(brokers, brokerApprovals)
			if err != nil {
				return cmdutil.UsageError{Err: err}
			}
			for i, ca := range extraCAs {
				if extraCAs[i], err = filepath.Abs(ca); err != nil {
					return err
				}
				if st, err := os.Stat(extraCAs[i]); err != nil || !st.Mode().IsRegular() {
					return cmdutil.UsageError{Err: fmt.Errorf("--extra-ca %s: not a readable regular file", ca)}
				}
			}
			if registry && bins[devRegistryName] == "" {
				where := "beside airlock"
				if binDir != "" {
					where = "in " + binDir
				}
				return fmt.Errorf("--registry: no registry binary %s (build it with `make build`)", where)
			}
			if warmPool < 0 || warmPool > runspec.MaxWarmPool {
				return cmdutil.UsageError{Err: fmt.Errorf("--warm-pool %d: want 0 to %d", warmPool, runspec.MaxWarmPool)}
			}
			if otlp != "" {
				if err := config.CheckAddress(otlp); err != nil {
					return cmdutil.UsageError{Err: fmt.Errorf("--otlp-endpoint %q: %v", otlp, err)}
				}
			}
			opts := devOptions{host: host, repos: repos, resolvers: resolvers, domains: domains, sandboxPath: sandboxPath, registry: registry,
				credentials: creds, extraCAs: extraCAs, warmPool: warmPool, otlp: otlp}
			stack, err := devUp(ctx, abs, opts, bins, g.Stderr)
			if err != nil {
				return err
			}
			clientPath := filepath.Join(abs, "client.yaml")
			out := map[string]any{"dir": abs, "client_config": clientPath, "services": stack.services}
			if stack.git != nil {
				out["git"], out["repositories"] = stack.git, stack.repos
			}
			if stack.registry != nil {
				out["registry"] = stack.registry
			}
			return g.Print(out, func(w io.Writer) {
				fmt.Fprintln(w, "SERVICE\tADDRESS\tPID\tSTATUS\tLOG")
				for _, s := range stack.all() {
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", s.Name, s.Address, s.PID, s.Status, s.Log)
				}
				if len(stack.repos) > 0 {
					fmt.Fprintln(w)
				}
				for _, name := range slices.Sorted(maps.Keys(stack.repos)) {
					fmt.Fprintf(w, "repository %s: %s\n", name, stack.repos[name])
				}
				if r := stack.registry; r != nil {
					fmt.Fprintf(w, "\nregistry: https://%s (dev tenant's images: %s/%s*, push with `airlock dev image push --dir %s`)\n", r.Address, r.Address, devRegistryRepoPrefix, abs)
				}
				fmt.Fprintf(w, "\nexport %s=%s\n", clientconfig.EnvVar, clientPath)
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the stack's PKI, configs, data and logs (required)")
	cmdutil.Required(cmd, "dir")
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "where the authority, executor and publisher binaries are (default: beside airlock, then $PATH)")
	cmd.Flags().StringVar(&host, "host", "127.0.0.1", "address the services listen on")
	cmd.Flags().StringArrayVar(&repoFlags, "repo", nil, "NAME=PATH: a local git repository the dev tenant may run jobs on, served by the stack's git server (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for every process of the stack to serve, over all of dev up's starts")
	cmd.Flags().StringArrayVar(&resolvers, "resolver", nil, "IP[:PORT]: the DNS server the executor asks for jobs with a domains policy (repeatable, at most 3; default: the host's resolver)")
	cmd.Flags().StringVar(&sandboxPath, "sandbox-path", "", "the PATH jobs start with (the executor's sandbox.path), e.g. /usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin for a Go in /usr/local/go (default: the executor's)")
	cmd.Flags().BoolVar(&registry, "registry", false, "also run an OCI registry (bin/registry) on 127.0.0.1 whose dev/* images the dev tenant's jobs may run on")
	cmd.Flags().StringArrayVar(&domains, "egress-domain", nil, "NAME or *.SUFFIX the dev tenant's jobs may list with --allow-domain (repeatable; default: none, so domains jobs are refused)")
	cmd.Flags().StringArrayVar(&brokers, "credential-broker", nil, "NAME:HOST[,HOST...]:FILE: a brokered credential of the dev tenant, read from FILE and added as \"Authorization: Bearer VALUE\" to its jobs' requests to the hosts (NAME or *.SUFFIX, added to its egress domains); jobs ask for it with --credential NAME (repeatable)")
	cmd.Flags().StringArrayVar(&brokerApprovals, "credential-approval", nil, "NAME: a --credential-broker whose jobs wait for an approver's start approval (approval: required; repeatable)")
	cmd.Flags().StringVar(&otlp, "otlp-endpoint", "", "HOST:PORT: an OTLP/gRPC collector (plain text, on loopback) each service sends its traces and metrics to, every trace recorded")
	cmd.Flags().IntVar(&warmPool, "warm-pool", 0, "N: keep N sandboxes of the dev tenant's job shape started and ready on the executor (the tenant's warm_pool and the executor's warm_pool.max_sandboxes), so a session's first exec, or a job, starts at once; 0 to 16")
	cmd.Flags().StringArrayVar(&extraCAs, "extra-ca", nil, "PATH: a PEM CA file jobs and their egress proxy trust beside the host's (the executor's sandbox.extra_cas; repeatable)")
	return cmd
}

// devVMName is the vm runtime class's binary (make build puts it in bin/
// beside the guest agent it boots): optional, as runsc is.
const devVMName = "airlock-vm"

// findServiceBinaries locates the three service binaries.
func findServiceBinaries(binDir string) (map[string]string, error) {
	var dirs []string
	if binDir != "" {
		dirs = []string{binDir}
	} else if exe, err := os.Executable(); err == nil {
		dirs = []string{filepath.Dir(exe)}
	}
	bins := map[string]string{}
	for _, name := range append(identity.ServiceNames(), "runc", "runsc", devVMName, devRegistryName) {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				bins[name] = p
				break
			}
		}
		// The runtimes are never taken from $PATH: a distribution's runc may
		// lack security fixes the pinned one has. Nor is the registry: a
		// "registry" in $PATH may be anything.
		runtime := name == "runc" || name == "runsc" || name == devVMName
		if bins[name] == "" && binDir == "" && !runtime && name != devRegistryName {
			if p, err := exec.LookPath(name); err == nil {
				bins[name] = p
			}
		}
		if bins[name] == "" && (name == "runsc" || name == devVMName || name == devRegistryName) {
			continue // optional: the runsc or vm class, or dev up --registry, is then unavailable
		}
		if bins[name] == "" {
			where := "beside airlock or in $PATH"
			if runtime {
				where = "beside airlock"
			}
			if binDir != "" {
				where = "in " + binDir
			}
			return nil, fmt.Errorf("no %s binary %s (build it with `make build`)", name, where)
		}
	}
	return bins, nil
}

// devOptions are dev up's choices.
type devOptions struct {
	host  string
	repos map[string]string // repository name -> local git repository path
	// resolvers are the executor's upstream DNS servers for domains jobs
	// (network.resolvers); none is the host's.
	resolvers []string
	// domains are the names the dev tenant's jobs may list in a domains
	// policy (its egress ceiling).
	domains []string
	// sandboxPath is the executor's sandbox.path; "" keeps its default.
	sandboxPath string
	// registry runs the stack's OCI registry.
	registry bool
	// credentials are the dev tenant's brokered credentials.
	credentials []devCredential
	// extraCAs are the executor's sandbox.extra_cas.
	extraCAs []string
	// warmPool is the dev tenant's warm_pool and the executor's
	// warm_pool.max_sandboxes.
	warmPool int
	// otlp is the collector every service exports its telemetry to.
	otlp string
}

// devStack is what dev up started: the three services and, when it was
// given repositories, the git server and each repository's URL, and with
// --registry the registry.
type devStack struct {
	services []devService
	git      *devService
	repos    map[string]string
	registry *devService
}

func (s devStack) all() []devService {
	all := slices.Clone(s.services)
	for _, p := range []*devService{s.git, s.registry} {
		if p != nil {
			all = append(all, *p)
		}
	}
	return all
}

// devProcessNames are the processes a stack may run: the three services,
// then the git server and the registry they read.
func devProcessNames() []string {
	return append(identity.ServiceNames(), devGitName, devRegistryName)
}

func devUp(ctx context.Context, dir string, opts devOptions, bins map[string]string, progress io.Writer) (devStack, error) {
	for _, name := range devProcessNames() {
		if pid, ok := runningPID(dir, name); ok {
			return devStack{}, fmt.Errorf("%s is already running in %s (pid %d); run `airlock dev down --dir %s` first", name, dir, pid, dir)
		}
	}
	return startRetrying(ctx, progress, func(attempt int) (devStack, error) {
		return devStart(ctx, dir, opts, bins, progress, attempt)
	}, func() {
		// Stop what started, the services before the git server and the
		// registry they read.
		for _, name := range devProcessNames() {
			stopProcess(dir, name, 5*time.Second)
		}
	})
}

// devStartAttempts bounds how many times dev up starts a stack whose
// process lost its reserved port (startError.portTaken).
const devStartAttempts = 3

// startRetrying runs start (attempt 1), and after a failed start stop;
// when the failure was a process losing its port to another program in
// the moment it was not held, it starts again, on new ports, up to
// devStartAttempts times in all and while ctx lasts, saying so on
// progress.
func startRetrying(ctx context.Context, progress io.Writer, start func(attempt int) (devStack, error), stop func()) (devStack, error) {
	for attempt := 1; ; attempt++ {
		stack, err := start(attempt)
		if err == nil {
			return stack, nil
		}
		stop()
		var se *startError
		if !errors.As(err, &se) || !se.portTaken || attempt == devStartAttempts || ctx.Err() != nil {
			return stack, err
		}
		fmt.Fprintf(progress, "%s lost its port to another program before it bound it; starting the stack again on new ports\n", se.what)
	}
}

// devStart makes the stack's files and starts its processes; attempt
// counts the starts of one dev up (startRetrying).
func devStart(ctx context.Context, dir string, opts devOptions, bins map[string]string, progress io.Writer, attempt int) (devStack, error) {
	var stack devStack
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return stack, err
	}
	pkiDir := filepath.Join(dir, "pki")
	// A fresh PKI every time: nothing a previous stack handed out stays valid.
	if err := os.RemoveAll(pkiDir); err != nil {
		return stack, err
	}
	var callers []identity.ID
	for _, c := range devCallers {
		callers = append(callers, identity.MustParse("spiffe://"+devTrustDomain+"/"+c))
	}
	if _, err := pki.Init(pkiDir, devTrustDomain, callers); err != nil {
		return stack, err
	}
	// The git server and the registry listen on loopback only.
	hosts := []string{opts.host, opts.host, opts.host, "127.0.0.1", "127.0.0.1"}
	r, err := reserveAddresses(hosts)
	if err != nil {
		return stack, err
	}
	defer r.close()
	addrs := r.addrs
	gitAddr, registryAddr := addrs[3], addrs[4]
	services := map[string]*devService{}
	for i, name := range identity.ServiceNames() {
		s := devPaths(dir, name)
		s.Address = addrs[i]
		services[name] = &s
	}
	peer := func(name string) *config.Peer { return &config.Peer{Address: services[name].Address} }
	var git devGit
	if len(opts.repos) > 0 {
		if git, err = devGitSetup(ctx, dir, pkiDir, gitAddr, opts.repos, progress); err != nil {
			return stack, err
		}
		stack.git, stack.repos = git.server, git.urls
	}
	var registry devRegistry
	if opts.registry {
		if registry, err = devRegistrySetup(dir, pkiDir, registryAddr); err != nil {
			return stack, err
		}
		stack.registry = registry.server
	}
	grantKey := filepath.Join(dir, identity.ServiceAuthority, "grant.key")
	if _, err := grant.LoadOrCreateSigner(grantKey); err != nil {
		return stack, err
	}
	for _, name := range identity.ServiceNames() {
		s := services[name]
		cert, key := pki.Paths(pkiDir, identity.Service(devTrustDomain, name))
		file, err := yamlMap(config.Server{
			Version: config.Version, TrustDomain: devTrustDomain, Listen: s.Address, DataDir: s.DataDir,
			TLS: config.TLS{CA: pki.CAPath(pkiDir), Cert: cert, Key: key},
			Log: config.Log{Level: "info", Format: "json"}, ShutdownTimeout: 10 * time.Second,
			Telemetry: config.Telemetry{OTLPEndpoint: opts.otlp, Insecure: opts.otlp != ""},
		})
		if err != nil {
			return stack, err
		}
		switch name {
		case identity.ServiceAuthority:
			file["grant_key"] = grantKey
			policy := devTenantPolicy(git.tenantRepos, bins)
			creds, domains := credentialPolicy(opts.credentials, opts.domains)
			if len(domains) > 0 {
				policy["egress"].(map[string]any)["domains"] = domains
			}
			if len(creds) > 0 {
				policy["credentials"] = creds
			}
			if len(git.deployCredentials) > 0 {
				policy["deploy_credentials"] = git.deployCredentials
			}
			if registry.images != nil {
				policy["images"] = registry.images
			}
			if opts.warmPool > 0 {
				policy["warm_pool"] = opts.warmPool
			}
			file["tenants"] = map[string]any{devTenant: policy}
			// alice reads and verifies the whole log; a checkpoint of its
			// head is signed every 10 entries, or 10 s while entries come in.
			file["audit"] = map[string]any{"auditors": []string{"approver/alice"}, "checkpoint_every": 10, "checkpoint_interval": "10s"}
		case identity.ServiceExecutor:
			file["authority"] = map[string]any{"address": services[identity.ServiceAuthority].Address, "grant_public_key": grantKey + ".pub"}
			sandbox := map[string]any{"runc": bins["runc"]}
			if bins["runsc"] != "" {
				sandbox["runsc"] = bins["runsc"]
				// Stacks share the record of runsc's self-check, so it
				// runs once for the binaries, not at every dev up.
				if cache, err := os.UserCacheDir(); err == nil {
					sandbox["runsc_self_check_cache"] = filepath.Join(cache, "airlock")
				}
			}
			if bins[devVMName] != "" {
				// A development stack runs the vm class under emulation
				// where KVM is not usable; a production executor is
				// configured with it off (docs/operations.md).
				sandbox["vm"] = map[string]any{"runtime": bins[devVMName], "emulation": true}
			}
			if opts.sandboxPath != "" {
				sandbox["path"] = opts.sandboxPath
			}
			if len(opts.extraCAs) > 0 {
				sandbox["extra_cas"] = opts.extraCAs
			}
			file["sandbox"] = sandbox
			if len(opts.resolvers) > 0 {
				file["network"] = map[string]any{"resolvers": opts.resolvers}
			}
			if opts.warmPool > 0 {
				file["warm_pool"] = map[string]any{"max_sandboxes": opts.warmPool}
			}
		case identity.ServicePublisher:
			file["authority"] = map[string]any{"address": services[identity.ServiceAuthority].Address, "grant_public_key": grantKey + ".pub"}
		}
		if err := writeYAML(s.Config, file); err != nil {
			return stack, err
		}
	}
	client := &clientconfig.Config{
		Version: config.Version, TrustDomain: devTrustDomain, PKIDir: pkiDir, Identity: devIdentity, Tenant: devTenant,
		Authority: *peer(identity.ServiceAuthority), Executor: *peer(identity.ServiceExecutor), Publisher: *peer(identity.ServicePublisher),
	}
	if err := client.Save(filepath.Join(dir, "client.yaml")); err != nil {
		return stack, err
	}

	// The git server first: the authority fetches from it.
	if stack.git != nil {
		if err := devGitStart(ctx, dir, stack.git, pkiDir, r); err != nil {
			return stack, err
		}
		fmt.Fprintf(progress, "started %s (pid %d) on %s\n", devGitName, stack.git.PID, stack.git.Address)
	}
	if stack.registry != nil {
		if err := devRegistryStart(ctx, dir, bins[devRegistryName], stack.registry, pkiDir, r); err != nil {
			return stack, err
		}
		fmt.Fprintf(progress, "started %s (pid %d) on %s\n", devRegistryName, stack.registry.PID, stack.registry.Address)
	}
	exited := map[string]chan error{}
	for _, name := range identity.ServiceNames() {
		s := services[name]
		argv := []string{bins[name], "--config", s.Config}
		if name == identity.ServiceExecutor {
			// On a cgroup v2 host the executor needs a cgroup of its
			// own; systemd, where it runs the host, makes one.
			// A start again gets a scope of its own: systemd may not have
			// collected the stopped one's yet.
			sum := sha256.Sum256([]byte(dir))
			unit := "airlock-dev-" + hex.EncodeToString(sum[:6]) + "-executor"
			if attempt > 1 {
				unit += "-" + strconv.Itoa(attempt)
			}
			argv = append(delegate.ReadHost().Prefix(unit), argv...)
		}
		pid, done, err := startProcess(argv, nil, s, r)
		if err != nil {
			return stack, err
		}
		s.PID = pid
		exited[name] = done
		if err := writePID(dir, name, pid); err != nil {
			return stack, err
		}
		fmt.Fprintf(progress, "started %s (pid %d) on %s\n", name, pid, s.Address)
	}

	src, err := client.Source("")
	if err != nil {
		return stack, err
	}
	for _, name := range identity.ServiceNames() {
		if err := awaitServing(ctx, services[name], src, name, exited[name]); err != nil {
			return stack, err
		}
	}
	for _, name := range identity.ServiceNames() {
		stack.services = append(stack.services, *services[name])
	}
	return stack, nil
}

// awaitServing polls the started service s until it reports SERVING, it
// exits, or ctx ends. One connection serves every attempt: gRPC keeps
// making it while an attempt's short deadline passes.
func awaitServing(ctx context.Context, s *devService, src *tlsconfig.Source, name string, exited <-chan error) error {
	cc, err := grpcclient.Dial(s.Address, src, identity.Service(devTrustDomain, name))
	if err != nil {
		return err
	}
	defer cc.Close()
	return awaitStart(ctx, name, s, exited, func(ctx context.Context) (bool, string) {
		st, err := cmdutil.CheckHealthOn(ctx, cc, "")
		if err != nil {
			return false, err.Error()
		}
		if st != healthpb.HealthCheckResponse_SERVING.String() {
			return false, st
		}
		s.Status = st
		return true, ""
	})
}

// yamlMap turns a struct into the map its YAML form would decode to, so
// service-specific keys can be added beside the common ones.
func yamlMap(v any) (map[string]any, error) {
	data, err := yaml.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	return m, yaml.Unmarshal(data, &m)
}

// devTenantPolicy is the dev tenant: client/dev may run jobs on the given
// repositories (as the policy names them) with modest limits, in whichever
// runtime classes are built.
func devTenantPolicy(repos map[string]any, bins map[string]string) map[string]any {
	rs := map[string]any{}
	maps.Copy(rs, repos)
	classes := []string{"runc"}
	if bins["runsc"] != "" {
		classes = append(classes, "runsc")
	}
	if bins[devVMName] != "" {
		classes = append(classes, "vm")
	}
	return map[string]any{
		"clients":      []string{devIdentity},
		"repositories": rs,
		"limits": map[string]any{
			"default": map[string]any{"cpu_millis": 1000, "memory": "512MiB", "pids": 256, "disk": "1GiB", "deadline": "10m"},
			"max":     map[string]any{"cpu_millis": 2000, "memory": "4GiB", "pids": 4096, "disk": "8GiB", "deadline": "2h"},
		},
		"runtime_classes": classes,
		// A job may ask for any destination (the executor always refuses
		// link-local, metadata and its own addresses); widening a running
		// job's network or limits needs an approval.
		"egress": map[string]any{"cidrs": []string{"0.0.0.0/0", "::/0"}},
		// Its clients may reach an unprivileged port inside a running
		// session from their own loopback (session port-forward), for up
		// to 8 hours, without an approval.
		"port_forward": map[string]any{"ports": []string{"1024-65535"}, "default_ttl": "1h", "max_ttl": "8h"},
		// Any of the dev approvers, one approval; approver/dev is refused
		// for dev's own jobs and changes (the same person as client/dev).
		"approvals": map[string]any{"approvers": []string{"approver/alice", "approver/bob", "approver/dev"}, "required": 1, "ttl": "24h", "widening": "approve"},
	}
}

// devToken returns path, a file holding a random token (0600) made with
// the given prefix if missing and kept across dev up runs: a repository's
// source (read) and deploy (push) credential, which the stack's git server
// checks and the authority holds (it leases the deploy one, sealed, to the
// publisher after an approval is consumed).
func devToken(path, prefix string) (string, error) {
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return path, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return path, pki.WriteFileAtomic(path, []byte(prefix+hex.EncodeToString(b[:])+"\n"), 0o600)
}

func writeYAML(path string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return pki.WriteFileAtomic(path, data, 0o600)
}

func newDevDown(g *cmdutil.Globals) *cobra.Command {
	var dir string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down --dir DIR",
		Short: "Stop the dev stack started in DIR",
		Long: `Sends SIGTERM to each service of the stack in DIR, then to its git server
and its registry, waits for a graceful stop, and sends SIGKILL to any that are still running
after --timeout. Data, logs, the PKI and the served repositories stay in DIR.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			var stack devStack
			for _, name := range devProcessNames() {
				s := devPaths(abs, name)
				if name == devGitName || name == devRegistryName {
					if _, err := os.Stat(s.Config); err != nil {
						continue // a stack without repositories, or without --registry, has none
					}
				}
				s.PID, _ = readPID(abs, name)
				s.Status = stopProcess(abs, name, timeout)
				switch name {
				case devGitName:
					stack.git = &s
				case devRegistryName:
					stack.registry = &s
				default:
					stack.services = append(stack.services, s)
				}
			}
			out := map[string]any{"dir": abs, "services": stack.services}
			if stack.git != nil {
				out["git"] = stack.git
			}
			if stack.registry != nil {
				out["registry"] = stack.registry
			}
			return g.Print(out, func(w io.Writer) {
				fmt.Fprintln(w, "SERVICE\tPID\tRESULT")
				for _, s := range stack.all() {
					fmt.Fprintf(w, "%s\t%d\t%s\n", s.Name, s.PID, s.Status)
				}
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the directory given to dev up (required)")
	cmdutil.Required(cmd, "dir")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Second, "how long to wait for a graceful stop before SIGKILL")
	return cmd
}
