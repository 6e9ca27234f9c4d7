// Package clock provides the time source runcue schedules by.
//
// Every scheduling decision in runcue (eligibility of delayed work, retry
// backoff, timeouts, rate windows, circuit cooldowns, change polling) reads a
// Clock, so tests can control time with a Fake instead of sleeping.
//
// A Clock has two readings. The wall clock (Now) says what time it is: it
// is what runcue stores and reports, and it may jump when the system's time
// is set (NTP, a resumed virtual machine). The monotonic clock (Monotonic)
// only measures how much time passes: it never goes backwards and does not
// follow the wall clock's jumps. Within a process runcue measures every
// duration (rate windows, timeouts, backoff, holds, cooldowns) on the
// monotonic clock, so a step of the wall clock neither stalls nor speeds up
// dispatch.
package clock

import "time"

// Clock tells the time and makes timers.
//
// Implementations must be safe for simultaneous use by multiple goroutines.
type Clock interface {
	// Now returns the current wall-clock time. Successive readings may go
	// backwards or jump forwards when the system's time is set.
	Now() time.Time
	// Monotonic returns the time elapsed since an origin fixed for the
	// clock's life. Successive readings never decrease, and the difference of
	// two readings is the time that passed between them, whatever the wall
	// clock did meanwhile. Readings of different processes are not
	// comparable.
	Monotonic() time.Duration
	// NewTimer returns a timer that delivers the wall-clock time on its
	// channel once at least d has passed on the monotonic clock. A d of zero
	// or less fires at once.
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

// origin is the real clock's monotonic origin: time.Since(origin) reads the
// monotonic clock that time.Now carries.
var origin = time.Now()

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Monotonic() time.Duration { return time.Since(origin) }

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
