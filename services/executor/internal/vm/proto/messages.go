package proto

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path"
	"strings"
)

// Bounds the guest holds a Config and a Process to (beyond MaxPayload).
const (
	MaxFileSize   = 1 << 20 // one Config file's content
	MaxFiles      = 64
	MaxShares     = 64
	MaxArgs       = 1 << 12
	MaxEnv        = 1 << 12
	MaxStdinQueue = 1 << 20 // stdin bytes the host may have sent but the guest not yet acknowledged
	RootTag       = "root"  // the 9p share that is the job's root filesystem
	maxTagLen     = 31      // virtio-9p's mount_tag limit
	maxPathLen    = 4096
)

// Hello is the guest's first frame: who answers.
type Hello struct {
	Version string `json:"version"` // the agent's build
	Kernel  string `json:"kernel"`  // uname -r and -v
}

// Error answers a control request, or a Start whose process never ran.
type Error struct {
	Message string `json:"message"`
	// ExitCode is set when Start failed to execute argv[0]: 127 (not found)
	// or 126 (not executable); Message is then what runc would log, e.g.
	// `exec: "x": executable file not found in $PATH`.
	ExitCode int `json:"exit_code,omitempty"`
}

// Config is the machine's setup, sent once after Hello and answered by Ready or Error.
type Config struct {
	Hostname string  `json:"hostname,omitempty"`
	Shares   []Share `json:"shares"` // must include RootTag
	// Files are placed read-only at Path (over whatever the root has there).
	// Their contents travel in File frames before the Config.
	Files []File `json:"files,omitempty"`
	// Tmpfs are the bundle's tmpfs mounts (/tmp, say), the guest's own.
	Tmpfs     []Tmpfs  `json:"tmpfs,omitempty"`
	Network   *Network `json:"network,omitempty"` // nil: the guest has no NIC
	PidsLimit int64    `json:"pids_limit,omitempty"`
	Disk      bool     `json:"disk,omitempty"`   // /dev/vda exists (ext4)
	Docker    bool     `json:"docker,omitempty"` // start dockerd, data on the disk; needs Disk
	// DockerUID/DockerGID own dockerd's socket so the job's user can use it.
	DockerUID uint32 `json:"docker_uid,omitempty"`
	DockerGID uint32 `json:"docker_gid,omitempty"`
}

// Share is one virtio-9p export mounted in the guest.
type Share struct {
	Tag    string `json:"tag"`
	Path   string `json:"path"` // mount point in the job's root; "/" for RootTag
	RO     bool   `json:"ro,omitempty"`
	NoSuid bool   `json:"nosuid,omitempty"`
	NoDev  bool   `json:"nodev,omitempty"`
	NoExec bool   `json:"noexec,omitempty"`
}

// Tmpfs is a tmpfs the guest mounts in the job's root.
type Tmpfs struct {
	Path   string `json:"path"`
	Size   int64  `json:"size,omitempty"` // bytes; 0: the kernel's default (half of RAM)
	Mode   uint32 `json:"mode,omitempty"` // 0: 01777
	NoSuid bool   `json:"nosuid,omitempty"`
	NoDev  bool   `json:"nodev,omitempty"`
	NoExec bool   `json:"noexec,omitempty"`
}

// File is a small regular file the host copies in (resolv.conf, passwd, group).
type File struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode"`
	Size    int    `json:"size"`
	Content []byte `json:"-"` // host side only: sent as File frames
}

// Network configures eth0 from the job netns's view of its own interface.
type Network struct {
	MAC        string   `json:"mac"` // QEMU sets it; the guest checks it
	MTU        int      `json:"mtu,omitempty"`
	Addresses  []string `json:"addresses"` // CIDR prefixes, IPv4 and IPv6
	Gateway4   string   `json:"gateway4,omitempty"`
	Gateway6   string   `json:"gateway6,omitempty"`
	GatewayMAC string   `json:"gateway_mac,omitempty"` // static neighbour for both gateways
}

// Process is a Start's payload.
type Process struct {
	Args           []string `json:"args"`
	Env            []string `json:"env,omitempty"`
	Cwd            string   `json:"cwd,omitempty"`
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	AdditionalGIDs []uint32 `json:"additional_gids,omitempty"`
	Rlimits        []Rlimit `json:"rlimits,omitempty"`
	Stdin          bool     `json:"stdin,omitempty"` // false: /dev/null
}

// Rlimit is one OCI rlimit ("RLIMIT_NOFILE" and so on).
type Rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

// Started says the process runs; Pid is also its process group and session.
type Started struct {
	Pid int `json:"pid"`
}

// StdinAck returns stdin window: Bytes more may be sent.
type StdinAck struct {
	Bytes int `json:"bytes"`
}

// Exit is a process stream's last frame.
type Exit struct {
	Code     int    `json:"code"`             // exit status, or 128+Signal
	Signal   int    `json:"signal,omitempty"` // the signal that killed it
	OOMKills uint64 `json:"oom_kills"`        // /proc/vmstat oom_kill delta since Start
}

// Signal asks the guest for kill(Pid, Signal); a negative Pid is a process group.
type Signal struct {
	Pid    int `json:"pid"`
	Signal int `json:"signal"`
}

// Validate checks a Config the guest received.
func (c *Config) Validate() error {
	if len(c.Hostname) > 64 || strings.ContainsAny(c.Hostname, "/\x00") {
		return fmt.Errorf("config hostname %q: not a host name", c.Hostname)
	}
	if len(c.Shares) > MaxShares {
		return fmt.Errorf("config shares: %d exceeds %d", len(c.Shares), MaxShares)
	}
	root := false
	for i, s := range c.Shares {
		if s.Tag == "" || len(s.Tag) > maxTagLen || strings.ContainsAny(s.Tag, ",\x00") {
			return fmt.Errorf("config shares[%d] tag %q: empty, longer than %d or with , or NUL", i, s.Tag, maxTagLen)
		}
		if err := checkPath(s.Path); err != nil {
			return fmt.Errorf("config shares[%d] path: %w", i, err)
		}
		if s.Tag == RootTag {
			if s.Path != "/" {
				return fmt.Errorf("config shares[%d]: the %q share must be at /, not %q", i, RootTag, s.Path)
			}
			root = true
		} else if s.Path == "/" {
			return fmt.Errorf("config shares[%d]: only the %q share may be at /", i, RootTag)
		}
	}
	if !root {
		return fmt.Errorf("config shares: no %q share", RootTag)
	}
	if len(c.Files) > MaxFiles {
		return fmt.Errorf("config files: %d exceeds %d", len(c.Files), MaxFiles)
	}
	for i, f := range c.Files {
		if err := checkPath(f.Path); err != nil || f.Path == "/" {
			return fmt.Errorf("config files[%d] path %q: not an absolute clean file path", i, f.Path)
		}
		if f.Size < 0 || f.Size > MaxFileSize {
			return fmt.Errorf("config files[%d] %s: size %d outside [0, %d]", i, f.Path, f.Size, MaxFileSize)
		}
		if f.Mode&^0o7777 != 0 {
			return fmt.Errorf("config files[%d] %s: mode %o has non-permission bits", i, f.Path, f.Mode)
		}
	}
	if len(c.Tmpfs) > MaxShares {
		return fmt.Errorf("config tmpfs: %d exceeds %d", len(c.Tmpfs), MaxShares)
	}
	for i, m := range c.Tmpfs {
		if err := checkPath(m.Path); err != nil || m.Path == "/" {
			return fmt.Errorf("config tmpfs[%d] path %q: not an absolute clean path below /", i, m.Path)
		}
		if m.Size < 0 || m.Mode&^0o7777 != 0 {
			return fmt.Errorf("config tmpfs[%d] %s: negative size or mode %o with non-permission bits", i, m.Path, m.Mode)
		}
	}
	if c.PidsLimit < 0 {
		return fmt.Errorf("config pids_limit %d: negative", c.PidsLimit)
	}
	if c.Docker && !c.Disk {
		return fmt.Errorf("config docker: needs the disk")
	}
	if n := c.Network; n != nil {
		if _, err := net.ParseMAC(n.MAC); err != nil {
			return fmt.Errorf("config network mac: %w", err)
		}
		if n.GatewayMAC != "" {
			if _, err := net.ParseMAC(n.GatewayMAC); err != nil {
				return fmt.Errorf("config network gateway_mac: %w", err)
			}
		}
		if n.MTU < 0 || n.MTU > 65535 {
			return fmt.Errorf("config network mtu %d: outside [0, 65535]", n.MTU)
		}
		if len(n.Addresses) > 16 {
			return fmt.Errorf("config network addresses: %d exceeds 16", len(n.Addresses))
		}
		for i, a := range n.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("config network addresses[%d]: %w", i, err)
			}
		}
		for _, g := range []struct {
			name, addr string
			v4         bool
		}{{"gateway4", n.Gateway4, true}, {"gateway6", n.Gateway6, false}} {
			if g.addr == "" {
				continue
			}
			a, err := netip.ParseAddr(g.addr)
			if err != nil || a.Is4() != g.v4 {
				return fmt.Errorf("config network %s %q: not an IPv%s address", g.name, g.addr, map[bool]string{true: "4", false: "6"}[g.v4])
			}
		}
	}
	return nil
}

// Validate checks a Process the guest received.
func (p *Process) Validate() error {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return fmt.Errorf("process args: empty")
	}
	if len(p.Args) > MaxArgs || len(p.Env) > MaxEnv || len(p.AdditionalGIDs) > 256 || len(p.Rlimits) > 32 {
		return fmt.Errorf("process: more than %d args, %d env, 256 additional gids or 32 rlimits", MaxArgs, MaxEnv)
	}
	for _, list := range [][]string{p.Args, p.Env} {
		for _, s := range list {
			if strings.IndexByte(s, 0) >= 0 {
				return fmt.Errorf("process args/env %q: contains NUL", s)
			}
		}
	}
	if p.Cwd != "" {
		if err := checkPath(p.Cwd); err != nil {
			return fmt.Errorf("process cwd: %w", err)
		}
	}
	for i, r := range p.Rlimits {
		if r.Soft > r.Hard {
			return fmt.Errorf("process rlimits[%d] %s: soft %d above hard %d", i, r.Type, r.Soft, r.Hard)
		}
	}
	return nil
}

func checkPath(p string) error {
	if len(p) > maxPathLen || !path.IsAbs(p) || path.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%q is not an absolute clean path", p)
	}
	return nil
}

// MaxFileChunk is the data one File frame carries, leaving room for its header.
const MaxFileChunk = MaxPayload - 2 - maxPathLen - 4

// EncodeFileChunk makes a File frame's payload: a 2-byte path length, the
// path, the 4-byte mode, then data (≤ MaxFileChunk). Chunks of one path append.
func EncodeFileChunk(p string, mode uint32, data []byte) ([]byte, error) {
	if len(p) > maxPathLen || len(data) > MaxFileChunk {
		return nil, fmt.Errorf("file chunk %q: path or data too long", p)
	}
	b := make([]byte, 0, 2+len(p)+4+len(data))
	b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	b = append(b, p...)
	b = binary.BigEndian.AppendUint32(b, mode)
	return append(b, data...), nil
}

// DecodeFileChunk parses a File frame's payload; data aliases payload.
func DecodeFileChunk(payload []byte) (p string, mode uint32, data []byte, err error) {
	if len(payload) < 2 {
		return "", 0, nil, fmt.Errorf("%w: file chunk of %d bytes", ErrProtocol, len(payload))
	}
	n := int(binary.BigEndian.Uint16(payload))
	if n > maxPathLen || len(payload) < 2+n+4 {
		return "", 0, nil, fmt.Errorf("%w: file chunk path length %d", ErrProtocol, n)
	}
	p = string(payload[2 : 2+n])
	mode = binary.BigEndian.Uint32(payload[2+n:])
	return p, mode, payload[2+n+4:], nil
}
