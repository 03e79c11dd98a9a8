package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Two managers on one host with overlapping pools would hand out the same
// addresses, and one job could then get another's replies. A pool only
// shows on the host's interfaces while its jobs run, so each manager
// claims its Pool4 host-wide for as long as it lives: an exclusive flock
// on claimDir/pool4-<prefix>.lock, which the kernel also drops when the
// process dies. Claims are made and given up under a lock on
// claimDir/claims.lock, so a manager sees every claim that overlaps its
// pool, not only one of the same prefix, and a claim file is only
// removed while nobody can be opening it. Executors in different mount
// namespaces must share claimDir for this to work.

// claimDir holds the claims of every manager on the host.
var claimDir = "/run/airlock/netpolicy"

// poolClaim is a manager's claim on its pool; nil-safe.
type poolClaim struct {
	f    *os.File
	path string
}

// claims is claimDir while its lock is held: one manager at a time looks
// at the claims and adds its own.
type claims struct {
	dir   string
	guard *os.File
	// held are the pools other live managers have claimed.
	held []netip.Prefix
}

// lockClaims takes claimDir's lock (waiting for another manager's claim
// to finish) and lists the live claims, removing those of dead managers.
func lockClaims() (*claims, error) {
	if err := os.MkdirAll(claimDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: pool claims: %v", ErrUnavailable, err)
	}
	g, err := lockClaimsOnly()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	c := &claims{dir: claimDir, guard: g}
	ents, err := os.ReadDir(claimDir)
	if err != nil {
		c.unlock()
		return nil, fmt.Errorf("%w: pool claims: %v", ErrUnavailable, err)
	}
	for _, e := range ents {
		p, ok := claimPrefix(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(claimDir, e.Name())
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			c.unlock()
			return nil, fmt.Errorf("%w: pool claims: %v", ErrUnavailable, err)
		}
		err = flock(f, unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case errors.Is(err, unix.EWOULDBLOCK):
			c.held = append(c.held, p)
		case err != nil:
			f.Close()
			c.unlock()
			return nil, fmt.Errorf("%w: pool claims: lock %s: %v", ErrUnavailable, path, err)
		default:
			// Its manager died without giving it up.
			_ = os.Remove(path)
		}
		f.Close()
	}
	return c, nil
}

// heldOverlapping returns a pool another manager holds that overlaps p.
func (c *claims) heldOverlapping(p netip.Prefix) (netip.Prefix, bool) {
	for _, h := range c.held {
		if h.Overlaps(p) {
			return h, true
		}
	}
	return netip.Prefix{}, false
}

// claim claims p for the caller until release.
func (c *claims) claim(p netip.Prefix) (*poolClaim, error) {
	path := filepath.Join(c.dir, "pool4-"+strings.ReplaceAll(p.String(), "/", "_")+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: claim pool %s: %v", ErrUnavailable, p, err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: claim pool %s: lock %s: %v", ErrUnavailable, p, path, err)
	}
	c.held = append(c.held, p)
	return &poolClaim{f: f, path: path}, nil
}

func (c *claims) unlock() {
	// Closing the file drops its lock.
	c.guard.Close()
}

// release gives the claim up (under claimDir's lock, so nobody is
// opening the file as it goes).
func (pc *poolClaim) release() error {
	if pc == nil || pc.f == nil {
		return nil
	}
	c, err := lockClaimsOnly()
	if err != nil {
		return err
	}
	defer c.Close()
	var errs []error
	if err := os.Remove(pc.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, pc.f.Close())
	pc.f = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netpolicy: give up the claim on the pool: %w", err)
	}
	return nil
}

// lockClaimsOnly takes claimDir's lock without looking at the claims.
func lockClaimsOnly() (*os.File, error) {
	g, err := os.OpenFile(filepath.Join(claimDir, "claims.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: pool claims: %w", err)
	}
	if err := flock(g, unix.LOCK_EX); err != nil {
		g.Close()
		return nil, fmt.Errorf("netpolicy: pool claims: lock %s: %w", g.Name(), err)
	}
	return g, nil
}

// claimPrefix parses a claim file's name.
func claimPrefix(name string) (netip.Prefix, bool) {
	s, ok := strings.CutPrefix(name, "pool4-")
	if !ok {
		return netip.Prefix{}, false
	}
	s, ok = strings.CutSuffix(s, ".lock")
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(strings.Replace(s, "_", "/", 1))
	return p, err == nil && p.Addr().Is4()
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
