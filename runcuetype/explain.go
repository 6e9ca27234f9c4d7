package runcuetype

import (
	"time"

	"github.com/runcue/runcue/store"
)

// ReasonKind names why a unit is not running. The strings are stable.
type ReasonKind string

// Reasons a unit is not running now.
const (
	// ReasonRunning: it is running.
	ReasonRunning ReasonKind = "running"
	// ReasonFinished: it is completed, skipped, failed or cancelled.
	ReasonFinished ReasonKind = "finished"
	// ReasonDependencies: it waits for Dependencies to complete.
	ReasonDependencies ReasonKind = "waiting_dependencies"
	// ReasonDependencyCheck: its dependencies completed, but
	// Config.DependencySatisfied does not (yet) say they are usable; Until
	// is the next check.
	ReasonDependencyCheck ReasonKind = "dependency_not_satisfied"
	// ReasonServiceBusy: Service is at its concurrency limit.
	ReasonServiceBusy ReasonKind = "service_at_capacity"
	// ReasonRateLimited: Service's rate window is full until Until.
	ReasonRateLimited ReasonKind = "rate_window_full"
	// ReasonSequence: the unit waits for its turn in its task's sequence
	// (Task.Sequence): Dependencies names the unit before it, or the
	// failed unit that holds the key.
	ReasonSequence ReasonKind = "waiting_sequence"
	// ReasonBatch: the unit's batch (Task.Batch) waits for more units to
	// join it until Until (Batch.Wait).
	ReasonBatch ReasonKind = "waiting_batch"
	// ReasonMeterFull: an amount meter of Service (Meter: tokens, bytes)
	// has no room for the unit's cost until Until.
	ReasonMeterFull ReasonKind = "meter_full"
	// ReasonCircuitOpen: Service's circuit is open until Until.
	ReasonCircuitOpen ReasonKind = "circuit_open"
	// ReasonCircuitProbe: Service's circuit is half-open and its one probe
	// is running.
	ReasonCircuitProbe ReasonKind = "circuit_probing"
	// ReasonBudgetExhausted: a calendar budget of Service (Service.Budgets)
	// is spent until Until, the start of its next period.
	ReasonBudgetExhausted ReasonKind = "budget_exhausted"
	// ReasonQueuePaused: the queue is paused (PauseQueue).
	ReasonQueuePaused ReasonKind = "queue_paused"
	// ReasonTaskPaused: the unit's task type is paused (PauseTask).
	ReasonTaskPaused ReasonKind = "task_paused"
	// ReasonPaused: Service is paused.
	ReasonPaused ReasonKind = "service_paused"
	// ReasonServiceRetryAfter: Service asked for a pause (Retry-After)
	// until Until.
	ReasonServiceRetryAfter ReasonKind = "service_retry_after"
	// ReasonGlobalCap: Config.MaxConcurrent units are running.
	ReasonGlobalCap ReasonKind = "global_cap"
	// ReasonCommitBacklog: Config.MaxUncommitted ended runs wait for the
	// database to record their outcomes.
	ReasonCommitBacklog ReasonKind = "commit_backlog"
	// ReasonTaskCap: the task's MaxConcurrent units are running (for a
	// task run by executors, as many as its live executors have room
	// for, when that is fewer).
	ReasonTaskCap ReasonKind = "task_cap"
	// ReasonNoExecutor: the task runs in executors (Task.Remote) and none
	// that runs it is alive.
	ReasonNoExecutor ReasonKind = "no_executor"
	// ReasonBackoff: it failed and retries at Until.
	ReasonBackoff ReasonKind = "retry_backoff"
	// ReasonRetryAfter: its last run was deferred by a Retry-After; it runs
	// again at Until.
	ReasonRetryAfter ReasonKind = "retry_after"
	// ReasonRunAt: it was submitted to run at Until.
	ReasonRunAt ReasonKind = "run_at"
	// ReasonDependenciesSkipped (informational): Dependencies were skipped
	// (Skip) and count as satisfied, since the unit's task does not set
	// FailOnSkippedDependency.
	ReasonDependenciesSkipped ReasonKind = "dependencies_skipped"
	// ReasonBackpressure: the queue is over its high-water mark; new
	// submissions are refused or wait (informational).
	ReasonBackpressure ReasonKind = "backpressure"
	// ReasonTaskNotRegistered: its task type has no handler in the owning
	// Cue.
	ReasonTaskNotRegistered ReasonKind = "task_not_registered"
	// ReasonNotOwned: no Cue in this process owns the database (Start), so
	// nothing here dispatches it; the reasons given are those the database
	// shows.
	ReasonNotOwned ReasonKind = "not_owned"
	// ReasonStopping: the owning Cue is stopping, or its store failed.
	ReasonStopping ReasonKind = "stopping"
	// ReasonNotLoaded: the owning Cue started on a deep queue and has not
	// loaded the unit yet: it loads the stored queue in submission order
	// as dispatch makes room (Config.LoadAhead). The other reasons given
	// are those the database shows.
	ReasonNotLoaded ReasonKind = "not_loaded"
	// ReasonEligible: nothing holds it back; it runs when its turn comes
	// (submission order, or priority when Config.Priority is set).
	ReasonEligible ReasonKind = "eligible"
)

// Reason is one reason a unit is not running.
type Reason struct {
	Kind ReasonKind `json:"kind"`
	// Service is the service concerned, if any.
	Service string `json:"service,omitempty"`
	// Meter is the amount meter concerned (ReasonMeterFull).
	Meter string `json:"meter,omitempty"`
	// Until is when the reason may end, if known.
	Until time.Time `json:"until,omitzero"`
	// Dependencies are the units still awaited (ReasonDependencies) or
	// skipped (ReasonDependenciesSkipped).
	Dependencies []string `json:"dependencies,omitempty"`
	// Detail is a human-readable sentence.
	Detail string `json:"detail"`
}

// Explanation says why a unit is not running now.
type Explanation struct {
	ID    string      `json:"id"`
	Task  string      `json:"task"`
	State store.State `json:"state"`
	// Reasons are every reason that holds now, most fundamental first.
	Reasons []Reason `json:"reasons"`
	// Live reports that the owning dispatcher answered from its live state
	// (this Cue owns the database and holds the unit). Otherwise the
	// answer was read from the database at AsOf: stored pauses, holds,
	// circuits, logged rate windows and budgets, dependencies and delays,
	// as they were committed then. A keyed instance's reasons are given
	// only where the unit's task is registered with its ServiceKeys.
	Live bool      `json:"live"`
	AsOf time.Time `json:"as_of"`
	// Schedule and Period name the schedule and the period that
	// submitted the unit, if one did.
	Schedule string `json:"schedule,omitempty"`
	Period   string `json:"period,omitempty"`
	// Notes say what else the owner knows of the unit's services that it
	// did not act on: an amount their runs reported (Work.Used,
	// Work.Observe) that no meter counts (ServiceStatus.Unmatched).
	Notes []string `json:"notes,omitempty"`
}
