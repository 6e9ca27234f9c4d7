package runcue

import (
	"github.com/runcue/runcue/store"
)

// Ownership and leases.
//
// One Cue at a time owns a database: Start takes an operating-system lock
// (on SQLite, flock on path+".lock", LockFileEx on Windows) that the kernel
// releases when the process dies, so a lock held proves its owner alive and a lock acquired
// proves the previous owner gone. The new owner therefore requeues, at once,
// every unit the previous owner left running (work_recovered); it does not
// wait for their leases to expire.
//
// Each dispatch records leased_by (the owner's lease name) and
// lease_expires_at (the run's deadline plus Config.LeaseBuffer) in the same
// transaction that marks the unit running. The run's deadline is enforced
// by the owner's timer; on SQLite the lock, not the lease, is the liveness
// signal, so a long run is never taken from an owner that is alive.
//
// The owner writes its Holder record into the lock file and clears it when
// it releases ownership, so another process can tell who owns the
// database, or that no one does, without taking the lock. A previous
// owner's starts of rate-limited handlers are bounded in time (see
// Config.MaxStartDelay), so the next owner's rate windows count them. The
// recovery itself is in recovery.go.

// LockedError reports that another Cue owns the database. It matches
// ErrLocked.
type LockedError = store.LockedError

// Holder identifies a database's owner: its lease name, process ID, host and
// the time it took ownership.
type Holder = store.Holder

// Owner returns the lease name of the running dispatcher, or "" when this
// Cue does not own the database.
func (c *Cue) Owner() string {
	if d := c.disp.Load(); d != nil {
		return d.owner()
	}
	return ""
}
