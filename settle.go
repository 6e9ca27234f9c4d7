package runcue

import (
	"context"
)

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
	if d := c.disp.Load(); d != nil {
		return d.settle(ctx)
	}
	return 0, c.w.Sync(ctx)
}
