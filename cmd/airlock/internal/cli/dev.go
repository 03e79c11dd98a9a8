package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// The dev stack's fixed choices.
const (
	devTrustDomain = "airlock.local"
	devIdentity    = "client/dev"
	devTenant      = "dev"
)

// devCallers are the caller identities a dev stack issues, so every role in
// the flow can be tried from one terminal with --as.
var devCallers = []string{"client/dev", "approver/alice", "approver/bob", "approver/dev", "pipeline/deploy"}

// devService is one service of the dev stack and where its files live.
type devService struct {
	Name    string `json:"service"`
	Address string `json:"address,omitempty"`
	PID     int    `json:"pid"`
	Config  string `json:"config"`
	Log     string `json:"log"`
	DataDir string `json:"data_dir"`
	Status  string `json:"status"`
}

func devPaths(dir, name string) devService {
	sdir := filepath.Join(dir, name)
	return devService{
		Name:    name,
		Config:  filepath.Join(sdir, "config.yaml"),
		Log:     filepath.Join(sdir, name+".log"),
		DataDir: filepath.Join(sdir, "data"),
	}
}

func pidFile(dir, name string) string { return filepath.Join(dir, name, name+".pid") }

func newDev(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the three services as local processes for development",
	}
	cmd.AddCommand(newDevUp(g), newDevDown(g))
	return cmd
}

func newDevUp(g *globals) *cobra.Command {
	var dir, binDir, host string
	var repoFlags []string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "up --dir DIR [--repo NAME=PATH]...",
		Short: "Start authority, executor and publisher with a fresh PKI under DIR",
		Long: `Creates a fresh CA and identities in DIR/pki, writes a config for each
service, starts the three services as separate background processes, waits
until each reports SERVING over mTLS, and writes DIR/client.yaml for the CLI:

  export AIRLOCK_CONFIG=DIR/client.yaml
  airlock status

Logs go to DIR/SERVICE/SERVICE.log. Stop everything with airlock dev down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usageError{errors.New("--dir is required")}
			}
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
					return usageError{fmt.Errorf("--repo %q: want NAME=PATH", r)}
				}
				abs, err := filepath.Abs(path)
				if err != nil {
					return err
				}
				if _, err := os.Stat(filepath.Join(abs, ".git")); err != nil {
					if _, berr := os.Stat(filepath.Join(abs, "HEAD")); berr != nil {
						return usageError{fmt.Errorf("--repo %s: %s is not a git repository", name, abs)}
					}
				}
				repos[name] = abs
			}
			services, err := devUp(ctx, abs, devOptions{host: host, repos: repos}, bins, g.stderr)
			if err != nil {
				return err
			}
			clientPath := filepath.Join(abs, "client.yaml")
			return g.print(map[string]any{"dir": abs, "client_config": clientPath, "services": services}, func(w io.Writer) {
				fmt.Fprintln(w, "SERVICE\tADDRESS\tPID\tSTATUS\tLOG")
				for _, s := range services {
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", s.Name, s.Address, s.PID, s.Status, s.Log)
				}
				fmt.Fprintf(w, "\nexport %s=%s\n", clientconfig.EnvVar, clientPath)
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the stack's PKI, configs, data and logs (required)")
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "where the authority, executor and publisher binaries are (default: beside airlock, then $PATH)")
	cmd.Flags().StringVar(&host, "host", "127.0.0.1", "address the services listen on")
	cmd.Flags().StringArrayVar(&repoFlags, "repo", nil, "NAME=PATH: a local git repository the dev tenant may run jobs on (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for all three to serve")
	return cmd
}

// findServiceBinaries locates the three service binaries.
func findServiceBinaries(binDir string) (map[string]string, error) {
	var dirs []string
	if binDir != "" {
		dirs = []string{binDir}
	} else if exe, err := os.Executable(); err == nil {
		dirs = []string{filepath.Dir(exe)}
	}
	bins := map[string]string{}
	for _, name := range append(identity.ServiceNames(), "runc", "runsc") {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				bins[name] = p
				break
			}
		}
		// The runtimes are never taken from $PATH: a distribution's runc may
		// lack security fixes the pinned one has.
		runtime := name == "runc" || name == "runsc"
		if bins[name] == "" && binDir == "" && !runtime {
			if p, err := exec.LookPath(name); err == nil {
				bins[name] = p
			}
		}
		if bins[name] == "" && name == "runsc" {
			continue // optional: the runsc class is then unavailable
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
}

func devUp(ctx context.Context, dir string, opts devOptions, bins map[string]string, progress io.Writer) ([]devService, error) {
	for _, name := range identity.ServiceNames() {
		if pid, ok := runningPID(dir, name); ok {
			return nil, fmt.Errorf("%s is already running in %s (pid %d); run `airlock dev down --dir %s` first", name, dir, pid, dir)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pkiDir := filepath.Join(dir, "pki")
	// A fresh PKI every time: nothing a previous stack handed out stays valid.
	if err := os.RemoveAll(pkiDir); err != nil {
		return nil, err
	}
	var callers []identity.ID
	for _, c := range devCallers {
		callers = append(callers, identity.MustParse("spiffe://"+devTrustDomain+"/"+c))
	}
	if _, err := pki.Init(pkiDir, devTrustDomain, callers); err != nil {
		return nil, err
	}
	addrs, err := freeAddresses(opts.host, 3)
	if err != nil {
		return nil, err
	}
	services := map[string]*devService{}
	for i, name := range identity.ServiceNames() {
		s := devPaths(dir, name)
		s.Address = addrs[i]
		services[name] = &s
	}
	peer := func(name string) *config.Peer { return &config.Peer{Address: services[name].Address} }
	grantKey := filepath.Join(dir, identity.ServiceAuthority, "grant.key")
	if _, err := grant.LoadOrCreateSigner(grantKey); err != nil {
		return nil, err
	}
	for _, name := range identity.ServiceNames() {
		s := services[name]
		cert, key := pki.Paths(pkiDir, identity.Service(devTrustDomain, name))
		file, err := yamlMap(config.Server{
			Version: config.Version, TrustDomain: devTrustDomain, Listen: s.Address, DataDir: s.DataDir,
			TLS: config.TLS{CA: pki.CAPath(pkiDir), Cert: cert, Key: key},
			Log: config.Log{Level: "info", Format: "json"}, ShutdownTimeout: 10 * time.Second,
		})
		if err != nil {
			return nil, err
		}
		switch name {
		case identity.ServiceAuthority:
			file["executor"] = peer(identity.ServiceExecutor)
			file["grant_key"] = grantKey
			creds, err := devDeployCredentials(filepath.Join(dir, identity.ServiceAuthority, "credentials"), opts.repos)
			if err != nil {
				return nil, err
			}
			policy := devTenantPolicy(opts.repos, bins)
			if len(creds) > 0 {
				policy["deploy_credentials"] = creds
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
			}
			file["sandbox"] = sandbox
		case identity.ServicePublisher:
			file["authority"], file["executor"] = peer(identity.ServiceAuthority), peer(identity.ServiceExecutor)
		}
		if err := writeYAML(s.Config, file); err != nil {
			return nil, err
		}
	}
	client := &clientconfig.Config{
		Version: config.Version, TrustDomain: devTrustDomain, PKIDir: pkiDir, Identity: devIdentity, Tenant: devTenant,
		Authority: *peer(identity.ServiceAuthority), Executor: *peer(identity.ServiceExecutor), Publisher: *peer(identity.ServicePublisher),
	}
	if err := client.Save(filepath.Join(dir, "client.yaml")); err != nil {
		return nil, err
	}

	exited := map[string]chan error{}
	var started []string
	fail := func(err error) ([]devService, error) {
		for _, name := range started {
			stopProcess(dir, name, 5*time.Second)
		}
		return nil, err
	}
	for _, name := range identity.ServiceNames() {
		s := services[name]
		pid, done, err := startService(bins[name], s)
		if err != nil {
			return fail(err)
		}
		s.PID = pid
		started = append(started, name)
		exited[name] = done
		if err := pki.WriteFileAtomic(pidFile(dir, name), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
			return fail(err)
		}
		fmt.Fprintf(progress, "started %s (pid %d) on %s\n", name, pid, s.Address)
	}

	src, err := client.Source("")
	if err != nil {
		return fail(err)
	}
	for _, name := range identity.ServiceNames() {
		s := services[name]
		for {
			select {
			case err := <-exited[name]:
				return fail(fmt.Errorf("%s exited during start-up (%v); last log lines:\n%s", name, err, tail(s.Log, 20)))
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := checkHealth(cctx, s.Address, src, identity.Service(devTrustDomain, name), "")
			cancel()
			if err == nil && st == healthpb.HealthCheckResponse_SERVING.String() {
				s.Status = st
				break
			}
			if ctx.Err() != nil {
				return fail(fmt.Errorf("%s did not report SERVING in time (last: %s %v); last log lines:\n%s", name, st, err, tail(s.Log, 20)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var out []devService
	for _, name := range identity.ServiceNames() {
		out = append(out, *services[name])
	}
	return out, nil
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
// repositories with modest limits, in whichever runtime classes are built.
func devTenantPolicy(repos map[string]string, bins map[string]string) map[string]any {
	rs := map[string]any{}
	for name, path := range repos {
		rs[name] = map[string]any{"url": path}
	}
	classes := []string{"runc"}
	if bins["runsc"] != "" {
		classes = append(classes, "runsc")
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
		// Any of the dev approvers, one approval; approver/dev is refused
		// for dev's own jobs and changes (the same person as client/dev).
		"approvals": map[string]any{"approvers": []string{"approver/alice", "approver/bob", "approver/dev"}, "required": 1, "ttl": "24h", "widening": "approve"},
	}
}

// devDeployCredentials makes a stand-in deploy credential (a random token,
// 0600) for each repository, kept across dev up runs: the authority leases
// it, sealed, to the publisher after an approval is consumed.
func devDeployCredentials(dir string, repos map[string]string) (map[string]any, error) {
	out := map[string]any{}
	if len(repos) == 0 {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for name := range repos {
		path := filepath.Join(dir, name+".deploy")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			var b [24]byte
			if _, err := rand.Read(b[:]); err != nil {
				return nil, err
			}
			if err := pki.WriteFileAtomic(path, []byte("dev-deploy-token-"+hex.EncodeToString(b[:])+"\n"), 0o600); err != nil {
				return nil, err
			}
		}
		out[name] = path
	}
	return out, nil
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

// freeAddresses reserves n distinct free ports on host. They are released
// before the services bind them; a collision in that window fails start-up
// loudly rather than silently.
func freeAddresses(host string, n int) ([]string, error) {
	var out []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("--host %s: %w", host, err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// startService starts one service detached from this process, in its own
// session so it outlives the CLI and a terminal's signals.
func startService(bin string, s *devService) (int, chan error, error) {
	if err := os.MkdirAll(filepath.Dir(s.Log), 0o700); err != nil {
		return 0, nil, err
	}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--config", s.Config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd.Process.Pid, done, nil
}

func newDevDown(g *globals) *cobra.Command {
	var dir string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down --dir DIR",
		Short: "Stop the dev stack started in DIR",
		Long: `Sends SIGTERM to each service of the stack in DIR, waits for a graceful
stop, and sends SIGKILL to any that are still running after --timeout.
Data, logs and the PKI stay in DIR.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return usageError{errors.New("--dir is required")}
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			var out []devService
			for _, name := range identity.ServiceNames() {
				s := devPaths(abs, name)
				s.PID, _ = readPID(abs, name)
				s.Status = stopProcess(abs, name, timeout)
				out = append(out, s)
			}
			return g.print(map[string]any{"dir": abs, "services": out}, func(w io.Writer) {
				fmt.Fprintln(w, "SERVICE\tPID\tRESULT")
				for _, s := range out {
					fmt.Fprintf(w, "%s\t%d\t%s\n", s.Name, s.PID, s.Status)
				}
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the directory given to dev up (required)")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Second, "how long to wait for a graceful stop before SIGKILL")
	return cmd
}

func readPID(dir, name string) (int, error) {
	data, err := os.ReadFile(pidFile(dir, name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// runningPID returns the pid of the named service of the stack in dir if
// that process is alive and really is that service: a pid file can outlive
// its process, and the kernel reuses pids.
func runningPID(dir, name string) (int, bool) {
	pid, err := readPID(dir, name)
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("\x00"+devPaths(dir, name).Config+"\x00")) {
		return 0, false
	}
	return pid, alive(pid)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may hold spaces.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// stopProcess stops the named service gracefully, then by force, and says
// which it took.
func stopProcess(dir, name string, timeout time.Duration) string {
	defer os.Remove(pidFile(dir, name))
	pid, ok := runningPID(dir, name)
	if !ok {
		return "not running"
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return "not running"
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return "stopped"
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 100 {
		if !alive(pid) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "killed after " + timeout.String()
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
