// Package broker holds the pure decision logic of runcue's resource broker:
// sliding rate windows and circuit breakers. Nothing here reads a clock; the
// caller passes the time, so the logic is tested without sleeping.
package broker

import (
	"sort"
	"time"
)

// Window is an exact sliding log of start instants: at most Limit starts
// lie within any interval of length Length.
//
// A dispatch is decided before its start is known, so the window counts
// reservations too: Reserve holds a place for a decided dispatch, and Commit
// turns it into an entry at the instant the dispatch actually started (or
// Release gives it back if it never starts). Allow admits a new dispatch at
// now only while the entries later than now-Length plus the reservations
// are fewer than Limit. Since a reservation's start is at or after its
// decision, this keeps every interval of length Length to at most Limit
// starts, whatever the delay between decision and start. An entry at t
// leaves the window at t+Length.
//
// Its memory follows its entries: at most about twice the entries in it,
// whatever Limit is. Queries (Count, Used, Allow, NextFree) change nothing
// and may ask about any instant, the future included; entries that have
// left the window are dropped by Expire, and by Add and Commit, which are
// given the present. A Window is not safe for concurrent use.
type Window struct {
	limit   int
	length  time.Duration
	ts      []int64 // entries (Unix ns), sorted; the live ones are ts[head:]
	head    int
	pending int // reservations not yet committed or released
}

// NewWindow returns an empty window.
func NewWindow(limit int, length time.Duration) *Window {
	return &Window{limit: limit, length: length}
}

// Limit and Length return the window's settings.
func (w *Window) Limit() int            { return w.limit }
func (w *Window) Length() time.Duration { return w.length }

// Expire drops the entries that left the window by now. now must not be
// ahead of the present: an entry dropped is gone for every later query.
func (w *Window) Expire(now time.Time) {
	cut := now.UnixNano() - int64(w.length)
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
	cut := t.UnixNano() - int64(w.length)
	live := w.ts[w.head:]
	return w.head + sort.Search(len(live), func(i int) bool { return live[i] > cut })
}

// Count returns the entries in the window ending at t (reservations
// aside).
func (w *Window) Count(t time.Time) int {
	return len(w.ts) - w.first(t)
}

// Pending returns the reservations not yet committed or released.
func (w *Window) Pending() int { return w.pending }

// Used returns the entries in the window ending at now plus the
// reservations: the places taken.
func (w *Window) Used(now time.Time) int { return w.Count(now) + w.pending }

// Allow reports whether a dispatch may be decided at now.
func (w *Window) Allow(now time.Time) bool {
	return w.Used(now) < w.limit
}

// NextFree returns the earliest time a dispatch may be decided: now if
// allowed, otherwise the instant enough entries have left the window, or
// the zero time if reservations alone fill it (a place frees only when one
// is committed or released).
func (w *Window) NextFree(now time.Time) time.Time {
	used := w.Used(now)
	if used < w.limit {
		return now
	}
	need := used - w.limit + 1
	i := w.first(now)
	if need > len(w.ts)-i {
		return time.Time{}
	}
	return time.Unix(0, w.ts[i+need-1]+int64(w.length))
}

// Reserve takes a place for a dispatch decided now (callers check Allow
// first).
func (w *Window) Reserve() { w.pending++ }

// Commit turns a reservation into an entry at t, the dispatch's start.
func (w *Window) Commit(t time.Time) {
	if w.pending > 0 {
		w.pending--
	}
	w.Add(t)
}

// Release gives back a reservation whose dispatch never started.
func (w *Window) Release() {
	if w.pending > 0 {
		w.pending--
	}
}

// Add logs a start at t, in order among the entries (starts reported out
// of order are placed where they belong).
func (w *Window) Add(t time.Time) {
	w.Expire(t)
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

// SetLimits changes the window's settings in place, keeping the newest
// entries that fit and every reservation.
func (w *Window) SetLimits(limit int, length time.Duration) {
	w.limit, w.length = limit, length
	if n := len(w.ts) - w.head; n > limit {
		w.head += n - limit
	}
}

// UsedOrZero is Used for a window that may be nil.
func (w *Window) UsedOrZero(now time.Time) int {
	if w == nil {
		return 0
	}
	return w.Used(now)
}
