package engine

import (
	"context"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// What the Cue asks of its engine. Every method is safe to call from any
// goroutine: each hands a message to the dispatcher goroutine and, for a
// question, waits for its answer. A question's ok is false when the
// dispatcher exited before answering (the caller then reads the store).

// Recover requeues what the previous owner left running and loads the
// queued units (see recover). Call it once, before Run; on its error,
// call Discard.
func (d *Engine) Recover(ctx context.Context) error { return d.recover(ctx) }

// Discard releases what New took, for an engine that will not Run.
func (d *Engine) Discard() { d.keys.stop() }

// Done is closed once the dispatcher has exited (ownership released).
func (d *Engine) Done() <-chan struct{} { return d.done }

// EndedRuns returns, once Done is closed, the runs this engine held that
// are over although the store may still hold them running: their handlers
// returned (or never started) and their Finishes were not stored, because
// ownership was lost or the store failed. The next engine of the same
// process passes them on (Config.Ended). Nil before Done, and after an
// Abandon (handlers may still run).
func (d *Engine) EndedRuns() []store.RunRef {
	select {
	case <-d.done:
		return d.unwritten
	default:
		return nil
	}
}

// Deposed reports whether the engine lost ownership: a write found
// another owner's epoch, or its lease was not renewed in time.
func (d *Engine) Deposed() bool { return d.deposed.Load() }

// Owner is the lease name the engine owns the store under.
func (d *Engine) Owner() string { return d.owner }

// Stopping reports whether Stop has been called.
func (d *Engine) Stopping() bool { return d.stopReq.Load() }

// Stop stops dispatching; the dispatcher exits once the running runs are
// over. With cancel, their Runners are asked to stop them (ErrShutdown).
func (d *Engine) Stop(cancel bool) {
	d.stopReq.Store(true)
	d.in.Push(msgStop{cancel: cancel})
}

// SetRoom holds task's cap at room, what the live executors that run it
// have room for (negative: no bound of theirs; zero: none is alive, and
// its units wait).
func (d *Engine) SetRoom(task string, room int) { d.in.Push(msgRoom{task: task, room: room}) }

// Abandon makes the dispatcher exit now, leaving running handlers behind
// (their units stay running in the store; the next owner recovers them).
func (d *Engine) Abandon() {
	d.abandonOnce.Do(func() { close(d.abandonCh) })
	d.in.Push(msgAbandon{})
}

// Inserted tells the engine of units its Cue committed (queued ones), and
// of the events of the same insert that ended other units.
func (d *Engine) Inserted(units []*store.Unit, ended []store.Event) {
	d.in.Push(msgInserted{units: units, ended: ended})
}

// External hands the engine events committed by another process, or by
// its Cue outside the engine (requeues).
func (d *Engine) External(events []store.Event) { d.in.Push(msgExternal{events: events}) }

// Answer hands the engine questions another process asked it (read from
// the store's questions table): it answers each from its live state, in
// one store.AnswerQuestion.
func (d *Engine) Answer(questions []store.OwnerQuestion) {
	d.in.Push(msgQuestions{questions: questions})
}

// StoreFailed tells the engine the store failed: nothing more is
// dispatched.
func (d *Engine) StoreFailed(err error) { d.in.Push(msgStoreFailed{err: err}) }

// SetRegistry hands the engine a snapshot of the Cue's registrations.
// Snapshots only add, so their order does not matter.
func (d *Engine) SetRegistry(reg Registry) { d.in.Push(msgRegistry{reg: reg}) }

// ServiceChanged tells the engine that a service's stored override or
// pause changed; it returns once the engine applied it, the engine exited
// or ctx ended.
func (d *Engine) ServiceChanged(ctx context.Context, name string) {
	applied := make(chan struct{})
	d.in.Push(msgServiceChanged{service: name, applied: applied})
	d.await(ctx, applied)
}

// PausesChanged tells the engine that a task's or the queue's stored pause
// changed; it returns once the engine applied the stored pauses, the
// engine exited or ctx ended.
func (d *Engine) PausesChanged(ctx context.Context) {
	applied := make(chan struct{})
	d.in.Push(msgPausesChanged{applied: applied})
	d.await(ctx, applied)
}

func (d *Engine) await(ctx context.Context, ch <-chan struct{}) {
	select {
	case <-ch:
	case <-d.done:
	case <-ctx.Done():
	}
}

// Cancel cancels unit id as the owner: a running unit's Runner is asked to
// stop it; a queued one is cancelled in the store. ok is false when the
// dispatcher exited first (the caller cancels in the store).
func (d *Engine) Cancel(ctx context.Context, id string, opts rt.CancelOptions) (rep CancelReply, ok bool, err error) {
	reply := make(chan CancelReply, 1)
	d.in.Push(msgCancel{id: id, opts: opts, reply: reply})
	select {
	case rep = <-reply:
		return rep, true, nil
	case <-ctx.Done():
		return rep, false, ctx.Err()
	case <-d.done:
		return rep, false, nil
	}
}

// Drain returns once the engine holds no work of registered task types
// (or only units held by a spent budget, with DrainOnSpentBudget), or
// ctx ends.
func (d *Engine) Drain(ctx context.Context) error { return d.drain(ctx) }

// Sync returns after the dispatcher handled every message sent before the
// call and completed one loop iteration (or exited).
func (d *Engine) Sync(ctx context.Context) error { return d.sync(ctx) }

// Settle blocks until the engine has done everything it can at the
// current instant of its clock (see runcue's Cue.Settle) and returns how
// many handlers are running then.
func (d *Engine) Settle(ctx context.Context) (running int, err error) {
	s := &d.settling
	for {
		a0 := s.activity.Load()
		if err := d.sync(ctx); err != nil {
			return 0, err
		}
		if err := d.w.Sync(ctx); err != nil {
			return 0, err
		}
		if err := d.sync(ctx); err != nil {
			return 0, err
		}
		// The counts are read before the activity: a goroutine that
		// lowers one has pushed its message and stepped the activity
		// first, so a lowered count with an unchanged activity means
		// nothing happened during this round.
		idle := s.launching.Load() == 0 && s.helpers.Load() == 0
		running := int(s.inside.Load())
		if idle && s.activity.Load() == a0 {
			select {
			case <-d.done:
				return 0, nil
			default:
			}
			return running, nil
		}
	}
}

// Explain says why unit id is not running, from the live state; its ID is
// empty when the engine does not hold the unit. AsOf is the engine's
// wall clock.
func (d *Engine) Explain(ctx context.Context, id string) (rt.Explanation, bool, error) {
	return ask(ctx, d, func(d *Engine) rt.Explanation {
		ex := d.explain(id)
		ex.AsOf = d.wall()
		return ex
	})
}

// Services reports every service's live status.
func (d *Engine) Services(ctx context.Context) ([]rt.ServiceStatus, bool, error) {
	return ask(ctx, d, (*Engine).statusAll)
}

// KeyStatus reports a keyed instance's live status (nil when the engine
// does not hold it).
func (d *Engine) KeyStatus(ctx context.Context, name string) (*rt.ServiceStatus, bool, error) {
	return ask(ctx, d, func(d *Engine) *rt.ServiceStatus { return d.liveKeyStatus(name) })
}

// ServiceStats reports every service with its busiest keyed instances.
func (d *Engine) ServiceStats(ctx context.Context) ([]rt.ServiceStats, bool, error) {
	return ask(ctx, d, (*Engine).serviceStats)
}

// Backpressure reports the live state of backpressure (Since is zero:
// the engine does not keep it).
func (d *Engine) Backpressure(ctx context.Context) (rt.BackpressureStats, bool, error) {
	return ask(ctx, d, func(d *Engine) rt.BackpressureStats {
		return rt.BackpressureStats{Active: d.bpActive, MaxQueued: d.cfg.MaxQueued, Queued: d.queuedCount()}
	})
}

// Patterns reports the sequence keys' state and the batches
// (rt.PatternStats but Debouncing, which the store counts); ok is false
// when the engine has exited.
func (d *Engine) Patterns(ctx context.Context) (rt.PatternStats, bool, error) {
	return ask(ctx, d, (*Engine).patternStats)
}

// patternStats is Patterns' answer.
func (d *Engine) patternStats() rt.PatternStats {
	p := d.sequenceStats()
	p.Batches, p.Batched = d.stats.Batches.Load(), d.stats.Batched.Load()
	for _, l := range d.lanes {
		if l.batchTimer != nil {
			p.BatchesWaiting++
		}
	}
	return p
}

// Queued is the number of queued units as of the last loop iteration
// (for the metrics' gauge).
func (d *Engine) Queued() (queued, unloaded int64) { return d.queued.Load(), d.unloadedNow.Load() }

// Wall returns the engine's wall clock (its timeline's reading).
func (d *Engine) Wall() time.Time { return d.wall() }

// Now returns the current instant on the engine's timeline (see Run.Now).
func (d *Engine) Now() time.Time { return d.now() }
