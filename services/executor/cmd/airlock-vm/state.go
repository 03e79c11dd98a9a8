package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/atomicfile"
)

// The files of a container's state directory ROOT/ID.
const (
	stateFile   = "state.json" // the record below
	ctlSock     = "ctl.sock"   // run's control socket for exec and kill
	consoleLog  = "console.log"
	qemuLog     = "qemu.log"
	maxStateLen = 64 << 10
)

// proc names a process by pid and start time (clock ticks since boot, from
// /proc/PID/stat), so a reused pid is never mistaken for it.
type proc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// record is what run keeps in state.json for delete and kill.
type record struct {
	CLI     proc     `json:"cli"`
	QEMU    proc     `json:"qemu,omitzero"`
	Netns   string   `json:"netns,omitempty"`
	Cgroups []string `json:"cgroups,omitempty"`
}

type stateDir string

func (s stateDir) path(name string) string { return filepath.Join(string(s), name) }

// newState makes ROOT/ID, failing if it exists: an ID runs once.
func newState(root, id string) (stateDir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("state root: %w", err)
	}
	d := filepath.Join(root, id)
	if err := os.Mkdir(d, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("container %q already exists", id)
		}
		return "", fmt.Errorf("state: %w", err)
	}
	return stateDir(d), nil
}

func (s stateDir) save(r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path(stateFile), b, 0o600, atomicfile.Fast)
}

func (s stateDir) load() (record, error) {
	var r record
	b, err := readSmall(s.path(stateFile), maxStateLen)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("state %s: %w", s, err)
	}
	return r, nil
}

// procOf is pid's record, with its current start time.
func procOf(pid int) proc {
	st, _ := startTime(pid)
	return proc{Pid: pid, Start: st}
}

// startTime reads field 22 of /proc/PID/stat.
func startTime(pid int) (uint64, error) {
	b, err := readSmall(fmt.Sprintf("/proc/%d/stat", pid), 4096)
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields
	// are counted after its closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive says whether p still runs (and is the same process).
func (p proc) alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, err := startTime(p.Pid)
	return err == nil && st == p.Start
}

// killWait sends SIGKILL to each live process of ps and waits until all
// are gone (reaped by their parents, or zombies of a dead parent).
func killWait(timeout time.Duration, ps ...proc) error {
	for _, p := range ps {
		if p.alive() {
			unix.Kill(p.Pid, unix.SIGKILL)
		}
	}
	deadline := time.Now().Add(timeout)
	for _, p := range ps {
		for p.alive() && !zombie(p.Pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d survived SIGKILL for %s", p.Pid, timeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// zombie says whether pid has exited and awaits its parent's wait.
func zombie(pid int) bool {
	b, err := readSmall(fmt.Sprintf("/proc/%d/stat", pid), 4096)
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
