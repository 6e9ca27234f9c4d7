package runcue

import (
	"context"

	"github.com/runcue/runcue/store"
)

// Recovery: what a new owner does before it dispatches (see lease.go).

// recover requeues the units a previous owner left running and indexes the
// queued units. It runs before the dispatcher goroutine starts.
func (d *dispatcher) recover(ctx context.Context) error {
	res, err := d.w.Do(ctx, &store.Recover{At: d.wall()})
	if err != nil {
		return wrapStoreErr(err)
	}
	if n := len(res[0].IDs); n > 0 {
		d.log.Info("runcue: requeued units left running by the previous owner", "units", n)
	}
	// Every queued unit is indexed before any is filed, so that a
	// dependent stored before its dependency waits for it.
	var loaded []*unit
	err = d.st.LoadActive(ctx, func(su *store.Unit) error {
		if su.State == store.Queued {
			if u := d.index(su, false); u != nil {
				loaded = append(loaded, u)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.file(loaded)
	d.schedulePrune(d.now())
	if d.cfg.QueueStatusInterval > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(d.cfg.QueueStatusInterval), kind: tQueueStatus})
	}
	return nil
}
