package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/airlockhq/airlock/pkg/errdefs"
)

// exportCgroup names the cgroup, below a job's, that the executor's own
// processes over the job's files run in once it has ended.
const exportCgroup = "export"

// Cgroup is a cgroup the executor runs its own processes in on a job's
// behalf, under the job's limits.
type Cgroup struct {
	cg     cgroupDriver
	rel    string
	memory int64
}

// ExportCgroup makes a cgroup below the job's, with the job's memory and
// pids limits, for what the executor runs over the job's files after
// the job has ended (or when it never ran: a suspended session's): the
// git that computes its patch reads files the job chose, and without it
// would spend the host's memory on them, not the job's. Memory the job's
// files still hold there (a tmpfs scratch) counts against the same limit;
// what the job left in /tmp and $HOME, never exported, is removed first.
// CPU is not what needs bounding there, and the job's quota would let a
// job of a few millicores stretch its export to hours: the job's cgroup
// (nothing of the job runs in it any more) and the export's get every
// core's worth (exportCPU), for good: the export is the last thing a
// job's sandbox does before Destroy (v1 would refuse the job's quota back
// while the removed export cgroup lingers in the kernel). The export's
// deadline bounds its time (runs.Config.ExportTimeout). Close removes it;
// Destroy would too.
func (s *Sandbox) ExportCgroup() (*Cgroup, error) {
	s.mu.Lock()
	state, l := s.state, s.spec.Limits
	s.mu.Unlock()
	if state == stateRunning || state == stateDestroyed {
		return nil, fmt.Errorf("%w: sandbox %s: an export cgroup is made while the sandbox exists and runs nothing", errdefs.ErrFailedPrecondition, s.spec.ID)
	}
	if s.scr.kind == scratchTmpfs {
		// A tmpfs scratch's pages stay charged to the job's cgroup: what
		// the job left in /tmp and $HOME (never exported) would take the
		// export's memory.
		for _, d := range []string{scratchTmp, scratchHome} {
			if err := emptyDir(filepath.Join(s.scr.point, d)); err != nil {
				return nil, fmt.Errorf("sandbox %s: empty the scratch's %s before the export: %w", s.spec.ID, d, err)
			}
		}
	}
	rel := cgroupRel(s.cgRel, exportCgroup)
	// One left by an export that never closed it (the executor died in
	// it) is emptied and made again.
	if err := s.m.cg.kill(rel, killWait); err != nil {
		return nil, err
	}
	if err := s.m.cg.remove(rel); err != nil {
		return nil, err
	}
	lifted := l
	lifted.CPUMillis = exportCPU()
	if err := s.m.cg.setLimits(s.cgRel, l, lifted); err != nil {
		return nil, fmt.Errorf("lift the job's CPU quota for its export: %w", err)
	}
	if err := s.m.cg.createLeaf(rel, lifted); err != nil {
		return nil, errors.Join(err, s.m.cg.remove(rel))
	}
	return &Cgroup{cg: s.m.cg, rel: rel, memory: l.MemoryBytes}, nil
}

// exportCPU is the CPU quota, in millicores, of a job's cgroup once it
// runs its export: every core of the host.
func exportCPU() int64 { return int64(runtime.NumCPU()) * 1000 }

// CgroupProcs are the cgroup.procs files a process writes 0 to, to join it.
func (c *Cgroup) CgroupProcs() []string { return c.cg.procsFiles(c.rel) }

// MemoryBytes is its memory limit: the job's.
func (c *Cgroup) MemoryBytes() int64 { return c.memory }

// OOMKills counts the kernel's OOM kills in it so far.
func (c *Cgroup) OOMKills() int64 { return c.cg.oomKills(c.rel) }

// PeakMemory is the most memory it has held, where the kernel keeps a
// peak (0 elsewhere).
func (c *Cgroup) PeakMemory() int64 { return c.cg.stats(c.rel).peakMemory }

// Close kills what is left in it and removes it.
func (c *Cgroup) Close() error {
	return errors.Join(c.cg.kill(c.rel, killWait), c.cg.remove(c.rel))
}
