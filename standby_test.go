package runcue_test

import (
	"context"

	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestStandbyTakesOver: a Cue started with Config.Standby while another
// owns the database returns from Start at once and runs nothing; when the
// owner stops, it takes over and runs what was left queued, each unit
// once. Stop ends a standby that is still waiting, and its Start is then
// a Start again.
func TestStandbyTakesOver(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 2})
	var mu sync.Mutex
	ran := map[string][]string{} // unit -> the Cues whose handler completed it
	started := make(chan struct{}, 100)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		started <- struct{}{}
		<-ctx.Done() // held until the owner stops and cancels it
		return nil, ctx.Err()
	}}))
	e.start()
	standby := e.open(runcue.Config{Standby: true, PollInterval: 5 * time.Millisecond})
	require.NoError(t, standby.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[w.ID] = append(ran[w.ID], "standby")
		return nil, nil
	}}))
	require.NoError(t, standby.Start(e.ctx), "a standby's Start returns at once")
	require.NoError(t, standby.Start(e.ctx), "and a second Start does nothing")
	assert.Empty(t, standby.Owner(), "the standby does not own the database")

	subs, err := e.c.SubmitBatch(e.ctx, batchOf("t", 20))
	require.NoError(t, err)
	<-started
	<-started
	// The owner stops, cancelling its two runs (their units go back to the
	// queue); the standby takes over and runs every unit.
	require.NoError(t, e.c.StopAndCancel(e.ctx))
	// The standby tries again every PollInterval, on its clock.
	for standby.Owner() == "" {
		require.NoError(t, e.ctx.Err(), "the standby never took over")
		e.clk.Advance(5 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	for _, s := range subs {
		wi, err := standby.Wait(e.ctx, s.ID)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State)
	}
	assert.NotEmpty(t, standby.Owner(), "the standby took over")
	mu.Lock()
	for _, s := range subs {
		if !assert.Equal(t, []string{"standby"}, ran[s.ID], s.ID) {
			evs, _ := standby.WorkEvents(e.ctx, s.ID, 0, 100)
			for _, ev := range evs {
				t.Logf("%d %s %s attempt %d", ev.Seq, ev.Type, ev.ErrorKind, ev.Attempt)
			}
		}
	}
	mu.Unlock()
	require.NoError(t, standby.Stop(e.ctx))
	assert.Empty(t, standby.Owner())

	// A standby still waiting stops at once.
	owner := e.open(runcue.Config{})
	require.NoError(t, owner.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
	require.NoError(t, owner.Start(e.ctx))
	waiting := e.open(runcue.Config{Standby: true, PollInterval: 5 * time.Millisecond})
	require.NoError(t, waiting.Start(e.ctx))
	require.NoError(t, waiting.Stop(e.ctx))
	require.NoError(t, owner.Stop(e.ctx))
	assert.Empty(t, waiting.Owner(), "a stopped standby never takes over")
}
