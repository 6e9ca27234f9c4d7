// Package broker holds the pure decision logic of runcue's resource broker:
// sliding rate windows and circuit breakers. Nothing here reads a clock; the
// caller passes the time, so the logic is tested without sleeping.
package broker

import (
	"sort"
	"time"
)

// Window is an exact sliding log of start instants: at most Limit starts
// lie within any interval of length Length plus Margin.
//
// The margin is for the wire: a server counts a request when it arrives,
// some time after its start, and that delay varies. If every start counts
// for Length+Margin, and the delays of any two requests differ by at most
// Margin, no interval of length Length at the server holds more than Limit
// arrivals: the arrivals in [a, a+Length] started in [a-Margin, a+Length].
//
// A dispatch is decided before its start is known, so the window counts
// reservations too: Reserve holds a place for a decided dispatch, and Commit
// turns it into an entry at the instant the dispatch actually started (or
// Release gives it back if it never starts). Allow admits a new dispatch at
// now only while the entries later than now-Length plus the reservations
// are fewer than Limit. Since a reservation's start is at or after its
// decision, this keeps every interval of length Length to at most Limit
// starts, whatever the delay between decision and start. An entry at t
// leaves the window at t+Length. The argument holds as well for an entry
// placed later than its start (a start known only by the latest instant it
// can have had, on another host's clock or in an earlier owner's log), and
// fails for one placed earlier.
//
// Its memory follows its entries: at most about twice the entries in it,
// whatever Limit is. Queries (Count, Used, Allow, NextFree) change nothing
// and may ask about any instant, the future included; entries that have
// left the window are dropped by Expire, which is given the present. Add
// and Commit may be given an instant in the future (a start's latest
// bound): they drop only what left the window by the latest present
// Expire or Reserve was given, never what still counts now. A Window is
// not safe for concurrent use.
//
// Paced, a window also spaces its dispatches: none is decided sooner than
// Length/Limit after the previous decision or start, so a backlog leaves
// at an even rate rather than a window's worth at once.
type Window struct {
	limit   int
	length  time.Duration
	margin  time.Duration
	pace    bool
	ts      []int64 // entries (Unix ns), sorted; the live ones are ts[head:]
	head    int
	pending int   // reservations not yet committed or released
	decided int64 // the latest reservation's decision (Unix ns), for pacing
	present int64 // the latest present given to Expire or Reserve (Unix ns)
}

// NewWindow returns an empty window without margin or pacing.
func NewWindow(limit int, length time.Duration) *Window {
	return &Window{limit: limit, length: length}
}

// Limit, Length, Margin and Paced return the window's settings; Hold is
// how long an entry counts: Length plus Margin.
func (w *Window) Limit() int            { return w.limit }
func (w *Window) Length() time.Duration { return w.length }
func (w *Window) Margin() time.Duration { return w.margin }
func (w *Window) Paced() bool           { return w.pace }
func (w *Window) Hold() time.Duration   { return w.length + w.margin }

// SetMargin sets the margin (negative is taken as zero). A larger margin
// holds the entries already in the window longer; a smaller one may free
// places at once.
func (w *Window) SetMargin(m time.Duration) { w.margin = max(m, 0) }

// SetPace turns pacing on or off.
func (w *Window) SetPace(on bool) { w.pace = on }

// spacing is the least time between paced dispatches.
func (w *Window) spacing() time.Duration { return w.length / time.Duration(max(w.limit, 1)) }

// pacedAt returns the earliest instant pacing lets a dispatch be decided:
// spacing after the later of the last decision and the newest entry. Zero
// when the window is not paced.
func (w *Window) pacedAt() int64 {
	if !w.pace {
		return 0
	}
	last := w.decided
	if len(w.ts) > w.head && w.ts[len(w.ts)-1] > last {
		last = w.ts[len(w.ts)-1]
	}
	if last == 0 {
		return 0
	}
	return last + int64(w.spacing())
}

// Expire drops the entries that left the window by now. now must not be
// ahead of the present: an entry dropped is gone for every later query.
func (w *Window) Expire(now time.Time) {
	w.present = max(w.present, now.UnixNano())
	w.expire()
}

// expire drops the entries that left the window by the latest present.
func (w *Window) expire() {
	if w.present == 0 {
		return
	}
	cut := w.present - int64(w.Hold())
	for w.head < len(w.ts) && w.ts[w.head] <= cut {
		w.head++
	}
	if w.head > 0 && 2*w.head >= len(w.ts) {
		n := len(w.ts) - w.head
		if cap(w.ts) > 2*n+16 {
			w.ts = append(make([]int64, 0, 2*n), w.ts[w.head:]...)
		} else {
			copy(w.ts, w.ts[w.head:])
			w.ts = w.ts[:n]
		}
		w.head = 0
	}
}

// first returns the index of the first entry still in the window at t.
func (w *Window) first(t time.Time) int {
	cut := t.UnixNano() - int64(w.Hold())
	live := w.ts[w.head:]
	return w.head + sort.Search(len(live), func(i int) bool { return live[i] > cut })
}

// Count returns the entries that count at t (started in the Hold before
// it), reservations aside.
func (w *Window) Count(t time.Time) int {
	return len(w.ts) - w.first(t)
}

// CountAt returns the entries that counted at t: those in the window
// ending at t, not the later ones.
func (w *Window) CountAt(t time.Time) int {
	i := w.first(t)
	end := t.UnixNano()
	return sort.Search(len(w.ts)-i, func(k int) bool { return w.ts[i+k] > end })
}

// Pending returns the reservations not yet committed or released.
func (w *Window) Pending() int { return w.pending }

// Used returns the entries in the window ending at now plus the
// reservations: the places taken.
func (w *Window) Used(now time.Time) int { return w.Count(now) + w.pending }

// Allow reports whether a dispatch may be decided at now.
func (w *Window) Allow(now time.Time) bool {
	return w.Used(now) < w.limit && now.UnixNano() >= w.pacedAt()
}

// NextFree returns the earliest time a dispatch may be decided: now if
// allowed, otherwise the instant enough entries have left the window (and
// pacing allows), or the zero time if reservations alone fill it (a place
// frees only when one is committed or released).
func (w *Window) NextFree(now time.Time) time.Time {
	at := now
	if p := w.pacedAt(); p > now.UnixNano() {
		at = time.Unix(0, p)
	}
	used := w.Used(now)
	if used < w.limit {
		return at
	}
	need := used - w.limit + 1
	i := w.first(now)
	if need > len(w.ts)-i {
		return time.Time{}
	}
	if free := time.Unix(0, w.ts[i+need-1]+int64(w.Hold())); free.After(at) {
		return free
	}
	return at
}

// Reserve takes a place for a dispatch decided at now (callers check Allow
// first).
func (w *Window) Reserve(now time.Time) {
	w.pending++
	if n := now.UnixNano(); n > w.decided {
		w.decided = n
	}
	w.present = max(w.present, now.UnixNano())
}

// Commit turns a reservation into an entry at t, the dispatch's start.
func (w *Window) Commit(t time.Time) {
	w.releaseOne()
	w.Add(t)
}

// releaseOne gives back a reservation.
func (w *Window) releaseOne() {
	if w.pending > 0 {
		w.pending--
	}
}

// Add logs a start at t, in order among the entries (starts reported out
// of order are placed where they belong). t may lie in the future: Add
// expires by the latest present it was given, not by t, which would drop
// entries that still count now.
func (w *Window) Add(t time.Time) {
	w.expire()
	v := t.UnixNano()
	i := len(w.ts)
	for i > w.head && w.ts[i-1] > v {
		i--
	}
	w.ts = append(w.ts, 0)
	copy(w.ts[i+1:], w.ts[i:])
	w.ts[i] = v
}

// Last returns the newest entry, and false if the window is empty.
func (w *Window) Last() (time.Time, bool) {
	if len(w.ts) == w.head {
		return time.Time{}, false
	}
	return time.Unix(0, w.ts[len(w.ts)-1]), true
}

// Cap returns the entries the window has room for without allocating.
func (w *Window) Cap() int { return cap(w.ts) }

// SetLimits changes the window's limit and length in place, keeping every
// entry and reservation: a limit lowered and raised again (an adaptive
// limit, an override undone) still counts every start of the window, so
// the higher limit holds across the change.
func (w *Window) SetLimits(limit int, length time.Duration) {
	w.limit, w.length = limit, length
}
