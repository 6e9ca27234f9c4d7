package engine

import "sync/atomic"

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
