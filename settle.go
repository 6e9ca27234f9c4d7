package runcue

import (
	"context"
	"sync/atomic"
)

// settling counts what Settle waits for. Any goroutine updates it; every
// change that can lead to more work is followed by a step of activity, so
// that Settle notices it (see Settle).
type settling struct {
	// activity counts the dispatcher's handled messages (but syncs),
	// fired timers, handler entries and returns and helper answers.
	activity atomic.Uint64
	// launching counts the handler goroutines started that have neither
	// called their handler nor ended; inside those in their handler.
	launching atomic.Int64
	inside    atomic.Int64
	// helpers counts the requests out on helper goroutines (scoring
	// passes, params reads, dependency checks, Feed calls) not answered.
	helpers atomic.Int64
}

// helperStart records a request sent to a helper goroutine.
func (s *settling) helperStart() { s.helpers.Add(1) }

// helperDone records a helper's answer, once it is pushed to the
// dispatcher.
func (s *settling) helperDone() {
	s.activity.Add(1)
	s.helpers.Add(-1)
}

// Settle blocks until the Cue has done everything it can at the current
// instant of its clock: every message to its dispatcher is handled (with
// the timers due, the dispatches they allow and the writes they make,
// committed), every store read and helper call (priority scoring, params
// reads, DependencySatisfied, Feed) has answered, and every handler
// goroutine it started has either called its handler or ended. It returns
// how many handlers are running then (called and not returned). It does
// not wait for handlers: a handler that returns later brings more work,
// and a later Settle sees it.
//
// Settle is for simulations that drive a Cue on a fake clock
// (Config.Clock): a loop of Settle and advancing the clock to the next
// deadline replays hours of traffic in seconds. For the same inputs (and a
// seeded Config.Rand) to give the same run, the simulation's handlers wait
// on the simulation itself, which releases them one at a time in an order
// of its own (as by finish time, then a key), settling after each; timers
// of the fake clock that fire together wake their handlers in no set order.
// A handler whose context runcue ended (a timeout, a cancellation) is
// running until it returns: the simulation must not move the clock before
// it has (its end is read from the clock). Config.CallbackTimeout is real
// time: a simulation that must replay on a loaded machine sets it far
// beyond any callback's time.
// With the real clock Settle is only a barrier: timers keep firing
// meanwhile. It returns
// ctx's error if ctx ends first, and returns at once, with 0, when the Cue
// is not started.
func (c *Cue) Settle(ctx context.Context) (running int, err error) {
	for {
		d := c.disp.Load()
		if d == nil {
			return 0, c.w.Sync(ctx)
		}
		s := &d.settling
		a0 := s.activity.Load()
		if err := d.sync(ctx); err != nil {
			return 0, err
		}
		if err := c.w.Sync(ctx); err != nil {
			return 0, err
		}
		if err := d.sync(ctx); err != nil {
			return 0, err
		}
		// The counts are read before the activity: a goroutine that
		// lowers one has pushed its message and stepped the activity
		// first, so a lowered count with an unchanged activity means
		// nothing happened during this round.
		idle := s.launching.Load() == 0 && s.helpers.Load() == 0
		running := int(s.inside.Load())
		if idle && s.activity.Load() == a0 {
			select {
			case <-d.done:
				return 0, nil
			default:
			}
			return running, nil
		}
	}
}
