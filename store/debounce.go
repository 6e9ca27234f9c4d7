package store

import (
	"context"
	"time"
)

// Debounce collapses a burst of submissions of one key into one unit. An
// Insert of a unit with a Debounce skips the unit that holds Key if it is
// still queued and has never started (state skipped, error kind
// "debounced", error "replaced by <the new unit>", a work_skipped event
// with that reason), and the new unit takes the key. Its RunAt is Period
// after the insert, and at the latest MaxWait (zero: no bound) after the
// burst's first insert, which the key's holders pass on. A holder that
// started, or ended, leaves the next insert to start a new burst.
type Debounce struct {
	Key     string
	Period  time.Duration
	MaxWait time.Duration
}

// DebounceKind is the error kind of a unit a later one replaced.
const DebounceKind = "debounced"

// DebounceReader is implemented by stores that can say which debounce key
// a unit holds (see Debounce).
type DebounceReader interface {
	// DebounceOf returns the debounce key unit id holds and when its burst
	// began; ok is false when it holds none.
	DebounceOf(ctx context.Context, id string) (key string, since time.Time, ok bool, err error)
	// Debouncing counts the keys a queued unit that never started holds.
	Debouncing(ctx context.Context) (int, error)
}
