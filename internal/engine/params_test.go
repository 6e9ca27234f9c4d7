package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// submitParams submits n units of task t from ID number from, each with
// params naming its own ID; the running engine is told, as a Cue does.
func (w *world) submitParams(t string, from, n int) {
	units := make([]*store.Unit, n)
	for i := range units {
		id := fmt.Sprintf("u%05d", from+i)
		units[i] = &store.Unit{ID: id, Task: t, Params: []byte(`{"ID":"` + id + `"}`)}
	}
	w.insert(units...)
}

// TestParamsBeyondBudgetReadInBatches: with a params budget far below the
// queue's params, the units beyond it (loaded at the start and submitted
// while the engine runs) get their params from batched reads, never one
// read per run, and every handler sees its own params. (Moved from the
// root, where it set the budget through a back door.)
func TestParamsBeyondBudgetReadInBatches(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	var mu sync.Mutex
	var reads, readUnits int
	w.hooks = func(h *Hooks) {
		h.ParamBudget = 2000
		h.ParamRead = func(n int) { mu.Lock(); reads++; readUnits += n; mu.Unlock() }
	}
	var seenMu sync.Mutex
	seen := map[string]string{} // unit ID to the ID its params name
	w.useRunner("task t", &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
		var params struct{ ID string }
		_ = json.Unmarshal(b, &params)
		seenMu.Lock()
		seen[p.ID] = params.ID
		seenMu.Unlock()
		return Ending{Result: []byte(`null`)}
	}})
	w.submitParams("t", 0, 3000)
	w.do("start")
	w.submitParams("t", 3000, 2000)
	if err := w.e.Drain(w.ctx); err != nil {
		t.Fatal(err)
	}
	seenMu.Lock()
	defer seenMu.Unlock()
	if len(seen) != 5000 {
		t.Fatalf("%d units ran, want 5000", len(seen))
	}
	for id, p := range seen {
		if id != p {
			t.Fatalf("%s saw %s's params", id, p)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d reads of params for %d units", reads, readUnits)
	if reads == 0 || reads*100 > readUnits {
		t.Fatalf("%d reads for %d units: the budget was passed, and params are read in batches (at least 100 units a read on average)", reads, readUnits)
	}
}

// TestParamlessListDropsUnitsThatLeft: units indexed without params that
// leave without running (cancelled here) do not stay reachable through
// the list of units whose params are to be read. (Moved from the root.)
func TestParamlessListDropsUnitsThatLeft(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	w.hooks = func(h *Hooks) { h.ParamBudget = 1000 }
	w.do("task t max=1")
	w.submitParams("t", 0, 3000)
	w.do("start") // one unit runs and holds the only slot
	before, err := w.e.Inspect(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.WithoutParams <= 2500 {
		t.Fatalf("%d units without params: most should be beyond the budget", before.WithoutParams)
	}
	for i := 1; i < 3000; i++ {
		if _, _, err := w.e.Cancel(w.ctx, fmt.Sprintf("u%05d", i), rt.CancelOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.settle()
	after, err := w.e.Inspect(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("without params: %d listed for %d units before; %d listed for %d after", before.NoParams, before.WithoutParams,
		after.NoParams, after.WithoutParams)
	if after.NoParams > 2*after.WithoutParams+64 {
		t.Fatalf("the list was not compacted: %d listed for %d units", after.NoParams, after.WithoutParams)
	}
}
