package runcue_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// finishGate is a store whose transactions holding a run's Finish wait
// until the gate opens: the database falls behind the handlers.
type finishGate struct {
	store.Store
	open chan struct{}
	once sync.Once
}

func (g *finishGate) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	if slices.ContainsFunc(ops, func(op store.Op) bool { _, ok := op.(*store.Finish); return ok }) {
		select {
		case <-g.open:
		case <-ctx.Done():
			return store.Batch{}, ctx.Err()
		}
	}
	return g.Store.Apply(ctx, ops)
}

func (g *finishGate) release() { g.once.Do(func() { close(g.open) }) }

// TestMaxUncommitted: while Config.MaxUncommitted ended runs wait for their
// outcomes to commit, no run starts, although a slot is free; Explain
// says why; once the database catches up the rest runs. Without the cap,
// handlers faster than the writer ran ahead of it without bound (240,000
// runs ahead with 300,000 no-op units queued), and a crash ran all of
// those again.
func TestMaxUncommitted(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	gate := &finishGate{Store: st, open: make(chan struct{})}
	c, err := runcue.New(gate, runcue.Config{MaxConcurrent: 4, MaxUncommitted: 3, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	quit := make(chan struct{}) // on a failure, before Close: handlers return
	defer close(quit)
	defer gate.release()
	ctx := t.Context()

	started := make(chan string, 64)
	hold := make(chan struct{})
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		started <- w.ID
		select {
		case <-hold:
		case <-quit:
		case <-ctx.Done():
		}
		return nil, nil
	}}))
	concluded := make(chan string, 64)
	runcue.OnConcluded(c, func(id string) { concluded <- id })
	subs, err := c.SubmitBatch(ctx, batchOf("t", 20))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))

	runs := map[string]bool{}
	for range 4 {
		runs[<-started] = true
	}
	// Each of the first two runs to end frees a slot that is filled at
	// once: one and then two runs wait for their commits.
	for range 2 {
		hold <- struct{}{}
		<-concluded
		runs[<-started] = true
	}
	// The third: three wait (the cap), and its slot stays free.
	hold <- struct{}{}
	<-concluded
	require.NoError(t, runcue.SyncDispatcher(ctx, c))
	assert.Len(t, runs, 6, "MaxConcurrent + MaxUncommitted - 1 runs started before any outcome committed")
	select {
	case id := <-started:
		t.Fatalf("%s started while 3 outcomes waited for their commit", id)
	default:
	}
	var queued string
	for _, s := range subs {
		if !runs[s.ID] {
			queued = s.ID
			break
		}
	}
	ex, err := c.Explain(ctx, queued)
	require.NoError(t, err)
	var kinds []runcue.ReasonKind
	for _, r := range ex.Reasons {
		kinds = append(kinds, r.Kind)
	}
	assert.Equal(t, []runcue.ReasonKind{runcue.ReasonCommitBacklog}, kinds, "3 of 4 slots are taken; the commit backlog holds the unit")

	// The database catches up: everything runs.
	gate.release()
	go func() {
		for range started {
			hold <- struct{}{}
		}
	}()
	for range 3 {
		hold <- struct{}{} // the runs still holding their slots
	}
	require.NoError(t, c.Drain(ctx))
	for _, s := range subs {
		w, err := c.Get(ctx, s.ID)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, w.State, s.ID)
	}
	require.NoError(t, c.Stop(ctx))
	close(started)
}
