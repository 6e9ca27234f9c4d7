// Package clocksync bounds the offset of this host's clock to a reference
// clock (the database server's), from timed exchanges: read the local
// clock, read the reference, read the local clock again. It is pure: the
// caller makes the exchanges and passes the instants.
//
// An exchange sent at local s, answered with reference r, received at
// local t, proves that the offset (reference minus local) lay within
// [r-t, r-s] while it ran, whatever the delays on the way: the reference
// was read at some local instant in [s, t]. Clocks drift apart at most
// MaxDrift (a fraction: 100e-6 is 100 ppm, far above a disciplined
// clock's), so a proof made a time a ago holds now widened by a x
// MaxDrift on each side. The bound in force is the intersection of every
// proof still held, widened so; its midpoint is the estimate and half its
// width the uncertainty. A clock stepped on either side (an NTP step, a
// VM resumed) makes the proofs disagree: when a new one does not meet the
// bound in force, the older proofs are dropped and the new one stands
// alone. A step is seen only by an exchange whose proof excludes the old
// bound: one slow enough to hold both offsets cannot tell them apart, and
// until a faster one comes the bound is wrong by up to the step. Local
// instants should come from a monotonic clock (time.Now's readings
// subtracted with Sub), so that only the reference can step.
package clocksync

import (
	"math"
	"time"
)

// Sample is one exchange: Sent and Received on the local clock, Remote
// the reference clock's reading in between.
type Sample struct {
	Sent, Received time.Time
	Remote         time.Time
}

// interval is a proof: the offset lay in [lo, hi] at local instant at.
type interval struct {
	lo, hi time.Duration
	at     time.Time
}

// Estimator holds the proofs of the last exchanges. Not safe for
// concurrent use.
type Estimator struct {
	// MaxDrift bounds how fast the two clocks drift apart (default 100e-6).
	MaxDrift float64
	// Keep bounds the proofs held (default 8): the oldest is dropped.
	Keep int

	proofs []interval
	// Steps counts the times proofs disagreed and were dropped.
	Steps int
}

func (e *Estimator) drift() float64 {
	if e.MaxDrift <= 0 {
		return 100e-6
	}
	return e.MaxDrift
}

// widened returns p's bound at local instant now.
func (e *Estimator) widened(p interval, now time.Time) (lo, hi time.Duration) {
	age := now.Sub(p.at)
	if age < 0 {
		age = -age // the local clock went back: the proof is as old as the distance
	}
	w := time.Duration(math.Ceil(float64(age) * e.drift()))
	return p.lo - w, p.hi + w
}

// Add records an exchange. A sample whose Received is before its Sent
// (the local clock went back during it) proves nothing and is ignored; it
// reports whether the sample was taken.
func (e *Estimator) Add(s Sample) bool {
	if s.Received.Before(s.Sent) {
		return false
	}
	// The reference was read at a local instant in [Sent, Received]: the
	// proof ages from Sent, the earliest it can be.
	p := interval{lo: s.Remote.Sub(s.Received), hi: s.Remote.Sub(s.Sent), at: s.Sent}
	e.proofs = append(e.proofs, p)
	if _, _, ok := e.bound(s.Received); !ok {
		// The proofs disagree: a clock was stepped, and the old ones no
		// longer hold.
		e.proofs = append(e.proofs[:0], p)
		e.Steps++
	}
	keep := e.Keep
	if keep <= 0 {
		keep = 8
	}
	if len(e.proofs) > keep {
		e.proofs = append(e.proofs[:0], e.proofs[len(e.proofs)-keep:]...)
	}
	return true
}

// bound intersects the proofs held, widened to now.
func (e *Estimator) bound(now time.Time) (lo, hi time.Duration, ok bool) {
	for i, p := range e.proofs {
		l, h := e.widened(p, now)
		if i == 0 || l > lo {
			lo = l
		}
		if i == 0 || h < hi {
			hi = h
		}
	}
	return lo, hi, len(e.proofs) > 0 && lo <= hi
}

// Estimate returns the offset to add to a local instant to get the
// reference clock's at local instant now, and the uncertainty: the true
// offset lies within Offset ± Uncertainty, as long as the drift bound
// holds and no clock was stepped since the last sample. ok is false
// before the first sample.
func (e *Estimator) Estimate(now time.Time) (offset, uncertainty time.Duration, ok bool) {
	lo, hi, ok := e.bound(now)
	if !ok {
		return 0, 0, false
	}
	return lo + (hi-lo)/2, (hi - lo + 1) / 2, true
}

// LatestStart returns the latest local instant at which a handler may
// start and still start, on the reference clock, no later than deadline
// (a lease's start deadline on the database's clock): the deadline less
// the offset and its uncertainty. ok is false before the first sample:
// then nothing may start.
func (e *Estimator) LatestStart(deadline, now time.Time) (time.Time, bool) {
	offset, unc, ok := e.Estimate(now)
	if !ok {
		return time.Time{}, false
	}
	return deadline.Add(-offset - unc), true
}
