package proc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/proc"
)

// The test binary is also every program the tests run: pool workers and
// command supervisors (proc.Main), and helper commands (helperEnv).
const helperEnv = "RUNCUE_TEST_HELPER"

func TestMain(m *testing.M) {
	proc.Register("echo", func(ctx context.Context, w *runcue.Work) (any, error) {
		var p map[string]any
		_ = w.Bind(&p)
		return map[string]any{"params": p, "pid": os.Getpid(), "attempt": w.Attempt}, nil
	})
	proc.Register("panic", func(context.Context, *runcue.Work) (any, error) { panic("handler bug") })
	proc.Register("exit3", func(context.Context, *runcue.Work) (any, error) { os.Exit(3); return nil, nil })
	proc.Register("hang", func(context.Context, *runcue.Work) (any, error) { select {} })
	proc.Register("skip", func(context.Context, *runcue.Work) (any, error) { return nil, runcue.Skip("nothing to do") })
	proc.Register("bad-input", func(context.Context, *runcue.Work) (any, error) {
		return nil, runcue.Permanent(errors.New("unparseable"))
	})
	proc.Main()
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(helper(h))
	}
	goleak.VerifyTestMain(m)
}

// helper is the main of the test's helper commands.
func helper(name string) int {
	switch name {
	case "args":
		json.NewEncoder(os.Stdout).Encode(os.Args[1:])
	case "echo":
		io.Copy(os.Stdout, os.Stdin)
		fmt.Fprint(os.Stderr, "to stderr")
	case "bigout":
		n, _ := strconv.Atoi(os.Args[1])
		os.Stdout.Write([]byte(strings.Repeat("x", n)))
		os.Stderr.Write([]byte(strings.Repeat("y", n)))
	case "exit":
		code, _ := strconv.Atoi(os.Args[1])
		fmt.Fprint(os.Stderr, "failing on purpose")
		return code
	case "stubborn":
		// Ignores SIGTERM; starts a grandchild that does too; prints both
		// pids; waits forever.
		signal.Ignore(syscall.SIGTERM)
		gc := exec.Command(os.Args[0])
		gc.Env = append(os.Environ(), helperEnv+"=sleeper")
		if err := gc.Start(); err != nil {
			return 1
		}
		fmt.Printf("%d %d\n", os.Getpid(), gc.Process.Pid)
		select {}
	case "sleeper":
		signal.Ignore(syscall.SIGTERM)
		select {}
	case "orchestrator":
		// A Cue running one stubborn command; killed by the test.
		return orchestrator()
	}
	return 0
}

func orchestrator() int {
	dir := os.Getenv("RUNCUE_TEST_DIR")
	c, err := runcue.Open(filepath.Join(dir, "orch.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 2
	}
	pids := filepath.Join(dir, "pids")
	err = c.Task("run", runcue.Task{Handler: proc.Command(func(ctx context.Context, w *runcue.Work) (proc.Cmd, error) {
		return proc.Cmd{Args: []string{os.Args[0]}, Env: append(os.Environ(), helperEnv+"=stubborn")}, nil
	}, proc.CommandOptions{Grace: 500 * time.Millisecond})})
	if err != nil {
		return 2
	}
	ctx := context.Background()
	c.Submit(ctx, runcue.Submission{Task: "run"})
	c.Start(ctx)
	_ = pids
	select {}
}

func self(t *testing.T, helperName string, args ...string) proc.Cmd {
	t.Helper()
	return proc.Cmd{Args: append([]string{os.Args[0]}, args...), Env: append(os.Environ(), helperEnv+"="+helperName)}
}

func TestCommandOutput(t *testing.T) {
	c := self(t, "echo")
	c.Stdin = []byte("hello from stdin")
	res, err := proc.CommandOptions{}.Run(t.Context(), c)
	require.NoError(t, err)
	assert.Equal(t, "hello from stdin", res.Stdout)
	assert.Equal(t, "to stderr", res.Stderr)
	assert.Zero(t, res.ExitCode)
}

func TestCommandOutputCap(t *testing.T) {
	res, err := proc.CommandOptions{MaxOutput: 1000}.Run(t.Context(), self(t, "bigout", "3000000"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(res.Stdout, strings.Repeat("x", 1000)))
	assert.Contains(t, res.Stdout, "[runcue: 2999000 more bytes truncated]")
	assert.Equal(t, int64(2999000), res.StdoutTruncated)
	assert.Equal(t, int64(2999000), res.StderrTruncated)
	assert.Less(t, len(res.Stdout), 1100)
}

func TestCommandExitCodes(t *testing.T) {
	o := proc.CommandOptions{PermanentExitCodes: []int{2}, SuccessExitCodes: []int{0, 3}}
	for _, tc := range []struct {
		code      int
		ok        bool
		permanent bool
	}{{0, true, false}, {3, true, false}, {1, false, false}, {2, false, true}} {
		res, err := o.Run(t.Context(), self(t, "exit", strconv.Itoa(tc.code)))
		require.NotNil(t, res)
		assert.Equal(t, tc.code, res.ExitCode)
		if tc.ok {
			assert.NoError(t, err, "exit %d", tc.code)
			continue
		}
		var xe *proc.ExitError
		require.ErrorAs(t, err, &xe, "exit %d", tc.code)
		assert.Equal(t, tc.code, xe.Code)
		assert.Contains(t, xe.Error(), "failing on purpose", "the error carries the end of stderr")
		assert.Equal(t, tc.permanent, errors.Is(err, runcue.ErrPermanent), "exit %d", tc.code)
	}
	_, err := proc.CommandOptions{}.Run(t.Context(), proc.Cmd{Args: []string{"/no/such/program"}})
	assert.ErrorIs(t, err, runcue.ErrPermanent, "a missing program is permanent")
}

// TestNoShell: a shell-looking argument reaches the program as one literal
// argument, through a whole Cue, and nothing interprets it.
func TestNoShell(t *testing.T) {
	tmp := t.TempDir()
	evil := `; touch "$TMPDIR/pwned" && echo $(id)`
	c, err := runcue.Open(filepath.Join(tmp, "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("args", runcue.Task{Handler: proc.Command(func(ctx context.Context, w *runcue.Work) (proc.Cmd, error) {
		cmd := self(t, "args", "first", w.Target)
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
		return cmd, nil
	}, proc.CommandOptions{})}))
	require.NoError(t, c.Start(t.Context()))
	s, err := c.Submit(t.Context(), runcue.Submission{Task: "args", Target: evil})
	require.NoError(t, err)
	wi, err := c.Wait(t.Context(), s.ID)
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, wi.State, wi.Error)
	var res proc.CommandResult
	require.NoError(t, json.Unmarshal(wi.Result, &res))
	var args []string
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &args))
	assert.Equal(t, []string{"first", evil}, args, "one literal argument")
	_, err = os.Stat(filepath.Join(tmp, "pwned"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no shell ran")
	require.NoError(t, c.Stop(t.Context()))
}

// waitGone waits until every pid is gone. The bound guards against a hang;
// it is not a measure of speed.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still alive", pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestCommandTimeoutKillsGroup: a command that ignores SIGTERM, and its
// grandchild that does too, are killed at timeout + grace, with or without a
// supervisor.
func TestCommandTimeoutKillsGroup(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	for _, supervised := range []bool{true, false} {
		t.Run(fmt.Sprintf("supervised=%v", supervised), func(t *testing.T) {
			defer proc.Supervised(supervised)()
			ctx, cancel := context.WithCancel(t.Context())
			type out struct {
				res *proc.CommandResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := proc.CommandOptions{Grace: 300 * time.Millisecond}.Run(ctx, self(t, "stubborn"))
				done <- out{res, err}
			}()
			var cmdPid, gcPid int
			deadline := time.Now().Add(10 * time.Second)
			for gcPid == 0 {
				require.True(t, time.Now().Before(deadline), "the command did not start")
				cmdPid, gcPid = findStubborn(processTree(), os.Getpid(), supervised)
				time.Sleep(5 * time.Millisecond)
			}
			start := time.Now()
			cancel()
			o := <-done
			require.Error(t, o.err)
			assert.ErrorIs(t, o.err, context.Canceled)
			assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "SIGTERM is ignored: SIGKILL after the grace")
			assert.Equal(t, 128+int(syscall.SIGKILL), o.res.ExitCode)
			waitGone(t, cmdPid, gcPid)
		})
	}
}

// findStubborn finds, below root, the stubborn helper and its grandchild:
// root -> [supervisor ->] command -> grandchild. The grandchild exists only
// once the helper ignores SIGTERM.
func findStubborn(tree map[int][]int, root int, supervised bool) (cmd, grandchild int) {
	parents := tree[root]
	if supervised {
		parents = nil
		for _, s := range tree[root] {
			parents = append(parents, tree[s]...)
		}
	}
	for _, c := range parents {
		if gcs := tree[c]; len(gcs) > 0 {
			return c, gcs[0]
		}
	}
	return 0, 0
}

// TestOrchestratorKilled: SIGKILL the orchestrator while its command, which
// has forked a grandchild, runs: both are gone shortly after.
func TestOrchestratorKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("parent-death signals are Linux's")
	}
	dir := t.TempDir()
	orch := exec.Command(os.Args[0], "-test.run=^$")
	orch.Env = append(os.Environ(), helperEnv+"=orchestrator", "RUNCUE_TEST_DIR="+dir)
	orch.Stderr = os.Stderr
	require.NoError(t, orch.Start())
	defer orch.Process.Kill()
	// Find orchestrator -> shim -> command -> grandchild.
	var shim, cmd, gc int
	deadline := time.Now().Add(20 * time.Second)
	for gc == 0 {
		require.True(t, time.Now().Before(deadline), "the command did not start")
		tree := processTree()
		for _, s := range tree[orch.Process.Pid] {
			for _, c := range tree[s] {
				if g := tree[c]; len(g) > 0 {
					shim, cmd, gc = s, c, g[0]
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, orch.Process.Signal(syscall.SIGKILL))
	_ = orch.Wait()
	waitGone(t, shim, cmd, gc)
}

func processTree() map[int][]int {
	tree := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue // zombies are dead
		}
		ppid, _ := strconv.Atoi(f[1])
		tree[ppid] = append(tree[ppid], pid)
	}
	return tree
}

func newCue(t *testing.T) *runcue.Cue {
	c, err := runcue.Open(filepath.Join(t.TempDir(), "q.db"), runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPool: a panic, an os.Exit and a timeout each fail only their unit;
// the pool replaces the worker; over 1,000 units the orchestrator's
// goroutines return to their baseline and its heap stays bounded.
func TestPool(t *testing.T) {
	c := newCue(t)
	pool, err := proc.NewPool(c, proc.PoolOptions{Size: 2})
	require.NoError(t, err)
	defer pool.Close()
	for _, name := range []string{"echo", "panic", "exit3", "bad-input", "skip"} {
		require.NoError(t, c.Task(name, runcue.Task{Services: []string{pool.Service()}, Handler: pool.Handler(name),
			Retry: runcue.RetryPolicy{MaxAttempts: 1}}))
	}
	require.NoError(t, c.Task("hang", runcue.Task{Services: []string{pool.Service()}, Handler: pool.Handler("hang"),
		Timeout: 300 * time.Millisecond, Retry: runcue.RetryPolicy{MaxAttempts: 1}}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	run := func(task string) runcue.WorkInfo {
		s, err := c.Submit(ctx, runcue.Submission{Task: task, Params: map[string]int{"n": 7}})
		require.NoError(t, err)
		wi, err := c.Wait(ctx, s.ID)
		require.NoError(t, err)
		return wi
	}
	ok := run("echo")
	require.Equal(t, runcue.StateCompleted, ok.State, ok.Error)
	var out struct {
		Params map[string]int
		Pid    int
	}
	require.NoError(t, json.Unmarshal(ok.Result, &out))
	assert.Equal(t, 7, out.Params["n"], "params and results travel as JSON")
	assert.NotEqual(t, os.Getpid(), out.Pid, "in another process")

	p := run("panic")
	assert.Equal(t, runcue.StateFailed, p.State)
	assert.Contains(t, p.Error, "handler bug")
	e := run("exit3")
	assert.Equal(t, runcue.StateFailed, e.State)
	assert.Contains(t, e.Error, "exit status 3")
	h := run("hang")
	assert.Equal(t, runcue.StateFailed, h.State)
	assert.Equal(t, "timeout", h.ErrorKind)
	assert.Equal(t, "panic", p.ErrorKind, "a worker's panic is a panic, as in-process")
	b := run("bad-input")
	assert.Equal(t, "unparseable", b.Error)
	s := run("skip")
	assert.Equal(t, runcue.StateSkipped, s.State, "a worker's Skip skips the unit, as in-process")
	assert.Equal(t, "nothing to do", s.Error)
	after := run("echo")
	assert.Equal(t, runcue.StateCompleted, after.State, "the next unit runs on a fresh worker")
	assert.LessOrEqual(t, pool.Workers(), 2)

	// 1,000 units: goroutines back to baseline, heap bounded. Each live
	// worker has one goroutine waiting for its process; the pool may hold a
	// different number of live workers at the end.
	runtime.GC()
	baseG := runtime.NumGoroutine() - pool.Workers()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap := ms.HeapAlloc
	subs := make([]runcue.Submission, 1000)
	for i := range subs {
		task := "echo"
		if i%100 == 0 {
			task = "exit3" // a dead worker every hundred units
		}
		subs[i] = runcue.Submission{Task: task, Params: map[string]int{"n": i}}
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))
	page, err := c.List(ctx, runcue.ListOptions{States: []runcue.State{runcue.StateCompleted}, Limit: 1000})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(page.Units), 990)
	// Polled here, not with assert.Eventually, which runs its condition on
	// a goroutine of its own.
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine()-pool.Workers() > baseG; {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d besides the workers', baseline %d\n%s", runtime.NumGoroutine()-pool.Workers(), baseG,
				buf[:runtime.Stack(buf, true)])
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	growth := int64(ms.HeapAlloc) - int64(baseHeap)
	t.Logf("heap after GC: %d KiB before, %d KiB after 1,000 units (%+d KiB)", baseHeap>>10, ms.HeapAlloc>>10, growth>>10)
	assert.Less(t, growth, int64(8<<20), "heap growth under 8 MiB")
	require.NoError(t, c.Stop(ctx))
}

func TestPoolCloseStopsWorkers(t *testing.T) {
	c := newCue(t)
	pool, err := proc.NewPool(c, proc.PoolOptions{Size: 1, Service: "cpu"})
	require.NoError(t, err)
	require.NoError(t, c.Task("hang", runcue.Task{Services: []string{"cpu"}, Handler: pool.Handler("hang")}))
	require.NoError(t, c.Start(t.Context()))
	_, err = c.Submit(t.Context(), runcue.Submission{Task: "hang"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pool.Workers() == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, pool.Close()) // kills the busy worker too
	assert.Zero(t, pool.Workers())
	_, err = pool.Handler("echo")(t.Context(), &runcue.Work{ID: "x"})
	assert.ErrorIs(t, err, proc.ErrPoolClosed)
	require.NoError(t, c.StopAndCancel(t.Context()))
}
