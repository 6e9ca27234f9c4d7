package runcue

import (
	"github.com/runcue/runcue/store"
)

// Ownership, epochs and leases.
//
// One Cue at a time owns a database. Start takes ownership through the
// store: on SQLite an operating-system lock (flock on path+".lock",
// LockFileEx on Windows) that the kernel releases when the process dies,
// so a lock acquired proves every earlier owner gone. Taking ownership
// also moves a stored epoch on, and every write the owner makes (claims,
// outcomes, heartbeats, recovery, retention, its events) carries its epoch
// and fails, alone, with ErrNotOwner once the epoch has moved on: an owner
// that lost the database (a paused VM, a partitioned host; on SQLite, a
// takeover of a stuck owner) writes nothing more, stops dispatching and
// cancels its handlers.
//
// Each dispatch records leased_by (the owner's lease name), the owner's
// epoch and lease_expires_at (the run's deadline plus Config.LeaseBuffer)
// in the transaction that marks the unit running. A new owner requeues a
// run an earlier owner left running at once when that owner is proven
// dead (the lock was free), and otherwise only once the run's lease has
// expired; until then the run counts against its task's cap and its
// services. Within one owner the lease also bounds a run cut off at its
// deadline whose handler has not returned: its unit runs again only after
// the lease ends, or once the handler returns (the lease rule).
//
// The owner writes its Holder record into the lock file and clears it when
// it releases ownership, so another process can tell who owns the
// database, or that no one does, without taking the lock. A previous
// owner's starts of rate-limited handlers are bounded in time (see
// Config.MaxStartDelay), so the next owner's rate windows count them.

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
