package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// TestLeaseLostStopsOwner: when another holder takes the lease over while
// the owner still runs (here TakeOver; in production, the owner's lease
// expired because it could not renew it), the owner stops trusting its
// lease within a renewal: it cancels its handler (cause ErrNotOwner), and,
// being a standby, waits again; when the other holder releases the lease
// it takes over once more and, once the deposed run's lease has ended,
// runs the unit to completion.
func TestLeaseLostStopsOwner(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	opts := postgres.Options{LeaseTTL: 400 * time.Millisecond}
	st, err := postgres.Open(ctx, u, opts)
	require.NoError(t, err)
	defer st.Close()
	// The deposed owner's run cannot record its end: the unit is recovered
	// when the run's lease (timeout + LeaseBuffer) ends.
	c, err := runcue.New(st, runcue.Config{Standby: true, PollInterval: 20 * time.Millisecond, DefaultTimeout: time.Second,
		LeaseBuffer: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	started := make(chan struct{}, 4)
	causes := make(chan error, 4)
	first := true
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		started <- struct{}{}
		if first {
			first = false
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		}
		return "done", nil
	}}))
	sub, err := c.Submit(ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	<-started
	owner := c.Owner()
	require.NotEmpty(t, owner)

	other, err := postgres.Open(ctx, u, opts)
	require.NoError(t, err)
	defer other.Close()
	own, err := other.TakeOver(ctx, store.Holder{Owner: "operator"})
	require.NoError(t, err)
	select {
	case cause := <-causes:
		assert.True(t, errors.Is(cause, runcue.ErrNotOwner), "cause %v", cause)
	case <-time.After(time.Minute):
		t.Fatal("the deposed owner's handler was not cancelled")
	}
	require.NoError(t, own.Release())
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wi, err := c.Wait(wctx, sub.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.NotEqual(t, owner, c.Owner(), "a new ownership, under a new lease name")
	require.NoError(t, c.Stop(ctx))
}
