//go:build unix && !linux

package proc

import (
	"os/exec"
	"syscall"
)

// start starts cmd in its own process group. There is no parent-death
// signal on this system.
func start(cmd *exec.Cmd, _ syscall.Signal) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return cmd.Start()
}

func release() {}

func signalGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}

func becomeSubreaper() {}

func newGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

func reapOrphans() {}

const canSupervise = true

func protectPipes() {
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
}
