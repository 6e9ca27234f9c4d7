// Package proc runs work in other processes: commands (SSH, CLI tools)
// run directly, never through a shell, and an isolated pool of worker
// processes for CPU-heavy or crash-prone Go code.
//
// Call Main at the top of main, before anything else. It returns at once in
// a normal process; in a process runcue started (a pool worker, or the small
// supervisor that runs each command) it does that process's work and exits:
//
//	func main() {
//		proc.Register("parse_pdf", parsePDF) // pool handlers, by name
//		proc.Main()
//		...
//	}
//
// # Commands
//
// Command builds a runcue.Handler from a function that returns the command
// for a unit. runcue runs it with its arguments as given (no shell: an
// argument holding "; rm -rf ~" reaches the program as that one argument),
// captures stdout and stderr up to a cap, and stores
// {"stdout", "stderr", "exit_code"} as the unit's result. A non-zero exit
// fails the run (retried per the task's policy) unless listed as permanent.
//
// Each command runs under a small supervisor process (this binary again,
// in Main) that leads a process group holding the command and everything it
// starts, and is the subreaper of its descendants. On timeout or
// cancellation the group gets SIGTERM, then SIGKILL after a grace period.
// On Linux the supervisor also gets SIGTERM when the orchestrator dies, even
// by SIGKILL (PR_SET_PDEATHSIG, sent by a forking thread pinned for the
// purpose, since the kernel sends it when the forking thread exits, not the
// process); it then ends the group the same way, and any descendants that
// left the group. So when the orchestrator dies, no child or grandchild
// keeps working. Processes a command leaves behind when it exits are killed
// too: a unit's processes end with it.
//
// If Main was not called, commands run without the supervisor: in their
// own process group, killed by group on timeout and cancellation, the direct
// child killed with the orchestrator (Linux), but a grandchild may outlive
// an orchestrator that dies. On other Unix systems there is no parent-death
// signal; on Windows, commands run but only the direct child is killed.
//
// # Pool
//
// NewPool starts a pool of worker processes: this binary, re-executed,
// which Main turns into a worker serving the handlers registered with
// Register. Params and results travel as JSON over pipes. A panic, a
// segfault in cgo, an os.Exit or a leak in a handler takes down at most its
// worker: the unit fails (and is retried per its policy) and the pool starts
// a new worker. A timeout or cancellation kills the worker. Workers exit
// when the orchestrator does: their requests pipe closes (and on Linux they
// also get SIGKILL as their parent-death signal). The pool registers a
// service of its size, so its capacity is enforced like any other.
package proc
