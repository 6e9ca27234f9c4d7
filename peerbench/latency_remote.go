package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// Latency across processes. The scheduler (this process) and its helpers
// (this program run again, as children) share the machine's wall clock,
// so an instant stamped in one process is compared with one stamped in
// another. A child reports its instants on its standard output, one line
// each: "id unix-nanoseconds [unix-nanoseconds]".

// childEnv names the role of this program run as a child: submit (a
// submitter in another process than the scheduler) or execute (an
// executor). childURL is the schema's URL, childArgs the role's numbers.
const (
	childEnv  = "RUNCUE_PEERBENCH_CHILD"
	childURL  = "RUNCUE_PEERBENCH_URL"
	childArgs = "RUNCUE_PEERBENCH_ARGS"
)

// maybeChild runs this process as a child if its environment names a role;
// ok is false otherwise.
func maybeChild() (ok bool, err error) {
	role := os.Getenv(childEnv)
	if role == "" {
		return false, nil
	}
	var a, b int
	if _, err := fmt.Sscan(os.Getenv(childArgs), &a, &b); err != nil {
		return true, fmt.Errorf("peerbench child: %s=%q: %w", childArgs, os.Getenv(childArgs), err)
	}
	// The child ends when its parent closes its standard input (or dies).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	switch role {
	case "submit":
		return true, submitChild(ctx, os.Getenv(childURL), a, float64(b))
	case "execute":
		return true, executeChild(ctx, os.Getenv(childURL), a)
	}
	return true, fmt.Errorf("peerbench child: %s=%q: want submit or execute", childEnv, role)
}

// openCue opens a Cue on the schema at u with the no-op task (remote or
// not), not started.
func openCue(ctx context.Context, u string, remote bool, h runcue.Handler) (*runcue.Cue, func(), error) {
	st, err := postgres.Open(ctx, u, postgres.Options{})
	if err != nil {
		return nil, nil, err
	}
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	closeAll := func() { c.Close(); st.Close() }
	if err := c.Task("noop", runcue.Task{Remote: remote, Handler: h}); err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, closeAll, nil
}

// submitChild submits n no-op units, one every 1/rate, and prints each
// one's ID and the instants Submit was called and returned.
func submitChild(ctx context.Context, u string, n int, rate float64) error {
	c, closeAll, err := openCue(ctx, u, false, func(context.Context, *runcue.Work) (any, error) { return nil, nil })
	if err != nil {
		return err
	}
	defer closeAll()
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	return submitSteady(ctx, c, n, rate, func(id string, called, returned time.Time) {
		fmt.Fprintln(w, id, called.UnixNano(), returned.UnixNano())
	})
}

// executeChild runs an executor of capacity handlers of the no-op task,
// printing each run's ID and the instant its handler started, until ctx
// ends. It prints "ready" first.
func executeChild(ctx context.Context, u string, capacity int) error {
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	h := func(_ context.Context, wk *runcue.Work) (any, error) {
		now := time.Now()
		mu.Lock()
		fmt.Fprintln(w, wk.ID, now.UnixNano())
		w.Flush()
		mu.Unlock()
		return nil, nil
	}
	c, closeAll, err := openCue(ctx, u, true, nil)
	if err != nil {
		return err
	}
	defer closeAll()
	x, err := c.Executor(runcue.ExecutorConfig{Capacity: capacity, Logger: slog.New(slog.DiscardHandler)}, map[string]runcue.Handler{"noop": h})
	if err != nil {
		return err
	}
	mu.Lock()
	fmt.Fprintln(w, "ready")
	w.Flush()
	mu.Unlock()
	if err := x.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// child is a running child process: its lines arrive on lines until it
// ends; stop closes its standard input and waits for it.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan []string
	done  chan error
	once  sync.Once
	err   error // stop's
}

func startChild(role, u string, a, b int) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+role, childURL+"="+u, fmt.Sprintf("%s=%d %d", childArgs, a, b))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := &child{cmd: cmd, in: in, lines: make(chan []string, 1024), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- strings.Fields(sc.Text())
		}
		close(ch.lines)
		ch.done <- cmd.Wait()
	}()
	return ch, nil
}

// stop ends the child and returns its error, if it failed; called again,
// it returns the same.
func (ch *child) stop() error {
	ch.once.Do(func() {
		ch.in.Close()
		for range ch.lines {
		}
		if err := <-ch.done; err != nil {
			ch.err = fmt.Errorf("peerbench child %v: %w", ch.cmd.Env[len(ch.cmd.Env)-3:], err)
		}
	})
	return ch.err
}

// unixNS parses a line's field of Unix nanoseconds.
func unixNS(f string) (time.Time, error) {
	n, err := strconv.ParseInt(f, 10, 64)
	return time.Unix(0, n), err
}

// latencyFromProcess measures from Submit in another process (a child) to
// the handler's start in the scheduler's: n units, every 1/rate.
func latencyFromProcess(ctx context.Context, out io.Writer, base string, n int, rate float64) error {
	u, _, drop, err := withSchema(ctx, base)
	if err != nil {
		return err
	}
	defer drop()
	st := newStarts(n)
	c, closeAll, err := openCue(ctx, u, false, func(_ context.Context, w *runcue.Work) (any, error) {
		st.add(w.ID, time.Now())
		return nil, nil
	})
	if err != nil {
		return err
	}
	defer closeAll()
	if err := c.Start(ctx); err != nil {
		return err
	}
	sub, err := startChild("submit", u, n, int(rate))
	if err != nil {
		return err
	}
	defer sub.stop() // on an early return, the child ends too
	called, returned := map[string]time.Time{}, map[string]time.Time{}
	for f := range sub.lines {
		if len(f) != 3 {
			return fmt.Errorf("peerbench: the submitter printed %q", f)
		}
		if called[f[0]], err = unixNS(f[1]); err == nil {
			returned[f[0]], err = unixNS(f[2])
		}
		if err != nil {
			return err
		}
	}
	if err := sub.stop(); err != nil {
		return err
	}
	return st.report(ctx, out, fmt.Sprintf("from another process, no-op, %d units at %.0f/s", n, rate), called, returned)
}

// latencyExecutors measures from Submit in the scheduler's process to the
// handler's start in an executor's: executors children of capacity
// handlers each; n units, every 1/rate, after a few not measured.
func latencyExecutors(ctx context.Context, out io.Writer, base string, n int, rate float64, executors, capacity int) error {
	u, _, drop, err := withSchema(ctx, base)
	if err != nil {
		return err
	}
	defer drop()
	// An executor that ends before the measure does ends the measure.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c, closeAll, err := openCue(ctx, u, true, nil)
	if err != nil {
		return err
	}
	defer closeAll()
	if err := c.Start(ctx); err != nil {
		return err
	}
	st := newStarts(n)
	ready := make(chan struct{}, executors)
	var kids []*child
	var wg sync.WaitGroup
	defer func() {
		for _, k := range kids {
			_ = k.stop()
		}
		wg.Wait()
	}()
	for range executors {
		k, err := startChild("execute", u, capacity, 0)
		if err != nil {
			return err
		}
		kids = append(kids, k)
		wg.Go(func() {
			for f := range k.lines {
				if len(f) == 1 && f[0] == "ready" {
					ready <- struct{}{}
					continue
				}
				at, err := unixNS(f[len(f)-1])
				if len(f) != 2 || err != nil {
					continue
				}
				st.add(f[0], at)
			}
			cancel(errors.New("peerbench: an executor child ended before the measure did"))
		})
	}
	for range executors {
		select {
		case <-ready:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	// A few units first, not measured: the executors' registrations and
	// first reads are behind them.
	for i := range 10 {
		if _, err := c.Submit(ctx, runcue.Submission{Task: "noop", ID: fmt.Sprint("warm", i)}); err != nil {
			return err
		}
	}
	time.Sleep(time.Second)
	called, returned := make(map[string]time.Time, n), make(map[string]time.Time, n)
	if err := submitSteady(ctx, c, n, rate, func(id string, call, ret time.Time) { called[id], returned[id] = call, ret }); err != nil {
		return err
	}
	return st.report(ctx, out, fmt.Sprintf("through %d executors of %d, no-op, %d units at %.0f/s", executors, capacity, n, rate), called, returned)
}
