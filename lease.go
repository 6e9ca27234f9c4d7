package runcue

import (
	"context"

	"github.com/runcue/runcue/store"
)

// Ownership and leases.
//
// One Cue at a time owns a database: Start takes an operating-system lock
// (on SQLite, flock on path+".lock") that the kernel releases when the
// process dies, so a lock held proves its owner alive and a lock acquired
// proves the previous owner gone. The new owner therefore requeues, at once,
// every unit the previous owner left running (work_recovered); it does not
// wait for their leases to expire.
//
// Each dispatch records leased_by (the owner's lease name) and
// lease_expires_at (the run's deadline plus Config.LeaseBuffer) in the same
// transaction that marks the unit running. The run's deadline is enforced
// by the owner's timer; on SQLite the lock, not the lease, is the liveness
// signal, so a long run is never taken from an owner that is alive.

// recover requeues the units a previous owner left running and indexes the
// queued units. It runs before the dispatcher goroutine starts.
func (d *dispatcher) recover(ctx context.Context) error {
	res, err := d.c.w.Do(ctx, &store.Recover{At: d.wall()})
	if err != nil {
		return wrapStoreErr(err)
	}
	if n := len(res[0].IDs); n > 0 {
		d.c.log.Info("runcue: requeued units left running by the previous owner", "units", n)
	}
	// Every queued unit is indexed before any is filed, so that a
	// dependent stored before its dependency waits for it.
	var loaded []*unit
	err = d.c.st.LoadActive(ctx, func(su *store.Unit) error {
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
	if d.c.cfg.QueueStatusInterval > 0 {
		d.pushTimer(&timerEntry{at: d.now().Add(d.c.cfg.QueueStatusInterval), kind: tQueueStatus})
	}
	return nil
}
