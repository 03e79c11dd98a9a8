// Package initramfs makes the guest's initramfs: the agent as /init and the
// kernel modules it loads before it can reach the host (virtio, 9p, ext4,
// overlay), in dependency order with a manifest. The VM runtime CLI builds one
// per kernel and agent; the boot tests build their own.
package initramfs

import (
	"fmt"
	"io"
	"strings"
)

// CPIO writes a newc ("070701") archive, the format the kernel unpacks.
type CPIO struct {
	w   io.Writer
	ino uint32
	err error
}

// NewCPIO writes an archive to w; call Close to end it.
func NewCPIO(w io.Writer) *CPIO { return &CPIO{w: w, ino: 1} }

// Mode bits the kernel's unpacker understands.
const (
	ModeDir  = 0o040000
	ModeFile = 0o100000
)

// Dir adds a directory (parents must come first, as the kernel creates them in order).
func (c *CPIO) Dir(name string, perm uint32) error { return c.entry(name, ModeDir|perm&0o7777, nil) }

// File adds a regular file.
func (c *CPIO) File(name string, perm uint32, data []byte) error {
	return c.entry(name, ModeFile|perm&0o7777, data)
}

// Close writes the trailer; the archive is complete only then.
func (c *CPIO) Close() error { return c.entry("TRAILER!!!", 0, nil) }

func (c *CPIO) entry(name string, mode uint32, data []byte) error {
	if c.err != nil {
		return c.err
	}
	name = strings.TrimPrefix(name, "/")
	if name == "" || strings.IndexByte(name, 0) >= 0 || uint64(len(data)) > 0xffffffff {
		return fmt.Errorf("cpio entry %q: bad name or over 4 GiB", name)
	}
	nlink := 1
	if mode&ModeDir != 0 {
		nlink = 2
	}
	ino := c.ino
	if name == "TRAILER!!!" {
		ino, nlink = 0, 1
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+8+len(data)+4)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	buf = append(buf, data...)
	buf = pad4(buf)
	_, c.err = c.w.Write(buf)
	return c.err
}

// pad4 aligns to 4 bytes; every entry starts aligned, so the length is enough.
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
