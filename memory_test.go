package runcue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestFinishedRunsUnreachable: once a unit has finished, nothing runcue
// keeps reaches its run (unit record, contexts, span) or its unit record,
// whatever the way it ended and although its 30-minute deadline, its
// dependency deadline and its cancellation grace are still far off. A
// timer entry once kept each run alive until its deadline.
func TestFinishedRunsUnreachable(t *testing.T) {
	e := newEnv(t, runcue.Config{Priority: runcue.PriorityByWaitTime(time.Hour)})
	cancelled := make(chan struct{})
	require.NoError(t, e.c.Task("ok", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Task("fails", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("no") }}))
	require.NoError(t, e.c.Task("cancelled", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		cancelled <- struct{}{}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}}))
	reachable := runcue.TrackRuns(e.c)
	e.start()
	const n = 300
	subs := batchOf("ok", n)
	for i := range subs {
		subs[i].DependencyTimeout = 24 * time.Hour
		if i%3 == 1 {
			subs[i].Task = "fails"
		}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	id := e.submit("cancelled")
	<-cancelled
	require.NoError(t, e.c.Cancel(e.ctx, id, runcue.CancelOptions{}))
	require.NoError(t, e.c.Drain(e.ctx))
	e.settle()
	runs, units, started := reachable()
	t.Logf("%d runs started; %d runs and %d units still reachable", started, runs, units)
	assert.Equal(t, n+1, started)
	assert.Zero(t, runs, "finished runs are unreachable")
	assert.Zero(t, units, "finished units are unreachable")
}
