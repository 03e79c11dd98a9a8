package runs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/services/executor/internal/images"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/worktree"
)

// execute runs one job from staging to report.
func (m *Manager) execute(ctx context.Context, e *entry) {
	// What identifies the job never changes; limits and network policy
	// are read from the grant in force when the sandbox is made.
	m.mu.Lock()
	g := e.run.Grant
	m.mu.Unlock()
	log := m.cfg.Logger.With("job_id", g.JobID, "tenant", g.Tenant)
	// Closed on every path; the bundle reads the files by name, not these handles.
	defer e.stdout.close()
	defer e.stderr.close()
	fail := func(err error) {
		state, reason := Failed, sandbox.Reason("sandbox_error")
		switch {
		case ctx.Err() != nil:
			state, reason = Cancelled, sandbox.Reason("cancelled")
		case errors.Is(err, ErrCredential):
			reason = ReasonCredentialUnavailable
		}
		log.Error("run failed", "error", err)
		m.finish(e, state, &Result{Reason: reason, ExitCode: -1, Message: err.Error()})
	}
	makeCtx := ctx
	if e.kept {
		// A session kept across a restart is made again whatever its
		// client asks meanwhile: a finish or cancel takes effect once its
		// sandbox exists, and finds its files there.
		makeCtx = m.ctx
	}
	// failEarly is fail before the sandbox exists. A kept session's files
	// stay kept while the executor stops (the next start tries again);
	// otherwise they are of no more use.
	failEarly := func(err error) {
		if e.kept {
			if m.ctx.Err() != nil {
				log.Info("executor stopping while a kept session was being made again; its files stay kept", "error", err)
				return
			}
			if derr := m.cfg.Sandbox.DiscardKept(g.JobID); derr != nil {
				log.Error("discard a kept session's files", "error", derr)
			}
		}
		fail(err)
	}
	tctx := trace.ContextWithSpanContext(context.Background(), e.trace)
	_, span := tracer.Start(tctx, "runs.stage_source")
	src, err := m.cfg.Sources.Get(makeCtx, stage.Key{Tenant: g.Tenant, Repository: g.Repository, Commit: g.Commit, Depth: g.HistoryDepth},
		func(ctx context.Context) (stage.Header, io.ReadCloser, error) {
			return m.cfg.Authority.FetchSource(ctx, g.JobID)
		})
	span.End()
	if err != nil {
		failEarly(fmt.Errorf("stage source: %w", err))
		return
	}
	var img *images.Image
	if g.Image != nil {
		img, err = m.cfg.Images.Acquire(makeCtx, images.Ref{Tenant: g.Tenant, JobID: g.JobID,
			Registry: g.Image.Registry, Repository: g.Image.Repository, Digest: g.Image.Digest}, m.cfg.Authority)
		if err != nil {
			failEarly(fmt.Errorf("pull image: %w", err))
			return
		}
		// After the sandbox is gone (deferred calls run last first).
		defer img.Release()
	}
	if err := m.waitFence(makeCtx, e); err != nil {
		failEarly(err)
		return
	}
	_, span = tracer.Start(tctx, "runs.make_sandbox")
	sb, err := m.makeSandbox(makeCtx, e, src, img)
	if err != nil {
		span.End()
		failEarly(err)
		return
	}
	span.SetAttributes(attribute.Bool("airlock.pooled", strings.HasPrefix(sb.Name(), sandbox.PoolPrefix)))
	span.End()
	// keep is set when the executor stops under a session: its files
	// outlive this process (Recover).
	keep := false
	defer func() {
		e.filesMu.Lock()
		defer e.filesMu.Unlock()
		e.updateMu.Lock()
		defer e.updateMu.Unlock()
		destroy := sb.Destroy
		if keep {
			destroy = sb.DestroyKeeping
		}
		if err := destroy(); err != nil {
			log.Error("destroy sandbox", "keep_files", keep, "error", err)
		}
		if keep {
			m.syncRecords()
		}
		if e.egress != nil {
			e.egress.close()
		}
		if e.net != nil {
			if keep {
				// The next start makes a new namespace, with new counters.
				sent, received := m.netBytes(e)
				m.update(e, func(r *Run) { r.NetSentBefore, r.NetReceivedBefore = sent, received })
			}
			m.closeNet(e.net)
		}
		if !keep {
			// A kept session keeps its generations for its next start.
			m.releaseCaches(e.caches)
		}
		m.mu.Lock()
		e.net = nil
		m.mu.Unlock()
		e.sb, e.egress, e.caches = nil, nil, nil
	}()
	m.mu.Lock()
	_, _, isSession := e.session()
	m.mu.Unlock()
	if !isSession {
		// A session runs once its sandbox is up (Spec.Ready).
		m.markRunning(e)
	}
	if isSession {
		idleCtx, stopIdle := context.WithCancel(ctx)
		defer stopIdle()
		m.wg.Add(1)
		go func() { defer m.wg.Done(); m.watchIdle(idleCtx, e) }()
	}
	var (
		res    sandbox.Result
		runErr error
	)
	if isSession {
		m.mu.Lock()
		if e.run.State != Running {
			_, e.readySpan = tracer.Start(tctx, "runs.start_sandbox")
		}
		m.mu.Unlock()
		res, runErr = m.runSession(ctx, e, sb)
	} else {
		_, span = tracer.Start(tctx, "runs.run")
		res, runErr = sb.Run(ctx)
		span.End()
	}
	// The job is gone: its egress record is complete once the proxy and
	// DNS server have stopped, before the bundle takes it.
	e.updateMu.Lock()
	if e.egress != nil {
		e.egress.close()
	}
	e.updateMu.Unlock()
	m.mu.Lock()
	abort := e.abort
	m.mu.Unlock()
	if abort != "" {
		// Update stopped the job: say why, not that someone cancelled it.
		res.Reason, res.ExitCode, res.Message, runErr = sandbox.ReasonSandboxError, -1, abort, nil
	}
	if runErr != nil && res.Reason == "" {
		fail(fmt.Errorf("run: %w", runErr))
		return
	}
	m.mu.Lock()
	stopped := e.stopping // a session its client finished or cancelled, or that sat idle
	m.mu.Unlock()
	if m.ctx.Err() != nil && abort == "" && isSession && stopped == "" {
		// The executor is shutting down under a session: it keeps its
		// files and waits, suspended, for the next start's Recover and
		// its client. Nothing is reported: it has not ended.
		keep = true
		m.update(e, func(r *Run) {
			// Asleep, falling asleep or being woken, it stays asleep: its
			// next call wakes it on the next start as on this one.
			why := ReasonExecutorRestarted
			if r.Suspended && r.SuspendReason == ReasonIdleTimeout || !r.Suspended && e.suspendWhy == ReasonIdleTimeout {
				why = ReasonIdleTimeout
			}
			r.beginSuspension(m.cfg.Now(), why)
		})
		log.Info("executor stopping: the session's files are kept for its next start")
		return
	}
	if m.ctx.Err() != nil && abort == "" && !isSession {
		// The executor is shutting down, not the caller cancelling: say so,
		// and leave the report to the next start's Recover.
		result := &Result{Reason: ReasonExecutorRestarted, ExitCode: -1, Class: res.Class, Usage: res.Usage,
			RuntimeVersion: res.RuntimeVersion, TemplateVersion: res.TemplateVersion, Image: imageOf(g), Message: "the executor shut down while this job was running"}
		m.account(e, result, false)
		m.finish(e, Failed, result)
		return
	}
	result := &Result{
		Reason: res.Reason, ExitCode: res.ExitCode, Usage: res.Usage, Class: res.Class,
		RuntimeVersion: res.RuntimeVersion, TemplateVersion: res.TemplateVersion, Image: imageOf(g), Message: res.Message,
	}
	m.account(e, result, isSession)
	// Every process of the job is gone: its caches' upper layers are final.
	e.updateMu.Lock()
	leases := e.caches
	e.updateMu.Unlock()
	result.Caches = m.commitCaches(g, leases, sb, res.Reason)
	// The patch and bundle are built even for a cancelled or timed-out run:
	// reviewers and operators may want to see what it did. What leaves the
	// sandbox is bounded by apparent size (export.go).
	exported := &bundle.Tally{Limit: g.Limits.DiskBytes}
	_, span = tracer.Start(tctx, "runs.export")
	defer func() { span.End() }() // on every path; ended before the report below
	patch, stat, err := m.diffJob(ctx, src, sb, exported)
	outDir := sb.OutDir()
	if exportRefused(result, err) {
		patch, stat, outDir = nil, worktree.DiffStat{}, ""
	} else if err != nil {
		fail(fmt.Errorf("compute patch: %w", err))
		return
	}
	setPatch(result, patch, stat)
	// The .git the job was given is its own to change; others it made
	// are worth a word.
	gitPaths := slices.DeleteFunc(stat.GitPaths, func(p string) bool { return p == ".git" && src.GitObjects != "" })
	if len(gitPaths) > 0 {
		note := fmt.Sprintf("left out of the patch: %d .git entries (%s)", len(gitPaths), strings.Join(gitPaths, ", "))
		result.Message = strings.TrimPrefix(result.Message+"; "+note, "; ")
	}
	err = m.writeBundle(e, result, patch, stat.Files, outDir, exported)
	if exportRefused(result, err) {
		setPatch(result, nil, worktree.DiffStat{})
		err = m.writeBundle(e, result, nil, nil, "", nil)
	}
	if err != nil {
		fail(fmt.Errorf("bundle: %w", err))
		return
	}
	state := Finished
	switch {
	case res.Reason == sandbox.ReasonCancelled:
		state = Cancelled
	case res.Reason == sandbox.ReasonSandboxError:
		state = Failed
	}
	span.End()
	m.finish(e, state, result)
}

// makeSandbox makes the job's network namespace and sandbox from the grant
// in force, which no Update changes meanwhile.
// imageOf is the reference of g's image, "" for the host template.
func imageOf(g Grant) string {
	if g.Image == nil {
		return ""
	}
	return g.Image.Reference()
}

func (m *Manager) makeSandbox(ctx context.Context, e *entry, src *stage.Source, img *images.Image) (*sandbox.Sandbox, error) {
	e.updateMu.Lock()
	defer e.updateMu.Unlock()
	m.mu.Lock()
	g := e.run.Grant
	m.mu.Unlock()
	spec := sandbox.Spec{
		ID:         g.JobID,
		Class:      g.Class,
		Source:     src.Dir,
		GitObjects: src.GitObjects,
		Command:    g.Command,
		Env:        g.Env,
		Limits:     g.Limits,
		User:       g.User,
		Docker:     g.Docker,
		Stdout:     e.stdout,
		Stderr:     e.stderr,
	}
	if g.Session != nil {
		spec.Command = sandbox.IdleCommand
		spec.Ready = func() { m.markRunning(e) }
	}
	if sb, n, ok := m.fromPool(ctx, e, g, spec, src); ok {
		m.mu.Lock()
		e.net = n
		m.mu.Unlock()
		e.sb = sb
		return sb, nil
	}
	if img != nil {
		spec.Image = &sandbox.ImageRoot{Digest: img.Digest, Layers: img.Layers, Env: img.Env, WorkingDir: img.WorkingDir}
	}
	var (
		n  *netpolicy.Net
		eg *jobEgress
	)
	if m.cfg.Network != nil {
		p := g.Network
		opts := append(netOptions(spec.Class, p), netpolicy.Generation(g.NetworkGeneration))
		var err error
		n, err = m.cfg.Network.Create(ctx, g.JobID, p.Net, opts...)
		var b *brokered
		if err == nil && p.domains() && len(g.Credentials) > 0 {
			// Leased before the proxy is made: its CA is made for their
			// hosts alone.
			if b, err = m.leaseCredentials(ctx, g); err != nil {
				m.closeNet(n)
				return nil, err
			}
		}
		if err == nil && p.domains() {
			// Fail closed: a domains job whose proxy or DNS server cannot
			// serve does not start.
			if eg, err = m.startEgress(g.JobID, n, p.Names, b, e.kept, func() { m.mu.Lock(); e.notify(); m.mu.Unlock() }); err != nil {
				m.closeNet(n)
				n = nil
				if b != nil {
					revokeLeases(m.cfg.Credentials, m.cfg.Logger.With("job_id", g.JobID), b.leases, "the job's start failed")
					err = fmt.Errorf("%w: %w", ErrCredential, err)
				}
			}
		}
		if err != nil {
			m.update(e, func(r *Run) { r.NetworkFailure = err.Error() })
			return nil, fmt.Errorf("network policy: %w", err)
		}
		m.update(e, func(r *Run) { r.NetworkUpdatedAt = m.cfg.Now() })
		spec.NetNS = n.Path()
		if eg != nil {
			env := maps.Clone(spec.Env)
			if env == nil {
				env = map[string]string{}
			}
			maps.Copy(env, eg.env())
			if b != nil {
				maps.Copy(env, b.env)
				spec.ExtraCAs = eg.proxy.CACertPEM()
			}
			spec.Env = env
			spec.Nameservers = eg.addrs[:1]
		} else if len(g.Credentials) > 0 {
			// Start refuses such a grant; defend.
			m.closeNet(n)
			return nil, fmt.Errorf("%w: the job has brokered credentials but no egress proxy to add them", ErrCredential)
		}
	}
	leases, mounts, err := m.openCaches(g)
	if err != nil {
		if eg != nil {
			eg.close()
		}
		if n != nil {
			m.closeNet(n)
		}
		return nil, err
	}
	spec.Caches = mounts
	if e.kept {
		// Its /work (its own .git among it) and /out as the previous
		// executor process left them.
		spec.Kept, spec.Started = true, e.run.StartedAt
	}
	began := time.Now()
	sb, err := m.cfg.Sandbox.Create(ctx, spec)
	m.metrics.sandboxMade(spec.Class, time.Since(began), err)
	if err != nil {
		m.releaseCaches(leases)
		if eg != nil {
			eg.close()
		}
		if n != nil {
			m.closeNet(n)
		}
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	m.seedGit(sb, g, src)
	m.mu.Lock()
	e.net = n
	m.mu.Unlock()
	e.sb, e.egress, e.caches = sb, eg, leases
	return sb, nil
}

// seedGit gives the job its own .git at its base commit; the patch never
// reads it. A kept session has its own already, unless the executor
// stopped before it was made (SeedGitDir leaves one that is there).
func (m *Manager) seedGit(sb *sandbox.Sandbox, g Grant, src *stage.Source) {
	if src.GitObjects == "" {
		return
	}
	uid, gid := sb.HostIDs()
	if err := worktree.SeedGitDir(sb.WorkDir(), g.Commit, src.Shallow, src.Index, uid, gid); err != nil {
		m.cfg.Logger.Warn("the job gets no .git", "job_id", g.JobID, "error", err)
	}
}

// closeNet removes a job's network namespace. Should that fail, it keeps
// trying in the background until it works or the executor stops (the next
// start's netpolicy Recover then removes what is left): netpolicy releases
// the job's addresses only once everything of it is gone.
func (m *Manager) closeNet(n *netpolicy.Net) {
	err := n.Close()
	if err == nil {
		return
	}
	log := m.cfg.Logger.With("job_id", n.ID())
	log.Error("remove network namespace; retrying in the background", "error", err)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for delay := 200 * time.Millisecond; ; delay = min(delay*2, 30*time.Second) {
			select {
			case <-m.ctx.Done():
				log.Error("network namespace not removed before the executor stopped; the next start removes it", "error", err)
				return
			case <-time.After(delay):
			}
			if err = n.Close(); err == nil {
				log.Info("network namespace removed after a retry")
				return
			}
			log.Warn("remove network namespace", "error", err, "retry_in", min(delay*2, 30*time.Second))
		}
	}()
}

// markRunning records run e running: a job once its sandbox is started,
// a session once its sandbox is up and takes execs (Spec.Ready), so its
// client, which waits for running, finds its first exec as fast as the
// others. A session running already (kept across a restart, or resumed)
// stays as it is.
func (m *Manager) markRunning(e *entry) {
	m.update(e, func(r *Run) {
		if e.readySpan != nil {
			e.readySpan.End()
			e.readySpan = nil
		}
		if r.State.Terminal() {
			return
		}
		r.State = Running
		if r.StartedAt.IsZero() { // a session kept across a restart started before
			r.StartedAt = m.cfg.Now()
		}
	})
}
