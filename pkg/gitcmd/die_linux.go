package gitcmd

import "syscall"

// dieWithParent has the kernel kill git when the thread that started it
// ends.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
