package broker

import (
	"time"

	rt "github.com/runcue/runcue/runcuetype"
)

// Circuit is a circuit breaker. Closed, it counts consecutive failures and
// opens at Threshold; open, it refuses dispatch for Timeout; then it is
// half-open and admits exactly one probe, whose success closes it and whose
// failure opens it again for a fresh Timeout. A probe that ends without a
// verdict (cancelled, say) frees the half-open circuit for another probe.
// A Circuit is not safe for concurrent use.
type Circuit struct {
	Threshold int
	Timeout   time.Duration

	State    rt.CircuitState
	Failures int       // consecutive failures while closed
	Until    time.Time // end of the open period
	Probing  bool      // a half-open probe is running
}

// NewCircuit returns a closed circuit.
func NewCircuit(threshold int, timeout time.Duration) *Circuit {
	return &Circuit{Threshold: threshold, Timeout: timeout, State: rt.CircuitClosed}
}

// Allow reports whether a dispatch may start at now. When it may not,
// until is when to ask again (zero while a probe runs: ask when it ends).
// probe reports that the dispatch, if made, is the half-open probe. Allow
// moves an open circuit whose time has come to half-open.
func (c *Circuit) Allow(now time.Time) (ok bool, until time.Time, probe bool) {
	switch c.State {
	case rt.CircuitOpen:
		if now.Before(c.Until) {
			return false, c.Until, false
		}
		c.State = rt.CircuitHalfOpen
		c.Probing = false
		fallthrough
	case rt.CircuitHalfOpen:
		if c.Probing {
			return false, time.Time{}, false
		}
		return true, time.Time{}, true
	}
	return true, time.Time{}, false
}

// Started records that the dispatch Allow admitted has started.
func (c *Circuit) Started(probe bool) {
	if probe {
		c.Probing = true
	}
}

// Success records a successful run; it reports whether the state changed.
func (c *Circuit) Success(probe bool) bool {
	c.Failures = 0
	if c.State == rt.CircuitHalfOpen && probe {
		c.State, c.Probing = rt.CircuitClosed, false
		return true
	}
	return false
}

// Failure records a failed run at now; it reports whether the state
// changed. Only a closed circuit's count and the probe's verdict matter:
// failures of runs started before the circuit opened change nothing more.
func (c *Circuit) Failure(now time.Time, probe bool) bool {
	switch c.State {
	case rt.CircuitClosed:
		c.Failures++
		if c.Failures >= c.Threshold {
			c.open(now)
			return true
		}
	case rt.CircuitHalfOpen:
		if probe {
			c.open(now)
			return true
		}
	}
	return false
}

// Neutral records a run that ended without a verdict.
func (c *Circuit) Neutral(probe bool) {
	if probe {
		c.Probing = false
	}
}

func (c *Circuit) open(now time.Time) {
	c.State, c.Until, c.Probing, c.Failures = rt.CircuitOpen, now.Add(c.Timeout), false, 0
}
