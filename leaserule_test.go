package runcue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestLeaseRule: a run cut off at its deadline whose handler has not
// returned (it ignores its context, or its worker is lost) may go on until
// its lease ends (the deadline plus LeaseBuffer): its unit does not run
// again before then, though its backoff is over. Once the handler
// returns, the unit runs at its backoff.
func TestLeaseRule(t *testing.T) {
	e := newEnv(t, runcue.Config{LeaseBuffer: time.Minute})
	release := make(chan struct{})
	runs := make(chan int, 4)
	require.NoError(t, e.c.Task("t", runcue.Task{Timeout: 10 * time.Second,
		Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, Jitter: runcue.JitterNone},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			runs <- w.Attempt
			if w.Attempt == 1 {
				<-release // ignores its context
			}
			return nil, nil
		}}))
	e.start()
	id := e.submit("t")
	assert.Equal(t, 1, <-runs)
	e.clk.Advance(10 * time.Second) // its deadline
	e.settle()
	wi := e.get(id)
	assert.Equal(t, runcue.StateQueued, wi.State)
	assert.True(t, wi.RunAt.Equal(epoch.Add(70*time.Second)), "stored: it waits for the lease's end: %v", wi.RunAt)
	e.clk.Advance(5 * time.Second) // the backoff is over, the lease is not
	e.settle()
	assert.Empty(t, runs, "no second run while the first may go on")
	ex, err := e.c.Explain(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonBackoff, ex.Reasons[0].Kind)
	close(release) // the handler returns: the lease no longer holds the unit
	e.settle()
	assert.Equal(t, 2, <-runs)
	assert.Equal(t, runcue.StateCompleted, e.wait(id).State)

	// A handler that never returns holds its unit until the lease's end.
	hang := make(chan struct{})
	defer close(hang)
	require.NoError(t, e.c.Task("hang", runcue.Task{Timeout: 10 * time.Second,
		Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, Jitter: runcue.JitterNone},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			runs <- w.Attempt
			if w.Attempt == 1 {
				<-hang
			}
			return nil, nil
		}}))
	h := e.submit("hang")
	assert.Equal(t, 1, <-runs)
	e.clk.Advance(69 * time.Second)
	e.settle()
	assert.Empty(t, runs)
	e.clk.Advance(time.Second) // the lease ends
	e.settle()
	assert.Equal(t, 2, <-runs)
	assert.Equal(t, runcue.StateCompleted, e.wait(h).State)
}
