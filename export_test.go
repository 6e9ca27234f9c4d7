package runcue

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/runcue/runcue/internal/writer"
)

// Settle returns once the dispatcher has handled everything sent to it, the
// writer has committed everything queued, and the dispatcher has handled the
// commits' consequences. Handlers still running are not waited for.
func Settle(ctx context.Context, c *Cue) error {
	for range 2 {
		if d := c.disp.Load(); d != nil {
			if err := d.sync(ctx); err != nil {
				return err
			}
		}
		if err := c.w.Sync(ctx); err != nil {
			return err
		}
	}
	if d := c.disp.Load(); d != nil {
		return d.sync(ctx)
	}
	return nil
}

// SyncDispatcher returns once the dispatcher has handled every message sent
// before the call and finished one loop iteration (dispatch included). It
// does not wait for the writer.
func SyncDispatcher(ctx context.Context, c *Cue) error { return c.disp.Load().sync(ctx) }

// SyncWriter returns once the writer has committed everything queued and
// called back for it (the dispatcher's commit messages are pushed); it does
// not wait for the dispatcher or its reads.
func SyncWriter(ctx context.Context, c *Cue) error { return c.w.Sync(ctx) }

// PollNow makes the Cue check the database for other processes' commits.
func PollNow(ctx context.Context, c *Cue) error { return c.w.Poll(ctx) }

// WriterStats returns the group-commit counters.
func WriterStats(c *Cue) (batches, ops int64) { return c.w.Stats() }

// CheckInvariants makes the dispatcher verify the broker's bookkeeping after
// every loop iteration, reporting violations to report. Call before Start.
func CheckInvariants(c *Cue, report func(error)) {
	c.testHooks.checkInvariants = func(d *dispatcher) {
		if err := d.verify(); err != nil {
			report(err)
		}
	}
}

// DispatcherState is a snapshot of dispatcher internals for tests.
type DispatcherState struct {
	Live, Inflight, Claims, Keyed, Lanes, Units int
	// Drains is the number of Drain calls waiting for a reply.
	Drains int
	// Reads is the number of store reads not yet answered.
	Reads int
	// NoParams is the length of the list of units indexed without params;
	// WithoutParams the number of such units still indexed.
	NoParams, WithoutParams int
}

// Inspect returns a snapshot taken on the dispatcher goroutine.
func Inspect(ctx context.Context, c *Cue) (DispatcherState, error) {
	d := c.disp.Load()
	if d == nil {
		return DispatcherState{}, fmt.Errorf("not running")
	}
	ch := make(chan DispatcherState, 1)
	d.in.Push(msgCall{f: func(d *dispatcher) {
		ch <- DispatcherState{Live: d.live, Inflight: d.inflight, Claims: d.claims, Keyed: len(d.keyed), Lanes: len(d.lanes), Units: len(d.units), Drains: len(d.drains), Reads: d.pending,
			NoParams: d.noParams.len(), WithoutParams: d.withoutParams}
	}})
	select {
	case st := <-ch:
		return st, nil
	case <-ctx.Done():
		return DispatcherState{}, ctx.Err()
	}
}

// verify checks that every resource's count matches the runs holding it:
// a running unit holds all of its resources and a waiting one holds none.
func (d *dispatcher) verify() error {
	if d.inflight > d.cfg.MaxConcurrent {
		return fmt.Errorf("inflight %d > MaxConcurrent %d", d.inflight, d.cfg.MaxConcurrent)
	}
	holders := map[*resource]int{}
	for _, r := range d.runs {
		if r.over() {
			return fmt.Errorf("run of %s in the run table in state %d", r.id, r.state)
		}
		for _, res := range r.lane.resources {
			holders[res]++
		}
	}
	for r := range d.held {
		if r.state != runHolding || !r.lane.task.def.HoldSlotsUntilReturn {
			return fmt.Errorf("run of %s in the held set but not holding", r.id)
		}
		for _, res := range r.lane.resources {
			holders[res]++
		}
	}
	check := func(res *resource) error {
		if res.Active != holders[res] {
			return fmt.Errorf("%s: active %d, but %d running or holding units hold it", res.name, res.Active, holders[res])
		}
		if res.Limit > 0 && res.Active > res.Limit {
			return fmt.Errorf("%s: active %d > limit %d", res.name, res.Active, res.Limit)
		}
		if res.Window != nil && res.Window.Used(d.now()) > res.Window.Limit() {
			return fmt.Errorf("%s: window over its limit", res.name)
		}
		return nil
	}
	for _, t := range d.tasks {
		if err := check(t.cap); err != nil {
			return err
		}
	}
	for _, name := range sortedNames(d.services) {
		if err := check(d.services[name]); err != nil {
			return err
		}
	}
	for _, res := range d.keyed {
		if err := check(res); err != nil {
			return err
		}
	}
	for _, l := range d.lanes {
		if l.inReady && l.parkedOn != nil {
			return fmt.Errorf("lane %q both ready and parked", l.key)
		}
		if l.parkedOn != nil && !slices.Contains(l.resources, l.parkedOn) {
			return fmt.Errorf("lane %q parked on a resource it does not use", l.key)
		}
	}
	return nil
}

var _ = writer.ErrClosed

// Counters returns the priority calls and dispatches counted so far.
func Counters(c *Cue) (priorityCalls, dispatches, callbackErrors int64) {
	return c.stats.priorityCalls.Load(), c.stats.dispatches.Load(), c.stats.callbackErrors.Load()
}

// StallSubscribers makes every subscriber of c block before each send until
// the returned function is called. Call before subscribing.
func StallSubscribers(c *Cue) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	var stalled atomic.Bool
	stalled.Store(true)
	c.hub.BeforeSend = func() {
		if stalled.Load() {
			<-ch
		}
	}
	return func() {
		once.Do(func() {
			stalled.Store(false)
			close(ch)
		})
	}
}

// WatchChecks returns a channel that gets the unit ID of every
// DependencySatisfied check whose answer the dispatcher received, in order
// (set before Start).
func WatchChecks(c *Cue) <-chan string {
	if c.testHooks.checked == nil {
		c.testHooks.checked = make(chan string, 1024)
	}
	return c.testHooks.checked
}

// SetLoad sets the sizes of the parts of the start's streamed load, and a
// func the loading goroutine calls before each batch and before the load's
// end (it may block; its context ends when the dispatcher exits). Call
// before Start.
func SetLoad(c *Cue, first, batch int, step func(context.Context)) {
	c.testHooks.firstLoad, c.testHooks.loadBatch, c.testHooks.loadStep = first, batch, step
}

// SetParamBudget sets the memory budget of params kept for queued units,
// and a func called (on the dispatcher goroutine) for every read of params
// with the number of units it reads. Call before Start.
func SetParamBudget(c *Cue, bytes int, read func(units int)) {
	c.testHooks.paramBudget, c.testHooks.paramRead = bytes, read
}

// WatchIterations returns a channel that receives after loop iterations of
// c's dispatcher (signals coalesce). Call before Start.
func WatchIterations(c *Cue) <-chan struct{} {
	if c.testHooks.iterated == nil {
		c.testHooks.iterated = make(chan struct{}, 1)
	}
	return c.testHooks.iterated
}

// CorruptActive adds a phantom holder to a registered service's count, on
// the dispatcher goroutine, so tests can see that CheckInvariants fails.
func CorruptActive(ctx context.Context, c *Cue, service string) error {
	d := c.disp.Load()
	if d == nil {
		return fmt.Errorf("not running")
	}
	done := make(chan struct{})
	d.in.Push(msgCall{f: func(d *dispatcher) {
		d.services[service].Active++
		close(done)
	}})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TrackRuns records a weak pointer to every run c starts, and to its unit.
// The returned function collects garbage and reports how many runs and
// units are still reachable, of how many started. Call before Start.
func TrackRuns(c *Cue) (reachable func() (runs, units, started int)) {
	var mu sync.Mutex
	var rs []weak.Pointer[run]
	var us []weak.Pointer[unit]
	c.testHooks.started = func(r *run) {
		mu.Lock()
		rs = append(rs, weak.Make(r))
		us = append(us, weak.Make(r.u))
		mu.Unlock()
	}
	return func() (int, int, int) {
		runtime.GC()
		runtime.GC()
		mu.Lock()
		defer mu.Unlock()
		runs, units := 0, 0
		for _, p := range rs {
			if p.Value() != nil {
				runs++
			}
		}
		for _, p := range us {
			if p.Value() != nil {
				units++
			}
		}
		return runs, units, len(rs)
	}
}

// BudgetRecheckEvery is how often a spent budget is checked against the
// wall clock.
const BudgetRecheckEvery = budgetRecheckEvery

// OnConcluded makes c call f on its dispatcher goroutine for every run
// whose outcome it decided and queued for the writer. Call before Start.
func OnConcluded(c *Cue, f func(id string)) {
	c.testHooks.concluded = func(r *run) { f(r.id) }
}
