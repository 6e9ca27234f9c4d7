package runcue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// Wall-clock steps (NTP, a resumed virtual machine) move the fake clock's
// wall reading alone (StepWall); runcue measures every duration on the
// monotonic clock, so they change no window, timeout, backoff or hold.

// fullWindow starts a Cue whose service api allows 10 starts a second,
// submits 30 units, and returns once the first 10 have run; calls counts
// the handler's calls.
func fullWindow(t *testing.T) (e *env, calls *atomic.Int64) {
	t.Helper()
	e = newEnv(t, runcue.Config{})
	calls = new(atomic.Int64)
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 10, RateWindow: time.Second}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		calls.Add(1)
		return nil, nil
	}}))
	e.start()
	_, err := e.c.SubmitBatch(e.ctx, batchOf("t", 30))
	require.NoError(t, err)
	e.quiesce(e.c)
	require.Equal(t, int64(10), calls.Load(), "a full window")
	return e, calls
}

func TestWallStepBackDoesNotStallWindow(t *testing.T) {
	e, calls := fullWindow(t)
	e.clk.StepWall(-time.Hour)
	e.clk.Advance(time.Second + runcue.DefaultMargin)
	e.quiesce(e.c)
	assert.Equal(t, int64(20), calls.Load(), "one second later the window has room again, though the wall clock reads an hour earlier")
}

func TestWallStepForwardDoesNotOpenWindow(t *testing.T) {
	e, calls := fullWindow(t)
	e.clk.StepWall(time.Hour)
	require.NoError(t, runcue.PollNow(e.ctx, e.c)) // something to wake the dispatcher
	e.quiesce(e.c)
	assert.Equal(t, int64(10), calls.Load(), "a forward step lets nothing more through")
	e.clk.Advance(time.Second + runcue.DefaultMargin - time.Millisecond)
	e.quiesce(e.c)
	assert.Equal(t, int64(10), calls.Load())
	e.clk.Advance(time.Millisecond)
	e.quiesce(e.c)
	assert.Equal(t, int64(20), calls.Load())
}

// TestWallStepTimeoutsAndBackoff: a run's timeout and a retry's backoff
// last their durations, whatever the wall clock does meanwhile.
func TestWallStepTimeoutsAndBackoff(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var calls atomic.Int64
	started := make(chan struct{}, 10)
	require.NoError(t, e.c.Task("hang", runcue.Task{Timeout: time.Minute, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}}))
	require.NoError(t, e.c.Task("flaky", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 2, BaseDelay: 10 * time.Second, Jitter: runcue.JitterNone},
		Handler: func(context.Context, *runcue.Work) (any, error) {
			if calls.Add(1) == 1 {
				return nil, errors.New("transient")
			}
			return nil, nil
		}}))
	e.start()
	hang := e.submit("hang")
	<-started
	rec := record(t, e.c) // before the submit: the retry's event may come at once
	flaky := e.submit("flaky")
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, flaky))
	e.settle()

	e.clk.StepWall(2 * time.Hour) // forward: no deadline is reached, no backoff ends
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	e.settle()
	assert.Equal(t, runcue.StateRunning, e.get(hang).State)
	assert.Equal(t, 1, e.get(flaky).Runs, "no retry yet")

	e.clk.StepWall(-5 * time.Hour) // backward: nothing is stretched either
	e.clk.Advance(10*time.Second - time.Millisecond)
	e.settle()
	assert.Equal(t, 1, e.get(flaky).Runs, "no retry before 10s")
	e.clk.Advance(time.Millisecond)
	assert.Equal(t, runcue.StateCompleted, e.wait(flaky).State, "the retry came 10s after the failure")
	assert.Equal(t, int64(2), calls.Load())
	e.clk.Advance(50 * time.Second)
	wi := e.wait(hang)
	assert.Equal(t, "timeout", wi.ErrorKind, "the timeout fired a minute after the start")
}

// TestWallStepBackAcrossRestart: records of past events written before the
// wall clock was set back (rate-log entries, a circuit's opening, a
// Retry-After hold) lie in the future for the next owner; it clamps them,
// so no hold lasts longer from now than its own length.
func TestWallStepBackAcrossRestart(t *testing.T) {
	const lag = 100 * time.Millisecond
	e := newEnv(t, runcue.Config{MaxStartDelay: lag})
	var calls atomic.Int64
	register := func(c *runcue.Cue, fail bool) {
		require.NoError(t, c.Service("api", runcue.Service{RateLimit: 2, RateWindow: time.Second}))
		require.NoError(t, c.Service("flaky", runcue.Service{CircuitThreshold: 1, CircuitTimeout: time.Minute}))
		require.NoError(t, c.Service("polite", runcue.Service{}))
		require.NoError(t, c.Task("rated", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
			calls.Add(1)
			return nil, nil
		}}))
		require.NoError(t, c.Task("breaks", runcue.Task{Services: []string{"flaky"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
			Handler: func(context.Context, *runcue.Work) (any, error) {
				if fail {
					return nil, errors.New("502")
				}
				return nil, nil
			}}))
		require.NoError(t, c.Task("held", runcue.Task{Services: []string{"polite"}, Handler: func(context.Context, *runcue.Work) (any, error) {
			if fail {
				return nil, runcue.RetryAfter(30*time.Second, errors.New("429"))
			}
			return nil, nil
		}}))
	}
	register(e.c, true)
	e.start()
	_, err := e.c.SubmitBatch(e.ctx, batchOf("rated", 4))
	require.NoError(t, err)
	e.wait(e.submit("breaks"))
	held := e.submit("held")
	e.quiesce(e.c)
	require.Equal(t, int64(2), calls.Load())
	breaks := e.submit("breaks")
	require.NoError(t, e.c.Close())

	e.clk.StepWall(-time.Hour)
	c := e.open(runcue.Config{MaxStartDelay: lag})
	register(c, false)
	require.NoError(t, c.Start(e.ctx))
	e.quiesce(c)
	assert.Equal(t, int64(2), calls.Load(), "the old starts still fill the window")
	st, err := c.ServiceStatus(e.ctx, "flaky")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitOpen, st.Circuit)
	assert.False(t, st.CircuitOpenUntil.After(e.clk.Now().Add(time.Minute)), "open at most its CircuitTimeout from now: %v", st.CircuitOpenUntil)
	st, err = c.ServiceStatus(e.ctx, "polite")
	require.NoError(t, err)
	assert.False(t, st.BlockedUntil.After(e.clk.Now().Add(30*time.Second)), "held at most its Retry-After from now: %v", st.BlockedUntil)

	e.clk.Advance(time.Second + lag)
	e.quiesce(c)
	assert.Equal(t, int64(4), calls.Load(), "the window frees within a window (and the start lag), not an hour")
	e.clk.Advance(time.Minute)
	for _, id := range []string{breaks, held} {
		wi, err := c.Wait(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State, "the circuit probed within a minute; the hold ended within 30s")
	}
}
