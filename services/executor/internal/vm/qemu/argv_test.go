package qemu

import (
	"slices"
	"strings"
	"testing"
)

func baseConfig() Config {
	return Config{
		Accel: "tcg", CPUs: 2, MemoryBytes: 1 << 30, BIOS: QbootROM,
		Kernel: "/k/vmlinux", Initrd: "/s/initrd", Append: "console=ttyS0",
		Shares:  []Share{{Tag: "root", Path: "/b/rootfs", ReadOnly: true}, {Tag: "s1", Path: "/b/work"}},
		Disk:    "/b/disk.img",
		TapFD:   5,
		MAC:     "02:42:ac:11:00:02",
		AgentFD: 4, ConsoleFD: 3,
	}
}

// pairs returns every value of a repeated option.
func pairs(args []string, opt string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == opt {
			out = append(out, args[i+1])
		}
	}
	return out
}

func TestArgs(t *testing.T) {
	a, err := Args(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-nodefaults", "-no-user-config", "-no-reboot"} {
		if !slices.Contains(a, want) {
			t.Errorf("no %s in %q", want, a)
		}
	}
	if got := pairs(a, "-sandbox"); !slices.Equal(got, []string{"on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}) {
		t.Errorf("-sandbox %q", got)
	}
	if got := pairs(a, "-accel"); !slices.Equal(got, []string{"tcg,thread=multi,tb-size=64"}) || !slices.Equal(pairs(a, "-cpu"), []string{"max"}) {
		t.Errorf("-accel %q -cpu %q", got, pairs(a, "-cpu"))
	}
	if got := pairs(a, "-m"); !slices.Equal(got, []string{"1024M"}) {
		t.Errorf("-m %q", got)
	}
	wantDevices := []string{
		"virtio-serial-pci,id=vser",
		"virtserialport,bus=vser.0,chardev=agent,name=" + AgentPort,
		"virtio-9p-pci,fsdev=fs0,mount_tag=root",
		"virtio-9p-pci,fsdev=fs1,mount_tag=s1",
		"virtio-blk-pci,drive=disk",
		"virtio-net-pci,netdev=net,mac=02:42:ac:11:00:02",
	}
	if got := pairs(a, "-device"); !slices.Equal(got, wantDevices) {
		t.Errorf("-device %q, want %q", got, wantDevices)
	}
	if got := pairs(a, "-serial"); !slices.Equal(got, []string{"chardev:console"}) {
		t.Errorf("-serial %q", got)
	}
	fs := pairs(a, "-fsdev")
	if len(fs) != 2 || !strings.HasSuffix(fs[0], ",readonly=on") || strings.Contains(fs[1], "readonly") {
		t.Errorf("-fsdev %q: want the root read-only, the other not", fs)
	}
	for _, f := range fs {
		if !strings.Contains(f, "security_model=passthrough") || !strings.Contains(f, "multidevs=remap") {
			t.Errorf("-fsdev %q: want passthrough and remap", f)
		}
	}
	if d := pairs(a, "-drive"); len(d) != 1 || !strings.Contains(d[0], "werror=report") || !strings.Contains(d[0], "rerror=report") || !strings.Contains(d[0], "format=raw") {
		t.Errorf("-drive %q", d)
	}
	if got := pairs(a, "-netdev"); !slices.Equal(got, []string{"tap,id=net,fd=5"}) {
		t.Errorf("-netdev %q", got)
	}
	if got := pairs(a, "-chardev"); !slices.Equal(got, []string{"socket,id=console,fd=3", "socket,id=agent,fd=4"}) {
		t.Errorf("-chardev %q", got)
	}
}

func TestArgsWithoutNetOrDiskOnKVM(t *testing.T) {
	c := baseConfig()
	c.TapFD, c.MAC, c.Disk, c.Accel, c.BIOS = 0, "", "", "kvm", ""
	a, err := Args(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, opt := range []string{"-netdev", "-drive", "-bios"} {
		if got := pairs(a, opt); got != nil {
			t.Errorf("%s %q, want none", opt, got)
		}
	}
	if !slices.Equal(pairs(a, "-accel"), []string{"kvm"}) || !slices.Equal(pairs(a, "-cpu"), []string{"host"}) {
		t.Errorf("-accel %q -cpu %q", pairs(a, "-accel"), pairs(a, "-cpu"))
	}
}

func TestArgsRejects(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"accel":          func(c *Config) { c.Accel = "hvf" },
		"no cpus":        func(c *Config) { c.CPUs = 0 },
		"tiny memory":    func(c *Config) { c.MemoryBytes = 1 << 20 },
		"comma in share": func(c *Config) { c.Shares[1].Path = "/b/x,readonly=off" },
		"comma in disk":  func(c *Config) { c.Disk = "/b/d,if=ide" },
		"long tag":       func(c *Config) { c.Shares[1].Tag = strings.Repeat("t", 32) },
		"duplicate tag":  func(c *Config) { c.Shares[1].Tag = "root" },
		"tag with comma": func(c *Config) { c.Shares[1].Tag = "a,b" },
		"bad mac":        func(c *Config) { c.MAC = "02:42:AC:11:00:02,x" },
		"stdio fd":       func(c *Config) { c.AgentFD = 1 },
		"newline append": func(c *Config) { c.Append = "a\nb" },
	} {
		c := baseConfig()
		mod(&c)
		if _, err := Args(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestCleanCgroupPath(t *testing.T) {
	for p, want := range map[string]string{"/airlock/j1/ctr": "airlock/j1/ctr", "a/b": "a/b"} {
		if got, err := cleanCgroupPath(p); err != nil || got != want {
			t.Errorf("cleanCgroupPath(%q) = %q, %v", p, got, err)
		}
	}
	for _, p := range []string{"", "/", "../x", "/a/../../b", "a//b", "a/./b", "a\x00"} {
		if _, err := cleanCgroupPath(p); err == nil {
			t.Errorf("cleanCgroupPath(%q): no error", p)
		}
	}
	if got := unescapeMount(`/sys/fs/cgroup/a\040b`); got != "/sys/fs/cgroup/a b" {
		t.Errorf("unescapeMount = %q", got)
	}
}
