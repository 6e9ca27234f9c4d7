// Package clock provides the time source runcue schedules by.
//
// Every scheduling decision in runcue (eligibility of delayed work, retry
// backoff, timeouts, rate windows, circuit cooldowns, change polling) reads a
// Clock, so tests can control time with a Fake instead of sleeping.
package clock

import "time"

// Clock tells the time and makes timers.
//
// Implementations must be safe for simultaneous use by multiple goroutines.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that delivers the time on its channel after at
	// least d has passed. A d of zero or less fires at once.
	NewTimer(d time.Duration) Timer
}

// Timer is a single-shot timer made by a Clock.
//
// Its channel has a buffer of one: a fire that nobody has received yet is
// discarded by Stop and Reset, as with time.Timer since Go 1.23.
type Timer interface {
	// C returns the channel the timer fires on.
	C() <-chan time.Time
	// Stop prevents the timer from firing. It reports whether the call
	// stopped the timer, false if it had already fired or been stopped.
	Stop() bool
	// Reset changes the timer to fire after d. It reports whether the timer
	// had been active.
	Reset(d time.Duration) bool
}

// Real returns the Clock backed by the time package.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// IsReal reports whether c is the clock returned by Real.
func IsReal(c Clock) bool {
	_, ok := c.(realClock)
	return ok
}
