package broker

import (
	"math"
	"time"
)

// AIMD finds a limit below a configured ceiling from what the service says
// (additive increase, multiplicative decrease): an overload signal (a 429,
// a 503, a timeout) multiplies the effective limit by Decrease, and each
// success of amount a adds Increase times the ceiling times a divided by
// the effective limit, so that a window's worth of successes (their
// amounts summing to the limit: as many requests, or as many tokens)
// raises it by Increase of the ceiling. It never leaves [Floor, Ceiling].
//
// Overload signals come in bursts: every request sent past the service's
// real limit is refused, and those in flight when the first refusal
// arrives are refused too. One burst is one cut: a signal from a run that
// started before the last cut, or at its instant, says nothing the cut did
// not act on, and is counted (Overloads) but not acted on again.
//
// AIMD reads no clock (the caller passes the instants) and is not safe for
// concurrent use.
type AIMD struct {
	Ceiling, Floor     float64
	Decrease, Increase float64

	effective float64
	cutAt     time.Time // the last cut, on the caller's timeline
	overloads int       // signals since the limit last rose to the ceiling
}

// NewAIMD returns a controller at its ceiling.
func NewAIMD(ceiling, floor, decrease, increase float64) *AIMD {
	return &AIMD{Ceiling: ceiling, Floor: min(floor, ceiling), Decrease: decrease, Increase: increase, effective: ceiling}
}

// Limit is the effective limit, rounded down, at least one and at least
// the floor rounded up.
func (a *AIMD) Limit() int64 {
	return max(int64(math.Floor(a.effective)), int64(math.Ceil(a.Floor)), 1)
}

// Effective is the effective limit before rounding.
func (a *AIMD) Effective() float64 { return a.effective }

// Overloads counts the overload signals since the limit was last at its
// ceiling.
func (a *AIMD) Overloads() int { return a.overloads }

// Overload records a signal at now from a run that started at start. It
// cuts the limit unless the run started no later than the last cut (the
// same burst), and reports whether Limit changed.
func (a *AIMD) Overload(start, now time.Time) bool {
	a.overloads++
	if !a.cutAt.IsZero() && !start.After(a.cutAt) {
		return false
	}
	before := a.Limit()
	a.effective = max(a.Floor, a.effective*a.Decrease)
	a.cutAt = now
	return a.Limit() != before
}

// Success records a run that the service served, of amount (one request,
// or the tokens it used), and reports whether Limit changed.
func (a *AIMD) Success(amount float64) bool {
	if a.effective >= a.Ceiling || amount <= 0 {
		return false
	}
	before := a.Limit()
	a.effective = min(a.Ceiling, a.effective+a.Increase*a.Ceiling*amount/max(a.effective, 1))
	if a.effective >= a.Ceiling {
		a.overloads = 0
	}
	return a.Limit() != before
}

// SetCeiling changes the configured limit: the effective one keeps its
// fraction of it.
func (a *AIMD) SetCeiling(ceiling, floor float64) {
	if a.Ceiling > 0 {
		a.effective = a.effective / a.Ceiling * ceiling
	} else {
		a.effective = ceiling
	}
	a.Ceiling, a.Floor = ceiling, min(floor, ceiling)
	a.effective = min(max(a.effective, a.Floor), a.Ceiling)
}

// AIMDState is what a new owner needs to go on where the last stopped:
// the effective limit and the overloads behind it.
type AIMDState struct {
	Effective float64 `json:"effective"`
	Overloads int     `json:"overloads,omitempty"`
}

// State returns a's state, to persist.
func (a *AIMD) State() AIMDState { return AIMDState{Effective: a.effective, Overloads: a.overloads} }

// Restore goes on from s, within a's bounds (a limit configured lower
// since is respected).
func (a *AIMD) Restore(s AIMDState) {
	if s.Effective <= 0 || math.IsNaN(s.Effective) || math.IsInf(s.Effective, 0) {
		return
	}
	a.effective = min(max(s.Effective, a.Floor), a.Ceiling)
	a.overloads = max(s.Overloads, 0)
}
