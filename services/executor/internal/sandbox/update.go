package sandbox

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// ErrEnded is wrapped in UpdateLimits' error when the job has ended or is
// being stopped.
var ErrEnded = errors.New("the job has ended")

// CheckLimits makes the checks Create makes of a spec's limits for a job of
// class c, so a caller can refuse limits before it has a sandbox.
func CheckLimits(c Class, l Limits) error {
	// The other fields only need to pass, so that what is checked is
	// exactly Create's rule for the limits.
	spec := Spec{Class: c, Source: "/", Command: []string{"x"}, Limits: l}
	return spec.validateBody()
}

// Limits returns the limits in force.
func (s *Sandbox) Limits() Limits { return s.limits() }

func (s *Sandbox) limits() Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spec.Limits
}

// isEnding reports whether the sandbox is ending or no longer running.
func (s *Sandbox) isEnding() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ending || s.state != stateRunning
}

func (s *Sandbox) markEnding() {
	s.mu.Lock()
	s.ending = true
	s.mu.Unlock()
}

// UpdateLimits puts l in force for a created or running job: memory, pids
// and CPU in its cgroup at once, and the deadline, still counted from when
// Run started; a deadline already past times the job out now. DiskBytes
// cannot change: the scratch filesystem is sized when the sandbox is made;
// nor can a runsc job's Pids, which gVisor's sentry holds from its start
// (see cgroupLimitsOf).
//
// On error nothing changes. A memory limit below what the job holds and the
// kernel cannot reclaim is refused (errdefs.ErrFailedPrecondition), as is
// any change once the job has ended or is being stopped.
func (s *Sandbox) UpdateLimits(l Limits) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.spec.Limits
	if l.DiskBytes != cur.DiskBytes {
		return invalid("limits.disk_bytes %d: cannot change on a running job: the scratch filesystem is sized when the sandbox is made (it is %d)", l.DiskBytes, cur.DiskBytes)
	}
	if l.Pids != cur.Pids && s.spec.Class == ClassRunsc {
		return invalid("limits.pids %d: cannot change on a running runsc job: gVisor holds the job to the limit it started with (it is %d)", l.Pids, cur.Pids)
	}
	if s.spec.Class == ClassVM {
		if why := vmRefuseLive(cur, l); why != "" {
			return invalid("%s", why)
		}
	}
	next := s.spec
	next.Limits = l
	if err := next.validateBody(); err != nil {
		return err
	}
	if (s.state != stateCreated && s.state != stateRunning) || s.ending {
		return fmt.Errorf("%w: sandbox %s: %w; its limits can no longer change", errdefs.ErrFailedPrecondition, s.spec.ID, ErrEnded)
	}
	if err := s.m.cg.setLimits(s.cgRel, cgroupLimitsOf(s.spec.Class, cur), cgroupLimitsOf(s.spec.Class, l)); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w: limits.memory_bytes %d: the job holds more memory than that and the kernel cannot reclaim it; the limit stays %d",
				errdefs.ErrFailedPrecondition, l.MemoryBytes, cur.MemoryBytes)
		}
		return fmt.Errorf("sandbox %s: update limits: %w", s.spec.ID, err)
	}
	s.spec.Limits = l
	if s.state == stateRunning && l.Deadline != cur.Deadline {
		select {
		case s.deadlineChanged <- struct{}{}:
		default: // a wake-up is pending; it reads the newest deadline
		}
	}
	return nil
}
