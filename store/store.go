// Package store defines the persistence contract runcue's Cue is built on:
// the records it keeps and the Store interface a backend implements.
//
// This interface is not stable: it changes with runcue's needs, without
// notice in minor versions. Implement it outside this module only if you
// are ready to follow it; package store/storetest is the conformance suite
// every backend must pass, and package store/sqlite is the reference
// backend.
//
// The interface is shaped for group commit: a Cue collects the mutations of
// many goroutines (submits, dispatches, completions) and hands them to Apply
// as one ordered batch, which the backend runs in a single transaction.
//
// What a backend guarantees:
//
//   - Atomicity per op, in one transaction per batch. Apply runs the ops in
//     order; an op that fails on its own is rolled back alone (Result.Err)
//     and the others stand; an error from Apply means nothing of the batch
//     was stored. Every rule an op states (idempotency, dependency failure
//     propagation, the queued count, MaxQueued) holds inside the op's
//     transaction, so it holds across processes.
//   - Event sequence numbers are strictly increasing and never reused for
//     the database's whole life (pruning deletes old events; it never
//     renumbers), and events become visible in Seq order: once a reader
//     sees an event, every event with a lower Seq that will ever be
//     committed is visible too. A reader that follows the log with
//     EventsAfter therefore misses nothing, whatever the writers' commit
//     order. Numbers may have gaps (a backend may burn a number in a
//     transaction that rolls back); nobody infers anything from a gap: Apply
//     says which events preceded a batch's (Batch.Follows), and FirstSeq
//     which were deleted. Each backend provides this its own way (SQLite's
//     single writer; a lock held from a transaction's first append to its
//     commit on a database with concurrent writers).
//   - Ownership: Acquire succeeds for one holder at a time, across
//     processes, and moves the owner epoch on (Ownership.Epoch). Every op
//     an owner makes carries its epoch (OwnerOp) and fails, in its own
//     transaction, with ErrNotOwner once the stored epoch has moved on: a
//     deposed owner (a paused VM, a partitioned host) can no longer write.
//     Ownership ends when released or when its process dies; a new holder
//     requeues what an older epoch left running once its lease has expired
//     or the backend proves that owner's process dead
//     (Ownership.PreviousDead).
//   - Isolation: the shared rules (txn.go) read and then write inside one
//     transaction. A backend gives them either serializable transactions
//     (SQLite's single writer) or READ COMMITTED with the locks each Tx
//     method documents; the conformance suite runs every rule with two
//     writers at once.
//   - Concurrency: Apply and Changed are called by one goroutine at a time
//     (the Cue's writer); every other method may be called by any number of
//     goroutines at once, in this process and in others, while Apply runs.
//   - Times are stored with nanosecond precision. The zero time.Time means
//     "not set" everywhere.
//
// What a backend does not decide: the rules that read state inside an op's
// transaction (resolving idempotency keys, dead dependencies, the queue
// bound and drop-oldest, cancellation, requeueing, propagating a failure or
// cancellation to dependents) are written once in this package (ApplyInsert,
// ApplyCancel, ApplyFailQueued, ApplyRequeue, FinishApplied, Propagate)
// against Tx, the storage primitives a backend's transaction provides; the
// backend calls them from inside its transaction. The pure rules (CheckCycles,
// TopoOrder) and the payloads of derived events are here too.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// State is the state of a work unit. The string values are part of the
// persisted format and of runcue's public vocabulary.
type State string

// The states of a work unit.
const (
	Queued    State = "queued"
	Running   State = "running"
	Completed State = "completed"
	Failed    State = "failed"
	Cancelled State = "cancelled"
	// Skipped: the handler ended the unit with Skip. It is terminal and,
	// unlike Failed and Cancelled, never fails the unit's dependents in the
	// store: whether a dependent may run is its task's choice, made by the
	// dispatcher.
	Skipped State = "skipped"
)

// Terminal reports whether s is a final state.
func (s State) Terminal() bool {
	return s == Completed || s == Failed || s == Cancelled || s == Skipped
}

// Valid reports whether s is one of the six states.
func (s State) Valid() bool {
	switch s {
	case Queued, Running, Completed, Failed, Cancelled, Skipped:
		return true
	}
	return false
}

// Unit is a work unit as stored.
type Unit struct {
	// Seq orders units by submission; the store assigns it on insert.
	Seq    int64
	ID     string
	Task   string
	Target string
	// Params is the JSON encoding of the submission's parameters.
	Params []byte
	State  State
	// Runs counts the runs started, including interrupted ones.
	Runs int
	// Failures counts the failed runs that spent retry budget.
	Failures int
	// Deferrals counts the runs that ended in a Retry-After deferral.
	Deferrals int
	CreatedAt time.Time
	// RunAt is the time before which the unit is not eligible (a delayed
	// submission or a retry's next attempt); zero means at once.
	RunAt      time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	// Timeout is the submission's own timeout; zero means the task's.
	Timeout        time.Duration
	LeasedBy       string
	LeaseExpiresAt time.Time
	// HeartbeatAt is the time of the running unit's last heartbeat.
	HeartbeatAt time.Time
	// Result is the JSON encoding of a completed unit's result.
	Result []byte
	// Error and ErrorKind describe the last failure.
	Error     string
	ErrorKind string
	// IdempotencyKey, when set, is unique among stored units.
	IdempotencyKey string
	// Debounce, on an Insert, collapses the unit with the queued one that
	// holds Debounce.Key (see Debounce). It is not read back.
	Debounce *Debounce
	// DependsOn lists the units that must complete before this one runs.
	DependsOn []string
	// DependencyDeadline, when set, is the time at which a unit still waiting
	// for its dependencies fails.
	DependencyDeadline time.Time
	// Retry is an opaque per-submission retry policy; the store keeps it.
	Retry []byte
	// Costs are the unit's costs by meter name (nil: one request), stored
	// at submit so that every process and every owner sees the same.
	Costs map[string]int64
	// Epoch is the owner epoch of a running unit's run (Claim.Epoch).
	Epoch int64
	// Trace is an opaque propagation carrier for the submitter's trace.
	Trace []byte
	// CancelRequested is set when a running unit was asked to stop by a
	// process that does not own it.
	CancelRequested bool
	// Attempts is the history of runs, oldest first.
	Attempts []Attempt
}

// Attempt records one run of a unit.
type Attempt struct {
	Run     int       `json:"run"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Outcome string    `json:"outcome"`
	Error   string    `json:"error,omitempty"`
	// Used are the amounts the run reported it used (Work.Used), by
	// meter amount; nil when it reported none.
	Used map[string]int64 `json:"used,omitempty"`
}

// Event is one entry of the durable event log. Seq is assigned by the store;
// it increases strictly and is never reused, and events become visible in
// Seq order.
type Event struct {
	Seq    int64
	Type   string
	Time   time.Time
	WorkID string
	Task   string
	// Target is the unit's target, for work events.
	Target  string
	Attempt int
	// Data is a JSON object with the event's other fields.
	Data []byte
	// Result is a completed unit's result. The store does not keep it twice:
	// EventsAfter fills it in from the unit, if the unit is still stored.
	Result []byte
	// Detail is Data's typed form, for the work events runcue makes
	// (failures, retries, deferrals, skips): when it is set and Data is
	// not, the store writes Data as Detail.Encode(). The rules read Detail
	// (ActivityOf), never Data's JSON. Events read back have it nil.
	Detail *EventData
}

// Event types the store itself writes (for transitions it derives, such as
// recovery). The rest are chosen by the caller.
const (
	EventWorkQueued    = "work_queued"
	EventWorkRecovered = "work_recovered"
	EventWorkCancelled = "work_cancelled"
	EventWorkFailed    = "work_failed"
	EventWorkSkipped   = "work_skipped"
	// EventWorkCancelRequested records a request to cancel a running unit,
	// made by a process that does not own it; Data is {"cascade":bool}.
	EventWorkCancelRequested = "work_cancel_requested"
)

// Errors reported by stores.
var (
	ErrNotFound          = errors.New("runcue: work unit not found")
	ErrDuplicateID       = errors.New("runcue: a work unit with this ID already exists")
	ErrDuplicate         = errors.New("runcue: a failed or cancelled work unit holds this idempotency key")
	ErrUnknownDependency = errors.New("runcue: unknown dependency")
	ErrCycle             = errors.New("runcue: dependency cycle")
	ErrSchemaTooNew      = errors.New("runcue: database schema is newer than this version of runcue")
	ErrLocked            = errors.New("runcue: database is owned by another Cue")
	ErrBackpressure      = errors.New("runcue: queue is full")
	// ErrNotOwner: the op was made by an owner whose epoch is no longer
	// the stored one (another holder took ownership since).
	ErrNotOwner = errors.New("runcue: this Cue no longer owns the database")
	// ErrDependencyRefused: a unit of a batch depends on a unit of the same
	// batch that was refused, so it is refused too.
	ErrDependencyRefused = errors.New("runcue: a dependency in the same batch was refused")
	// ErrUnknownSchedule: no schedule of that name is stored.
	ErrUnknownSchedule = errors.New("runcue: unknown schedule")
	// ErrScheduleMoved: a Fire's period is at or before the schedule's
	// stored cursor, or the schedule is no longer stored.
	ErrScheduleMoved = errors.New("runcue: the schedule's cursor is past this period")
)

// LockedError reports that another Cue owns the database. It matches
// ErrLocked with errors.Is.
type LockedError struct {
	Holder Holder
}

func (e *LockedError) Error() string {
	h := e.Holder
	if h.PID == 0 {
		return "runcue: database is owned by another Cue (holder unknown)"
	}
	return fmt.Sprintf("runcue: database is owned by another Cue (pid %d on %s since %s)",
		h.PID, h.Host, h.Since.Format(time.RFC3339))
}

// Is reports whether target is ErrLocked.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Holder identifies the owner of a database.
type Holder struct {
	// Owner is the lease name the owner writes into leased_by.
	Owner string    `json:"owner"`
	PID   int       `json:"pid"`
	Host  string    `json:"host"`
	Since time.Time `json:"since"`
}

// CycleError names the units of a dependency cycle. It matches ErrCycle.
type CycleError struct{ Members []string }

func (e *CycleError) Error() string {
	return fmt.Sprintf("runcue: dependency cycle among %v", e.Members)
}

// Is reports whether target is ErrCycle.
func (e *CycleError) Is(target error) bool { return target == ErrCycle }

// Ownership is held by the one Cue that dispatches a database's work.
type Ownership interface {
	// Epoch is the owner epoch this holder took: one more than the
	// previous holder's. Every op it makes carries it.
	Epoch() int64
	// PreviousDead reports that the backend proves every earlier holder's
	// process dead (SQLite: the operating system's lock was free), so
	// that what they left running may be requeued at once; otherwise
	// their runs wait for their leases to expire.
	PreviousDead() bool
	// Release gives ownership up. It is safe to call more than once.
	Release() error
}

// Leased is implemented by an Ownership held by a lease that its holder
// renews (PostgreSQL's lease row), rather than by the operating system
// (SQLite's lock, which ends only with the process). Trusted reports, at
// the instant it is called, whether the holder may still act as the owner:
// its lease was renewed recently enough that it cannot have expired (the
// backend stops trusting it well before the lease's TTL ends, so that no
// standby takes over while the holder still acts) and no other holder took
// over. The engine asks it before each handler start, so that a process
// frozen past its lease and resumed starts nothing, however late it
// notices. Lost is closed once Trusted turned false; it is not reopened.
type Leased interface {
	Trusted() bool
	Lost() <-chan struct{}
}

// ListFilter selects units for ListUnits.
type ListFilter struct {
	// IDs, if set, selects only the units with these IDs (any number;
	// IDs that match no unit are skipped).
	IDs    []string
	States []State
	Tasks  []string
	// AfterSeq and BeforeSeq bound Seq exclusively; zero means unbounded.
	AfterSeq  int64
	BeforeSeq int64
	// Desc lists newest first.
	Desc bool
	// Limit caps the number of units; zero means 100.
	Limit int
	// FinishedBefore selects units finished before the time.
	FinishedBefore time.Time
	// FinishedAfter selects units finished at or after the time.
	FinishedAfter time.Time
	// CreatedAfter and CreatedBefore bound the submission time: at or
	// after, strictly before. Zero means unbounded.
	CreatedAfter, CreatedBefore time.Time
	// TargetPrefix selects units whose target starts with it.
	TargetPrefix string
	// ErrorContains selects units whose error contains it (case
	// sensitive).
	ErrorContains string
}

// EventQuery selects events for MatchingEvents.
type EventQuery struct {
	After, Upto int64
	Types       []string
	Tasks       []string
	// WorkID, if set, selects only the events of this unit, through the
	// unit's record of its events (store.UnitRecord: cost what it
	// returns); for a unit no longer stored, by reading the log in range.
	WorkID string
	// Limit caps the events returned; zero means 1000.
	Limit int
}

// Store is a runcue backend.
//
// Apply and Changed are called by one goroutine at a time (the Cue's writer);
// every other method is safe for simultaneous use by multiple goroutines.
type Store interface {
	// Apply runs ops in order in one transaction and returns one Result per
	// op. An op that fails on its own (a duplicate ID, an unknown
	// dependency) is rolled back alone and reports Result.Err; the others
	// stand. A non-nil error means the transaction as a whole failed and
	// nothing in it was stored.
	// An OwnerOp whose epoch is no longer the stored one fails alone with
	// ErrNotOwner.
	Apply(ctx context.Context, ops []Op) (Batch, error)
	// Changed reports whether another connection or process has committed
	// since the previous call.
	Changed(ctx context.Context) (bool, error)

	GetUnit(ctx context.Context, id string) (*Unit, error)
	ListUnits(ctx context.Context, f ListFilter) ([]*Unit, error)
	// UnitStates returns the state of each of ids that is stored (any
	// number of IDs; an ID that matches no unit is absent from the map).
	UnitStates(ctx context.Context, ids []string) (map[string]State, error)
	// LoadActive calls fn for every queued or running unit with a Seq
	// above after, in Seq order, without Result, Error or Attempts
	// (ErrorKind is loaded: it tells a Retry-After deferral from a
	// backoff). fn must not keep the *Unit after it returns (the backend
	// may reuse it for a later unit); the strings and slices it holds are
	// the unit's own and may be kept. A backend reads in pages: fn may
	// take its time without holding a read transaction open.
	LoadActive(ctx context.Context, after int64, fn func(*Unit) error) error
	// CountActive returns the number of queued and running units per task.
	CountActive(ctx context.Context) (map[string]int, error)
	// QueuedCount returns the number of queued units, cheaply (the store
	// maintains it).
	QueuedCount(ctx context.Context) (int, error)
	// Dependents returns the units that depend on id.
	Dependents(ctx context.Context, id string) ([]string, error)

	// EventsAfter returns up to limit events with Seq > after, in order.
	EventsAfter(ctx context.Context, after int64, limit int) ([]Event, error)
	// MatchingEvents returns, in order, up to q.Limit events with Seq in
	// (q.After, q.Upto] whose type is one of q.Types and whose task is one
	// of q.Tasks (an empty list matches all). It reads only what matches
	// (an index per filter), so a narrow subscription far behind costs
	// what it delivers, not the whole log.
	MatchingEvents(ctx context.Context, q EventQuery) ([]Event, error)
	// LastOfTypes returns the retained event of one of types with the
	// highest Seq, and false if none is retained. It reads only what can
	// hold one (not the whole log).
	LastOfTypes(ctx context.Context, types []string) (Event, bool, error)
	// LastSeq returns the highest event Seq visible (see the Seq
	// guarantee): every event up to it that will ever be visible is.
	LastSeq(ctx context.Context) (int64, error)
	// FirstSeq returns the retention floor: every event with a lower Seq
	// was deleted by Prune (or never existed), none at or above it was. 0
	// when no event is stored.
	FirstSeq(ctx context.Context) (int64, error)

	// Tasks and Services return the stored definitions by name.
	Tasks(ctx context.Context) (map[string][]byte, error)
	Services(ctx context.Context) ([]ServiceRecord, error)
	// Schedules returns the stored schedules, by name.
	Schedules(ctx context.Context) ([]ScheduleRecord, error)
	// Pauses returns what SetPause stored: whether the queue is paused,
	// and the paused task types.
	Pauses(ctx context.Context) (Pauses, error)
	// Subscriptions returns the named subscriptions, by name.
	Subscriptions(ctx context.Context) ([]Subscription, error)

	// Counts returns the number of units per task and state, kept as they
	// change (not counted by a scan). States with no unit may be absent or
	// zero.
	Counts(ctx context.Context) ([]UnitCount, error)
	// OldestQueued returns the submission time of the queued unit submitted
	// first, and false if none is queued.
	OldestQueued(ctx context.Context) (time.Time, bool, error)
	// Activity returns the events per minute, task and kind of the minutes
	// from since (see ActivityCount), kept as they are appended.
	Activity(ctx context.Context, since time.Time) ([]ActivityCount, error)
	// QueueWaits returns, summed over the minutes from since, the number of
	// dispatches whose Claim.Wait fell in each bucket of QueueWaitBounds
	// (one more count than bounds: the last is beyond the last bound).
	QueueWaits(ctx context.Context, since time.Time) ([]int64, error)
	// ServiceLog returns the starts logged for service at or after since,
	// every meter's, oldest first (ties in log order).
	ServiceLog(ctx context.Context, service string, since time.Time) ([]Logged, error)
	// ServiceLogPrefix returns, for every service whose name starts with
	// prefix, the starts logged at or after since, oldest first.
	ServiceLogPrefix(ctx context.Context, prefix string, since time.Time) (map[string][]Logged, error)

	// Acquire takes ownership of the database for h, moving the owner
	// epoch on. If another holder has it, Acquire returns a *LockedError at
	// once. Ownership ends when released or when the holding process
	// dies.
	Acquire(ctx context.Context, h Holder) (Ownership, error)

	Close() error
}

// Watcher is implemented by stores that push change notifications (a
// database's LISTEN/NOTIFY): the Cue then reads the log when Watch's
// channel receives, as well as every PollInterval. Without it, the Cue
// polls Changed every PollInterval (SQLite's way: its data_version).
type Watcher interface {
	// Watch returns a channel that receives (coalesced) after another
	// connection commits, until ctx ends.
	Watch(ctx context.Context) (<-chan struct{}, error)
}

// StartLogger is implemented by stores that apply a batch of LogStart ops
// (nothing else in it) in a transaction of their own that takes no turn
// with the others (it appends no event), while another Apply runs: a Cue
// then logs the starts counted in rate windows on a second writer, so that
// a handler waits for its start's log entry alone, not for the turn of the
// writer's next transaction. Apply is then called with such batches beside
// the Cue's writer.
type StartLogger interface {
	LogsStartsAside()
}

// Backuper is implemented by stores that can copy themselves while in
// use (SQLite: VACUUM INTO). path must not exist.
type Backuper interface {
	Backup(ctx context.Context, path string) error
}

// OwnerProber is implemented by stores that can tell, without taking
// ownership, whether some process owns the database (Owner reports false
// when none does). runcue uses it to warn about waiting on work that no
// one will run.
type OwnerProber interface {
	Owner(ctx context.Context) (Holder, bool, error)
}

// UnitCount is the number of units of a task in a state.
type UnitCount struct {
	Task  string
	State State
	N     int
}

// ActivityCount is the number of events of a kind for a task in one
// minute. Kind is the event type, except work_failed_retry for a
// work_failed that will be retried and work_deferred for a work_retrying
// after a Retry-After. A work_retrying after a Retry-After also counts
// once per service it held (its data's "services", keyed instances by
// class), with Kind ActivityServiceDeferred and the service in Task.
type ActivityCount struct {
	Minute time.Time
	Task   string
	Kind   string
	N      int
}

// ActivityServiceDeferred is the Kind of the activity counts of deferrals
// by service (see ActivityCount).
const ActivityServiceDeferred = "service_deferred"

// QueueWaitBounds are the upper bounds of the queue-wait histogram
// buckets.
var QueueWaitBounds = []time.Duration{
	time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
	5 * time.Minute, 15 * time.Minute, time.Hour,
}

// WaitBucket returns the bucket of QueueWaitBounds that holds d.
func WaitBucket(d time.Duration) int {
	for i, b := range QueueWaitBounds {
		if d <= b {
			return i
		}
	}
	return len(QueueWaitBounds)
}

// Subscription is a named subscription as stored.
type Subscription struct {
	Name      string
	Acked     int64
	CreatedAt time.Time
	AckedAt   time.Time
	// Types and Tasks are its filter (Ack's), empty for all.
	Types, Tasks []string
}

// Pauses is what SetPause stored.
type Pauses struct {
	Queue bool
	Tasks []string
}

// ServiceRecord is a service as stored.
type ServiceRecord struct {
	Name string
	// Def is the definition registered in code, Override the run-time
	// override (nil when none); both are opaque to the store.
	Def      []byte
	Override []byte
	Paused   bool
	// Meters holds the persisted state of the service's meters that keep
	// one (opaque to the store), by meter name: MeterCircuit's is the
	// circuit breaker and any Retry-After hold (CircuitRecord). Nil when
	// none is stored.
	Meters map[string][]byte
}

// ScheduleRecord is a schedule as stored.
type ScheduleRecord struct {
	Name string
	// Def is the definition registered in code, Timing a timing set at
	// run time (nil: none); both are opaque to the store.
	Def, Timing []byte
	Paused      bool
	Created     time.Time
	// LastAt and LastKey are the last period handled (submitted or
	// skipped): its nominal instant and key. Before the first, LastAt is
	// Created and LastKey empty. LastUnit is the last unit submitted.
	LastAt            time.Time
	LastKey, LastUnit string
}

// Logged is a start in the service log: when, which meter of the service
// it charged, and how much (Claim.Log). Reconciled reports that Amount was
// replaced by the actual charge (Reconcile), which may happen once.
type Logged struct {
	At         time.Time
	Meter      string
	Amount     int64
	Reconciled bool
}

// The meters runcue's engine names: a service's requests (its rate window
// and calendar budgets count them), its circuit breaker's state, and its
// adaptive limits' state (AdaptRecord).
const (
	MeterRequests = "requests"
	MeterCircuit  = "circuit"
	MeterAdapt    = "adapt"
	// MeterStated keys the limits a service's provider stated (the
	// meters with FromProvider), JSON: meter name to limit.
	MeterStated = "stated"
)

// AdaptRecord is the persisted state of a service's adaptive limits: each
// limit's effective value (by "concurrency", "requests" or a meter's
// amount) and the overloads behind them, by kind.
type AdaptRecord struct {
	Limits      map[string]AdaptLimitRecord `json:"limits"`
	Throttled   int                         `json:"throttled,omitempty"`
	Unavailable int                         `json:"unavailable,omitempty"`
	Timeouts    int                         `json:"timeouts,omitempty"`
}

// AdaptLimitRecord is one adaptive limit's state.
type AdaptLimitRecord struct {
	Effective float64 `json:"effective"`
	Overloads int     `json:"overloads,omitempty"`
}
