//go:build linux

package proc

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The kernel sends a child's parent-death signal when the thread that forked
// it exits, not the process. Go may run a fork on any thread, and threads
// locked by goroutines that end are destroyed; so every child that needs
// the signal is forked by one goroutine locked to its thread, which ends
// only when no child it forked is alive.
type forker struct {
	mu    sync.Mutex
	reqs  chan forkReq
	alive int // children started and not yet waited for
}

type forkReq struct {
	cmd  *exec.Cmd
	done chan error
}

var theForker forker

// start starts cmd from the pinned thread, with deathSig as its parent-death
// signal. The caller must call release once the child has been waited for.
func start(cmd *exec.Cmd, deathSig syscall.Signal) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = deathSig
	f := &theForker
	f.mu.Lock()
	f.alive++
	if f.reqs == nil {
		f.reqs = make(chan forkReq)
		go f.loop(f.reqs)
	}
	reqs := f.reqs
	f.mu.Unlock()
	done := make(chan error, 1)
	reqs <- forkReq{cmd: cmd, done: done}
	err := <-done
	if err != nil {
		release()
	}
	return err
}

// release records that a child started by start has been waited for.
func release() {
	f := &theForker
	f.mu.Lock()
	defer f.mu.Unlock()
	f.alive--
	if f.alive == 0 && f.reqs != nil {
		close(f.reqs) // the loop ends; its thread dies with no child left
		f.reqs = nil
	}
}

func (f *forker) loop(reqs chan forkReq) {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	for r := range reqs {
		r.done <- r.cmd.Start()
	}
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}

// becomeSubreaper makes orphaned descendants of this process its children.
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// newGroup puts cmd in a process group of its own.
func newGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// reapOrphans kills and reaps the processes reparented to this subreaper
// (descendants of the command whose parents died), until none is left.
func reapOrphans() {
	self := os.Getpid()
	for range 100 {
		kids := childrenOf(self)
		if len(kids) == 0 {
			return
		}
		for _, k := range kids {
			_ = syscall.Kill(k, syscall.SIGKILL)
		}
		for _, k := range kids {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(k, &ws, 0, nil)
		}
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(pid)
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == pid {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == want {
			out = append(out, n)
		}
	}
	return out
}

// canSupervise reports that commands can run under a supervisor and the
// pool can start workers (both inherit pipes as fds 3 and 4).
const canSupervise = true

// protectPipes marks fds 3 and 4 close-on-exec, so that processes this one
// starts do not hold the orchestrator's pipes open.
func protectPipes() {
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
}
