package engine

import (
	"time"

	"github.com/runcue/runcue/store"
)

// What the engine reports: the status of services, the queue, Explain's
// reasons, the live statistics. runcue turns each into its public type of
// the same name (whose documentation says what the fields mean).

// ServiceStatus is a service's (or keyed instance's) limits and load.
type ServiceStatus struct {
	Name, Class      string
	Limits           store.ServiceDef
	Overridden       bool
	Active, Waiting  int
	InWindow         int
	Circuit          string
	CircuitOpenUntil time.Time
	Paused           bool
	Budgets          []BudgetStatus
	Meters           []MeterStatus
	Adaptive         []AdaptStatus
	AdaptCounts      AdaptCounts
	BlockedUntil     time.Time
	NextCapacity     time.Time
	Keys             int
	KeysActive       int
	KeysWaiting      int
	OpenKeys         int
	BlockedKeys      int
	PausedKeys       int
}

// ServiceStats is a service with its busiest keyed instances (Stats).
type ServiceStats struct {
	ServiceStatus
	Keys []ServiceStatus
}

// MeterStatus is an amount meter now: Used (reservations included) of
// Limit per Window; Frees is when its oldest counted start leaves the
// window (zero when none counts).
type MeterStatus struct {
	Name        string
	Used, Limit int64
	Window      time.Duration
	Frees       time.Time
}

// BudgetStatus is a calendar budget in its current period.
type BudgetStatus struct {
	Budget      store.BudgetDef
	Used        int
	PeriodStart time.Time
	Resets      time.Time
	Exhausted   bool
}

// BudgetEvent is the data of a budget_exhausted event: a budget of Service
// (of class Class) spent.
type BudgetEvent struct {
	Service, Class string
	Budget         BudgetStatus
}

// QueueStatus is the periodic summary of the queue (queue_status).
type QueueStatus struct {
	Queued, Waiting, Blocked, Running, Orphaned, Unloaded int
	Backpressure, Paused                                  bool
}

// BackpressureStats is the owner's state of backpressure.
type BackpressureStats struct {
	Active    bool
	MaxQueued int
	Queued    int
	Since     time.Time
}

// ReasonKind names why a unit is not running (runcue.ReasonKind).
type ReasonKind string

// The reasons the engine gives (the same strings as runcue's).
const (
	ReasonRunning             ReasonKind = "running"
	ReasonFinished            ReasonKind = "finished"
	ReasonDependencies        ReasonKind = "waiting_dependencies"
	ReasonDependencyCheck     ReasonKind = "dependency_not_satisfied"
	ReasonServiceBusy         ReasonKind = "service_at_capacity"
	ReasonRateLimited         ReasonKind = "rate_window_full"
	ReasonCircuitOpen         ReasonKind = "circuit_open"
	ReasonCircuitProbe        ReasonKind = "circuit_probing"
	ReasonBudgetExhausted     ReasonKind = "budget_exhausted"
	ReasonQueuePaused         ReasonKind = "queue_paused"
	ReasonTaskPaused          ReasonKind = "task_paused"
	ReasonPaused              ReasonKind = "service_paused"
	ReasonServiceRetryAfter   ReasonKind = "service_retry_after"
	ReasonGlobalCap           ReasonKind = "global_cap"
	ReasonCommitBacklog       ReasonKind = "commit_backlog"
	ReasonTaskCap             ReasonKind = "task_cap"
	ReasonNoExecutor          ReasonKind = "no_executor"
	ReasonBackoff             ReasonKind = "retry_backoff"
	ReasonRetryAfter          ReasonKind = "retry_after"
	ReasonRunAt               ReasonKind = "run_at"
	ReasonDependenciesSkipped ReasonKind = "dependencies_skipped"
	ReasonBackpressure        ReasonKind = "backpressure"
	ReasonTaskNotRegistered   ReasonKind = "task_not_registered"
	ReasonStopping            ReasonKind = "stopping"
	ReasonNotLoaded           ReasonKind = "not_loaded"
	ReasonEligible            ReasonKind = "eligible"
)

// Reason is one reason a unit is not running.
type Reason struct {
	Kind         ReasonKind
	Service      string
	Until        time.Time
	Dependencies []string
	Detail       string
}

// Explanation says why a unit is not running now, from the owner's live
// state (ID is empty when the engine does not hold the unit).
type Explanation struct {
	ID, Task string
	State    store.State
	Reasons  []Reason
	AsOf     time.Time
}

// CancelOptions qualify a cancellation (runcue.CancelOptions).
type CancelOptions struct {
	Cascade bool
	Reason  string
}

// Backpressure's water marks, as fractions of MaxQueued.
const (
	HighWater = 0.9
	LowWater  = 0.7
)
