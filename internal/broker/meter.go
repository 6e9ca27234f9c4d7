package broker

import (
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// Limiter is one limit of a Resource. Admission asks every meter of every
// resource a dispatch needs, and the dispatch goes only if none refuses
// (Refusal, the one answer that dispatch, Explain and status share). A
// meter then follows the dispatch through its life:
//
//   - Take, when it is decided: the meter holds its charge (a concurrency
//     slot, a place in a window or a budget);
//   - Start, when its start is reported (or counted at its deadline when
//     its Runner is silent): the charge counts at that instant;
//   - Release, when its Runner confirms that it never started: the charge
//     taken at Take is given back;
//   - End, when it is over: what it held while running is freed.
//
// A meter that counts an amount (Counts: "requests" for rate windows and
// calendar budgets) has each start logged in the service log with the
// amount it charged, and is rebuilt from that log at recovery (Restore).
// A dispatch's cost in a meter is the unit's cost of that amount (Costs),
// one by default.
//
// Limiters read no clock (every method that depends on time takes it), do no
// I/O, and are not safe for concurrent use: the engine's dispatcher
// goroutine owns them.
type Limiter interface {
	// Counts names the amount the meter counts, as the service log keys
	// it; "" for a meter that logs nothing (a concurrency cap, a circuit).
	Counts() string
	// Refusal says whether a dispatch costing cost may be decided at now;
	// if not, why and until when (zero: until something happens).
	Refusal(now time.Time, cost int64) (Refusal, bool)
	// Take holds the charge of a dispatch decided at now.
	Take(now time.Time, cost int64)
	// Start counts the charge at the dispatch's start: start on the
	// scheduling timeline, wall on the wall clock. A start outside the
	// order of the others is placed where it belongs.
	Start(start, wall time.Time, cost int64)
	// Release gives back the charge of a dispatch that never started.
	Release(cost int64)
	// End frees what a dispatch held while it ran.
	End(cost int64)
	// Restore counts the starts earlier owners logged (see Logged), as of
	// now on the timeline.
	Restore(starts []Logged, now time.Time)
	// Quiet reports whether the meter holds nothing at now; otherwise
	// until when it holds something (zero: until something happens).
	Quiet(now time.Time) (quiet bool, until time.Time)
}

// Horizoned is implemented by a meter whose logged starts stop counting a
// fixed time after they were made: Horizon is that time. Recovery reads
// the service log that far back for it.
type Horizoned interface {
	Horizon() time.Duration
}

// Logged is a start from the service log: at on the scheduling timeline,
// wall on the wall clock, with the amount it charged.
type Logged struct {
	At, Wall time.Time
	Amount   int64
}

// concurrency is a Resource's concurrency cap as a meter: Limit dispatches
// hold it at once (Resource.Limit, Resource.Active).
type concurrency struct{ r *Resource }

func (c concurrency) Counts() string { return "" }

func (c concurrency) Refusal(now time.Time, cost int64) (Refusal, bool) {
	r := c.r
	if r.Limit > 0 && r.Active >= r.Limit {
		if r.Cap {
			return Refusal{Kind: RefuseTaskCap}, true
		}
		return Refusal{Kind: RefuseBusy}, true
	}
	return Refusal{}, false
}

func (c concurrency) Take(now time.Time, cost int64)          { c.r.Active++ }
func (c concurrency) Start(start, wall time.Time, cost int64) {}
func (c concurrency) Release(cost int64)                      {}
func (c concurrency) End(cost int64)                          { c.r.Active-- }
func (c concurrency) Restore(starts []Logged, now time.Time)  {}
func (c concurrency) Quiet(now time.Time) (bool, time.Time)   { return c.r.Active == 0, time.Time{} }

// A Window counts requests: each start is an entry (cost entries for a
// cost above one).

func (w *Window) Counts() string { return rt.Requests }

func (w *Window) Refusal(now time.Time, cost int64) (Refusal, bool) {
	if w.Used(now)+int(max(cost, 1))-1 < w.limit && now.UnixNano() >= w.pacedAt() {
		return Refusal{}, false
	}
	return Refusal{Kind: RefuseRateLimited, Until: w.NextFree(now)}, true
}

func (w *Window) Take(now time.Time, cost int64) {
	for range max(cost, 1) {
		w.Reserve(now)
	}
}

func (w *Window) Start(start, wall time.Time, cost int64) {
	for range max(cost, 1) {
		w.Commit(start)
	}
}

func (w *Window) Release(cost int64) {
	for range max(cost, 1) {
		w.releaseOne()
	}
}

func (w *Window) End(cost int64) {}

// Restore adds the logged starts that still hold a place in the window at
// now, the newest up to the limit.
func (w *Window) Restore(starts []Logged, now time.Time) {
	cut := now.Add(-w.Hold())
	var in []time.Time
	for _, s := range starts {
		if s.At.After(cut) {
			for range max(s.Amount, 1) {
				in = append(in, s.At)
			}
		}
	}
	for _, at := range in[max(0, len(in)-w.limit):] {
		w.Add(at)
	}
}

func (w *Window) Quiet(now time.Time) (bool, time.Time) {
	if w.pending > 0 {
		return false, time.Time{}
	}
	if w.Count(now) > 0 {
		last, _ := w.Last()
		return false, last.Add(w.Hold())
	}
	return true, time.Time{}
}

// A Quota counts requests in calendar periods.

func (b *Quota) Counts() string { return rt.Requests }

func (b *Quota) Refusal(now time.Time, cost int64) (Refusal, bool) {
	if b.Used(now)+int(max(cost, 1))-1 < b.Limit {
		return Refusal{}, false
	}
	return Refusal{Kind: RefuseBudget, Until: b.EndMono()}, true
}

func (b *Quota) Take(now time.Time, cost int64) {
	for range max(cost, 1) {
		b.Reserve()
	}
}

func (b *Quota) Start(start, wall time.Time, cost int64) {
	for range max(cost, 1) {
		b.Commit(wall, start)
	}
}

func (b *Quota) Release(cost int64) {
	for range max(cost, 1) {
		b.releaseOne()
	}
}

func (b *Quota) End(cost int64) {}

// Restore counts the logged starts in the periods they reach (the caller
// Syncs the budget first, and again after).
func (b *Quota) Restore(starts []Logged, now time.Time) {
	for _, s := range starts {
		if !s.Wall.Before(b.end) {
			continue
		}
		for range max(s.Amount, 1) {
			b.Add(s.Wall, s.At)
		}
	}
}

func (b *Quota) Quiet(now time.Time) (bool, time.Time) {
	if b.Idle(now) {
		return true, time.Time{}
	}
	return false, b.EndMono()
}

// A Circuit refuses while open or probing; its probe and verdicts go
// through the Resource (Admit, Judge).

func (c *Circuit) Counts() string { return "" }

func (c *Circuit) Refusal(now time.Time, cost int64) (Refusal, bool) {
	switch {
	case c.State == rt.CircuitOpen && now.Before(c.Until):
		return Refusal{Kind: RefuseCircuitOpen, Until: c.Until}, true
	case c.Probing && (c.State == rt.CircuitHalfOpen || c.State == rt.CircuitOpen):
		return Refusal{Kind: RefuseCircuitProbe}, true
	}
	return Refusal{}, false
}

func (c *Circuit) Take(now time.Time, cost int64)          {}
func (c *Circuit) Start(start, wall time.Time, cost int64) {}
func (c *Circuit) Release(cost int64)                      {}
func (c *Circuit) End(cost int64)                          {}
func (c *Circuit) Restore(starts []Logged, now time.Time)  {}
func (c *Circuit) Quiet(now time.Time) (bool, time.Time) {
	return c.State == rt.CircuitClosed, time.Time{}
}
