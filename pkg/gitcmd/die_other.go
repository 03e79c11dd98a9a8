//go:build !linux

package gitcmd

import "syscall"

// dieWithParent does nothing where the kernel offers no parent-death
// signal.
func dieWithParent() *syscall.SysProcAttr { return nil }
