package proc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// shimSpec is what the orchestrator tells a command's supervisor, on fd 3.
type shimSpec struct {
	Args  []string      `json:"args"`
	Dir   string        `json:"dir,omitempty"`
	Env   []string      `json:"env,omitempty"`
	Grace time.Duration `json:"grace"`
}

// runShim is the main of a command's supervisor. The command runs in a
// process group of its own, of which the supervisor is not part, and the
// supervisor is the subreaper of the command's descendants. On SIGTERM (a
// timeout, a cancellation, or the orchestrator's death) it signals the
// group, waits the grace, kills the group, and kills the descendants that
// left it. When the command exits, whatever it left behind is killed too.
// It writes the command's pid on fd 4 and exits with the command's exit
// code (128+signal if a signal ended it).
func runShim() int {
	becomeSubreaper()
	protectPipes() // the command must not inherit fds 3 and 4
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	specFile, pidFile := os.NewFile(3, "spec"), os.NewFile(4, "pid")
	var spec shimSpec
	if specFile == nil || json.NewDecoder(specFile).Decode(&spec) != nil || len(spec.Args) == 0 {
		fmt.Fprintln(os.Stderr, "runcue: bad command spec")
		return 125
	}
	specFile.Close()
	cmd := exec.Command(spec.Args[0], spec.Args[1:]...)
	cmd.Dir, cmd.Env = spec.Dir, spec.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	newGroup(cmd)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "runcue:", err)
		return 127
	}
	pid := cmd.Process.Pid
	if pidFile != nil {
		pidFile.WriteString(strconv.Itoa(pid))
		pidFile.Close()
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-term:
		signalGroup(pid, syscall.SIGTERM)
		select {
		case err = <-exited:
		case <-time.After(spec.Grace):
			signalGroup(pid, syscall.SIGKILL)
			err = <-exited
		}
	}
	signalGroup(pid, syscall.SIGKILL) // what the command left behind
	reapOrphans()
	return exitCode(err)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 125
}
