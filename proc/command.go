package proc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runcue/runcue"
)

// Cmd is a command to run for a unit.
type Cmd struct {
	// Args is the program and its arguments, passed as they are: no shell
	// sees them. A program without a slash is looked up in PATH.
	Args []string
	// Dir is the working directory. Default: the orchestrator's.
	Dir string
	// Env is the environment. Default (nil): the orchestrator's.
	Env []string
	// Stdin is the command's standard input. Default: none.
	Stdin []byte
}

// CommandOptions configure Command. The zero value is valid.
type CommandOptions struct {
	// MaxOutput caps the bytes of stdout and, separately, of stderr that
	// are kept; the rest is counted and the truncation marked. Default
	// 1 MiB.
	MaxOutput int
	// Grace is how long a command has to exit after SIGTERM (on timeout or
	// cancellation) before SIGKILL. Default 5s.
	Grace time.Duration
	// SuccessExitCodes are the exit codes that complete the unit. Default
	// {0}.
	SuccessExitCodes []int
	// PermanentExitCodes fail the unit without retrying it (bad input,
	// refused credentials). Other failing codes are retried per the task's
	// policy.
	PermanentExitCodes []int
}

func (o CommandOptions) withDefaults() CommandOptions {
	if o.MaxOutput <= 0 {
		o.MaxOutput = 1 << 20
	}
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	if len(o.SuccessExitCodes) == 0 {
		o.SuccessExitCodes = []int{0}
	}
	return o
}

// CommandResult is the stored result of a command.
type CommandResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	StdoutTruncated int64  `json:"stdout_truncated,omitempty"` // bytes dropped
	StderrTruncated int64  `json:"stderr_truncated,omitempty"`
}

// ExitError reports a command that exited with a failing code. Stderr holds
// the end of its standard error.
type ExitError struct {
	Code   int
	Stderr string
}

func (e *ExitError) Error() string {
	if e.Stderr == "" {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return fmt.Sprintf("exit status %d: %s", e.Code, e.Stderr)
}

// Command returns a Handler that runs the command build returns for each
// unit, and stores its output as a CommandResult. See the package
// documentation for how its processes are supervised.
func Command(build func(ctx context.Context, w *runcue.Work) (Cmd, error), o CommandOptions) runcue.Handler {
	o = o.withDefaults()
	return func(ctx context.Context, w *runcue.Work) (any, error) {
		c, err := build(ctx, w)
		if err != nil {
			return nil, err
		}
		return o.Run(ctx, c)
	}
}

// Run runs one command: until it exits, or ctx ends (SIGTERM, then SIGKILL
// after Grace, to its whole process group).
func (o CommandOptions) Run(ctx context.Context, c Cmd) (*CommandResult, error) {
	if len(c.Args) == 0 || c.Args[0] == "" {
		return nil, runcue.Permanent(errors.New("runcue: empty command"))
	}
	o = o.withDefaults()
	stdout, stderr := &capped{max: o.MaxOutput}, &capped{max: o.MaxOutput}
	p, err := o.start(c, stdout, stderr)
	if err != nil {
		err = fmt.Errorf("runcue: start %s: %w", c.Args[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			err = runcue.Permanent(err) // running it again will not help
		}
		return nil, err
	}
	defer release()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	var cause error
	select {
	case <-done:
	case <-ctx.Done():
		cause = context.Cause(ctx)
		p.stop(o.Grace, done)
	}
	res := &CommandResult{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: p.cmd.ProcessState.ExitCode(),
		StdoutTruncated: stdout.dropped, StderrTruncated: stderr.dropped}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
	}
	if cause != nil {
		return res, fmt.Errorf("%w (command stopped, exit code %d)", cause, res.ExitCode)
	}
	if slices.Contains(o.SuccessExitCodes, res.ExitCode) {
		return res, nil
	}
	xerr := &ExitError{Code: res.ExitCode, Stderr: tail(res.Stderr, 512)}
	if slices.Contains(o.PermanentExitCodes, res.ExitCode) {
		return res, runcue.Permanent(xerr)
	}
	return res, xerr
}

// process is a started command: under its supervisor (shim) or direct.
type process struct {
	cmd    *exec.Cmd
	shim   bool
	cmdPid int // the command's pid (and process group) under a shim
}

func (o CommandOptions) start(c Cmd, stdout, stderr io.Writer) (*process, error) {
	var stdin io.Reader
	if c.Stdin != nil {
		stdin = bytes.NewReader(c.Stdin)
	}
	// A relative path with a slash resolves in the child's Dir; anything
	// else can be checked here, so that a missing program fails the same way
	// with or without a supervisor.
	if c.Dir == "" || !strings.ContainsRune(c.Args[0], os.PathSeparator) || filepath.IsAbs(c.Args[0]) {
		if _, err := exec.LookPath(c.Args[0]); err != nil {
			return nil, err
		}
	}
	exe, exeErr := os.Executable()
	if !mainCalled.Load() || exeErr != nil || !canSupervise {
		cmd := exec.Command(c.Args[0], c.Args[1:]...)
		cmd.Dir, cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Dir, c.Env, stdin, stdout, stderr
		cmd.WaitDelay = o.Grace // a leftover holding the pipes open cannot hold Wait
		if err := start(cmd, syscall.SIGKILL); err != nil {
			return nil, err
		}
		return &process{cmd: cmd}, nil
	}
	// Under a supervisor: this binary in shim mode.
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), modeEnv+"="+modeShim)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.WaitDelay = o.Grace
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	pidR, pidW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{specR, pidW}
	err = start(cmd, syscall.SIGTERM)
	specR.Close()
	pidW.Close()
	if err != nil {
		specW.Close()
		pidR.Close()
		return nil, err
	}
	json.NewEncoder(specW).Encode(shimSpec{Args: c.Args, Dir: c.Dir, Env: c.Env, Grace: o.Grace})
	specW.Close()
	b, _ := io.ReadAll(pidR) // written once the command started; EOF if it did not
	pidR.Close()
	pid, _ := strconv.Atoi(string(b))
	return &process{cmd: cmd, shim: true, cmdPid: pid}, nil
}

// stop ends a command whose unit timed out or was cancelled: SIGTERM to its
// group, SIGKILL after grace. Under a supervisor, the supervisor does that;
// it is killed itself only if it fails to.
func (p *process) stop(grace time.Duration, done <-chan error) {
	pid := p.cmd.Process.Pid
	if p.shim {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			return
		case <-time.After(grace + 5*time.Second):
		}
		if p.cmdPid > 0 {
			signalGroup(p.cmdPid, syscall.SIGKILL)
		}
		signalGroup(pid, syscall.SIGKILL)
		<-done
		return
	}
	signalGroup(pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		signalGroup(pid, syscall.SIGKILL)
		<-done
	}
	signalGroup(pid, syscall.SIGKILL) // what it left behind in its group
}

// capped keeps the first max bytes written and counts the rest.
type capped struct {
	max     int
	buf     bytes.Buffer
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - c.buf.Len()
	if room >= len(p) {
		c.buf.Write(p)
		return len(p), nil
	}
	if room > 0 {
		c.buf.Write(p[:room])
	}
	c.dropped += int64(len(p) - max(room, 0))
	return len(p), nil
}

// String returns what was kept, marked when something was dropped.
func (c *capped) String() string {
	if c.dropped == 0 {
		return c.buf.String()
	}
	return c.buf.String() + fmt.Sprintf("\n[runcue: %d more bytes truncated]", c.dropped)
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
