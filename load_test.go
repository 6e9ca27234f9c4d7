package runcue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestStreamedLoadDispatchesBeforeItEnds: a Cue that starts on a deep queue
// calls handlers while the rest of the queue is still loading. The loading
// goroutine is held before its first batch until a handler has been
// called; then every unit runs, once.
func TestStreamedLoadDispatchesBeforeItEnds(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	calls := map[string]int{}
	called := make(chan struct{}, 1)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		calls[w.ID]++
		mu.Unlock()
		select {
		case called <- struct{}{}:
		default:
		}
		return nil, nil
	}}))
	_, err := e.c.SubmitBatch(e.ctx, batchOf("t", 300))
	require.NoError(t, err)
	hold := make(chan struct{})
	runcue.SetLoad(e.c, 50, 50, func(context.Context) { <-hold })
	e.start()
	select {
	case <-called:
	case <-time.After(time.Minute):
		t.Fatal("no handler was called while the load was held")
	}
	close(hold) // the load was held before its first batch: it had not ended
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Len(t, calls, 300)
	for id, n := range calls {
		assert.Equal(t, 1, n, id)
	}
}

// TestStreamedLoadDependenciesAndCancel: dependents stored before their
// dependencies, in different parts of a streamed load, still wait for them;
// a unit cancelled after the loader read it, but before it was handed to
// the loop, never runs.
func TestStreamedLoadDependenciesAndCancel(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	done := map[string]bool{}
	var early []string
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		var p struct{ Dep string }
		_ = w.Bind(&p)
		mu.Lock()
		if p.Dep != "" && !done[p.Dep] {
			early = append(early, w.ID)
		}
		mu.Unlock()
		mu.Lock()
		done[w.ID] = true
		mu.Unlock()
		return nil, nil
	}}))
	// d0..d99 each depend on p<i>, submitted after them; then 100 more
	// independent units, the last of which is cancelled during the load.
	var subs []runcue.Submission
	for i := range 100 {
		dep := fmt.Sprint("p", i)
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("d", i), DependsOn: []string{dep}, Params: map[string]string{"Dep": dep}})
	}
	for i := range 100 {
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("p", i)})
	}
	for i := range 100 {
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("x", i)})
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	hold := make(chan struct{})
	var once sync.Once
	runcue.SetLoad(e.c, 30, 40, func(context.Context) { once.Do(func() { <-hold }) })
	e.start()
	require.NoError(t, e.c.Cancel(e.ctx, "x99", runcue.CancelOptions{}))
	close(hold)
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Empty(t, early, "dependents started before their dependencies completed")
	assert.False(t, done["x99"], "the cancelled unit ran")
	assert.Equal(t, runcue.StateCancelled, e.get("x99").State)
	assert.Len(t, done, 299)
}

// TestStopDuringStreamedLoad: a Cue stopped while its start is still
// streaming the queue in loses nothing: the units it never loaded stay
// queued, and the next owner runs every unit exactly once.
func TestStopDuringStreamedLoad(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	calls := map[string]int{}
	handler := func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		calls[w.ID]++
		mu.Unlock()
		return nil, nil
	}
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: handler}))
	_, err := e.c.SubmitBatch(e.ctx, batchOf("t", 500))
	require.NoError(t, err)
	midway := make(chan struct{})
	steps := 0
	runcue.SetLoad(e.c, 20, 20, func(ctx context.Context) {
		if steps++; steps == 2 {
			close(midway)
			<-ctx.Done() // the dispatcher exits while the load is mid-way
		}
	})
	e.start()
	<-midway
	require.NoError(t, e.c.Stop(e.ctx))
	require.NoError(t, e.c.Close())

	c2 := e.open(runcue.Config{})
	require.NoError(t, c2.Task("t", runcue.Task{Handler: handler}))
	require.NoError(t, c2.Start(e.ctx))
	require.NoError(t, c2.Drain(e.ctx))
	assert.Len(t, calls, 500)
	for id, n := range calls {
		assert.Equal(t, 1, n, id)
	}
}

// TestLoadFollowsDispatch: a Cue on a deep queue whose handlers keep
// every slot taken loads no further than Config.LoadAhead queued units
// (plus the batch that crossed it), counts the units it has not loaded in
// its queue (backpressure's count, Explain's not_loaded), and loads the
// rest as dispatch makes room: every unit runs, once.
func TestLoadFollowsDispatch(t *testing.T) {
	const units, ahead, batch, slots = 500, 50, 20, 5
	e := newEnv(t, runcue.Config{MaxConcurrent: slots, LoadAhead: ahead})
	release := make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		<-release
		mu.Lock()
		calls[w.ID]++
		mu.Unlock()
		return nil, nil
	}}))
	subs, err := e.c.SubmitBatch(e.ctx, batchOf("t", units))
	require.NoError(t, err)
	type wait struct{ held, unloaded int }
	waits := make(chan wait, units)
	runcue.SetLoad(e.c, batch, batch, nil)
	runcue.OnLoadWaits(e.c, func(held, unloaded int) { waits <- wait{held, unloaded} })
	e.start()
	var first wait
	select {
	case first = <-waits:
	case <-time.After(time.Minute):
		t.Fatal("the load never waited")
	}
	assert.GreaterOrEqual(t, first.held, ahead)
	assert.Less(t, first.held, ahead+batch)
	assert.Equal(t, units-slots-first.held, first.unloaded, "every unit is held, running or counted as not loaded")
	st := e.inspect()
	assert.Equal(t, first.held, st.Units-slots, "the load stays waiting while every slot is taken")
	stats, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, units-slots, stats.Backpressure.Queued, "the queue's count includes the units not loaded")
	ex, err := e.c.Explain(e.ctx, subs[units-1].ID)
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonNotLoaded, ex.Reasons[0].Kind, "%+v", ex.Reasons)

	close(release)
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Len(t, calls, units)
	for id, n := range calls {
		assert.Equal(t, 1, n, id)
	}
	close(waits)
	for w := range waits {
		assert.Less(t, w.held, ahead+batch, "held at a wait")
	}
}

// TestLoadDoesNotWaitBehindUnitsThatCannotRun: units held that cannot run
// (dependents whose dependencies are stored behind them, units of a
// paused service) never keep the units behind them from loading, whatever
// Config.LoadAhead says: a free handler slot is room.
func TestLoadDoesNotWaitBehindUnitsThatCannotRun(t *testing.T) {
	t.Run("dependencies", func(t *testing.T) {
		e := newEnv(t, runcue.Config{LoadAhead: 10})
		var mu sync.Mutex
		done := map[string]bool{}
		var early []string
		require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			var p struct{ Dep string }
			_ = w.Bind(&p)
			mu.Lock()
			defer mu.Unlock()
			if p.Dep != "" && !done[p.Dep] {
				early = append(early, w.ID)
			}
			done[w.ID] = true
			return nil, nil
		}}))
		var subs []runcue.Submission
		for i := range 200 {
			dep := fmt.Sprint("p", i)
			subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("d", i), DependsOn: []string{dep}, Params: map[string]string{"Dep": dep}})
		}
		for i := range 200 {
			subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("p", i)})
		}
		_, err := e.c.SubmitBatch(e.ctx, subs)
		require.NoError(t, err)
		runcue.SetLoad(e.c, 10, 10, nil)
		e.start()
		require.NoError(t, e.c.Drain(e.ctx))
		assert.Empty(t, early, "dependents started before their dependencies completed")
		assert.Len(t, done, 400)
	})
	t.Run("paused service", func(t *testing.T) {
		e := newEnv(t, runcue.Config{LoadAhead: 10})
		require.NoError(t, e.c.Service("slow", runcue.Service{MaxConcurrent: 1}))
		require.NoError(t, e.c.Service("fast", runcue.Service{MaxConcurrent: 1}))
		noop := func(context.Context, *runcue.Work) (any, error) { return nil, nil }
		require.NoError(t, e.c.Task("slow", runcue.Task{Services: []string{"slow"}, Handler: noop}))
		require.NoError(t, e.c.Task("fast", runcue.Task{Services: []string{"fast"}, Handler: noop}))
		require.NoError(t, e.c.PauseService(e.ctx, "slow"))
		_, err := e.c.SubmitBatch(e.ctx, batchOf("slow", 100))
		require.NoError(t, err)
		fast, err := e.c.SubmitBatch(e.ctx, batchOf("fast", 10))
		require.NoError(t, err)
		runcue.SetLoad(e.c, 10, 10, nil)
		e.start()
		for _, s := range fast {
			assert.Equal(t, runcue.StateCompleted, e.wait(s.ID).State)
		}
	})
}
