//go:build unix

package proc_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/proc"
)

// Workers that lie: each writes to the response pipe (fd 4) behind the
// protocol's back. They are registered before proc.Main runs in
// TestMain, in the orchestrator and in its workers alike.
func init() {
	write := func(b []byte) {
		for len(b) > 0 {
			n, err := syscall.Write(4, b)
			if err != nil {
				return
			}
			b = b[n:]
		}
	}
	proc.Register("extra-line", func(context.Context, *runcue.Work) (any, error) {
		// A line that looks like an answer, before the real one.
		write([]byte(`{"seq":1,"result":"not yours"}` + "\n"))
		return "mine", nil
	})
	proc.Register("garbage", func(context.Context, *runcue.Work) (any, error) {
		write([]byte("this is not JSON\n"))
		return "mine", nil
	})
	proc.Register("endless", func(context.Context, *runcue.Work) (any, error) {
		write([]byte(strings.Repeat("x", 3<<20))) // no newline, over the limit
		return "mine", nil
	})
	proc.Register("big-result", func(context.Context, *runcue.Work) (any, error) {
		return strings.Repeat("y", 2<<20), nil
	})
}

// TestPoolProtocolErrors: a worker that writes a line out of turn, a line
// that is not JSON, or a line without end over the size limit fails only
// the unit it was running, with an error naming the cause, is replaced at
// once, and never has its output attached to another unit. Params and
// results over the limit fail their unit permanently.
func TestPoolProtocolErrors(t *testing.T) {
	c := newCue(t)
	pool, err := proc.NewPool(c, proc.PoolOptions{Size: 1, MaxMessage: 1 << 20})
	require.NoError(t, err)
	defer pool.Close()
	for _, name := range []string{"echo", "extra-line", "garbage", "endless", "big-result"} {
		require.NoError(t, c.Task(name, runcue.Task{Services: []string{pool.Service()}, Handler: pool.Handler(name),
			Retry: runcue.RetryPolicy{MaxAttempts: 1}}))
	}
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	run := func(task string, params any) runcue.WorkInfo {
		t.Helper()
		s, err := c.Submit(ctx, runcue.Submission{Task: task, Params: params})
		require.NoError(t, err)
		wi, err := c.Wait(ctx, s.ID)
		require.NoError(t, err)
		return wi
	}
	echo := func() {
		t.Helper()
		wi := run("echo", map[string]int{"n": 1})
		require.Equal(t, runcue.StateCompleted, wi.State, wi.Error)
		assert.Contains(t, string(wi.Result), `"params":{"n":1}`, "the next unit gets its own answer")
	}
	echo()
	for _, tc := range []struct{ task, cause string }{
		{"extra-line", "response tagged 1 to request"},
		{"garbage", `undecodable response "this is not JSON"`},
		{"endless", "a response line over"},
	} {
		wi := run(tc.task, nil)
		assert.Equal(t, runcue.StateFailed, wi.State, tc.task)
		assert.Contains(t, wi.Error, "protocol error", tc.task)
		assert.Contains(t, wi.Error, tc.cause, tc.task)
		assert.NotContains(t, string(wi.Result), "not yours")
		echo()
	}
	big := run("big-result", nil)
	assert.Equal(t, runcue.StateFailed, big.State)
	assert.Contains(t, big.Error, "over the pool's limit")
	assert.Equal(t, 1, big.Runs)
	echo()
	params := run("echo", map[string]string{"blob": strings.Repeat("z", 2<<20)})
	assert.Equal(t, runcue.StateFailed, params.State)
	assert.Contains(t, params.Error, "params of")
	echo()
	require.NoError(t, c.Stop(ctx))
}
