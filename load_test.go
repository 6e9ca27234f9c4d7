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
