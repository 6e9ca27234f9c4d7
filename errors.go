package runcue

import (
	"context"
	"errors"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/runcuetype"
	"github.com/runcue/runcue/store"
)

// Sentinel errors, for use with errors.Is.
var (
	// ErrUnknownTask: the task type is registered neither in this Cue nor in
	// the database.
	ErrUnknownTask = errors.New("runcue: unknown task type")
	// ErrUnknownService: a task names a service that is not registered.
	ErrUnknownService = errors.New("runcue: unknown service")
	// ErrNotFound: no work unit has the ID.
	ErrNotFound = store.ErrNotFound
	// ErrClosed: the Cue has been closed.
	ErrClosed = writer.ErrClosed
	// ErrLocked: another Cue owns the database. The error is a *LockedError
	// naming the holder.
	ErrLocked = store.ErrLocked
	// ErrNotOwner: another Cue took ownership of the database from this
	// one (the owner epoch moved on). None of this Cue's owner writes is
	// stored from then on: it stops dispatching, cancels its handlers
	// (their contexts' cause) and says so (a Drain waiting in it, and a
	// store_failed event of kind not_owner on its own event stream).
	ErrNotOwner = store.ErrNotOwner
	// ErrSchemaTooNew: the database was written by a newer runcue.
	ErrSchemaTooNew = store.ErrSchemaTooNew
	// ErrDuplicateID: a submission's caller-chosen ID is taken.
	ErrDuplicateID = store.ErrDuplicateID
	// ErrDuplicate: a submission's idempotency key belongs to a failed or
	// cancelled unit and Config.FailedDuplicates rejects it.
	ErrDuplicate = store.ErrDuplicate
	// ErrDependencyRefused: a submission depends on a submission of the
	// same batch that was refused (Submitted.Err), so it is refused too.
	ErrDependencyRefused = store.ErrDependencyRefused
	// ErrUnknownDependency: a submission depends on a unit that does not
	// exist (in the database or in the same batch). Nothing is stored.
	ErrUnknownDependency = store.ErrUnknownDependency
	// ErrCycle: the units of a batch depend on each other in a cycle. The
	// error is a *CycleError naming them. Nothing is stored.
	ErrCycle = store.ErrCycle
	// ErrBackpressure: the queue holds Config.MaxQueued units and the
	// overflow policy refused the submission (or its context ended while it
	// waited for room).
	ErrBackpressure = store.ErrBackpressure
	// ErrCostTooLarge: a submission's cost of an amount is above the
	// limit of a meter that counts it (Meter.Limit, RateLimit, a budget):
	// it could never run. Nothing of its batch is stored.
	ErrCostTooLarge = errors.New("runcue: a cost is above the limit that counts it")
	// ErrInvalid: a registration or submission is malformed.
	ErrInvalid = runcuetype.ErrInvalid
	// ErrStopping: Start was called while a previous run of the Cue is still
	// stopping.
	ErrStopping = errors.New("runcue: previous run is still stopping")
	// ErrStoreFailed wraps the error that made the store fail at run time.
	// The Cue stops dispatching and every later write returns it; close the
	// Cue and open the database again once the cause is fixed.
	ErrStoreFailed = errors.New("runcue: store failed")
	// ErrShutdown is the cause of a handler's context cancelled by
	// StopAndCancel or Close.
	ErrShutdown = runcuetype.ErrShutdown
	// ErrPanic marks a failure recorded for a handler that panicked (or
	// called runtime.Goexit).
	ErrPanic = runcuetype.ErrPanic
	// ErrTimeout is the cause of a handler's context cancelled at its
	// deadline, and matches the error recorded for the run.
	ErrTimeout = runcuetype.ErrTimeout
	// ErrCancelled is the cause of a handler's context cancelled by Cancel.
	ErrCancelled = runcuetype.ErrCancelled
	// ErrPermanent matches every error made with Permanent: the run fails
	// without a retry.
	ErrPermanent = runcuetype.ErrPermanent
	// ErrOverloaded matches every error made with Overloaded: the service
	// said it is overloaded (see Adaptive).
	ErrOverloaded = runcuetype.ErrOverloaded
	// ErrFinished is returned by Cancel for a unit that is already
	// completed, failed or cancelled; the unit is unchanged.
	ErrFinished = errors.New("runcue: work unit already finished")
	// ErrUnknownSubscription: no durable subscription has the name.
	ErrUnknownSubscription = errors.New("runcue: unknown subscription")
	// ErrNotFailed is returned by Retry for a unit that is not failed.
	ErrNotFailed = errors.New("runcue: work unit is not failed")
	// ErrExecutorLost is the error recorded for a run whose executor
	// stopped heartbeating before it reported the run's end: the unit is
	// requeued, no retry budget spent (attempt outcome "abandoned").
	ErrExecutorLost = runcuetype.ErrExecutorLost
	// ErrLeaseLost is the cause an executor cancels a handler with when
	// its run is no longer assigned to it (the scheduler requeued or
	// ended it).
	ErrLeaseLost = runcuetype.ErrLeaseLost
	// ErrFeedExhausted is returned by a FeedFunc that has no more work,
	// ever.
	ErrFeedExhausted = errors.New("runcue: feed exhausted")
)

// CycleError names the units of a dependency cycle. It matches ErrCycle.
type CycleError = store.CycleError

// storeFailure wraps a store error so that it matches both ErrStoreFailed and
// the underlying error.
type storeFailure struct{ err error }

func (e *storeFailure) Error() string   { return "runcue: store failed: " + e.err.Error() }
func (e *storeFailure) Unwrap() []error { return []error{ErrStoreFailed, e.err} }
func wrapStoreErr(err error) error {
	if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrStoreFailed) ||
		errors.Is(err, ErrStoreUnavailable) || errors.Is(err, ErrOutcomeUnknown) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &storeFailure{err}
}
