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

// The start's streamed load: a deep queue stored before the engine
// started is read in batches while the engine dispatches.

// counter is a handler that counts its calls by unit and, for a unit whose
// params name a dependency (Dep), notes whether that dependency had run.
type counter struct {
	mu    sync.Mutex
	calls map[string]int
	early []string // units called before their dependency
}

func newCounter() *counter { return &counter{calls: map[string]int{}} }

func (c *counter) call(p *Run, params []byte) {
	var dep struct{ Dep string }
	_ = json.Unmarshal(params, &dep)
	c.mu.Lock()
	defer c.mu.Unlock()
	if dep.Dep != "" && c.calls[dep.Dep] == 0 {
		c.early = append(c.early, p.ID)
	}
	c.calls[p.ID]++
}

// once fails t unless exactly n units were called, each once.
func (c *counter) once(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls) != n {
		t.Errorf("%d units called, want %d", len(c.calls), n)
	}
	for id, k := range c.calls {
		if k != 1 {
			t.Errorf("%s called %d times", id, k)
		}
	}
	if len(c.early) > 0 {
		t.Errorf("called before their dependencies completed: %v", c.early)
	}
}

// dependents returns n units d<i>, each depending on p<i>, then the n
// units p<i>: every dependent is stored before its dependency.
func dependents(task string, n int) []*store.Unit {
	var units []*store.Unit
	for i := range n {
		dep := fmt.Sprint("p", i)
		units = append(units, &store.Unit{ID: fmt.Sprint("d", i), Task: task, DependsOn: []string{dep},
			Params: []byte(`{"Dep":"` + dep + `"}`)})
	}
	return append(units, numbered(task, "p", n)...)
}

func (w *world) drain() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, time.Minute)
	defer cancel()
	if err := w.e.Drain(ctx); err != nil {
		w.t.Fatalf("drain: %v", err)
	}
}

// TestStreamedLoadDispatchesBeforeItEnds: an engine that starts on a deep
// queue calls handlers while the rest of the queue is still loading. The
// loading goroutine is held before its first batch until a handler has
// been called; then every unit runs, once. (Moved from the root, where it
// set the load's sizes through a back door.)
func TestStreamedLoadDispatchesBeforeItEnds(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	c := newCounter()
	called := make(chan struct{}, 1)
	w.useRunner("task t", &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
		c.call(p, b)
		select {
		case called <- struct{}{}:
		default:
		}
		return Ending{}
	}})
	w.insert(numbered("t", "u", 300)...)
	hold := make(chan struct{})
	w.hooks = func(h *Hooks) {
		h.FirstLoad, h.LoadBatch = 50, 50
		h.LoadStep = func(context.Context) { <-hold }
	}
	w.start(nil)
	select {
	case <-called:
	case <-time.After(time.Minute):
		t.Fatal("no handler was called while the load was held")
	}
	close(hold) // the load was held before its first batch: it had not ended
	w.drain()
	c.once(t, 300)
}

// TestStreamedLoadDependenciesAndCancel: dependents stored before their
// dependencies, in different parts of a streamed load, still wait for
// them; a unit cancelled after the loader read it, but before it was
// handed to the loop, never runs. (Moved from the root.)
func TestStreamedLoadDependenciesAndCancel(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	c := newCounter()
	w.useRunner("task t", &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
		c.call(p, b)
		return Ending{}
	}})
	w.insert(append(dependents("t", 100), numbered("t", "x", 100)...)...)
	hold := make(chan struct{})
	var once sync.Once
	w.hooks = func(h *Hooks) {
		h.FirstLoad, h.LoadBatch = 30, 40
		h.LoadStep = func(context.Context) { once.Do(func() { <-hold }) }
	}
	w.start(nil)
	if _, _, err := w.e.Cancel(w.ctx, "x99", rt.CancelOptions{}); err != nil {
		t.Fatal(err)
	}
	close(hold)
	w.drain()
	c.mu.Lock()
	ran := c.calls["x99"]
	delete(c.calls, "x99")
	c.mu.Unlock()
	if ran != 0 {
		t.Error("the cancelled unit ran")
	}
	c.once(t, 299)
	u, err := w.st.GetUnit(w.ctx, "x99")
	if err != nil || u.State != store.Cancelled {
		t.Errorf("x99: %v %v, want cancelled", u.State, err)
	}
}

// TestStopDuringStreamedLoad: an engine stopped while its start is still
// streaming the queue in loses nothing: the units it never loaded stay
// queued, and the next owner runs every unit exactly once. (Moved from
// the root.)
func TestStopDuringStreamedLoad(t *testing.T) {
	w := newWorld(t)
	defer w.close()
	c := newCounter()
	w.useRunner("task t", &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
		c.call(p, b)
		return Ending{}
	}})
	w.insert(numbered("t", "u", 500)...)
	midway := make(chan struct{})
	steps := 0
	w.hooks = func(h *Hooks) {
		h.FirstLoad, h.LoadBatch = 20, 20
		h.LoadStep = func(ctx context.Context) {
			if steps++; steps == 2 {
				close(midway)
				<-ctx.Done() // the dispatcher exits while the load is mid-way
			}
		}
	}
	w.start(nil)
	<-midway
	w.do("stop")
	w.hooks = nil
	w.do("start")
	w.drain()
	c.once(t, 500)
}

// TestLoadFollowsDispatch: an engine on a deep queue whose handlers keep
// every slot taken loads no further than Settings.LoadAhead queued units
// (plus the batch that crossed it), counts the units it has not loaded
// in its queue (backpressure's count, Explain's not_loaded), and loads
// the rest as dispatch makes room: every unit runs, once. (Moved from the
// root.)
func TestLoadFollowsDispatch(t *testing.T) {
	const units, ahead, batch, slots = 500, 50, 20, 5
	w := newWorld(t)
	defer w.close()
	release := make(chan struct{})
	c := newCounter()
	w.useRunner("task t", &funcRunner{w: w, f: func(ctx context.Context, p *Run, _ time.Time, b []byte) Ending {
		select {
		case <-release:
		case <-ctx.Done():
			return stopped(ctx)
		}
		c.call(p, b)
		return Ending{}
	}})
	w.insert(numbered("t", "u", units)...)
	type wait struct{ held, unloaded int }
	waits := make(chan wait, units)
	w.settings = func(s *Settings) { s.MaxConcurrent, s.LoadAhead = slots, ahead }
	w.hooks = func(h *Hooks) {
		h.FirstLoad, h.LoadBatch = batch, batch
		h.LoadWaits = func(held, unloaded int) { waits <- wait{held, unloaded} }
	}
	w.start(nil)
	var first wait
	select {
	case first = <-waits:
	case <-time.After(time.Minute):
		t.Fatal("the load never waited")
	}
	if first.held < ahead || first.held >= ahead+batch {
		t.Errorf("%d units held at the first wait, want from %d to %d", first.held, ahead, ahead+batch-1)
	}
	if want := units - slots - first.held; first.unloaded != want {
		t.Errorf("%d units counted as not loaded, want %d: every unit is held, running or not loaded", first.unloaded, want)
	}
	st, err := w.e.Inspect(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Units-slots != first.held {
		t.Errorf("%d units held, want %d: the load stays waiting while every slot is taken", st.Units-slots, first.held)
	}
	bp, _, err := w.e.Backpressure(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bp.Queued != units-slots {
		t.Errorf("the queue counts %d, want %d: its count includes the units not loaded", bp.Queued, units-slots)
	}
	ex, _, err := w.e.Explain(w.ctx, fmt.Sprint("u", units-1))
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Reasons) == 0 || ex.Reasons[0].Kind != rt.ReasonNotLoaded {
		t.Errorf("the last unit's reasons: %+v, want not_loaded first", ex.Reasons)
	}

	close(release)
	w.drain()
	c.once(t, units)
	close(waits)
	for wt := range waits {
		if wt.held >= ahead+batch {
			t.Errorf("%d units held at a wait", wt.held)
		}
	}
}

// TestLoadDoesNotWaitBehindUnitsThatCannotRun: units held that cannot run
// (dependents whose dependencies are stored behind them, units of a
// paused service) never keep the units behind them from loading, whatever
// Settings.LoadAhead says: a free handler slot is room. (Moved from the
// root.)
func TestLoadDoesNotWaitBehindUnitsThatCannotRun(t *testing.T) {
	small := func(w *world) {
		w.settings = func(s *Settings) { s.LoadAhead = 10 }
	}
	t.Run("dependencies", func(t *testing.T) {
		w := newWorld(t)
		defer w.close()
		c := newCounter()
		w.useRunner("task t", &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
			c.call(p, b)
			return Ending{}
		}})
		w.insert(dependents("t", 200)...)
		small(w)
		w.start(nil)
		w.drain()
		c.once(t, 400)
	})
	t.Run("paused service", func(t *testing.T) {
		w := newWorld(t)
		defer w.close()
		c := newCounter()
		run := &funcRunner{w: w, f: func(_ context.Context, p *Run, _ time.Time, b []byte) Ending {
			c.call(p, b)
			return Ending{}
		}}
		w.do("service slow max=1")
		w.do("service fast max=1")
		w.useRunner("task slow services=slow", run)
		w.useRunner("task fast services=fast", run)
		w.do("pause service slow")
		w.insert(numbered("slow", "s", 100)...)
		w.insert(numbered("fast", "f", 10)...)
		small(w)
		w.start(nil)
		deadline := time.Now().Add(time.Minute)
		for i := 0; i < 10; {
			u, err := w.st.GetUnit(w.ctx, fmt.Sprint("f", i))
			switch {
			case err != nil:
				t.Fatal(err)
			case u.State == store.Completed:
				i++
			case time.Now().After(deadline):
				t.Fatalf("f%d is %v: the load waited behind the paused service's units", i, u.State)
			default:
				time.Sleep(time.Millisecond)
			}
		}
	})
}
