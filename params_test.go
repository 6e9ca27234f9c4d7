package runcue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestParamsBeyondBudgetReadInBatches: with a params budget far below the
// queue's params, the units beyond it (loaded at the start and submitted
// while the Cue runs) get their params from batched reads, never one read
// per run, and every handler sees its own params.
func TestParamsBeyondBudgetReadInBatches(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 4})
	var mu sync.Mutex
	var reads, readUnits int
	runcue.SetParamBudget(e.c, 2000, func(n int) {
		mu.Lock()
		reads++
		readUnits += n
		mu.Unlock()
	})
	seen := map[string]string{}
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		var p struct{ ID string }
		if err := w.Bind(&p); err != nil {
			return nil, err
		}
		mu.Lock()
		seen[w.ID] = p.ID
		mu.Unlock()
		return nil, nil
	}}))
	submit := func(from, n int) {
		subs := make([]runcue.Submission, n)
		for i := range subs {
			id := fmt.Sprintf("u%05d", from+i)
			subs[i] = runcue.Submission{Task: "t", ID: id, Params: map[string]string{"ID": id}}
		}
		_, err := e.c.SubmitBatch(e.ctx, subs)
		require.NoError(t, err)
	}
	submit(0, 3000)
	e.start()
	submit(3000, 2000)
	require.NoError(t, e.c.Drain(e.ctx))
	require.Len(t, seen, 5000)
	for id, p := range seen {
		require.Equal(t, id, p, "a handler saw another unit's params")
	}
	t.Logf("%d reads of params for %d units", reads, readUnits)
	assert.Positive(t, reads, "the budget was passed: some params were read")
	assert.LessOrEqual(t, reads*100, readUnits, "params are read in batches (at least 100 units per read on average)")
}

// TestParamlessListDropsUnitsThatLeft: units indexed without params that
// leave without running (cancelled here) do not stay reachable through the
// list of units whose params are to be read.
func TestParamlessListDropsUnitsThatLeft(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 1})
	runcue.SetParamBudget(e.c, 1000, nil)
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	subs := batchOf("t", 3000)
	for i := range subs {
		subs[i].Params = map[string]int{"I": i}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	g.next(t) // one unit runs and holds the only slot
	before := e.inspect()
	require.Greater(t, before.WithoutParams, 2500, "most units are beyond the budget")
	n, err := e.c.CancelWhere(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}}, runcue.CancelOptions{}, false)
	require.NoError(t, err)
	require.Greater(t, n, 2900)
	e.settle()
	after := e.inspect()
	t.Logf("without params: %d listed for %d units before; %d listed for %d after", before.NoParams, before.WithoutParams, after.NoParams, after.WithoutParams)
	assert.LessOrEqual(t, after.NoParams, 2*after.WithoutParams+64, "the list was compacted")
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
}
