package chaos

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill cmd's process when the harness dies:
// a harness killed by a signal (a test binary's timeout, a user's ^C)
// must not leave its nodes running, holding ports and CPU. (The signal
// follows the OS thread that started the child; the harness locks no
// goroutine to a thread, so its threads live as long as it does.)
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
