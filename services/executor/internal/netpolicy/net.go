package netpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// Net is one job's network namespace and the rules in force for it.
type Net struct {
	m     *Manager
	id    string
	path  string
	veth  string // the host end's name, whether or not it exists now
	table string
	fixed bool
	// pooled is a namespace made before any job (Pooled); job is the job
	// that claimed it (Claim), "" until one did.
	pooled bool
	job    string

	mu     sync.Mutex
	policy Policy
	gen    int64
	addr   jobAddrs // valid while slot >= 0
	// slot is the job's address slot while it has a veth, and after, until
	// no conntrack entry of its addresses is left.
	slot    int
	hasVeth bool
	// hasTable says the job's nftables table may exist: set before a
	// transaction that makes it, cleared once a delete succeeded. A
	// deny-all job that never had a veth never has a table at all.
	hasTable bool
	closed   bool
	// sent and received are the bytes of the veths already deleted
	// (jobBytes), for Bytes.
	sent, received int64
}

// CreateOption changes how Create makes a namespace.
type CreateOption func(*Net)

// FixedInterfaces is for a sandbox that reads the namespace's interfaces
// once, when it starts: gVisor's runsc copies them into its own network
// stack and never looks again. The namespace then keeps the interfaces it
// was created with. A job created with an allow policy keeps its veth for
// good, and a later deny-all policy drops everything at the host end
// instead of removing it; a job created deny-all has no veth, and Apply of
// an allow policy fails with ErrFixedInterfaces (start such a job with an
// allow policy if it may be widened later). Host-side rule changes (allow
// A to allow B) work either way.
func FixedInterfaces() CreateOption { return func(n *Net) { n.fixed = true } }

// Pooled is for a namespace made before its job, for a pooled sandbox: it
// is made deny-all, and the job that claims it puts its own policy in
// force with Claim, as whatever generation its grant says.
func Pooled() CreateOption { return func(n *Net) { n.pooled, n.gen = true, 0 } }

// Generation is the generation of the policy Create puts in force: the
// grant's network_policy_generation, at least 1. Without it, 1.
func Generation(gen int64) CreateOption { return func(n *Net) { n.gen = gen } }

func (m *Manager) newNet(id string) *Net {
	sum := sha256.Sum256([]byte(m.cfg.Name + "\x00" + id))
	h := hex.EncodeToString(sum[:])[:12]
	return &Net{
		m:     m,
		id:    id,
		path:  filepath.Join(m.nsDir, id),
		veth:  "alk" + h,
		table: m.cfg.Name + "_" + h,
		slot:  -1,
		gen:   1,
	}
}

// Create makes job id's namespace with p in force as generation 1, or the
// one the Generation option gives.
func (m *Manager) Create(ctx context.Context, id string, p Policy, opts ...CreateOption) (_ *Net, err error) {
	if !idFormat.MatchString(id) {
		return nil, fmt.Errorf("%w: netpolicy: job id %q: want 1 to 64 of [a-zA-Z0-9_-]", errdefs.ErrInvalidArgument, id)
	}
	p, err = p.normalize()
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	n := m.newNet(id)
	for _, o := range opts {
		o(n)
	}
	if n.pooled && !p.DenyAll() {
		return nil, fmt.Errorf("%w: netpolicy: %s: a pooled namespace is made deny-all", errdefs.ErrInvalidArgument, id)
	}
	if n.gen < 1 && !n.pooled {
		return nil, fmt.Errorf("%w: netpolicy: job %s: policy generation %d: want at least 1", errdefs.ErrInvalidArgument, id, n.gen)
	}
	m.mu.Lock()
	if _, dup := m.live[id]; dup {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: netpolicy: job %s already has a network namespace", errdefs.ErrAlreadyExists, id)
	}
	m.live[id] = n
	m.mu.Unlock()

	f, err := os.OpenFile(n.path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		m.forget(n)
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: netpolicy: job %s: a previous executor left its namespace %s behind; Recover removes it", errdefs.ErrAlreadyExists, id, n.path)
		}
		return nil, fmt.Errorf("netpolicy: job %s: %w", id, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			n.mu.Lock()
			cerr := n.teardown()
			n.mu.Unlock()
			if cerr != nil {
				// It stays live, with its address slot: Manager.Close
				// reports it, and the next start's Recover removes it.
				m.log.Error("netpolicy: undo a failed create; its leftovers stay until Recover", "job_id", id, "error", cerr)
				return
			}
			m.forget(n)
		}
	}()
	if err := makeNetns(n.path); err != nil {
		return nil, fmt.Errorf("netpolicy: job %s: %w", id, err)
	}
	if !p.DenyAll() {
		if err := n.addVeth(ctx, p); err != nil {
			return nil, err
		}
	}
	n.policy = p
	m.log.Info("netpolicy: namespace created", "job_id", id, "path", n.path, "generation", n.gen, "deny_all", p.DenyAll(), "veth", n.hasVeth)
	return n, nil
}

func (m *Manager) forget(n *Net) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[n.id] == n {
		delete(m.live, n.id)
	}
}

// Claim makes a pooled namespace (Pooled) job's, with p in force as
// generation gen (at least 1), as Apply does. A namespace not pooled, or
// claimed already, is refused. On error the namespace is of no more use.
func (n *Net) Claim(ctx context.Context, job string, p Policy, gen int64) error {
	if gen < 1 {
		return fmt.Errorf("%w: netpolicy: job %s: policy generation %d: want at least 1", errdefs.ErrInvalidArgument, job, gen)
	}
	n.mu.Lock()
	if !n.pooled || n.job != "" {
		n.mu.Unlock()
		return fmt.Errorf("%w: netpolicy: %s: not a pooled namespace waiting for a job", errdefs.ErrFailedPrecondition, n.id)
	}
	n.job = job
	n.mu.Unlock()
	if err := n.Apply(ctx, p, gen); err != nil {
		return err
	}
	n.m.log.Info("netpolicy: pooled namespace claimed", "name", n.id, "job_id", job)
	return nil
}

// Path is the namespace's path, for the OCI spec's network namespace.
func (n *Net) Path() string { return n.path }

// ID is the job id the namespace belongs to: for a pooled one, the name it
// was made under, whoever claimed it.
func (n *Net) ID() string { return n.id }

// CanApply reports the error Apply would return for reasons known before
// it touches the kernel: an invalid policy, a generation not higher than
// the current one, a closed namespace, or an interface the namespace
// cannot gain (ErrFixedInterfaces). A caller changing more than the
// network can check first, and change nothing when Apply would fail.
func (n *Net) CanApply(p Policy, gen int64) error {
	p, err := p.normalize()
	if err != nil {
		return fmt.Errorf("job %s: %w", n.id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.check(p, gen)
}

func (n *Net) check(p Policy, gen int64) error {
	switch {
	case n.closed:
		return fmt.Errorf("%w: netpolicy: job %s: namespace is closed", errdefs.ErrFailedPrecondition, n.id)
	case gen <= n.gen:
		return fmt.Errorf("%w: netpolicy: job %s: generation %d is not higher than the current %d", errdefs.ErrFailedPrecondition, n.id, gen, n.gen)
	case !p.DenyAll() && !n.hasVeth && n.fixed:
		return fmt.Errorf("job %s: %w: a deny-all namespace cannot gain an interface", n.id, ErrFixedInterfaces)
	}
	return nil
}

// Apply puts p in force as generation gen (higher than the current one)
// and returns once the rules are in the kernel and the job's connections
// p does not allow are cut (their conntrack entries removed, so no reply
// reaches the job). On error the previous policy stays in force.
func (n *Net) Apply(ctx context.Context, p Policy, gen int64) error {
	p, err := p.normalize()
	if err != nil {
		return fmt.Errorf("job %s: %w", n.id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.check(p, gen); err != nil {
		return err
	}
	switch {
	case !p.DenyAll() && !n.hasVeth:
		if err := n.addVeth(ctx, p); err != nil {
			return err
		}
	case p.DenyAll() && n.hasVeth && !n.fixed:
		if err := n.removeVeth(); err != nil {
			return err
		}
	case n.hasVeth:
		// One transaction: the kernel switches from the old rules to the
		// new ones at once, or keeps the old ones.
		n.hasTable = true
		if err := n.m.installRules(ctx, n, p); err != nil {
			return fmt.Errorf("netpolicy: job %s: replace rules: %w", n.id, err)
		}
		// Only then: until the new rules are in, the job could open
		// again what is removed.
		if err := n.forgetFlows(&p); err != nil {
			// Back to the old rules, which the remaining entries agree
			// with, so that on error the previous policy is in force.
			rerr := n.m.installRules(ctx, n, n.policy)
			if rerr == nil {
				return err
			}
			// The new rules stay, and they are what is recorded: the
			// policy in force must be the one reported. Only replies on
			// connections opened before could still reach the job.
			n.m.log.Error("netpolicy: new rules in force, but the connections they no longer allow could not be cut",
				"job_id", n.id, "generation", gen, "error", err, "restore_error", rerr)
		}
	}
	n.policy, n.gen = p, gen
	n.m.log.Info("netpolicy: policy applied", "job_id", n.id, "generation", gen, "deny_all", p.DenyAll(), "veth", n.hasVeth)
	return nil
}

// addVeth installs p's rules for the veth first, then makes it, so no
// packet ever crosses it unfiltered.
func (n *Net) addVeth(ctx context.Context, p Policy) error {
	if n.slot >= 0 && !n.hasVeth {
		// An earlier veth's entries could not be removed then.
		if err := n.forgetFlows(nil); err != nil {
			return err
		}
	}
	if n.slot < 0 {
		slot, err := n.m.takeSlot()
		if err != nil {
			return fmt.Errorf("job %s: %w", n.id, err)
		}
		n.slot, n.addr = slot, n.m.addrs(slot)
	}
	n.hasTable = true
	if err := n.m.installRules(ctx, n, p); err != nil {
		return fmt.Errorf("netpolicy: job %s: install rules: %w", n.id, err)
	}
	n.hasVeth = true
	if err := n.m.makeVeth(n); err != nil {
		if rerr := n.removeVeth(); rerr != nil {
			n.m.log.Error("netpolicy: undo a failed veth", "job_id", n.id, "error", rerr)
		}
		return fmt.Errorf("netpolicy: job %s: %w", n.id, err)
	}
	return nil
}

// removeVeth deletes the veth (the job's side goes with it), then its
// rules and its addresses' conntrack entries, and only then releases the
// addresses. With the veth gone nothing can reach or leave the namespace,
// so a failure after that is only logged, and the job keeps its addresses
// until Close or Recover clean up.
func (n *Net) removeVeth() error {
	sent, received, err := deleteLink(n.veth)
	if err != nil {
		return fmt.Errorf("netpolicy: job %s: %w", n.id, err)
	}
	n.sent, n.received = n.sent+sent, n.received+received
	n.hasVeth = false
	if err := n.m.deleteTables(context.Background(), n.table); err != nil {
		n.m.log.Warn("netpolicy: remove a job's rules after its veth", "job_id", n.id, "table", n.table, "error", err)
	} else {
		n.hasTable = false
	}
	if err := n.forgetFlows(nil); err != nil {
		n.m.log.Warn("netpolicy: keep a job's addresses until their conntrack entries are gone", "job_id", n.id, "error", err)
		return nil
	}
	n.m.freeSlot(n.slot)
	n.slot = -1
	return nil
}

// ProxyAddrs are the addresses of the host end of the job's veth, where a
// proxied job's egress services listen (IPv4, then IPv6 when the manager
// has Pool6), or nil while it has no veth.
func (n *Net) ProxyAddrs() []netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.hasVeth {
		return nil
	}
	out := []netip.Addr{n.addr.host4.Addr()}
	if n.addr.host6.IsValid() {
		out = append(out, n.addr.host6.Addr())
	}
	return out
}

// HostLink is the name of the host end of the job's veth (whether or not it
// exists now): a proxied job's services bind to it.
func (n *Net) HostLink() string { return n.veth }

// Bytes are the bytes the job sent and received over its veths so far:
// those deleted (by Apply of a deny-all policy, or Close) and the one it
// has now, read from the host end's counters (one netlink request). A
// deny-all namespace has no veth, so nothing but loopback, and counts
// nothing. After Close, Bytes is final.
func (n *Net) Bytes() (sent, received int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sent, received = n.sent, n.received
	if n.hasVeth {
		if l, err := netlink.LinkByName(n.veth); err == nil {
			s, r := jobBytes(l)
			sent, received = sent+s, received+r
		} else {
			n.m.log.Warn("netpolicy: read a job's veth counters", "job_id", n.id, "veth", n.veth, "error", err)
		}
	}
	return sent, received
}

// Refused are the destinations no job may reach, as the rules refuse
// them: the always-denied prefixes, the pools, and every address now on
// one of the host's interfaces (as a single address: the host's
// neighbours are not refused for being on its subnets). An egress proxy
// dialling for a job refuses them too.

// Current returns the policy in force and its generation.
func (n *Net) Current() (Policy, int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.policy.clone(), n.gen
}

// Close removes the namespace, its interfaces and its rules. It may be
// called again, also after a failure.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	if err := n.teardown(); err != nil {
		return err
	}
	n.m.forget(n)
	return nil
}

// teardown removes everything of n that may exist. The rules stay as long
// as the veth does, so a job is never left with a route and no filter; the
// addresses are released only once their conntrack entries are gone.
func (n *Net) teardown() error {
	var errs []error
	if sent, received, err := deleteLink(n.veth); err != nil {
		errs = append(errs, err)
	} else {
		n.sent, n.received = n.sent+sent, n.received+received
		n.hasVeth = false
		if n.hasTable {
			if err := n.m.deleteTables(context.Background(), n.table); err != nil {
				errs = append(errs, fmt.Errorf("remove rules: %w", err))
			} else {
				n.hasTable = false
			}
		}
		if n.slot >= 0 {
			if err := n.forgetFlows(nil); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := removeNetns(n.path); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("netpolicy: close job %s: %w", n.id, errors.Join(errs...))
	}
	if n.slot >= 0 {
		n.m.freeSlot(n.slot)
		n.slot = -1
	}
	return nil
}
