//go:build linux

// Command airlock-guest is the VM guest agent: PID 1 of the initramfs the VM
// runtime boots (see package vm/guest), and, re-executed as
// airlock-guest-exec, the last step of starting a job process. Build it
// static: CGO_ENABLED=0.
package main

import (
	"os"

	"github.com/airlockhq/airlock/services/executor/internal/vm/guest"
)

func main() {
	if len(os.Args) > 0 && os.Args[0] == guest.ChildArg0 {
		guest.Child()
	}
	guest.Main()
}
