// Package acceptloop is the accept loop the executor's per-job network
// services (the egress proxy, the job's DNS server over TCP) share: it hands
// each accepted connection on, and keeps serving through errors that pass
// (out of descriptors and the like, as net/http does) rather than leave a
// job with no way out, until its server closes.
package acceptloop

import (
	"errors"
	"net"
	"time"
)

// Serve accepts on l and passes each connection to handle, until Accept
// fails after closed reports true (it then returns closedErr) or l itself is
// closed (net.ErrClosed). Other Accept errors are waited out, 5 ms at first
// and doubling to a second.
func Serve(l net.Listener, closed func() bool, closedErr error, handle func(net.Conn)) error {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if closed() {
				return closedErr
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		handle(c)
	}
}
