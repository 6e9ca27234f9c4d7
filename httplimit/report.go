package httplimit

import (
	"errors"
	"net/http"
	"time"

	"github.com/runcue/runcue"
)

// ErrThrottled is the error Report returns for a 429 (Too Many Requests),
// wrapped in runcue.RetryAfter.
var ErrThrottled = errors.New("httplimit: the service answered 429 Too Many Requests")

// ErrUnavailable is the error Report returns for a 503 (Service
// Unavailable): wrapped in runcue.Overloaded, and in runcue.RetryAfter
// when the response says how long to wait.
var ErrUnavailable = errors.New("httplimit: the service answered 503 Service Unavailable")

// DefaultThrottle is how long Report holds a service that answered 429
// without saying how long to wait (no Retry-After, no exhausted limit
// with a reset).
const DefaultThrottle = time.Second

// Observation returns what r says of the limits it names, as a run
// reports it (runcue.Work.Observe).
func (r Reading) Observation() runcue.Observation {
	var o runcue.Observation
	for _, l := range r.Limits {
		o.Limits = append(o.Limits, runcue.ObservedLimit{Name: l.Name, Remaining: l.Remaining, Reset: l.Reset, Limit: max(l.Max, 0)})
	}
	return o
}

// Throttle returns how long a 429 asks to wait: Retry-After, else the
// latest reset of a limit with nothing left, else DefaultThrottle; zero
// when the response was not a 429.
func (r Reading) Throttle() time.Duration {
	if !r.Throttled {
		return 0
	}
	if r.RetryAfter > 0 {
		return r.RetryAfter
	}
	var d time.Duration
	for _, l := range r.Limits {
		if l.Remaining == 0 {
			d = max(d, l.Reset)
		}
	}
	if d == 0 {
		d = DefaultThrottle
	}
	return d
}

// Report reads what a response (its headers h and status code, received
// at now) says of the API's limits and reports it to the run w
// (runcue.Work.Observe): a remaining amount lower than runcue counts is
// counted as used from elsewhere, a limit with nothing left holds its
// meter until its reset, each at most a window. For a 429 it returns the
// error the handler should return, runcue.RetryAfter wrapping
// ErrThrottled, so that runcue holds the service for Throttle and runs
// the unit again without spending its retry budget. For a 503 it returns
// runcue.Overloaded wrapping ErrUnavailable (a failure, retried per the
// task's policy), inside runcue.RetryAfter if Retry-After is given. Both
// are overload signals to adaptive limits (runcue.Adaptive). Nil
// otherwise.
//
// The readings name their amounts Requests, Tokens, InputTokens and
// OutputTokens ("requests", "tokens", "input_tokens", "output_tokens"):
// the service's RateLimit takes the requests, and a meter takes an amount
// whose Name or one of whose Aliases is that name (a meter "llm_tokens"
// with Aliases {"tokens"}). A reading no meter takes is ignored; runcue
// logs it once and lists it in ServiceStatus.Unmatched.
func Report(w *runcue.Work, h http.Header, status int, now time.Time) error {
	r := Parse(h, status, now)
	if len(r.Limits) > 0 {
		w.Observe(r.Observation())
	}
	if d := r.Throttle(); d > 0 {
		return runcue.RetryAfter(d, ErrThrottled)
	}
	if status == http.StatusServiceUnavailable {
		if r.RetryAfter > 0 {
			return runcue.RetryAfter(r.RetryAfter, runcue.Overloaded(ErrUnavailable))
		}
		return runcue.Overloaded(ErrUnavailable)
	}
	return nil
}
