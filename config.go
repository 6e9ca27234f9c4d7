package runcue

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/runcue/runcue/clock"
)

// Configuration: Config, its defaults and its validation.

// Config configures a Cue. The zero Config is valid; each field documents
// its default. Zero means the default; a negative value (where the field
// documents no meaning for one) or a contradiction between fields makes
// Open and New return an error matching ErrInvalid.
type Config struct {
	// MaxConcurrent caps the handlers running at once. Default 100.
	MaxConcurrent int
	// MaxUncommitted bounds how far handlers may run ahead of the
	// database: while that many ended runs wait for the writer to commit
	// their outcomes, no run starts (Explain says commit_backlog).
	// Handlers that end faster than their outcomes are recorded would
	// otherwise run ahead without bound, every run not yet recorded a run
	// that a crash makes happen again and a record held in memory. With
	// the cap, at most MaxConcurrent + MaxUncommitted - 1 runs are ahead
	// of the database at any instant. Default 1024, enough for the
	// writer's group commits to stay full.
	MaxUncommitted int
	// MaxPayload bounds the size in bytes of a submission's encoded params
	// (a larger submission fails with ErrInvalid) and of a handler's encoded
	// result (a larger one fails the run permanently). Default 16 MiB.
	MaxPayload int
	// DefaultTimeout bounds runs of tasks and submissions that set no
	// timeout. Default 30 minutes.
	DefaultTimeout time.Duration
	// LeaseBuffer is added to a run's timeout to make its lease: a run cut
	// off at its deadline whose handler has not returned may go on until
	// then, so its unit runs again no sooner (unless the handler returns
	// first), and a new owner requeues the run of an owner not proven dead
	// only after it. Default 60s.
	LeaseBuffer time.Duration
	// MaxStartDelay bounds how long after runcue decides to dispatch a unit
	// of a rate-limited service its handler may start (the decision is
	// logged before the start, and the handler starts once that log entry
	// is committed). A run that would start later is not started but
	// requeued (outcome late_start), so that every logged decision's start
	// lies within MaxStartDelay after it: a new owner, which cannot know
	// when a dead owner's handlers started, counts each logged entry as
	// starting that much later. Default 2s.
	MaxStartDelay time.Duration
	// PollInterval is how often the Cue checks the database for commits made
	// by other processes (submissions to run, cancellations, events to
	// deliver). Work submitted elsewhere is picked up within PollInterval
	// plus one commit. Default 100ms.
	PollInterval time.Duration
	// Standby makes Start wait for ownership instead of failing with
	// ErrLocked while another Cue owns the database: Start returns at once,
	// and the Cue tries to take ownership every PollInterval, taking over
	// when the owner releases it or, on a backend with leases
	// (store/postgres), when its lease expires: the queue, windows,
	// circuits and budgets are rebuilt from the database, and the previous
	// owner's runs count against their services until their leases end. A
	// standby that becomes the owner and later loses ownership (its lease
	// not renewed in time, or another Cue took over) waits again. Stop
	// ends the wait.
	Standby bool
	// EventBuffer is the number of recent events kept in memory for
	// subscribers; a subscriber further behind reads from the database.
	// Default 4096.
	EventBuffer int
	// EventRetention is how long durable events are kept for subscribers
	// to resume from; the owner deletes older ones in the background.
	// Default 7 days.
	EventRetention time.Duration
	// SubscriptionRetention bounds how long events a named subscription
	// (SubscribeOptions.Name) has not acknowledged are kept past
	// EventRetention: a consumer away longer resumes with an EventGap
	// (counted in runcue.subscription.gaps). Default 30 days; never less
	// than EventRetention.
	SubscriptionRetention time.Duration
	// DrainSubscriptions names durable subscriptions whose consumers submit
	// follow-up work: Drain then also waits until each has acknowledged
	// every event committed (that its filter delivers), and returns only
	// when that leaves no work. Drain refuses at its start a name no
	// Subscribe has made yet (ErrUnknownSubscription).
	DrainSubscriptions []string
	// QueueStatusInterval is the period of queue_status events from the
	// owner. Default 5s; negative disables them.
	QueueStatusInterval time.Duration
	// ShutdownTimeout bounds how long Close waits for running handlers
	// after cancelling them. Default 10s.
	ShutdownTimeout time.Duration
	// CancelGrace is how long a cancelled handler has to return before its
	// unit is recorded cancelled without it (its late result is discarded).
	// Default 30s.
	CancelGrace time.Duration
	// FailedDuplicates decides what Submit does when a submission's
	// IdempotencyKey belongs to a failed or cancelled unit. Default
	// RejectFailedDuplicates.
	FailedDuplicates FailedDuplicatePolicy
	// Retention, when set, makes the owner delete finished units (and their
	// history) that finished longer ago than this, in the background. Default
	// 0: keep them until Prune.
	Retention time.Duration

	// DependencySatisfied, when set, is asked about each dependency of a
	// unit once that dependency has completed or been skipped (is its
	// output there, still valid?); the unit becomes eligible only when every answer is true. A
	// call that panics or outlasts CallbackTimeout counts as false and is
	// logged. Default: completion suffices.
	DependencySatisfied DependencyFunc
	// DependencyRecheck is how long after a false answer the units waiting
	// on DependencySatisfied are asked again: the callback may change its
	// answer without any runcue event. Default 1s.
	DependencyRecheck time.Duration
	// Priority, when set, scores the units that could run now (their
	// dependencies met, their services with room) and, of the units that
	// hold a score, the highest runs first, ties in submission order. A
	// unit is scored once it could run (in passes of at most 1,024 units, in
	// arrival order, off the dispatcher's loop) and takes part in decisions
	// from then on; units that arrived while their services were full
	// are all scored before their services' next dispatch. Each decision
	// costs O(log n) in the queued units.
	// Default: submission order, no scoring.
	Priority PriorityFunc
	// PriorityTTL is how long a unit's score is used before it is scored
	// again. Re-scoring runs when a handler slot is free, oldest scores
	// first, at most 1,024 units per PriorityTTL/10: with n units that
	// could run, a score a decision uses is at most about PriorityTTL +
	// n/1024 × PriorityTTL/10 old (1.1 s with 100,000 units and the
	// default). Default 100ms.
	PriorityTTL time.Duration
	// CallbackTimeout bounds, in real time, how long a scoring pass of
	// Priority may take before the units it has not scored take the score
	// 0.5 (its late answer replaces it), and how long a DependencySatisfied
	// call may take. Default 100ms.
	CallbackTimeout time.Duration

	// MaxQueued, when set, bounds the queued units; Overflow says what a
	// submission that would exceed it gets. The bound is enforced in the
	// transaction that stores the submission, so it holds across processes.
	// Default 0: unbounded.
	MaxQueued int
	// Overflow is the policy when the queue is full. Default OverflowReject.
	Overflow OverflowPolicy
	// OnBackpressure, when set, is called (on a goroutine of its own, in
	// every Cue on the database) when backpressure becomes active (the
	// queue reached HighWater of MaxQueued) and when it clears (LowWater).
	OnBackpressure func(active bool, queued int)

	// Feed, when set, supplies work: the owner calls it whenever fewer than
	// FeedLowWater units are queued, and submits what it returns. Drain
	// returns only once Feed has said ErrFeedExhausted and all work is done.
	Feed FeedFunc
	// FeedLowWater is the queued-unit count below which Feed is called.
	// Default 100.
	FeedLowWater int
	// LoadAhead bounds the queued units the owner holds in memory when it
	// starts on a deep stored queue: the queue's first LoadAhead units
	// (at most 10,000) are loaded before Start returns, the rest a batch
	// at a time whenever the owner holds fewer than LoadAhead queued units
	// or has a handler slot they cannot fill, so that loading follows
	// dispatch instead of competing with it, and memory is bounded by
	// LoadAhead (plus a batch) rather than by the queue's depth while the
	// units held keep dispatch busy. Units that cannot run (waiting for
	// dependencies, a time or a service) never keep the units behind them
	// from loading. A unit not yet loaded waits its turn in submission
	// order: a priority function scores only the units held, and Explain
	// says not_loaded of the others (QueueStatus.Unloaded counts them);
	// units submitted while the Cue runs are held at once. Negative: load
	// the whole queue at once (every unit scored from the start, memory
	// proportional to the queue). Default DefaultLoadAhead.
	LoadAhead int
	// FeedInterval is how long to wait before calling Feed again after it
	// returned nothing or an error. Default 1s.
	FeedInterval time.Duration
	// DrainOnSpentBudget makes Drain return, in the owning Cue, once the
	// only work left is held by a spent calendar budget (Service.Budgets)
	// until its period ends: nothing runs, and every queued unit uses a
	// service whose budget is spent or waits for dependencies so held. A
	// run that works to a daily budget ends for the day; its units stay
	// queued for the next. Default: Drain waits for them too.
	DrainOnSpentBudget bool
	// Clock is the time source of every scheduling decision. Default
	// clock.Real().
	Clock clock.Clock
	// Logger receives structured logs: lifecycle transitions at Debug
	// (work_started, work_completed, work_skipped), and so are failures
	// that will be retried and deferrals by a Retry-After (429, 503); a
	// unit that fails for good and a circuit that opens at Warn;
	// cancellations, pauses and lifecycle of the Cue at Info; store
	// failures at Error. Params and results are never logged. Default
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider receives runcue's metrics (see telemetry.go). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives one span per run. Default
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Rand is the source of the Cue's random choices (retry jitter). The
	// dispatcher goroutine alone draws from it, so it need not be safe for
	// concurrent use, but it must not be shared with another Cue or with
	// code that runs while the Cue does. Draws follow the order in which
	// runs end: with a fake Clock and runs that end in the same order (one
	// handler at a time, say), a seeded Rand makes the retry times of a run
	// repeat exactly. Default: a PCG seeded from the time at Start.
	Rand rand.Source
}

// FailedDuplicatePolicy says what to do with a submission whose idempotency
// key belongs to a failed or cancelled unit.
type FailedDuplicatePolicy uint8

const (
	// RejectFailedDuplicates makes Submit return ErrDuplicate.
	RejectFailedDuplicates FailedDuplicatePolicy = iota
	// ResubmitFailedDuplicates stores a new unit, which takes the key over.
	ResubmitFailedDuplicates
)

// DefaultMaxPayload is the default Config.MaxPayload: 16 MiB.
const DefaultMaxPayload = 16 << 20

// DefaultLoadAhead is the default Config.LoadAhead.
const DefaultLoadAhead = 10_000

// Bounds of the Config fields that allocate or spin: MaxConcurrent,
// MaxUncommitted, EventBuffer, FeedLowWater and LoadAhead are at most MaxConfigCount;
// MaxPayload at most MaxPayloadLimit; PollInterval, DependencyRecheck,
// CallbackTimeout and FeedInterval at least a millisecond
// (QueueStatusInterval 10 ms); durations added to the time (timeouts,
// retentions) at most MaxTimeout.
const (
	MaxConfigCount  = 1 << 20
	MaxPayloadLimit = 1 << 30
)

// validate refuses negative and contradictory settings; zero values are
// defaults and stay allowed.
func (cfg Config) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxConcurrent", int64(cfg.MaxConcurrent)}, {"MaxUncommitted", int64(cfg.MaxUncommitted)},
		{"MaxPayload", int64(cfg.MaxPayload)},
		{"DefaultTimeout", int64(cfg.DefaultTimeout)}, {"LeaseBuffer", int64(cfg.LeaseBuffer)},
		{"MaxStartDelay", int64(cfg.MaxStartDelay)}, {"PollInterval", int64(cfg.PollInterval)},
		{"EventBuffer", int64(cfg.EventBuffer)}, {"EventRetention", int64(cfg.EventRetention)},
		{"SubscriptionRetention", int64(cfg.SubscriptionRetention)},
		{"ShutdownTimeout", int64(cfg.ShutdownTimeout)}, {"CancelGrace", int64(cfg.CancelGrace)},
		{"Retention", int64(cfg.Retention)}, {"DependencyRecheck", int64(cfg.DependencyRecheck)},
		{"PriorityTTL", int64(cfg.PriorityTTL)}, {"CallbackTimeout", int64(cfg.CallbackTimeout)},
		{"MaxQueued", int64(cfg.MaxQueued)}, {"FeedLowWater", int64(cfg.FeedLowWater)},
		{"FeedInterval", int64(cfg.FeedInterval)},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: Config.%s is negative (%d)", ErrInvalid, f.name, f.v)
		}
	}
	// Settings that allocate, spin or overflow a time beyond some size.
	count := func(name string, v int, most int) error {
		if v > most {
			return fmt.Errorf("%w: Config.%s %d is more than %d", ErrInvalid, name, v, most)
		}
		return nil
	}
	span := func(name string, v, least, most time.Duration) error {
		if v != 0 && (v < least || v > most) {
			return fmt.Errorf("%w: Config.%s %v is outside [%v, %v]", ErrInvalid, name, v, least, most)
		}
		return nil
	}
	day := 24 * time.Hour
	if err := errors.Join(
		count("MaxConcurrent", cfg.MaxConcurrent, MaxConfigCount),
		count("MaxUncommitted", cfg.MaxUncommitted, MaxConfigCount),
		count("EventBuffer", cfg.EventBuffer, MaxConfigCount),
		count("FeedLowWater", cfg.FeedLowWater, MaxConfigCount),
		count("LoadAhead", cfg.LoadAhead, MaxConfigCount),
		count("MaxPayload", cfg.MaxPayload, MaxPayloadLimit),
		span("PollInterval", cfg.PollInterval, time.Millisecond, day),
		span("QueueStatusInterval", max(cfg.QueueStatusInterval, 0), 10*time.Millisecond, day),
		span("PriorityTTL", cfg.PriorityTTL, 1, day),
		span("DependencyRecheck", cfg.DependencyRecheck, time.Millisecond, day),
		span("CallbackTimeout", cfg.CallbackTimeout, time.Millisecond, time.Hour),
		span("FeedInterval", cfg.FeedInterval, time.Millisecond, day),
		span("MaxStartDelay", cfg.MaxStartDelay, 1, day),
		span("DefaultTimeout", cfg.DefaultTimeout, 1, MaxTimeout),
		span("LeaseBuffer", cfg.LeaseBuffer, 1, MaxTimeout),
		span("ShutdownTimeout", cfg.ShutdownTimeout, 1, MaxTimeout),
		span("CancelGrace", cfg.CancelGrace, 1, MaxTimeout),
		span("EventRetention", cfg.EventRetention, 1, MaxTimeout),
		span("SubscriptionRetention", cfg.SubscriptionRetention, 1, MaxTimeout),
		span("Retention", cfg.Retention, 1, MaxTimeout),
	); err != nil {
		return err
	}
	for _, name := range cfg.DrainSubscriptions {
		if err := validName("subscription", name); err != nil {
			return fmt.Errorf("Config.DrainSubscriptions: %w", err)
		}
	}
	switch {
	case cfg.FailedDuplicates > ResubmitFailedDuplicates:
		return fmt.Errorf("%w: Config.FailedDuplicates %d is not a policy", ErrInvalid, cfg.FailedDuplicates)
	case cfg.Overflow > OverflowBlock:
		return fmt.Errorf("%w: Config.Overflow %d is not a policy", ErrInvalid, cfg.Overflow)
	case cfg.Overflow != OverflowReject && cfg.MaxQueued == 0:
		return fmt.Errorf("%w: Config.Overflow is set but MaxQueued is not: the queue is unbounded", ErrInvalid)
	case cfg.OnBackpressure != nil && cfg.MaxQueued == 0:
		return fmt.Errorf("%w: Config.OnBackpressure is set but MaxQueued is not: it would never be called", ErrInvalid)
	}
	return nil
}

func (cfg Config) withDefaults() Config {
	orDefault(&cfg.MaxConcurrent, 100)
	orDefault(&cfg.MaxUncommitted, 1024)
	orDefault(&cfg.MaxPayload, DefaultMaxPayload)
	orDefault(&cfg.DefaultTimeout, 30*time.Minute)
	orDefault(&cfg.LeaseBuffer, 60*time.Second)
	orDefault(&cfg.MaxStartDelay, 2*time.Second)
	orDefault(&cfg.PollInterval, 100*time.Millisecond)
	orDefault(&cfg.EventBuffer, 4096)
	orDefault(&cfg.EventRetention, 7*24*time.Hour)
	orDefault(&cfg.SubscriptionRetention, 30*24*time.Hour)
	cfg.SubscriptionRetention = max(cfg.SubscriptionRetention, cfg.EventRetention)
	if cfg.QueueStatusInterval == 0 { // negative disables it
		cfg.QueueStatusInterval = 5 * time.Second
	}
	orDefault(&cfg.ShutdownTimeout, 10*time.Second)
	orDefault(&cfg.CancelGrace, 30*time.Second)
	orDefault(&cfg.DependencyRecheck, time.Second)
	orDefault(&cfg.PriorityTTL, 100*time.Millisecond)
	orDefault(&cfg.CallbackTimeout, 100*time.Millisecond)
	orDefault(&cfg.FeedLowWater, 100)
	if cfg.LoadAhead == 0 { // negative: no limit
		cfg.LoadAhead = DefaultLoadAhead
	}
	orDefault(&cfg.FeedInterval, time.Second)
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// orDefault sets *p to def when it is zero (validate has refused negative
// values by then).
func orDefault[T int | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}
