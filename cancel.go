package runcue

import (
	"context"
	"fmt"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// CancelOptions qualify a cancellation.
type CancelOptions struct {
	// Cascade cancels the unit's dependents too. Without it they fail with
	// ErrorKind "prerequisite_cancelled".
	Cascade bool
	// Reason is recorded as the unit's error. Default "cancelled".
	Reason string
}

// Cancel cancels a unit.
//
// A queued unit is cancelled at once. For a running unit that this Cue runs,
// the handler's context is cancelled with cause ErrCancelled before Cancel
// returns; if the handler then returns success the unit is recorded
// completed, otherwise (an error, or Config.CancelGrace passing first) it is
// recorded cancelled. Cancellation never spends retry budget. A finished unit
// is left as it is and Cancel returns ErrFinished; an unknown ID gives
// ErrNotFound.
//
// In a Cue that does not own the database, cancelling a running unit
// records a request (work_cancel_requested) that the owner acts on within
// its PollInterval; Cancel returns once the request is stored.
func (c *Cue) Cancel(ctx context.Context, id string, opts CancelOptions) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if d := c.disp.Load(); d != nil {
		errc := make(chan error, 1)
		d.in.Push(msgCancel{id: id, opts: opts, errc: errc})
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-d.done:
			// The dispatcher stopped before handling it: cancel in the store.
		}
	}
	res, err := c.w.Do(ctx, &store.Cancel{ID: id, At: c.clock.Now(), Reason: opts.Reason, Cascade: opts.Cascade})
	if err != nil {
		return wrapStoreErr(err)
	}
	return cancelResult(id, res[0])
}

// cancelResult maps a store Cancel result to Cancel's error.
func cancelResult(id string, r store.Result) error {
	switch {
	case r.Err != nil:
		return r.Err
	case r.Applied, r.State == store.Running:
		return nil
	case r.State.Terminal():
		return fmt.Errorf("%w: %s is %s", ErrFinished, id, r.State)
	}
	return nil
}

// cancelUnit handles Cancel for a unit this Cue owns.
func (d *dispatcher) cancelUnit(id string, opts CancelOptions, errc chan error) {
	if r := d.runs[id]; r != nil {
		d.cancelRun(r, opts)
		errc <- nil
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
		op.Events = []store.Event{{Type: string(EventWorkCancelled), Task: u.task, Target: u.target, Data: eventData{Reason: opts.Reason}.encode()}}
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
			errc <- wrapStoreErr(err)
			return
		}
		errc <- cancelResult(id, res[0])
	}})
	if err != nil {
		errc <- wrapStoreErr(err)
	}
}

// cancelRun cancels a running handler's context and starts its grace.
func (d *dispatcher) cancelRun(r *run, opts CancelOptions) {
	if r.cancelled != nil || r.over() {
		return
	}
	r.cancelled = &opts
	r.cause = ErrCancelled
	r.cancel(ErrCancelled)
	r.graceTimer = &timerEntry{at: d.now().Add(d.cfg.CancelGrace), kind: tGrace, r: r}
	d.pushTimer(r.graceTimer)
}
