package initramfs

import (
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// parseNewc reads an archive back: name → data, in order, strictly.
func parseNewc(t *testing.T, b []byte) (names []string, data map[string]string) {
	t.Helper()
	data = map[string]string{}
	for off := 0; ; {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("header field %d at %d: %v", i, off, err)
			}
			return int(v)
		}
		size, namesize := field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off = (off + 110 + namesize + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return names, data
		}
		names = append(names, name)
		data[name] = string(b[off : off+size])
		off = (off + size + 3) &^ 3
	}
}

func TestCPIO(t *testing.T) {
	var buf bytes.Buffer
	c := NewCPIO(&buf)
	c.Dir("/modules", 0o755)
	c.File("modules/a.ko", 0o644, []byte("abcde"))
	c.File("init", 0o755, []byte("#!"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	names, data := parseNewc(t, buf.Bytes())
	if strings.Join(names, " ") != "modules modules/a.ko init" || data["modules/a.ko"] != "abcde" || data["init"] != "#!" {
		t.Fatalf("got %q %q", names, data)
	}
	// A second opinion when a cpio tool is at hand.
	for _, tool := range [][]string{{"cpio", "-t"}, {"busybox", "cpio", "-t"}, {"bsdtar", "-tf", "-"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			continue
		}
		cmd := exec.Command(tool[0], tool[1:]...)
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.Output()
		if err != nil || strings.Fields(string(out))[1] != "modules/a.ko" {
			t.Errorf("%s lists %q, %v", tool, out, err)
		}
	}
	if err := NewCPIO(&buf).File("a\x00b", 0, nil); err == nil {
		t.Error("a NUL in a name was accepted")
	}
}
