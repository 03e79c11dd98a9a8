package cli

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// openPTY returns the two ends of a new pseudo-terminal in raw mode: what
// is written to tty is read, unchanged, from pty.
func openPTY(t *testing.T) (pty, tty *os.File) {
	t.Helper()
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { pty.Close() })
	if err := unix.IoctlSetPointerInt(int(pty.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(pty.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pseudo-terminal number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	// Raw, so the line discipline writes "\n" as it is, not as "\r\n".
	if _, err := term.MakeRaw(int(tty.Fd())); err != nil {
		t.Fatalf("raw mode: %v", err)
	}
	return pty, tty
}
