package execd

import (
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRecvThroughSignals: a Recv on a socket with a receive timeout (the
// executor's end has one, and SA_RESTART does not restart such a call)
// that signals keep interrupting still returns the frame that comes, with
// its fd, instead of EINTR. Without the retry it fails within the first
// signals.
func TestRecvThroughSignals(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	tv := unix.NsecToTimeval((10 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(pair[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	defer func() { signal.Stop(sigs); close(sigs) }()
	go func() {
		for range sigs {
		}
	}()

	type got struct {
		fds []int
		err error
		r   Response
	}
	done := make(chan got, 1)
	tid := make(chan int, 1)
	go func() {
		// One thread, so the signals below reach the Recv's.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		var r Response
		fds, err := Recv(pair[0], &r)
		done <- got{fds, err, r}
	}()
	thread := <-tid
	for range 200 {
		if err := unix.Tgkill(os.Getpid(), thread, unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-done:
			t.Fatalf("Recv returned before anything was sent: %v", g.err)
		case <-time.After(time.Millisecond):
		}
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	if err := Send(pair[1], Response{Pid: 42}, int(devnull.Fd())); err != nil {
		t.Fatal(err)
	}
	g := <-done
	if g.err != nil {
		t.Fatalf("Recv interrupted by signals: %v", g.err)
	}
	closeAll(g.fds)
	if g.r.Pid != 42 || len(g.fds) != 1 {
		t.Fatalf("Recv got %+v with %d fds, want pid 42 and 1 fd", g.r, len(g.fds))
	}
}
