// Package qemu starts the QEMU machine of one VM-class job: its command
// line (Args), the tap it gets in the job's network namespace (Tap), the
// job cgroup it runs in (JoinCgroup) and the unprivileged process itself
// (Start: a user namespace, the job's netns, a mount namespace of its own).
// Only cmd/airlock-vm and the VM's tests import it.
package qemu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// AgentPort is the virtio-serial port name the guest agent opens
// (/dev/virtio-ports/<AgentPort>).
const AgentPort = "airlock.agent"

// QbootROM is Debian's qboot firmware: it boots a -kernel faster than
// SeaBIOS. Used when present.
const QbootROM = "/usr/share/qemu/qboot.rom"

// Share is one virtio-9p export.
type Share struct {
	// Tag is the guest's mount tag (at most 31 bytes).
	Tag string
	// Path is the host directory exported.
	Path string
	// ReadOnly makes QEMU refuse every write (readonly=on).
	ReadOnly bool
}

// Config is everything the command line says. File descriptors are the
// numbers they have in QEMU's process (3 + index in exec.Cmd.ExtraFiles).
type Config struct {
	// Accel is "kvm" or "tcg".
	Accel string
	// CPUs and MemoryBytes size the machine.
	CPUs        int
	MemoryBytes int64
	// BIOS is the firmware (QbootROM), "" for QEMU's default.
	BIOS string
	// Kernel, Initrd and Append are the direct boot's.
	Kernel, Initrd, Append string
	// Shares are the 9p exports, the root first.
	Shares []Share
	// Disk is the raw disk image's path, "" for none.
	Disk string
	// TapFD is an open tap (0: no NIC); MAC is the NIC's address.
	TapFD int
	MAC   string
	// AgentFD is a connected stream socket: the agent's virtio-serial port.
	AgentFD int
	// ConsoleFD is a connected stream socket that receives the 16550's
	// output (boot messages).
	ConsoleFD int
}

var (
	tagRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,31}$`)
	macRe = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
)

// optValue checks a value for QEMU's comma-separated option syntax, where
// a comma would start another option (QEMU escapes it as ",,": the paths
// here come from a bundle and a comma in them is refused instead).
func optValue(field, v string) error {
	if v == "" || strings.ContainsAny(v, ",\x00\n") {
		return fmt.Errorf("qemu %s %q: empty, or holds a comma, NUL or newline", field, v)
	}
	return nil
}

// Validate checks c before it becomes a command line.
func (c Config) Validate() error {
	if c.Accel != "kvm" && c.Accel != "tcg" {
		return fmt.Errorf("qemu accel %q: want kvm or tcg", c.Accel)
	}
	if c.CPUs < 1 || c.CPUs > 64 {
		return fmt.Errorf("qemu cpus %d: want 1..64", c.CPUs)
	}
	if c.MemoryBytes < 64<<20 || c.MemoryBytes > 1<<40 {
		return fmt.Errorf("qemu memory %d bytes: want 64 MiB..1 TiB", c.MemoryBytes)
	}
	for _, f := range []struct{ name, v string }{{"kernel", c.Kernel}, {"initrd", c.Initrd}} {
		if err := optValue(f.name, f.v); err != nil {
			return err
		}
	}
	if c.BIOS != "" {
		if err := optValue("bios", c.BIOS); err != nil {
			return err
		}
	}
	if strings.ContainsAny(c.Append, "\x00\n") || len(c.Append) > 2048 {
		return fmt.Errorf("qemu kernel command line: NUL, newline, or longer than 2048 bytes")
	}
	seen := map[string]bool{}
	for _, s := range c.Shares {
		if !tagRe.MatchString(s.Tag) || seen[s.Tag] {
			return fmt.Errorf("qemu share tag %q: want 1-31 of [A-Za-z0-9_.-], unique", s.Tag)
		}
		seen[s.Tag] = true
		if err := optValue("share "+s.Tag+" path", s.Path); err != nil {
			return err
		}
	}
	if c.Disk != "" {
		if err := optValue("disk", c.Disk); err != nil {
			return err
		}
	}
	if c.TapFD < 0 || c.TapFD > 0 && c.TapFD < 3 || c.AgentFD < 3 || c.ConsoleFD < 3 {
		return fmt.Errorf("qemu file descriptors tap %d, agent %d, console %d: want ≥ 3", c.TapFD, c.AgentFD, c.ConsoleFD)
	}
	if c.TapFD > 0 && !macRe.MatchString(c.MAC) {
		return fmt.Errorf("qemu mac %q: want xx:xx:xx:xx:xx:xx in lower case", c.MAC)
	}
	return nil
}

// Args is QEMU's command line for c (without argv[0]). Only the devices
// listed are made: -nodefaults leaves out QEMU's own (VGA, NIC, monitor,
// serial, parallel, floppy, CD-ROM).
func Args(c Config) ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	a := []string{
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-display", "none",
		// QEMU itself may not use syscalls that would let a compromised
		// device model leave its process: no exec, no setuid, no
		// scheduler or resource changes, no obsolete calls.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-machine", "pc",
		"-smp", strconv.Itoa(c.CPUs),
		"-m", strconv.FormatInt(c.MemoryBytes>>20, 10) + "M",
	}
	if c.Accel == "kvm" {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		a = append(a, "-accel", "tcg,thread=multi,tb-size=64", "-cpu", "max")
	}
	if c.BIOS != "" {
		a = append(a, "-bios", c.BIOS)
	}
	a = append(a, "-kernel", c.Kernel, "-initrd", c.Initrd, "-append", c.Append)
	// The console: the first 16550 (ttyS0), into a socket the CLI reads.
	a = append(a,
		"-chardev", fmt.Sprintf("socket,id=console,fd=%d", c.ConsoleFD),
		"-serial", "chardev:console",
		"-device", "virtio-serial-pci,id=vser",
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d", c.AgentFD),
		"-device", "virtserialport,bus=vser.0,chardev=agent,name="+AgentPort,
	)
	for i, s := range c.Shares {
		opt := fmt.Sprintf("local,id=fs%d,path=%s,security_model=passthrough,multidevs=remap", i, s.Path)
		if s.ReadOnly {
			opt += ",readonly=on"
		}
		a = append(a, "-fsdev", opt, "-device", fmt.Sprintf("virtio-9p-pci,fsdev=fs%d,mount_tag=%s", i, s.Tag))
	}
	if c.Disk != "" {
		a = append(a,
			"-drive", "file="+c.Disk+",format=raw,if=none,id=disk,cache=unsafe,aio=threads,werror=report,rerror=report",
			"-device", "virtio-blk-pci,drive=disk",
		)
	}
	if c.TapFD > 0 {
		a = append(a,
			"-netdev", fmt.Sprintf("tap,id=net,fd=%d", c.TapFD),
			"-device", "virtio-net-pci,netdev=net,mac="+c.MAC,
		)
	}
	return a, nil
}
