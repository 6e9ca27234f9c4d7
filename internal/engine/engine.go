// Package engine is runcue's dispatcher: the one goroutine that decides
// what starts when, its parts (lanes and resources, the unit index, the
// dependency graph, the run table, priority scoring, intake, timers) and
// the flows that cross them. The public package runcue holds the user's
// vocabulary and adapts it to the engine through three ports:
//
//   - the Store (package store): where units, events and the service log
//     live, written through the writer in group commits;
//   - the Runner: what starts a run's handler and reports its start, its
//     progress and how it ended (runcue's in-process goroutines today);
//   - the Meters of each resource (package internal/broker): whether a
//     dispatch may start now, and if not until when and why.
//
// Nothing here knows a user's handlers: tasks arrive as TaskSpecs, limits
// as store.ServiceDefs, callbacks as funcs over plain values. What the
// engine reports (status, explanations, statistics) is in runcuetype's
// types, the ones runcue's users read.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/hub"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Errors the engine gives as the causes of the runs it stops (runcue's,
// from runcuetype), and the one a feed returns when it has no more work.
var (
	ErrShutdown       = rt.ErrShutdown
	ErrTimeout        = rt.ErrTimeout
	ErrCancelled      = rt.ErrCancelled
	ErrFeedExhausted  = errors.New("runcue: feed exhausted")
	ErrUnknownService = errors.New("runcue: unknown service")
)

// Settings is the engine's configuration: runcue.Settings with its defaults
// applied, and its callbacks adapted.
type Settings struct {
	MaxConcurrent, MaxUncommitted, MaxPayload int
	MaxQueued, FeedLowWater                   int
	// LoadAhead is how many queued units the owner holds before the load
	// of a deep stored queue waits for dispatch to make room; negative:
	// no limit (runcue.Config.LoadAhead).
	LoadAhead                                       int
	DefaultTimeout, LeaseBuffer, MaxStartDelay      time.Duration
	EventRetention, SubscriptionRetention           time.Duration
	QueueStatusInterval, CancelGrace, Retention     time.Duration
	DependencyRecheck, PriorityTTL, CallbackTimeout time.Duration
	FeedInterval                                    time.Duration
	// StatsKeys is how many keyed instances ServiceStats reports per
	// service (the busiest).
	StatsKeys          int
	DrainOnSpentBudget bool
	Rand               rand.Source
	Clock              clock.Clock
	Log                *slog.Logger

	// Priority scores a unit (nil: submission order); see PriorityInput.
	Priority func(PriorityInput) float64
	// DependencySatisfied is asked about each completed dependency (nil:
	// completion suffices).
	DependencySatisfied func(context.Context, rt.Dependency) (bool, error)
	// Ended are runs of earlier epochs this process held and saw end (or
	// never start) before it lost ownership: recovery requeues them at
	// once instead of waiting out their leases (store.Recover.Ended).
	Ended []store.RunRef

	// Feed supplies work when fewer than FeedLowWater units are queued: it
	// asks for want units, submits them itself, and returns ErrFeedExhausted
	// when it has no more (nil: no feed). It returns errFeedEmpty-like
	// errors for an empty answer: see FeedEmpty.
	Feed func(ctx context.Context, want int) error
}

// ErrFeedEmpty is what a Feed returns when it had nothing this time.
var ErrFeedEmpty = errors.New("runcue: feed returned nothing")

// pruneInterval is how often the owner prunes finished units (a tenth of
// Retention) and the service log, between a minute and an hour.
func (cfg Settings) pruneInterval() time.Duration {
	if cfg.Retention == 0 {
		return time.Minute
	}
	return min(max(cfg.Retention/10, time.Minute), time.Hour)
}

// PriorityInput is what a priority function sees of a unit.
type PriorityInput struct {
	Unit            UnitView
	QueueDepth      int
	ServicePressure map[string]float64
	WaitTime        time.Duration
}

// UnitView is a unit as callbacks see it.
type UnitView struct {
	ID, Task, Target string
	Params           []byte
	// Attempt is the number of its next run.
	Attempt int
}

// TaskSpec is a registered task as the engine runs it.
type TaskSpec struct {
	Name          string
	Services      []string
	Timeout       time.Duration
	MaxConcurrent int
	Retry         RetryPolicy
	// Retryable says whether a failure may be retried (the task's RetryOn;
	// Permanent errors are never retried whatever it says).
	Retryable func(error) bool
	// Keys derives a unit's keyed services (nil: none): an error fails the
	// unit permanently, without its handler.
	Keys         func(UnitView) ([]string, error)
	MaxDeferrals int
	// HoldSlotsUntilReturn and FailOnSkippedDependency are the Task's.
	HoldSlotsUntilReturn    bool
	FailOnSkippedDependency bool
	// Runner starts the task's runs.
	Runner Runner
	// Remote: the task's runs go to executors; none is dispatched until
	// the Runner tells their room (SetRoom).
	Remote bool
	// ClaimAhead: every run's claim commits before its handler starts
	// (as a rate-limited run's does), because the store may end a queued
	// unit of the task on its own (a debounced task's, which a later
	// submission replaces): a claim the store refuses then runs nothing.
	ClaimAhead bool
	// Sequence, when set, gives a unit's sequence key from its target
	// ("": none): the units of one key start one at a time, in
	// submission order, retries included. HoldOnFailure makes a unit that
	// fails for good hold its key until it is retried.
	Sequence      func(target string) string
	HoldOnFailure bool
	// Batch, when set, makes the task's units run in batches: one call
	// of its Runner for up to Batch.Max units of one lane (see Batch).
	Batch *BatchSpec
}

// RetryPolicy is a retry policy as the engine uses it: how many runs may
// fail, and the wait after each.
type RetryPolicy interface {
	Attempts() int
	Delay(failures int, r float64) time.Duration
}

// Deps are the engine's collaborators, fixed for its life.
type Deps struct {
	Store  store.Store
	Writer *writer.Writer
	// Starts, when set, writes the starts logged ahead of their claims
	// (store.LogStart; the store is a store.StartLogger), beside Writer.
	// Without it a start counted in a rate window is logged with its
	// claim, ahead of the handler.
	Starts *writer.Writer
	Hub    *hub.Hub
	Tel    *Telemetry
	Stats  *Counters
	// UnitRetry reads a unit's own stored retry policy (store.RetryDef).
	UnitRetry func(raw []byte) (RetryPolicy, error)
	// Encode turns what the engine reports in events and answers (a
	// ServiceStatus, a QueueStatus, a budget_exhausted, an Explanation, the
	// live service statistics) into the JSON of runcue's public types.
	Encode func(v any) []byte
	// ReportOrphans logs the units no registered task can run, at Drain.
	ReportOrphans func(map[string]int)
	// Detach tells the Cue this engine has exited.
	Detach func(*Engine)
	Hooks  Hooks
}

// Counters are counters read by metrics and tests (atomics: any goroutine).
type Counters struct {
	// CallbackErrors counts priority and dependency callbacks that
	// panicked or overran their timeout; PriorityCalls the calls of the
	// priority function; Dispatches the runs started.
	CallbackErrors atomic.Int64
	PriorityCalls  atomic.Int64
	Dispatches     atomic.Int64
	// Batches counts the batches of more than one unit dispatched,
	// Batched the units in them.
	Batches atomic.Int64
	Batched atomic.Int64
}

// Hooks are set by tests before Start, and read-only after.
type Hooks struct {
	// CheckInvariants verifies the broker's bookkeeping after every loop
	// iteration (see Verify).
	CheckInvariants func(error)
	// Concluded is called on the dispatcher goroutine for every run whose
	// Finish it queued, after queuing it.
	Concluded func(*Run)
	// Iterated gets a (non-blocking) signal after every loop iteration.
	Iterated chan struct{}
	// Checked gets the unit ID of every DependencySatisfied answer received
	// (buffered; a full buffer drops the signal).
	Checked chan string
	// FirstLoad and LoadBatch replace the sizes of the start's streamed
	// load; LoadStep is called on the loading goroutine before each batch
	// and before the load's end.
	FirstLoad, LoadBatch int
	LoadStep             func(context.Context)
	// LoadWaits is called on the dispatcher goroutine whenever the load
	// starts waiting for dispatch to make room, with the queued units held
	// and those not loaded.
	LoadWaits func(held, unloaded int)
	// ParamBudget replaces maxParamBytes; ParamRead is called for every
	// read of params with the units it reads.
	ParamBudget int
	ParamRead   func(units int)
	// Meters are extra meters by service: every resource of the service
	// (and of each of its keyed instances) gets one of each.
	Meters map[string][]func() broker.Limiter
}
