//go:build !unix

package proc

import (
	"os"
	"os/exec"
	"syscall"
)

// start starts cmd. Process groups and parent-death signals do not exist
// here: only the direct child is signalled.
func start(cmd *exec.Cmd, _ syscall.Signal) error { return cmd.Start() }

func release() {}

func signalGroup(pid int, sig syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}

func becomeSubreaper() {}

func newGroup(*exec.Cmd) {}

func reapOrphans() {}

// canSupervise is false: os/exec cannot pass extra file descriptors here.
const canSupervise = false

func protectPipes() {}
