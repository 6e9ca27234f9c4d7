package runcue

import "github.com/runcue/runcue/runcuetype"

// The vocabulary runcue shares with its engine is declared once, in
// package runcuetype; these are its names here. Each type's fields and
// methods are documented there.

// Adaptive configures adaptive limits (AIMD: additive increase,
// multiplicative decrease). See [runcuetype.Adaptive].
type Adaptive = runcuetype.Adaptive

// AdaptiveLimit is one adaptive limit: Limit names it ("concurrency",
// "requests" for the rate window, or a meter's amount such as "tokens");
// Effective is in force, at most Configured; Overloads counts the signals
// it took since it was last at Configured. See
// [runcuetype.AdaptiveLimit].
type AdaptiveLimit = runcuetype.AdaptiveLimit

// AdaptiveStatus reports a service's adaptive limits (Service.Adaptive)
// now: each limit in force beside its configured value, and the overload
// signals that lowered them, by kind, since they were last all at their
// configured values. See [runcuetype.AdaptiveStatus].
type AdaptiveStatus = runcuetype.AdaptiveStatus

// Backoff is the shape of the delays between retries. See
// [runcuetype.Backoff].
type Backoff = runcuetype.Backoff

// BackpressureStats is the state of backpressure: whether the queue
// reached HighWater of Config.MaxQueued and has not yet fallen back to
// LowWater. See [runcuetype.BackpressureStats].
type BackpressureStats = runcuetype.BackpressureStats

// Budget caps the requests to a service per calendar period of a time
// zone: "10,000 requests per day, Pacific time". See [runcuetype.Budget].
type Budget = runcuetype.Budget

// BudgetStatus reports a budget in its current period. See
// [runcuetype.BudgetStatus].
type BudgetStatus = runcuetype.BudgetStatus

// CancelOptions qualify a cancellation. See [runcuetype.CancelOptions].
type CancelOptions = runcuetype.CancelOptions

// Charge says what a start's charge in a Meter becomes once its handler
// reports the amount the run actually used (Work.Used). See
// [runcuetype.Charge].
type Charge = runcuetype.Charge

// CircuitState is a service's circuit breaker state. See
// [runcuetype.CircuitState].
type CircuitState = runcuetype.CircuitState

// Costs are a unit's costs by amount: how many tokens, input tokens,
// bytes or requests one run of it charges the meters that count them
// (Service.Meters; "requests" is what RateLimit and Budgets count, one by
// default). See [runcuetype.Costs].
type Costs = runcuetype.Costs

// Dependency is a completed dependency as a DependencyFunc sees it. See
// [runcuetype.Dependency].
type Dependency = runcuetype.Dependency

// Explanation says why a unit is not running now. See
// [runcuetype.Explanation].
type Explanation = runcuetype.Explanation

// Jitter is how a retry delay is randomized, so that units failing
// together do not retry together. See [runcuetype.Jitter].
type Jitter = runcuetype.Jitter

// Meter limits an amount other than requests that a service counts:
// tokens, input or output tokens, bytes, or any name. See
// [runcuetype.Meter].
type Meter = runcuetype.Meter

// The resource broker, as a user sees it. See [runcuetype.MeterStatus].
type MeterStatus = runcuetype.MeterStatus

// MinuteStats counts one minute's events: units started, completed,
// failed for good, failed and retried, skipped, cancelled, and runs
// deferred by a Retry-After (429, 503). See [runcuetype.MinuteStats].
type MinuteStats = runcuetype.MinuteStats

// Missed says what a schedule does with the periods that fell due while
// no owner ran it (a stop, a crash before a takeover) or while it was
// paused. See [runcuetype.Missed].
type Missed = runcuetype.Missed

// Observation is what a service said of its limits in one response (see
// Work.Observe). See [runcuetype.Observation].
type Observation = runcuetype.Observation

// ObservedLimit is one limit as a response reported it. See
// [runcuetype.ObservedLimit].
type ObservedLimit = runcuetype.ObservedLimit

// OverloadedError marks a failure as the service's overload: it answered
// 503 Service Unavailable, or shed the request, without saying how long
// to wait. See [runcuetype.OverloadedError].
type OverloadedError = runcuetype.OverloadedError

// PatternStats counts what the patterns hold now. See
// [runcuetype.PatternStats].
type PatternStats = runcuetype.PatternStats

// Period is the calendar period of a Budget. See [runcuetype.Period].
type Period = runcuetype.Period

// PermanentError marks a failure that is never retried. See
// [runcuetype.PermanentError].
type PermanentError = runcuetype.PermanentError

// QueueStatus summarizes the owner's queue. See [runcuetype.QueueStatus].
type QueueStatus = runcuetype.QueueStatus

// QueueWaitStats summarizes queue waits. See [runcuetype.QueueWaitStats].
type QueueWaitStats = runcuetype.QueueWaitStats

// Reason is one reason a unit is not running. See [runcuetype.Reason].
type Reason = runcuetype.Reason

// ReasonKind names why a unit is not running. See
// [runcuetype.ReasonKind].
type ReasonKind = runcuetype.ReasonKind

// RetryAfterError asks runcue to try a unit again after Delay because a
// service answered "not now" (HTTP 429 or 503 with Retry-After). See
// [runcuetype.RetryAfterError].
type RetryAfterError = runcuetype.RetryAfterError

// RetryPolicy says whether and when a failed run is tried again. See
// [runcuetype.RetryPolicy].
type RetryPolicy = runcuetype.RetryPolicy

// ScheduleStatus is a schedule as stored, with its next period. See
// [runcuetype.ScheduleStatus].
type ScheduleStatus = runcuetype.ScheduleStatus

// Service describes a rate-limited or capacity-limited external resource:
// an API, a remote host, a local pool. See [runcuetype.Service].
type Service = runcuetype.Service

// ServiceStats is a service in Stats. See [runcuetype.ServiceStats].
type ServiceStats = runcuetype.ServiceStats

// ServiceStatus reports a service's limits and load. See
// [runcuetype.ServiceStatus].
type ServiceStatus = runcuetype.ServiceStatus

// SkipError ends a unit as skipped. See [runcuetype.SkipError].
type SkipError = runcuetype.SkipError

// Stats is a summary of a database's work and services. See
// [runcuetype.Stats].
type Stats = runcuetype.Stats

// Timing says when a schedule's periods are due: every Every since
// Anchor, or at the local times a cron expression names in Zone. See
// [runcuetype.Timing].
type Timing = runcuetype.Timing

// The constants of runcuetype, documented there.
const (
	HighWater                 = runcuetype.HighWater
	LowWater                  = runcuetype.LowWater
	BackoffExponential        = runcuetype.BackoffExponential
	BackoffFixed              = runcuetype.BackoffFixed
	BackoffLinear             = runcuetype.BackoffLinear
	JitterEqual               = runcuetype.JitterEqual
	JitterFull                = runcuetype.JitterFull
	JitterNone                = runcuetype.JitterNone
	DefaultMaxAttempts        = runcuetype.DefaultMaxAttempts
	DefaultBaseDelay          = runcuetype.DefaultBaseDelay
	DefaultMaxDelay           = runcuetype.DefaultMaxDelay
	MaxTimeout                = runcuetype.MaxTimeout
	MaxRateWindow             = runcuetype.MaxRateWindow
	DefaultMargin             = runcuetype.DefaultMargin
	MaxMargin                 = runcuetype.MaxMargin
	PerDay                    = runcuetype.PerDay
	PerMonth                  = runcuetype.PerMonth
	MissedLatest              = runcuetype.MissedLatest
	MissedSkip                = runcuetype.MissedSkip
	MissedEach                = runcuetype.MissedEach
	ReasonRunning             = runcuetype.ReasonRunning
	ReasonFinished            = runcuetype.ReasonFinished
	ReasonDependencies        = runcuetype.ReasonDependencies
	ReasonDependencyCheck     = runcuetype.ReasonDependencyCheck
	ReasonServiceBusy         = runcuetype.ReasonServiceBusy
	ReasonRateLimited         = runcuetype.ReasonRateLimited
	ReasonMeterFull           = runcuetype.ReasonMeterFull
	ReasonSequence            = runcuetype.ReasonSequence
	ReasonBatch               = runcuetype.ReasonBatch
	ReasonCircuitOpen         = runcuetype.ReasonCircuitOpen
	ReasonCircuitProbe        = runcuetype.ReasonCircuitProbe
	ReasonBudgetExhausted     = runcuetype.ReasonBudgetExhausted
	ReasonQueuePaused         = runcuetype.ReasonQueuePaused
	ReasonTaskPaused          = runcuetype.ReasonTaskPaused
	ReasonPaused              = runcuetype.ReasonPaused
	ReasonServiceRetryAfter   = runcuetype.ReasonServiceRetryAfter
	ReasonGlobalCap           = runcuetype.ReasonGlobalCap
	ReasonCommitBacklog       = runcuetype.ReasonCommitBacklog
	ReasonTaskCap             = runcuetype.ReasonTaskCap
	ReasonNoExecutor          = runcuetype.ReasonNoExecutor
	ReasonBackoff             = runcuetype.ReasonBackoff
	ReasonRetryAfter          = runcuetype.ReasonRetryAfter
	ReasonRunAt               = runcuetype.ReasonRunAt
	ReasonDependenciesSkipped = runcuetype.ReasonDependenciesSkipped
	ReasonBackpressure        = runcuetype.ReasonBackpressure
	ReasonTaskNotRegistered   = runcuetype.ReasonTaskNotRegistered
	ReasonNotOwned            = runcuetype.ReasonNotOwned
	ReasonStopping            = runcuetype.ReasonStopping
	ReasonNotLoaded           = runcuetype.ReasonNotLoaded
	ReasonEligible            = runcuetype.ReasonEligible
	StatsKeys                 = runcuetype.StatsKeys
	MaxFreeProbes             = runcuetype.MaxFreeProbes
	CircuitClosed             = runcuetype.CircuitClosed
	CircuitOpen               = runcuetype.CircuitOpen
	CircuitHalfOpen           = runcuetype.CircuitHalfOpen
	MaxCost                   = runcuetype.MaxCost
	Requests                  = runcuetype.Requests
	ChargeActual              = runcuetype.ChargeActual
	ChargeLarger              = runcuetype.ChargeLarger
	ChargeEstimate            = runcuetype.ChargeEstimate
)
