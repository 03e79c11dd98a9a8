// Package server is the executor's composition root: it builds every part of
// the executor once from the validated config — the sandbox manager, the
// source cache, the run manager, the authority client and the API — runs
// it, and stops it. Only the executor's main imports it.
package server

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/pkg/authz"
	"github.com/airlockhq/airlock/pkg/daemon"
	"github.com/airlockhq/airlock/pkg/grant"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/logging"
	"github.com/airlockhq/airlock/pkg/provenance"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	"github.com/airlockhq/airlock/pkg/version"
	"github.com/airlockhq/airlock/services/executor/internal/api"
	"github.com/airlockhq/airlock/services/executor/internal/authorityclient"
	"github.com/airlockhq/airlock/services/executor/internal/cache"
	"github.com/airlockhq/airlock/services/executor/internal/config"
	"github.com/airlockhq/airlock/services/executor/internal/convert"
	"github.com/airlockhq/airlock/services/executor/internal/fleetclient"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/runs"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
)

// Run runs the executor until ctx is cancelled or a part of it fails.
func Run(ctx context.Context, cfg *config.Config) error {
	started := time.Now()
	logger, err := logging.New(os.Stderr, "executor", cfg.Log)
	if err != nil {
		return err
	}
	return daemon.Run(ctx, daemon.Spec{
		Name:    "executor",
		Version: version.String(),
		Config:  cfg.Server,
		Table:   authz.ExecutorTable,
		Logger:  logger,
		Start: func(ctx context.Context, env *daemon.Env) error {
			verifier, err := grant.NewFileVerifier(cfg.Authority.GrantPublicKey, logger)
			if err != nil {
				return err
			}
			if err := protectFromOOM(logger); err != nil {
				return err
			}
			sb, err := sandbox.New(sandbox.Config{
				StateDir:            env.DataDir.Join("sandbox"),
				RuncPath:            cfg.Sandbox.Runc,
				RunscPath:           cfg.Sandbox.Runsc,
				ExecdPath:           cfg.Sandbox.Execd,
				RunscPlatform:       cfg.Sandbox.RunscPlatform,
				RunscSelfCheckCache: cfg.Sandbox.RunscSelfCheckCache,
				UIDBase:             cfg.Sandbox.UIDBase,
				CgroupParent:        cfg.Sandbox.CgroupParent,
				DiskReadBPS:         cfg.Sandbox.DiskReadBPS.Bytes(),
				DiskWriteBPS:        cfg.Sandbox.DiskWriteBPS.Bytes(),
				Path:                cfg.Sandbox.Path,
				CABundle:            cfg.Sandbox.CAs,
				MemoryLimit:         cfg.Capacity.MemoryBytes,
				VM: sandbox.VMConfig{
					Path:      cfg.Sandbox.VM.Runtime,
					Kernel:    cfg.Sandbox.VM.Kernel,
					QEMU:      cfg.Sandbox.VM.QEMU,
					Emulation: cfg.Sandbox.VM.Emulation,
				},
				Logger: logger,
			})
			if err != nil {
				return err
			}
			env.OnStop(sb.Close)
			cg := sb.Cgroups()
			logger.Info("cgroups", "mode", cg.Mode, "controllers", cg.Controllers, "job_parent", cg.Parent)
			env.SetComponent(CgroupComponent(cg.Mode, ""), true)
			for _, ctl := range cg.Controllers {
				env.SetComponent(CgroupComponent(cg.Mode, ctl), true)
			}
			var classes []sandbox.Class
			for _, st := range sb.Probe(ctx) {
				if st.Available {
					classes = append(classes, st.Class)
				}
				logger.Info("runtime class", "class", st.Class, "available", st.Available, "version", st.Version, "reason", st.Reason, "self_check", st.SelfCheck, "self_check_cached", st.SelfCheckCached, "emulated", st.Emulated)
				env.SetComponent(RuntimeComponent(string(st.Class)), st.Available)
				if st.Platform != "" {
					env.SetComponent(RuntimeComponent(string(st.Class))+"/platform/"+st.Platform, st.Available)
				}
				if st.Emulated {
					env.SetComponent(RuntimeComponent(string(st.Class))+"/emulated", st.Available)
				}
				if st.SelfCheck != "" {
					env.SetComponent(RuntimeComponent(string(st.Class))+"/self-check", st.SelfCheck == sandbox.SelfCheckPassed)
				}
				if st.SelfCheckCached {
					// The pass an earlier start recorded for the same
					// binaries, kernel and CPU stood in for the check.
					env.SetComponent(RuntimeComponent(string(st.Class))+"/self-check/cached", true)
				}
			}
			// Per-component health: whether runc sessions' execs start
			// through the exec helper (fast) or with `runc exec`.
			helper, why := sb.ExecHelper()
			logger.Info("session exec path", "exec_helper", helper, "reason", why)
			env.SetComponent(RuntimeComponent(string(sandbox.ClassRunc))+"/exec-helper", helper)
			sources, err := stage.New(env.DataDir.Join("sources"), int(cfg.Sandbox.UIDBase), int(cfg.Sandbox.UIDBase))
			if err != nil {
				return err
			}
			cc, err := grpcclient.DialReplicas(cfg.Authority.Address, env.TLS, env.PeerID(identity.ServiceAuthority))
			if err != nil {
				return err
			}
			env.OnStop(cc.Close)
			self, err := env.TLS.ID()
			if err != nil {
				return err
			}
			netm, err := netpolicy.New(netpolicy.Config{
				Dir: env.DataDir.Join("netpolicy"), Logger: logger, Name: cfg.Network.Name,
				Pool4: cfg.Network.Pool4Prefix, MovablePool4: cfg.Network.Pool4Default, Pool6: cfg.Network.Pool6Prefix,
				AlwaysDeny: cfg.Network.AlwaysDenyPrefixes, MaxConnections: cfg.Network.MaxConnections,
			})
			if err != nil {
				return err
			}
			env.OnStop(netm.Close)
			if ids, err := netm.Recover(ctx); err != nil {
				return err
			} else if len(ids) > 0 {
				logger.Info("removed network namespaces left by an earlier run", "job_ids", ids)
			}
			caches, err := cache.New(cache.Config{
				Dir: env.DataDir.Join("caches"), IDBase: sb.UIDBase(), IDRange: sandbox.IDRange, Logger: logger,
			})
			if err != nil {
				return err
			}
			imgs, err := images.New(images.Config{
				Dir: env.DataDir.Join("images"), MaxBytes: cfg.Images.MaxSize.Bytes(),
				UIDBase: sb.UIDBase(), IDRange: sandbox.IDRange, Logger: logger, Meter: env.Meter,
			})
			if err != nil {
				return err
			}
			fence := fleetclient.NewFence(cfg.Fleet.FenceAfter, nil)
			authority := authorityclient.New(cc, env.TLS)
			mgr, err := runs.New(runs.Config{
				Dir:         env.DataDir.Join("runs"),
				Caches:      caches,
				Images:      imgs,
				DecodeGrant: convert.DecodeGrant,
				Sandbox:     sb,
				Sources:     sources,
				Network:     netm,
				Resolver:    resolverOf(cfg.Network.ResolverAddrs),
				Authority:   authority,
				Credentials: authority,
				Sign:        signer(env.TLS),
				Executor:    self.String(),
				OutputLimit: cfg.OutputLimit.Bytes(),
				Capacity: runs.Capacity{
					MemoryBytes: cfg.Capacity.MemoryBytes, CPUMillis: cfg.Capacity.CPUMillis,
					DiskBytes: cfg.Capacity.DiskBytes, Jobs: cfg.Capacity.Jobs,
				},
				Fence: fence,
				WarmPool: runs.WarmPool{
					MaxSandboxes: cfg.WarmPool.MaxSandboxes, PerTenant: cfg.WarmPool.PerTenant, MaxIdle: cfg.WarmPool.MaxIdle,
				},
				Meter:  env.Meter,
				Logger: logger,
			})
			if err != nil {
				return err
			}
			env.OnStop(func() error { mgr.Close(); return nil })
			fleet, err := fleetclient.New(fleetclient.Config{
				Authority: cc, Address: cfg.Advertise, Runs: mgr, Images: imgs, Sources: sources, Classes: classes,
				Pools:   netm.Pools(),
				Version: version.String(), StartedAt: started, Fence: fence, Meter: env.Meter, Logger: logger,
			})
			if err != nil {
				return err
			}
			env.OnStop(fleet.Close)
			if err := mgr.Recover(ctx); err != nil {
				return err
			}
			env.Go(fleet.Run)
			api.New(api.Config{Runs: mgr, Caches: caches, Images: imgs, Verifier: verifier, Self: self, Logger: logger}).Register(env.Server)
			return nil
		},
	})
}

// executorOOMScoreAdj is the executor's own OOM score adjustment: low, so
// that when the host runs short of memory the kernel kills jobs (1000,
// package sandbox) and most else first, but not -1000, which would leave
// a leaking executor unkillable.
const executorOOMScoreAdj = -900

// protectFromOOM lowers the executor's OOM score adjustment; package
// sandbox raises the runtimes it starts and every job process to 1000.
// Lowering needs CAP_SYS_RESOURCE, which a container may withhold even
// from root: without it the executor keeps its score, still below every
// job's, and says so.
func protectFromOOM(logger *slog.Logger) error {
	err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(executorOOMScoreAdj)), 0)
	if errors.Is(err, fs.ErrPermission) {
		logger.Warn("the executor cannot lower its oom_score_adj (no CAP_SYS_RESOURCE); jobs, at 1000, are still the OOM killer's first choice",
			"oom_score_adj", executorOOMScoreAdj)
		return nil
	}
	if err != nil {
		return fmt.Errorf("set the executor's oom_score_adj to %d: %w", executorOOMScoreAdj, err)
	}
	return nil
}

// CgroupComponent is the health service name under which the executor
// reports its cgroup mode ("cgroup/v2") and each controller its jobs use
// ("cgroup/v2/memory"), always SERVING: the executor does not start
// without them.
func CgroupComponent(mode, controller string) string {
	if controller == "" {
		return "cgroup/" + mode
	}
	return "cgroup/" + mode + "/" + controller
}

// RuntimeComponent is the health service name under which the executor
// reports whether it can run a runtime class. Below it, for runsc:
// "runtime/runsc/platform/PLATFORM" (gVisor's platform, with the class's
// status) and "runtime/runsc/self-check" (SERVING when the self-check job
// passed, NOT_SERVING when runsc failed it and is refused); for vm,
// "runtime/vm/emulated" when its machines run under QEMU's software
// emulation (TCG) rather than KVM, with the class's status.
func RuntimeComponent(class string) string { return "runtime/" + class }

// signer signs provenance with the executor's current mTLS key, so the
// statement carries the same SPIFFE identity the executor proves on every
// connection.
func signer(src *tlsconfig.Source) runs.Signer {
	return func(name, digest string, run provenance.Run) ([]byte, error) {
		cert, err := src.Certificate()
		if err != nil {
			return nil, err
		}
		key, ok := cert.PrivateKey.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("executor key %T cannot sign", cert.PrivateKey)
		}
		var chain []*x509.Certificate
		for _, der := range cert.Certificate {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, err
			}
			chain = append(chain, c)
		}
		return provenance.Sign(name, digest, run, key, chain)
	}
}

// resolverOf is the resolver of domains jobs: network.resolvers, or the
// host's when none are configured.
func resolverOf(addrs []netip.AddrPort) runs.Resolver {
	if len(addrs) == 0 {
		return nil
	}
	return runs.UpstreamResolver(addrs)
}
