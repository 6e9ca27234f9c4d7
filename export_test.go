package runcue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/internal/engine"
)

// Settle returns once the dispatcher has handled everything sent to it, the
// writer has committed everything queued, and the dispatcher has handled the
// commits' consequences. Handlers still running are not waited for.
func Settle(ctx context.Context, c *Cue) error {
	for range 2 {
		if d := c.disp.Load(); d != nil {
			if err := d.e.Sync(ctx); err != nil {
				return err
			}
		}
		if err := c.w.Sync(ctx); err != nil {
			return err
		}
	}
	if d := c.disp.Load(); d != nil {
		return d.e.Sync(ctx)
	}
	return nil
}

// SyncDispatcher returns once the dispatcher has handled every message sent
// before the call and finished one loop iteration (dispatch included). It
// does not wait for the writer.
func SyncDispatcher(ctx context.Context, c *Cue) error { return c.disp.Load().e.Sync(ctx) }

// SyncWriter returns once the writer has committed everything queued and
// called back for it (the dispatcher's commit messages are pushed); it does
// not wait for the dispatcher or its reads.
func SyncWriter(ctx context.Context, c *Cue) error { return c.w.Sync(ctx) }

// PollNow makes the Cue check the database for other processes' commits.
func PollNow(ctx context.Context, c *Cue) error { return c.w.Poll(ctx) }

// WriterStats returns the group-commit counters.
func WriterStats(c *Cue) (batches, ops int64) {
	batches, ops, _ = c.w.Stats()
	return batches, ops
}

// CheckInvariants makes the dispatcher verify the broker's bookkeeping after
// every loop iteration, reporting violations to report. Call before Start.
func CheckInvariants(c *Cue, report func(error)) { c.mach.hooks.CheckInvariants = report }

// DispatcherState is a snapshot of dispatcher internals for tests.
type DispatcherState = engine.State

// Inspect returns a snapshot taken on the dispatcher goroutine.
func Inspect(ctx context.Context, c *Cue) (DispatcherState, error) {
	d := c.disp.Load()
	if d == nil {
		return DispatcherState{}, fmt.Errorf("not running")
	}
	return d.e.Inspect(ctx)
}

// Counters returns the priority calls and dispatches counted so far.
func Counters(c *Cue) (priorityCalls, dispatches, callbackErrors int64) {
	st := &c.mach.stats
	return st.PriorityCalls.Load(), st.Dispatches.Load(), st.CallbackErrors.Load()
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
	if c.mach.hooks.Checked == nil {
		c.mach.hooks.Checked = make(chan string, 1024)
	}
	return c.mach.hooks.Checked
}

// WatchIterations returns a channel that receives after loop iterations of
// c's dispatcher (signals coalesce). Call before Start.
func WatchIterations(c *Cue) <-chan struct{} {
	if c.mach.hooks.Iterated == nil {
		c.mach.hooks.Iterated = make(chan struct{}, 1)
	}
	return c.mach.hooks.Iterated
}

// BudgetRecheckEvery is how often a spent budget is checked against the
// wall clock.
const BudgetRecheckEvery = engine.BudgetRecheckEvery

// StartReading makes x take f(reading) as a handler's start instant, the
// reading its start gate checks (f is called with x's lock held).
func StartReading(x *Executor, f func(time.Time) time.Time) { x.l.StartReading = f }
