package runcue

import (
	"context"
	"fmt"

	"github.com/runcue/runcue/store"
)

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
		if ok, err := d.cancel(ctx, id, opts); ok || err != nil {
			return err
		}
		// The engine stopped before handling it: cancel in the store.
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
