package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
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

// TestMaxUncommitted: while Settings.MaxUncommitted ended runs wait for
// their outcomes to commit, no run starts, although a slot is free;
// Explain says why; once the database catches up the rest runs. Without
// the cap, handlers faster than the writer ran ahead of it without bound
// (240,000 runs ahead with 300,000 no-op units queued), and a crash ran
// all of those again. (Moved from the root, where it watched the runs
// conclude through a back door.)
func TestMaxUncommitted(t *testing.T) {
	gate := &finishGate{open: make(chan struct{})}
	w := newWorldOn(t, func(st store.Store) store.Store { gate.Store = st; return gate })
	defer w.close()
	quit := make(chan struct{}) // on a failure, before close: handlers return
	defer close(quit)
	defer gate.release()

	started := make(chan string, 64)
	hold := make(chan struct{})
	w.useRunner("task t", &funcRunner{w: w, f: func(ctx context.Context, p *Run, _ time.Time, _ []byte) Ending {
		started <- p.ID
		select {
		case <-hold:
		case <-quit:
		case <-ctx.Done():
			return stopped(ctx)
		}
		return Ending{}
	}})
	concluded := make(chan string, 64)
	w.settings = func(s *Settings) { s.MaxConcurrent, s.MaxUncommitted = 4, 3 }
	w.hooks = func(h *Hooks) { h.Concluded = func(r *Run) { concluded <- r.ID } }
	w.insert(numbered("t", "u", 20)...)
	w.start(nil)

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
	if err := w.e.Sync(w.ctx); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 6 {
		t.Errorf("%d runs started before any outcome committed, want MaxConcurrent + MaxUncommitted - 1 = 6", len(runs))
	}
	select {
	case id := <-started:
		t.Fatalf("%s started while 3 outcomes waited for their commit", id)
	default:
	}
	var queued string
	for i := range 20 {
		if id := fmt.Sprint("u", i); !runs[id] {
			queued = id
			break
		}
	}
	ex, _, err := w.e.Explain(w.ctx, queued)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []rt.ReasonKind
	for _, r := range ex.Reasons {
		kinds = append(kinds, r.Kind)
	}
	if !slices.Equal(kinds, []rt.ReasonKind{rt.ReasonCommitBacklog}) {
		t.Errorf("%s's reasons: %v; 3 of 4 slots are taken, and the commit backlog holds it", queued, kinds)
	}

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
	w.drain()
	for i := range 20 {
		u, err := w.st.GetUnit(w.ctx, fmt.Sprint("u", i))
		if err != nil || u.State != store.Completed {
			t.Errorf("u%d: %v %v, want completed", i, u.State, err)
		}
	}
	w.do("stop")
	close(started)
}
