package proc

import (
	"fmt"
	"os"
	"sync/atomic"
)

// The environment variable with which runcue marks a process it started.
const modeEnv = "RUNCUE_EXECUTOR"

const (
	modeWorker = "worker"
	modeShim   = "shim"
)

// mainCalled records that Main ran (and returned): the binary can serve as
// a command supervisor.
var mainCalled atomic.Bool

// Main makes this process a pool worker or a command supervisor if runcue
// started it for that, and then exits; otherwise it returns at once. Call
// it at the top of main, after Register.
func Main() {
	mode := os.Getenv(modeEnv)
	if mode != "" {
		os.Unsetenv(modeEnv) // processes started from here are not runcue's
	}
	switch mode {
	case modeWorker:
		os.Exit(serveWorker())
	case modeShim:
		os.Exit(runShim())
	case "":
		mainCalled.Store(true)
	default:
		fmt.Fprintf(os.Stderr, "runcue: unknown %s=%q\n", modeEnv, os.Getenv(modeEnv))
		os.Exit(2)
	}
}
