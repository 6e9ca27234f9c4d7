package broker

import (
	"time"

	"github.com/runcue/runcue/runcuetype"
)

// Quota is a calendar budget: at most Limit starts whose wall-clock
// instants lie in one period (a day or a month of a time zone).
//
// Unlike a Window it follows the wall clock, the one place runcue lets
// wall time decide: a provider's daily quota resets at midnight on its
// clock, not 24 hours after the first request. The scheduling timeline
// (monotonic) still says when to look again: Sync maps the period's end
// onto it from a pair of readings, and every decision Syncs first, so the
// period turns over when the wall clock says so even if it was set
// meanwhile.
//
// Like a Window it counts reservations: Reserve holds a place for a
// decided dispatch, Commit counts it in the period its start's wall
// instant falls in, Release gives it back. Allow admits a new dispatch only
// while the starts counted in the current period plus the reservations are
// fewer than Limit; a reservation decided in one period and started in the
// next is counted in the next, whose decisions all saw it. So no period
// holds more than Limit starts, as long as the wall clock is not set back
// across a period's start (a start then dated in a past period is not
// counted again there, and a period is never reopened).
//
// Margin is the wire's, as a Window's: a start at t may reach the server
// until t+Margin, so it counts in every period it can reach: one started
// within Margin of a period's end counts in that period and in the next.
//
// A Quota is not safe for concurrent use.
type Quota struct {
	Limit  int
	Period runcuetype.Period
	Loc    *time.Location
	Margin time.Duration

	start, end time.Time // the current period, on the wall clock
	endMono    time.Time // end on the scheduling timeline, as of the last Sync
	used       int       // starts counted in the current period
	next       int       // starts counted in the period after it (within Margin of its end)
	pending    int       // reservations
	announced  time.Time // the start of the period whose exhaustion Exhaustion reported
}

// NewQuota returns a budget of limit starts per period p in loc, its
// current period the one holding wall, mapped onto the timeline at mono.
func NewQuota(limit int, p runcuetype.Period, loc *time.Location, wall, mono time.Time) *Quota {
	b := &Quota{Limit: limit, Period: p, Loc: loc}
	b.Sync(wall, mono)
	return b
}

// Sync moves the budget to the period holding wall, if that period is
// later than its own (the count starts again at zero), and maps the end of
// its period onto the scheduling timeline: wall and mono are readings of
// the two clocks at the same instant. A wall clock set back into an
// earlier period leaves the budget in its period.
func (b *Quota) Sync(wall, mono time.Time) {
	if b.end.IsZero() || !wall.Before(b.end) {
		start, end := b.Period.Bounds(b.Loc, wall)
		carried := 0
		if start.Equal(b.end) {
			carried = b.next // started within Margin of the previous period's end
		}
		b.start, b.end, b.used, b.next = start, end, carried, 0
	}
	b.endMono = mono.Add(b.end.Sub(wall))
}

// PeriodStart and PeriodEnd return the current period, on the wall clock;
// EndMono its end on the scheduling timeline as of the last Sync.
func (b *Quota) PeriodStart() time.Time { return b.start }
func (b *Quota) PeriodEnd() time.Time   { return b.end }
func (b *Quota) EndMono() time.Time     { return b.endMono }

// Used returns the starts counted in the current period plus the
// reservations, as of now on the scheduling timeline: once the period's
// end has passed there, those counted in the next period (within Margin of
// the end) and the reservations (the next Sync starts the new period).
func (b *Quota) Used(now time.Time) int {
	if !now.Before(b.endMono) {
		return b.next + b.pending
	}
	return b.used + b.pending
}

// Allow reports whether a dispatch may be decided at now (timeline).
func (b *Quota) Allow(now time.Time) bool { return b.Used(now) < b.Limit }

// Reserve takes a place for a dispatch decided now (callers check Allow
// first).
func (b *Quota) Reserve() { b.pending++ }

// releaseOne gives back a reservation.
func (b *Quota) releaseOne() {
	if b.pending > 0 {
		b.pending--
	}
}

// Commit turns a reservation into a start at wall, read with mono.
func (b *Quota) Commit(wall, mono time.Time) {
	b.releaseOne()
	b.Add(wall, mono)
}

// Add counts a start at wall (read with mono) in the periods it can reach,
// from wall to wall+Margin; one in an earlier period counts only if its
// margin reaches the current one. A start in the next period counts there
// (as one within Margin of the current period's end does) without moving
// the budget: it may be a bound still to come (the latest instant a start
// on another host can have had), and the decisions of the current period
// must go on counting its starts. Only Sync, given the present, and a
// start further ahead than the next period move the budget.
func (b *Quota) Add(wall, mono time.Time) {
	if !b.end.IsZero() && !wall.Before(b.end) {
		if _, nextEnd := b.Period.Bounds(b.Loc, b.end); wall.Before(nextEnd) {
			b.next++
			return
		}
	}
	b.Sync(wall, mono)
	reach := wall.Add(max(b.Margin, 0))
	if !reach.Before(b.start) {
		b.used++
	}
	if !reach.Before(b.end) {
		b.next++
	}
}

// Exhaustion reports, once per period, that the budget is spent at now
// (timeline): the places taken reached Limit. It returns the period.
func (b *Quota) Exhaustion(now time.Time) (start, end time.Time, ok bool) {
	if b.Allow(now) || !now.Before(b.endMono) || b.announced.Equal(b.start) {
		return time.Time{}, time.Time{}, false
	}
	b.announced = b.start
	return b.start, b.end, true
}

// Idle reports whether the budget counts nothing at now (timeline): no
// reservation, and no start in a period not over.
func (b *Quota) Idle(now time.Time) bool { return b.Used(now) == 0 }

// SetLimit changes the limit, keeping the count.
func (b *Quota) SetLimit(limit int) { b.Limit = limit }
