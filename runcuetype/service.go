package runcuetype

import (
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
)

// Service describes a rate-limited or capacity-limited external resource: an
// API, a remote host, a local pool. Every limit's zero value means unlimited
// (or, for the circuit breaker, disabled).
//
// Its JSON follows runcue's convention: max_concurrent, rate_limit,
// rate_window_ms, circuit_threshold, circuit_timeout_ms, budgets, margin_ms,
// pace, meters, adaptive, share, weight, min_concurrent.
type Service struct {
	// MaxConcurrent caps the units using the service at once.
	MaxConcurrent int
	// RateLimit caps the dispatches that start within any interval of
	// length RateWindow plus Margin, so that the service, counting
	// arrivals, sees at most RateLimit in any RateWindow. Set both or
	// neither.
	RateLimit  int
	RateWindow time.Duration
	// CircuitThreshold is the number of consecutive failures that open the
	// service's circuit; CircuitTimeout how long it then stays open before
	// admitting one probe. Set both or neither.
	CircuitThreshold int
	CircuitTimeout   time.Duration
	// Budgets are calendar budgets: requests per day or month of a time
	// zone (see Budget), besides the rolling window.
	Budgets []Budget
	// Margin is the spread, from a handler's start to its request's
	// arrival at the service, that the limits must tolerate: connection
	// set-up included, the difference between the fastest and the slowest
	// request's way there. The service counts a request when it arrives;
	// runcue counts it when the handler starts (Work.Started). So a start
	// holds its place in the rate window for RateWindow plus Margin, and
	// counts in every budget period that its arrival can fall in. With a
	// Margin at least the wire's jitter, the service's own sliding window
	// holds even when a whole window's worth of a backlog starts at once.
	// Zero means DefaultMargin; a negative Margin means none (a resource
	// that counts at the start itself, such as a local pool). At most
	// MaxMargin.
	Margin time.Duration
	// Pace spaces the dispatches of a rate-limited service at least
	// RateWindow/RateLimit apart, for services that dislike bursts: a
	// backlog then leaves at an even rate instead of a window's worth at
	// once. Off by default.
	Pace bool
	// Meters limit amounts other than requests (tokens, bytes) per
	// sliding window, each run charged its unit's Costs (see Meter). A
	// unit of a task using the service must state a cost of every
	// metered amount.
	Meters []Meter
	// Adaptive, when set, makes the service's limits (MaxConcurrent,
	// RateLimit, each meter's Limit) ceilings under which runcue finds
	// the limit the service really grants, from its overload signals
	// (see Adaptive).
	Adaptive *Adaptive
	// Share, on a service used with keys (Task.ServiceKeys: "tenant:a",
	// "tenant:b"), divides among its keys what they share (another
	// service they all use, a meter of it, the Cue's MaxConcurrent) in
	// proportion to their Weights, counted in the amount it names:
	// "requests" counts each dispatch as one, a meter's amount ("tokens")
	// counts each unit's cost of it. Empty: the keys' units go in
	// submission order, so the key with the longest backlog takes most.
	// See Weight and MinConcurrent; MaxConcurrent, set on the service or
	// a key's override, is a key's burst maximum. With a Priority
	// function, shares divide among units scored alike, approximately
	// while scoring lags behind a burst of submissions.
	Share string
	// Weight is a key's share relative to the others' (zero means one).
	// Set on the class it applies to every key; a key's own override
	// (SetServiceLimits("tenant:a", ...)) gives it its own.
	Weight float64
	// MinConcurrent is a key's guaranteed minimum: while fewer of its
	// units run, its next unit goes before any other key's. At most
	// MaxConcurrent when that is set.
	MinConcurrent int
	// RateFromProvider makes RateLimit follow what the provider states of
	// its request limit in its responses (ObservedLimit.Limit of
	// "requests": x-ratelimit-limit-requests,
	// anthropic-ratelimit-requests-limit), as Meter.FromProvider does for
	// an amount: RateLimit is the starting value, MaxRate (when set) the
	// cap, RateWindow the window.
	RateFromProvider bool
	MaxRate          int
}

// Adaptive configures adaptive limits (AIMD: additive increase,
// multiplicative decrease). Every limit the service configures is a
// ceiling: an overload signal from a run of the service cuts each
// effective limit to Decrease of itself (one cut per burst: signals from
// runs started before the last cut do not cut again), and successes raise
// each by Increase of its ceiling per window's worth (as many requests as
// the limit, or as many tokens), never above the ceiling nor below Floor
// of it. Each key of a keyed service adapts on its own.
//
// The overload signals: a Retry-After (RetryAfter, or httplimit.Report
// for a 429 or a 503), an error made with Overloaded (a 503 without
// Retry-After), and a run cut off by its timeout. When the run's report
// (Work.Observe, httplimit.Report's headers) said which of the service's
// limits had less left than the unit costs, a Retry-After or an overload
// cuts those only (a 429 for tokens leaves concurrency and requests
// alone; one for an amount the service does not meter cuts nothing); a
// timeout, or a report that named no exhausted limit, cuts each.
//
// Adaptive pays where the real limit is hidden or moves and refusals do
// not say how long to wait. Against a provider that states its limits in
// every response and an accurate Retry-After in its 429s, report the
// headers (httplimit.Report) and leave Adaptive off: the meters are
// corrected and the service held exactly as long as needed, and adaptive
// limits only slow the recovery. The effective limits
// are persisted (a new owner goes on from them), shown in ServiceStatus
// (Adaptive), Explain, the command line and the dashboard, announced by
// an EventLimitAdapted event and exported as the metric
// runcue.service.limit_effective.
//
// Zero fields take the defaults: Floor 0.1, Decrease 0.8, Increase 0.02.
// A gentler Decrease than the classic 0.5 keeps more throughput against
// a limit that is steady, at the cost of more cuts to reach it: against
// a hidden limit at 60% of the configured one, 0.8 keeps about 94% of it
// with under 1% of requests refused, 0.5 about 79%.
type Adaptive struct {
	Floor    float64 `json:"floor,omitempty"`
	Decrease float64 `json:"decrease,omitempty"`
	Increase float64 `json:"increase,omitempty"`
}

// MaxRateWindow is the longest RateWindow accepted.
const MaxRateWindow = 7 * 24 * time.Hour

// DefaultMargin is a service's Margin when it sets none: 10 ms, more than
// the 1-4 ms from start to arrival measured against local mock servers,
// and little against windows of a second or more (a limit of 4 per second
// becomes 4 per 1.01 s).
const DefaultMargin = store.DefaultMargin

// MaxMargin is the largest Margin accepted.
const MaxMargin = time.Minute

// serviceJSON is Service's JSON form.
type serviceJSON struct {
	MaxConcurrent    int      `json:"max_concurrent,omitempty"`
	RateLimit        int      `json:"rate_limit,omitempty"`
	RateWindowMS     int64    `json:"rate_window_ms,omitempty"`
	CircuitThreshold int      `json:"circuit_threshold,omitempty"`
	CircuitTimeoutMS int64    `json:"circuit_timeout_ms,omitempty"`
	Budgets          []Budget `json:"budgets,omitempty"`
	// MarginMS is the margin in milliseconds, rounded up; -1 for none,
	// omitted for the default.
	MarginMS      int64     `json:"margin_ms,omitempty"`
	Pace          bool      `json:"pace,omitempty"`
	Meters        []Meter   `json:"meters,omitempty"`
	Adaptive      *Adaptive `json:"adaptive,omitempty"`
	Share         string    `json:"share,omitempty"`
	Weight        float64   `json:"weight,omitempty"`
	MinConcurrent int       `json:"min_concurrent,omitempty"`
	// RateFromProvider and MaxRate: see Service.
	RateFromProvider bool `json:"rate_from_provider,omitempty"`
	MaxRate          int  `json:"max_rate,omitempty"`
}

// MarshalJSON writes s in runcue's JSON convention (durations in
// milliseconds; a Margin is rounded up to one, and a negative one is -1).
func (s Service) MarshalJSON() ([]byte, error) {
	var margin int64
	switch {
	case s.Margin < 0:
		margin = -1
	case s.Margin > 0:
		margin = int64((s.Margin + time.Millisecond - 1) / time.Millisecond)
	}
	return json.Marshal(serviceJSON{s.MaxConcurrent, s.RateLimit, s.RateWindow.Milliseconds(), s.CircuitThreshold,
		s.CircuitTimeout.Milliseconds(), s.Budgets, margin, s.Pace, s.Meters, s.Adaptive, s.Share, s.Weight, s.MinConcurrent,
		s.RateFromProvider, s.MaxRate})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Service) UnmarshalJSON(b []byte) error {
	var j serviceJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Service{MaxConcurrent: j.MaxConcurrent, RateLimit: j.RateLimit, RateWindow: time.Duration(j.RateWindowMS) * time.Millisecond,
		CircuitThreshold: j.CircuitThreshold, CircuitTimeout: time.Duration(j.CircuitTimeoutMS) * time.Millisecond, Budgets: j.Budgets,
		Margin: time.Duration(j.MarginMS) * time.Millisecond, Pace: j.Pace, Meters: j.Meters, Adaptive: j.Adaptive,
		Share: j.Share, Weight: j.Weight, MinConcurrent: j.MinConcurrent, RateFromProvider: j.RateFromProvider, MaxRate: j.MaxRate}
	if j.MarginMS < 0 {
		s.Margin = -1
	}
	return nil
}
