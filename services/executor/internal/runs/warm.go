package runs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/pkg/egress"
	"github.com/airlockhq/airlock/pkg/ids"
	"github.com/airlockhq/airlock/pkg/runspec"
	"github.com/airlockhq/airlock/services/executor/internal/netpolicy"
	"github.com/airlockhq/airlock/services/executor/internal/sandbox"
	"github.com/airlockhq/airlock/services/executor/internal/stage"
	"github.com/airlockhq/airlock/services/executor/internal/warmpool"
)

// Warm pools. Making a sandbox is most of the time from a session's
// creation to its first exec's output, and of a short job's: a runtime
// started, an exec helper started in it. A tenant's policy (warm_pool, in
// each grant) asks each executor to keep that many sandboxes of its job
// shape made and started ahead of time; this executor keeps at most
// WarmPool's bounds. A job or session whose grant matches a ready one's
// shape claims it (sandbox.Sandbox.Claim): its /work goes in, its limits
// and network policy are put in force, and a session is ready at once, a
// job's command starts as the sandbox's main exec. The pool makes another
// in the background. A pooled sandbox is made for one tenant and claimed
// by one run, never another tenant's, never twice; it holds nothing of any
// job before its claim.
//
// The shape is learned: the first run of a tenant's shape on an executor
// asks the pool for that shape (and misses), later ones find it warm. A
// tenant keeps at most maxTenantShapes shapes; a newer one drops the
// oldest.

// WarmPool bounds the executor's pooled sandboxes.
type WarmPool struct {
	// MaxSandboxes bounds the pooled sandboxes on this executor, every
	// tenant's together; 0 keeps none, whatever tenants ask.
	MaxSandboxes int
	// PerTenant bounds what one tenant's policy may ask for one shape;
	// 0 is MaxSandboxes.
	PerTenant int
	// MaxIdle is how long a pooled sandbox waits for its claim before it
	// is made again; 0 is an hour.
	MaxIdle time.Duration
}

// maxTenantShapes bounds the shapes kept warm for one tenant, and
// shapeHold is how long a shape stays before a newer one may replace it:
// a tenant whose runs cycle through more shapes than that does not make
// the executor make and discard sandboxes without end (the newer shapes
// are made cold meanwhile).
const (
	maxTenantShapes = 2
	shapeHold       = time.Minute
)

// tenantShape is a shape kept for a tenant and when it was learned.
type tenantShape struct {
	key     poolKey
	learned time.Time
}

// poolKey is what a pooled sandbox is made for: a job or session of this
// tenant, runtime class, user, disk limit and /dev/shm size claims it.
type poolKey struct {
	Tenant    string
	Class     sandbox.Class
	User      runspec.User
	DiskBytes int64
	ShmBytes  int64
}

func (k poolKey) String() string {
	return fmt.Sprintf("%s %s %d:%d disk %d shm %d", k.Tenant, k.Class, k.User.UID, k.User.GID, k.DiskBytes, k.ShmBytes)
}

// pooled is one ready sandbox and its network namespace (nil without
// Config.Network).
type pooled struct {
	sb  *sandbox.Sandbox
	net *netpolicy.Net
}

// Why a session was not given a pooled sandbox (metrics' cause).
const (
	poolMissNone    = "no_pool"     // its tenant asks for none, or the executor keeps none
	poolMissEmpty   = "empty"       // none of its shape was ready
	poolMissClass   = "class"       // not runc
	poolMissImage   = "image"       // an image
	poolMissCaches  = "caches"      // named caches
	poolMissDomains = "domains"     // a domains policy (its egress proxy is its own)
	poolMissKept    = "kept"        // a session made again after a restart
	poolMissOther   = "other"       // docker, brokered credentials
	poolMissFailed  = "claim_error" // a claim failed: the cold path made it
	poolMissExecd   = "no_execd"    // the exec helper cannot run here
)

// keyOf is g's shape: a job and a session of one shape share a pool.
func keyOf(g Grant) poolKey {
	return poolKey{Tenant: g.Tenant, Class: g.Class, User: g.User, DiskBytes: g.Limits.DiskBytes,
		ShmBytes: sandbox.ShmSize(g.Limits)}
}

// poolCause says why g cannot be served from a pool, "" if it can.
func (m *Manager) poolCause(e *entry, g Grant) string {
	helper, _ := m.cfg.Sandbox.ExecHelper()
	switch {
	case g.Class != sandbox.ClassRunc:
		return poolMissClass
	case g.Image != nil:
		return poolMissImage
	case len(g.Caches) > 0:
		return poolMissCaches
	case g.Network.domains():
		return poolMissDomains
	case e.kept:
		return poolMissKept
	case g.Docker || len(g.Credentials) > 0:
		return poolMissOther
	case !helper:
		return poolMissExecd
	case g.WarmPool <= 0 || m.pool == nil:
		return poolMissNone
	}
	return ""
}

// newPool makes the pool (nil when the executor keeps none).
func (m *Manager) newPool() error {
	w := m.cfg.WarmPool
	if w.MaxSandboxes <= 0 {
		return nil
	}
	p, err := warmpool.New(warmpool.Config[poolKey, pooled]{
		Make: m.makePooled, Discard: m.discardPooled, Max: w.MaxSandboxes, Room: m.poolRoom,
		Paused: func() bool {
			if m.cfg.Fence == nil {
				return false
			}
			fenced, _ := m.cfg.Fence.Fenced()
			return fenced
		},
		MaxIdle: w.MaxIdle, Now: m.cfg.Now, Logger: m.cfg.Logger,
	})
	if err != nil {
		return err
	}
	m.pool, m.shedKick = p, make(chan struct{}, 1)
	return nil
}

// startPool runs the pool until the manager closes (after Recover: no
// sandbox may be made before).
func (m *Manager) startPool() {
	if m.pool == nil {
		return
	}
	m.wg.Add(2)
	go func() { defer m.wg.Done(); m.pool.Run(m.ctx) }()
	go func() {
		defer m.wg.Done()
		for {
			select {
			case <-m.ctx.Done():
				return
			case <-m.shedKick:
				m.shedPool()
			}
		}
	}()
}

// kickShed asks for a shedPool pass, after an admission: pooled sandboxes
// give their room back to runs. Admissions that come while a pass is
// pending share it.
func (m *Manager) kickShed() {
	if m.pool == nil {
		return
	}
	select {
	case m.shedKick <- struct{}{}:
	default:
	}
}

// poolLimits are a pooled sandbox's limits until its claim: its shape's
// disk and /dev/shm, and little else.
func poolLimits(k poolKey) sandbox.Limits {
	return sandbox.Limits{CPUMillis: 500, MemoryBytes: 2 * k.ShmBytes, Pids: 64, DiskBytes: k.DiskBytes, Deadline: 24 * time.Hour}
}

// poolIdleMemory is what admission counts a ready pooled sandbox as
// holding of memory: its idle init, sleep and exec helper.
const poolIdleMemory = 16 << 20

// poolRoom says whether one more pooled sandbox of k fits beside what the
// runs hold and the pool holds (held): a pooled sandbox holds its disk
// limit and poolIdleMemory, and no CPU or job.
func (m *Manager) poolRoom(k poolKey, held map[poolKey]int) bool {
	m.mu.Lock()
	h := m.held(nil)
	m.mu.Unlock()
	addPool(&h, held)
	return m.cfg.Capacity.fits(h, sandbox.Limits{MemoryBytes: poolIdleMemory, DiskBytes: k.DiskBytes}, nil) == nil
}

// addPool adds what the pool's sandbox counts hold to h.
func addPool(h *holding, held map[poolKey]int) {
	for k, n := range held {
		h.memory += int64(n) * poolIdleMemory
		h.disk += int64(n) * k.DiskBytes
	}
}

// shedPool discards ready pooled sandboxes while the runs and the pool
// together hold more than the capacity: runs come first.
func (m *Manager) shedPool() {
	if m.pool == nil {
		return
	}
	for {
		m.mu.Lock()
		h := m.held(nil)
		m.mu.Unlock()
		addPool(&h, m.pool.Held())
		if m.cfg.Capacity.fits(h, sandbox.Limits{}, nil) == nil {
			return
		}
		if m.pool.Shed(1) == 0 {
			return
		}
		m.metrics.poolDiscarded("capacity")
	}
}

// makePooled makes one pooled sandbox of k, with a deny-all network
// namespace of its own.
func (m *Manager) makePooled(ctx context.Context, k poolKey) (_ pooled, err error) {
	began := time.Now()
	defer func() { m.metrics.poolRefilled(k.Class, time.Since(began), err) }()
	name := sandbox.PoolPrefix + ids.New()
	var n *netpolicy.Net
	if m.cfg.Network != nil {
		if n, err = m.cfg.Network.Create(ctx, name, netpolicy.Policy{}, netpolicy.Pooled()); err != nil {
			return pooled{}, err
		}
	}
	ws := sandbox.WarmSpec{Name: name, Class: k.Class, User: k.User, Limits: poolLimits(k)}
	if n != nil {
		ws.NetNS = n.Path()
	}
	sb, err := m.cfg.Sandbox.Warm(ctx, ws)
	if err != nil {
		if n != nil {
			m.closeNet(n)
		}
		return pooled{}, err
	}
	return pooled{sb: sb, net: n}, nil
}

// discardPooled destroys a pooled sandbox no claim took.
func (m *Manager) discardPooled(p pooled) {
	if err := p.sb.Destroy(); err != nil {
		m.cfg.Logger.Error("destroy a pooled sandbox", "name", p.sb.Name(), "error", err)
	}
	if p.net != nil {
		m.closeNet(p.net)
	}
}

// learnPool sets the target of g's shape from its tenant's policy, capped
// by the executor's bounds; a tenant's shapes beyond maxTenantShapes drop
// the oldest.
func (m *Manager) learnPool(k poolKey, asked int) {
	n := min(asked, m.cfg.WarmPool.MaxSandboxes)
	if per := m.cfg.WarmPool.PerTenant; per > 0 {
		n = min(n, per)
	}
	// Under poolMu throughout: the targets are what poolShapes says.
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	shapes := m.poolShapes[k.Tenant]
	i := slices.IndexFunc(shapes, func(x tenantShape) bool { return x.key == k })
	switch {
	case n <= 0 && i < 0:
		return
	case n <= 0:
		shapes = slices.Delete(shapes, i, i+1)
		m.pool.SetTarget(k, 0)
	case i >= 0:
		// Kept; its learned time stays, so a shape in use is not held
		// against a newer one for ever.
	case len(shapes) >= maxTenantShapes && m.cfg.Now().Sub(shapes[0].learned) < shapeHold:
		return // the oldest is too new to replace: this one is made cold
	default:
		shapes = append(shapes, tenantShape{key: k, learned: m.cfg.Now()})
		for len(shapes) > maxTenantShapes {
			m.pool.SetTarget(shapes[0].key, 0)
			shapes = shapes[1:]
		}
	}
	if len(shapes) == 0 {
		delete(m.poolShapes, k.Tenant)
	} else {
		m.poolShapes[k.Tenant] = shapes
	}
	if n > 0 && m.pool.Target(k) != n {
		m.pool.SetTarget(k, n)
	}
}

// fromPool gives run e a pooled sandbox claimed for spec, if g's shape has
// one ready: its namespace takes g's policy, the sandbox g's /work, limits
// and bundle. On a miss, or a claim that fails (the sandbox is
// discarded), ok is false and the caller makes one as before.
func (m *Manager) fromPool(ctx context.Context, e *entry, g Grant, spec sandbox.Spec, src *stage.Source) (_ *sandbox.Sandbox, _ *netpolicy.Net, ok bool) {
	cause := m.poolCause(e, g)
	if (cause == "" || cause == poolMissNone) && m.pool != nil {
		m.learnPool(keyOf(g), g.WarmPool)
	}
	if cause != "" {
		m.metrics.poolClaimed(false, cause, 0)
		return nil, nil, false
	}
	p, hit := m.pool.Take(keyOf(g))
	if !hit {
		m.metrics.poolClaimed(false, poolMissEmpty, 0)
		return nil, nil, false
	}
	began := time.Now()
	log := m.cfg.Logger.With("job_id", g.JobID, "pooled", p.sb.Name())
	err := func() error {
		if p.net != nil {
			// A failure here is not the run's: it is made cold after.
			if err := p.net.Claim(ctx, g.JobID, g.Network.Net, g.NetworkGeneration); err != nil {
				return fmt.Errorf("network policy: %w", err)
			}
			spec.NetNS = p.net.Path()
		}
		return p.sb.Claim(spec)
	}()
	if err != nil {
		log.Warn("a pooled sandbox could not be claimed; making one", "error", err)
		m.discardPooled(p)
		m.metrics.poolClaimed(false, poolMissFailed, 0)
		return nil, nil, false
	}
	if p.net != nil {
		m.update(e, func(r *Run) { r.NetworkUpdatedAt = m.cfg.Now() })
	}
	m.seedGit(p.sb, g, src)
	m.metrics.poolClaimed(true, "", time.Since(began))
	log.Info("run given a pooled sandbox", "took", time.Since(began))
	return p.sb, p.net, true
}

// maxPoolError bounds the text of a pool's last error in its status.
const maxPoolError = 512

// PoolStatus is one shape's pool on this executor, for the heartbeat's
// report.
type PoolStatus struct {
	Tenant       string
	Class        sandbox.Class
	User         runspec.User
	DiskBytes    int64
	ShmBytes     int64
	Ready        int
	Target       int
	Hits, Misses int64
	RefillLast   time.Duration
	RefillMedian time.Duration
	LastError    string
}

// WarmPools reports each shape the executor keeps warm, or counted a
// claim of.
func (m *Manager) WarmPools() []PoolStatus {
	if m.pool == nil {
		return nil
	}
	var out []PoolStatus
	for _, s := range m.pool.Status() {
		out = append(out, PoolStatus{Tenant: s.Key.Tenant, Class: s.Key.Class, User: s.Key.User, DiskBytes: s.Key.DiskBytes, ShmBytes: s.Key.ShmBytes,
			Ready: s.Ready, Target: s.Target, Hits: s.Hits, Misses: s.Misses, RefillLast: s.RefillLast, RefillMedian: s.RefillMedian,
			LastError: egress.Cut(strings.ToValidUTF8(s.LastError, "\uFFFD"), maxPoolError)})
	}
	return out
}
