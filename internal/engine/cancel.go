package engine

import (
	"fmt"
	"time"

	"github.com/runcue/runcue/internal/writer"
	rt "github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// CancelReply is the outcome of a Cancel the engine handled: Running when
// it cancelled a run it holds; else the store's Result of the Cancel op,
// or the error that kept it from being stored.
type CancelReply struct {
	Running bool
	Result  store.Result
	Err     error
}

// cancelUnit handles Cancel for a unit this Cue owns.
func (d *Engine) cancelUnit(id string, opts rt.CancelOptions, reply chan CancelReply) {
	if r := d.runs[id]; r != nil {
		d.cancelRun(r, opts)
		reply <- CancelReply{Running: true}
		return
	}
	u := d.units[id]
	if u == nil {
		for _, o := range d.orphans {
			if u = o[id]; u != nil {
				break
			}
		}
	}
	op := &store.Cancel{ID: id, At: d.wall(), Reason: opts.Reason, Cascade: opts.Cascade}
	if u != nil {
		// It cannot be dispatched while the cancel commits, and its
		// dependents wait for the commit, as for a Finish.
		d.removeQueued(u)
		d.finishing[id] = struct{}{}
		op.Events = []store.Event{{Type: store.TypeWorkCancelled, Task: u.task, Target: u.target, Data: store.EventData{Reason: opts.Reason}.Encode()}}
	}
	err := d.w.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		var evs []store.Event
		if err == nil {
			evs = res[0].Events
		}
		if u != nil {
			d.in.Push(msgSettled{id: id, state: store.Cancelled, applied: err == nil && res[0].Applied, derived: evs})
		} else if len(evs) > 0 {
			d.in.Push(msgApplied{events: evs})
		}
		if err != nil {
			reply <- CancelReply{Err: err}
			return
		}
		reply <- CancelReply{Result: res[0]}
	}})
	if err != nil {
		reply <- CancelReply{Err: err}
	}
}

// deadlinePassed ends r at its deadline: it fails (timeout) whether or not
// its handler ever returns, or, cancelled, is recorded cancelled.
func (d *Engine) deadlinePassed(r *run, wall time.Time) {
	switch {
	case r.over():
	case r.cancelled != nil:
		d.conclude(r, ending{err: ErrCancelled, cancelled: r.cancelled, at: wall})
	default:
		r.cause = ErrTimeout
		if r.state == runLaunched {
			r.lane.task.spec.Runner.Cancel(&r.pub, ErrTimeout)
		}
		d.conclude(r, ending{err: timeoutError(r), at: wall})
	}
}

// timeoutError is the failure recorded for a run cut off at its deadline.
func timeoutError(r *run) error {
	return fmt.Errorf("%w after %v", ErrTimeout, r.deadline.Sub(r.start))
}

// cancelRun cancels a running handler and starts its grace.
func (d *Engine) cancelRun(r *run, opts rt.CancelOptions) {
	if r.cancelled != nil || r.over() {
		return
	}
	r.cancelled = &opts
	r.cause = ErrCancelled
	if r.state == runLaunched {
		r.lane.task.spec.Runner.Cancel(&r.pub, ErrCancelled)
	}
	r.graceTimer = &timerEntry{at: d.now().Add(d.cfg.CancelGrace), kind: tGrace, r: r}
	d.pushTimer(r.graceTimer)
}
