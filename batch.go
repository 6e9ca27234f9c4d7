package runcue

import (
	"context"
	"fmt"
	"time"
)

// Batch makes a task's handler take its units in batches: one call for up
// to Max units (embedding 100 texts in one API request, one bulk insert).
// The batch is admitted as one dispatch: one slot of each cap (the task's,
// each service's), one request of each rate window and budget, and the
// summed cost of its units of every other amount (tokens, bytes), which
// its first unit's start logs. Each unit keeps its own run: its own
// outcome, events, retries and Finish. A failed unit is retried alone of
// its batch, in whatever batch it joins next.
//
// Units of different keys (Key), different keyed services (ServiceKeys)
// or different tasks never share a batch. A batch that a meter of an
// amount refuses is halved until it fits (a unit that costs more alone
// than a meter's limit fails, as any unit does). Batch tasks run in this
// process: a remote task cannot batch, nor can a Sequence's.
type Batch struct {
	// Handler performs a batch. Required; the task's own Handler must
	// be nil.
	Handler BatchHandler
	// Max is the most units in a batch: at least 1.
	Max int
	// MaxCost bounds a batch's summed cost of each amount it names
	// ("tokens": 5000); a unit that costs more alone runs alone.
	MaxCost Costs
	// Wait is how long a batch short of Max (and of MaxCost) waits for
	// more units to join it, from the instant its oldest unit was ready.
	// Zero sends what is queued at once.
	Wait time.Duration
	// Key gives a unit's batch key from its target: units of different
	// keys never share a batch. Nil, or an empty key: one batch stream
	// for the task. A Key that panics puts the unit in no key's batch.
	Key func(target string) string
}

// BatchHandler performs one batch of a batch task (see Batch): a call
// for every unit in batch, each with its Work (its ID, Params and
// Attempt; Started is the batch's start, the instant the rate windows
// count). It returns one Outcome per unit, in batch's order, or an error
// that is every unit's outcome (the request failed as a whole: a
// RetryAfter, a timeout, an overload); returning a number of outcomes other
// than len(batch) fails every unit. ctx ends when the batch's deadline
// passes (the Task's Timeout) or the Cue stops; cancelling one unit does
// not cancel the call: the unit is recorded cancelled, its outcome
// discarded. Used, Observe and Progress may be reported through any of
// the Works: Used adds up over the batch, the batch's total reconciled
// with its start's summed estimate.
type BatchHandler func(ctx context.Context, batch []*Work) ([]Outcome, error)

// Outcome is one unit's outcome in a batch: its result (stored as its
// JSON encoding), or its error, read as a Handler's error is (Permanent,
// Skip, RetryAfter...).
type Outcome struct {
	Result any
	Err    error
}

// validBatch checks a task's Batch (nil: none).
func validBatch(name string, t *Task) error {
	b := t.Batch
	switch {
	case b == nil:
		return nil
	case b.Handler == nil:
		return fmt.Errorf("%w: task %q: Batch has no Handler", ErrInvalid, name)
	case t.Handler != nil:
		return fmt.Errorf("%w: task %q: a batch task's handler is its Batch.Handler; Handler must be nil", ErrInvalid, name)
	case t.Remote:
		return fmt.Errorf("%w: task %q: a remote task cannot batch", ErrInvalid, name)
	case t.Sequence != nil:
		return fmt.Errorf("%w: task %q: a Sequence runs its units one at a time: it cannot batch", ErrInvalid, name)
	case b.Max < 1 || b.Wait < 0 || b.Wait > MaxTimeout:
		return fmt.Errorf("%w: task %q: Batch Max %d, Wait %v (Max at least 1, Wait from 0 to %v)", ErrInvalid, name, b.Max, b.Wait, MaxTimeout)
	}
	for amount, n := range b.MaxCost {
		if n < 1 || n > MaxCost {
			return fmt.Errorf("%w: task %q: Batch MaxCost of %q is %d (from 1 to %d)", ErrInvalid, name, amount, n, MaxCost)
		}
	}
	return nil
}
