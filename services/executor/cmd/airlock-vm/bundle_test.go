package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/services/executor/internal/vm/proto"
	"github.com/airlockhq/airlock/services/executor/internal/vm/qemu"
)

// testSpec is a bundle as the sandbox package writes one, on dirs under t.TempDir.
func testSpec(t *testing.T) (*specs.Spec, string) {
	t.Helper()
	b := t.TempDir()
	for _, d := range []string{"rootfs", "work", "cache"} {
		os.Mkdir(filepath.Join(b, d), 0o755)
	}
	os.WriteFile(filepath.Join(b, "resolv.conf"), []byte("nameserver 10.0.0.1\n"), 0o644)
	return &specs.Spec{
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "job",
		Process: &specs.Process{
			Args: []string{"make", "-j2"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/work",
			User:    specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{27}},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 4096, Soft: 1024}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"},
			{Destination: "/work", Type: "bind", Source: filepath.Join(b, "work"), Options: []string{"bind", "rw", "nosuid", "nodev"}},
			{Destination: "/cache", Type: "bind", Source: filepath.Join(b, "cache"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(b, "resolv.conf"), Options: []string{"bind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/airlock/j1/ctr",
			Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: "/run/airlock/netns/j1"}},
		},
		Annotations: map[string]string{
			annMemory: "1073741824", annCPUs: "2", annPids: "512", annUIDBase: "200000",
			annDisk: filepath.Join(b, "disk.img"), annDiskBytes: "1073741824", annDocker: "true",
		},
	}, b
}

func TestTranslate(t *testing.T) {
	spec, b := testSpec(t)
	p, err := translate(spec, b)
	if err != nil {
		t.Fatal(err)
	}
	wantShares := []qemu.Share{
		{Tag: proto.RootTag, Path: filepath.Join(b, "rootfs"), ReadOnly: true},
		{Tag: "s1", Path: filepath.Join(b, "work")},
		{Tag: "s2", Path: filepath.Join(b, "cache"), ReadOnly: true},
	}
	if len(p.shares) != len(wantShares) {
		t.Fatalf("shares %+v, want %+v", p.shares, wantShares)
	}
	for i := range wantShares {
		if p.shares[i] != wantShares[i] {
			t.Errorf("share %d = %+v, want %+v", i, p.shares[i], wantShares[i])
		}
	}
	gs := p.config.Shares
	if len(gs) != 3 || gs[0].Path != "/" || !gs[0].RO || gs[1].Path != "/work" || gs[1].RO || !gs[1].NoSuid || gs[1].NoExec ||
		gs[2].Path != "/cache" || !gs[2].RO || !gs[2].NoExec {
		t.Errorf("guest shares %+v", gs)
	}
	if len(p.config.Files) != 1 || p.config.Files[0].Path != "/etc/resolv.conf" || string(p.config.Files[0].Content) != "nameserver 10.0.0.1\n" {
		t.Errorf("files %+v", p.config.Files)
	}
	if p.process.Cwd != "/work" || p.process.UID != 1000 || len(p.process.AdditionalGIDs) != 1 || len(p.process.Rlimits) != 1 || p.process.Stdin {
		t.Errorf("process %+v", p.process)
	}
	if p.netns != "/run/airlock/netns/j1" || p.cgroupsPath != "/airlock/j1/ctr" || p.config.Hostname != "job" {
		t.Errorf("netns %q cgroups %q hostname %q", p.netns, p.cgroupsPath, p.config.Hostname)
	}
	if p.memoryBytes != 1<<30 || p.cpus != 2 || p.config.PidsLimit != 512 || p.uidBase != 200000 ||
		p.diskBytes != 1<<30 || !p.config.Disk || !p.config.Docker || p.config.DockerUID != 1000 {
		t.Errorf("annotations: %+v", p)
	}
}

func TestTranslateRejects(t *testing.T) {
	for name, mod := range map[string]func(*specs.Spec, string){
		"no root":         func(s *specs.Spec, _ string) { s.Root = nil },
		"root not a dir":  func(s *specs.Spec, b string) { s.Root.Path = "resolv.conf" },
		"no process":      func(s *specs.Spec, _ string) { s.Process = nil },
		"empty args":      func(s *specs.Spec, _ string) { s.Process.Args = nil },
		"relative dest":   func(s *specs.Spec, _ string) { s.Mounts[2].Destination = "work" },
		"dest with ..":    func(s *specs.Spec, _ string) { s.Mounts[2].Destination = "/a/../b" },
		"missing source":  func(s *specs.Spec, b string) { s.Mounts[2].Source = filepath.Join(b, "nope") },
		"relative source": func(s *specs.Spec, _ string) { s.Mounts[2].Source = "work" },
		"overlay mount":   func(s *specs.Spec, _ string) { s.Mounts[0].Type = "overlay" },
		"big file": func(s *specs.Spec, b string) {
			os.WriteFile(filepath.Join(b, "resolv.conf"), []byte(strings.Repeat("x", proto.MaxFileSize+1)), 0o644)
		},
		"no uid base":       func(s *specs.Spec, _ string) { delete(s.Annotations, annUIDBase) },
		"uid base 0":        func(s *specs.Spec, _ string) { s.Annotations[annUIDBase] = "0" },
		"memory words":      func(s *specs.Spec, _ string) { s.Annotations[annMemory] = "1G" },
		"memory tiny":       func(s *specs.Spec, _ string) { s.Annotations[annMemory] = "1024" },
		"cpus 1000":         func(s *specs.Spec, _ string) { s.Annotations[annCPUs] = "1000" },
		"disk relative":     func(s *specs.Spec, _ string) { s.Annotations[annDisk] = "disk.img" },
		"disk without size": func(s *specs.Spec, _ string) { delete(s.Annotations, annDiskBytes) },
		"docker no disk":    func(s *specs.Spec, _ string) { delete(s.Annotations, annDisk) },
		"docker maybe":      func(s *specs.Spec, _ string) { s.Annotations[annDocker] = "yes" },
		"netns relative":    func(s *specs.Spec, _ string) { s.Linux.Namespaces[1].Path = "netns/j1" },
		"hostname slash":    func(s *specs.Spec, _ string) { s.Hostname = "a/b" },
	} {
		spec, b := testSpec(t)
		mod(spec, b)
		if _, err := translate(spec, b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"9": 9, "KILL": 9, "SIGTERM": 15, "term": 15} {
		if got, err := parseSignal(in); err != nil || int(got) != want {
			t.Errorf("parseSignal(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"0", "65", "-1", "SIGNOPE", ""} {
		if _, err := parseSignal(in); err == nil {
			t.Errorf("parseSignal(%q): no error", in)
		}
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"", ".", "..", ".initramfs", "a/b", strings.Repeat("a", 129), "a b"} {
		if checkID(id) == nil {
			t.Errorf("checkID(%q): no error", id)
		}
	}
	if err := checkID("job-1_a.b"); err != nil {
		t.Error(err)
	}
}
