// Package broker holds the pure decision logic of runcue's resource broker:
// sliding rate windows and circuit breakers. Nothing here reads a clock; the
// caller passes the time, so the logic is tested without sleeping.
package broker

import "time"

// Window is an exact sliding log of dispatch times: at most Limit
// dispatches start within any interval of length Length. It keeps at most
// Limit entries.
//
// A dispatch at now is allowed when fewer than Limit logged dispatches are
// later than now-Length; an entry logged at t leaves the window at t+Length.
// A Window is not safe for concurrent use.
type Window struct {
	limit  int
	length time.Duration
	ring   []int64 // Unix ns, oldest at head
	head   int
	n      int
}

// NewWindow returns an empty window.
func NewWindow(limit int, length time.Duration) *Window {
	return &Window{limit: limit, length: length, ring: make([]int64, limit)}
}

// Limit and Length return the window's settings.
func (w *Window) Limit() int            { return w.limit }
func (w *Window) Length() time.Duration { return w.length }

func (w *Window) expire(now time.Time) {
	cut := now.UnixNano() - int64(w.length)
	for w.n > 0 && w.ring[w.head] <= cut {
		w.head = (w.head + 1) % len(w.ring)
		w.n--
	}
}

// Count returns the dispatches in the window ending at now.
func (w *Window) Count(now time.Time) int {
	w.expire(now)
	return w.n
}

// Allow reports whether a dispatch may start at now.
func (w *Window) Allow(now time.Time) bool {
	return w.Count(now) < w.limit
}

// NextFree returns the earliest time a dispatch may start: now if allowed,
// otherwise the instant the oldest entry leaves the window.
func (w *Window) NextFree(now time.Time) time.Time {
	if w.Allow(now) {
		return now
	}
	return time.Unix(0, w.ring[w.head]+int64(w.length))
}

// Add logs a dispatch at t. Entries must be added in time order; when the
// window is full the oldest is dropped (callers check Allow first).
func (w *Window) Add(t time.Time) {
	if w.n == len(w.ring) {
		w.head = (w.head + 1) % len(w.ring)
		w.n--
	}
	w.ring[(w.head+w.n)%len(w.ring)] = t.UnixNano()
	w.n++
}

// Last returns the newest entry, and false if the window is empty.
func (w *Window) Last() (time.Time, bool) {
	if w.n == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, w.ring[(w.head+w.n-1)%len(w.ring)]), true
}

// Resize returns a window with new settings holding the newest entries of
// w that fit.
func (w *Window) Resize(limit int, length time.Duration) *Window {
	nw := NewWindow(limit, length)
	start := max(0, w.n-limit)
	for i := start; i < w.n; i++ {
		nw.Add(time.Unix(0, w.ring[(w.head+i)%len(w.ring)]))
	}
	return nw
}

// CountOrZero is Count for a window that may be nil.
func (w *Window) CountOrZero(now time.Time) int {
	if w == nil {
		return 0
	}
	return w.Count(now)
}
