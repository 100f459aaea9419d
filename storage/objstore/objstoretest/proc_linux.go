package objstoretest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the server when the test process dies
// (a timeout's panic, a kill), so no versitygw outlives its test.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
