package runcuetype

import (
	"fmt"
	"math"
	"time"
)

// Backoff is the shape of the delays between retries.
type Backoff uint8

const (
	// BackoffExponential doubles the delay after each failure:
	// BaseDelay, 2×BaseDelay, 4×BaseDelay, ... It is the default.
	BackoffExponential Backoff = iota
	// BackoffFixed waits BaseDelay after every failure.
	BackoffFixed
	// BackoffLinear waits n×BaseDelay after the nth failure.
	BackoffLinear
)

func (b Backoff) String() string {
	switch b {
	case BackoffExponential:
		return "exponential"
	case BackoffFixed:
		return "fixed"
	case BackoffLinear:
		return "linear"
	}
	return fmt.Sprintf("Backoff(%d)", uint8(b))
}

// Jitter is how a retry delay is randomized, so that units failing together
// do not retry together.
type Jitter uint8

const (
	// JitterEqual draws the delay uniformly from [d/2, d], where d is the
	// backoff delay capped at MaxDelay. It is the default.
	JitterEqual Jitter = iota
	// JitterFull draws the delay uniformly from [0, d].
	JitterFull
	// JitterNone waits exactly d.
	JitterNone
)

// RetryPolicy says whether and when a failed run is tried again. Zero fields
// take the defaults: 3 attempts, exponential backoff from 1s, at most 5
// minutes between attempts, equal jitter, every error retried except those
// made with Permanent.
type RetryPolicy struct {
	// MaxAttempts is the number of failed runs after which the unit fails
	// for good. 1 means no retries. Default 3.
	MaxAttempts int
	// Backoff is the delay shape. Default BackoffExponential.
	Backoff Backoff
	// BaseDelay is the first delay. Default 1s.
	BaseDelay time.Duration
	// MaxDelay caps every delay, jitter included. Default 5m.
	MaxDelay time.Duration
	// Jitter randomizes delays. Default JitterEqual.
	Jitter Jitter
	// RetryOn, when set, decides which errors are retried; errors made with
	// Permanent never are. Default: every error.
	RetryOn func(error) bool
}

// Defaults for RetryPolicy.
const (
	DefaultMaxAttempts = 3
	DefaultBaseDelay   = time.Second
	DefaultMaxDelay    = 5 * time.Minute
)

// WithDefaults returns p with its zero fields set to the defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	return p
}

// Delay returns the wait after the failures-th failed run (from 1), with
// the random draw r in [0, 1). Delay is pure: the same arguments give the
// same delay. The result is never more than MaxDelay.
func (p RetryPolicy) Delay(failures int, r float64) time.Duration {
	p = p.WithDefaults()
	if failures < 1 {
		failures = 1
	}
	var d float64
	base := float64(p.BaseDelay)
	switch p.Backoff {
	case BackoffFixed:
		d = base
	case BackoffLinear:
		d = base * float64(failures)
	default:
		d = base * math.Exp2(float64(min(failures-1, 62)))
	}
	d = min(d, float64(p.MaxDelay))
	r = min(max(r, 0), math.Nextafter(1, 0))
	switch p.Jitter {
	case JitterEqual:
		d = d/2 + r*d/2
	case JitterFull:
		d = r * d
	}
	return time.Duration(d)
}

// MaxTimeout bounds the timeouts and other durations runcue adds to the
// time (Submission and Task timeouts, DependencyTimeout, Config's timeouts
// and retentions, a Retry-After's delay): 100 years.
const MaxTimeout = 100 * 365 * 24 * time.Hour
