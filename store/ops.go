package store

import "time"

// Op is one mutation in a batch passed to Store.Apply. The types in this file
// are the only Ops.
//
// Ops that change a unit carry the Events to append when they apply. The
// store fills in each event's Seq, WorkID and Task, and its Time when zero;
// it appends nothing for an op that does not apply.
type Op interface{ isOp() }

// OwnerOp is an op that only the owner makes: it carries the owner's epoch,
// and fails with ErrNotOwner, in its own transaction, when the stored epoch
// has moved on. A zero epoch marks an op made outside ownership (an
// operator's Prune, say), which is not checked.
type OwnerOp interface {
	Op
	OwnerEpoch() int64
}

// LogEntry is what a Claim logs for one meter of one service: the
// amount the start charges it.
type LogEntry struct {
	Service, Meter string
	Amount         int64
}

// DuplicatePolicy says what Insert does with an idempotency key held by a
// failed or cancelled unit.
type DuplicatePolicy uint8

const (
	// RejectFailedDuplicate makes the Insert fail with ErrDuplicate.
	RejectFailedDuplicate DuplicatePolicy = iota
	// ResubmitFailedDuplicate moves the key to the new unit.
	ResubmitFailedDuplicate
)

// Insert stores new units. Each unit gets a work_queued event. A unit whose
// IdempotencyKey is held by a queued, running or completed unit is not
// stored: its InsertedUnit names the existing unit and is marked
// Duplicate, and a unit of the batch that depends on it depends on the
// existing unit instead. A key held by a failed or cancelled unit is
// handled per OnFailedDuplicate: with RejectFailedDuplicate that unit is
// not stored and its InsertedUnit carries Refused (matching ErrDuplicate),
// and so is every unit of the batch that depends on it, directly or not
// (Refused matching ErrDependencyRefused); the rest of the batch is stored.
// Any other failure (an unknown dependency, a cycle, a duplicate ID)
// fails the whole op. DependsOn may name units of the same Insert that
// come before or after; an unknown dependency fails the op with
// ErrUnknownDependency, a cycle with a *CycleError. A unit whose dependency
// is already failed or cancelled is stored and failed at once with the
// ErrorKind "prerequisite_failed" or "prerequisite_cancelled".
type Insert struct {
	Units             []*Unit
	At                time.Time
	OnFailedDuplicate DuplicatePolicy
	// MaxQueued, when positive, bounds the queued units after the insert.
	// When the insert would exceed it, the op fails with ErrBackpressure,
	// or, with DropOldest, cancels the oldest queued units (reason
	// "dropped", with events and propagation) one at a time until the
	// bound holds (dependents failed with a dropped unit count towards the
	// room); if even that cannot make room, the op fails.
	MaxQueued  int
	DropOldest bool
}

// FailQueued fails a queued unit without running it (its dependencies did
// not complete in time, say), propagating to its dependents. Result.Applied
// reports whether the unit was queued.
type FailQueued struct {
	Epoch     int64
	ID        string
	At        time.Time
	Error     string
	ErrorKind string
	Events    []Event
}

// InsertedUnit is the outcome of one unit of an Insert.
type InsertedUnit struct {
	ID        string
	Seq       int64
	Duplicate bool
	// Refused, when set, says why the unit was not stored (see Insert).
	Refused error
	// State is the unit's state after the insert (queued, or failed when a
	// dependency was already dead; the existing unit's for a duplicate).
	State State
}

// Claim moves a queued unit to running for Owner, as run number Run.
// It applies only if the unit is queued and no cancellation was requested.
// Each entry of Log is logged at At (the service log): the amount the start
// charges that meter of that service.
type Claim struct {
	Epoch int64
	ID    string
	// Task is the unit's task type, if the caller knows it: the store
	// keeps its counts by task without reading it back. Empty: the store
	// reads it.
	Task         string
	Owner        string
	Run          int
	At           time.Time
	LeaseExpires time.Time
	Log          []LogEntry
	Events       []Event
	// Wait is how long the unit waited, from becoming eligible to this
	// dispatch; the store keeps its histogram per minute (QueueWaits).
	Wait time.Duration
}

// Finish ends run Run of a running unit leased by Owner. It applies only if
// the unit is running, leased by Owner, and on that run.
//
// State is the unit's next state: Completed, Failed, Cancelled, or Queued to
// run again at RunAt (a retry, a deferral, or an interrupted run).
type Finish struct {
	Epoch int64
	ID    string
	// Task is the unit's task type, if known (see Claim.Task).
	Task  string
	Owner string
	Run   int
	At    time.Time
	State State
	// Result is stored for Completed.
	Result    []byte
	Error     string
	ErrorKind string
	RunAt     time.Time
	// SpendBudget counts the run as a failure; Deferral as a deferral.
	SpendBudget bool
	Deferral    bool
	// Attempt is appended to the unit's history.
	Attempt Attempt
	// Propagate fails (or, with CascadeCancel, cancels) the dependents of a
	// unit that ends Failed or Cancelled, transitively.
	Propagate     bool
	CascadeCancel bool
	Events        []Event
}

// Recover is a new owner's (Epoch's) look at what earlier owners left
// running (see ApplyRecover): a run whose owner is gone (PreviousDead) or
// whose lease expired by At returns to queued with a work_recovered event
// and an "abandoned" attempt, or, with its cancellation requested, is
// cancelled; the others are left running for now. Result.IDs lists the
// units requeued, Result.Held those left running. Only names the units to
// look at (all when empty).
type Recover struct {
	Epoch        int64
	At           time.Time
	PreviousDead bool
	Only         []string
	// Ended are runs of earlier epochs that the recovering process knows
	// are over (it held them, and saw their handlers return or never
	// start, before it lost ownership and took it again): they are
	// requeued at once, whatever their leases say.
	Ended []RunRef
}

// RunRef names one run: its unit, its number and the owner epoch that
// claimed it.
type RunRef struct {
	ID    string
	Run   int
	Epoch int64
}

// Cancel cancels a unit. A queued unit becomes cancelled at once (Applied),
// with Events (default: one work_cancelled). A running unit gets
// CancelRequested set and a work_cancel_requested event, which tells its
// owner (another process, or this one for a run it does not hold). Result.State reports the state found. Dependents of a cancelled unit
// are handled as for Finish with Propagate.
type Cancel struct {
	ID      string
	At      time.Time
	Reason  string
	Cascade bool
	Events  []Event
}

// Requeue moves failed units back to queued with a fresh retry budget.
// With IDs it takes those units; otherwise every failed unit matching Tasks
// (all tasks when empty) that finished before FinishedBefore (when set).
// Units that failed only because of them (ErrorKind prerequisite_failed) are
// requeued too. Result.IDs lists the units requeued.
type Requeue struct {
	IDs            []string
	Tasks          []string
	FinishedBefore time.Time
	At             time.Time
}

// Heartbeat records, for a running unit leased by Owner on run Run, that
// its handler was alive at At, and extends its lease to at least
// LeaseExpires (a lease never shrinks).
type Heartbeat struct {
	Epoch        int64
	ID           string
	Owner        string
	Run          int
	At           time.Time
	LeaseExpires time.Time
}

// PutTask stores a task definition.
type PutTask struct {
	Name string
	Def  []byte
}

// Ack records that the named subscription's consumer has handled every
// event up to Seq: its position becomes the larger of the stored one and
// Seq. With Create it only creates the subscription at Seq if it does not
// exist (Result.Applied reports that it was created); Remove deletes it.
type Ack struct {
	Name   string
	Seq    int64
	At     time.Time
	Create bool
	Remove bool
	// SetFilter stores Types and Tasks as the subscription's filter (on
	// Create, they are stored in any case). With SetFilter alone (no
	// Create), Seq and At are ignored.
	SetFilter    bool
	Types, Tasks []string
}

// SetPause pauses or resumes a task type (Task, which must be stored) or,
// when Task is empty, the whole queue. Result.Applied is false for an
// unknown task.
type SetPause struct {
	Task   string
	Paused bool
}

// PutService stores a service's definition. Override, when non-nil, replaces
// the stored override (an empty slice clears it); Paused, when non-nil, sets
// the paused flag.
type PutService struct {
	Name     string
	Def      []byte
	Override []byte
	Paused   *bool
}

// PutMeterState replaces the persisted state of a meter of a service (an
// empty State deletes it). Owner op.
type PutMeterState struct {
	Epoch          int64
	Service, Meter string
	State          []byte
}

// Reconcile replaces the amount a run's start charged a meter (its log
// entry: service, meter, unit, and the Claim's At) with the actual amount,
// once: Result.Applied is false when the entry is gone or was already
// reconciled. Owner op.
type Reconcile struct {
	Epoch          int64
	Service, Meter string
	WorkID         string
	At             time.Time
	Amount         int64
}

// LogUsage logs Amount of Meter as used at At on Service by something
// this owner did not start: another process or key sharing the
// provider's quota, as the provider's response reported it. It is a
// service log entry of no unit, counted by the meters like a start at At
// and pruned like one. Owner op.
type LogUsage struct {
	Epoch          int64
	Service, Meter string
	At             time.Time
	Amount         int64
}

// LogStart logs the start of run Run of unit WorkID ahead of its claim:
// each entry of Log at At (the service log), as a Claim's Log would. It
// applies unless fenced; logging an entry already logged for the unit at
// At (on the same service and meter) again applies and adds nothing, so
// that a write whose commit's outcome was lost may be repeated. It appends
// no event. Owner op.
//
// A Cue whose store is a StartLogger logs a start counted in a rate
// window with it, on a writer of its own, and launches the handler once
// it commits; the run's Claim (without Log) is written behind the start,
// with the rest, as a run of an unlimited service's is.
type LogStart struct {
	Epoch  int64
	WorkID string
	Run    int
	At     time.Time
	Log    []LogEntry
}

// AppendEvent appends an event not tied to a unit transition. Epoch is the
// owner's for an owner's event (zero for anyone else's).
type AppendEvent struct {
	Epoch int64
	Event Event
}

// Prune deletes finished units (and their history) that finished before
// Before, events older than EventsBefore, and, for each service in
// LogBefore, service log entries older than its time; a LogBefore key
// ending in ":" (a class, "host:") covers every service named with that
// prefix. Zero times and a nil map skip that part. At most Limit rows of
// each kind go per op (zero means no limit). Result.Count is the number of
// units deleted; Result.IDs is empty.
type Prune struct {
	// Epoch is the owner's for its retention passes, zero for a Prune
	// made outside ownership.
	Epoch        int64
	Before       time.Time
	EventsBefore time.Time
	LogBefore    map[string]time.Time
	// ActivityBefore deletes the per-minute activity and queue-wait counts
	// of minutes before it.
	ActivityBefore time.Time
	// EventsHardBefore, when set, makes EventsBefore keep the events a
	// named subscription has not acknowledged (store.Ack), unless they
	// are older than EventsHardBefore.
	EventsHardBefore time.Time
	// Passed, by named subscription, is a position past its
	// acknowledgement that the caller found it may pass: no event after
	// the acknowledgement up to it matches the subscription's filter. The
	// subscription's position is the larger of the two.
	Passed map[string]int64
	Limit  int
}

// PutSchedule stores a schedule or changes it. With Def, it registers
// the schedule: a new one is created at At; a stored one whose Def
// differs takes the new Def and loses its run-time Timing and pause (the
// code's definition changed); the same Def changes nothing. Without Def,
// it changes what Timing (a nil *[]byte: unchanged; a nil []byte:
// cleared) and Paused say, or deletes the schedule (Delete). A new Def
// or Timing moves the cursor forward to At (the new timing's periods
// before the change are not due). A schedule
// that is not stored is ErrUnknownSchedule. Every change appends a
// schedule_changed event (Data: ScheduleEventData).
type PutSchedule struct {
	Name   string
	Def    []byte
	At     time.Time
	Timing *[]byte
	Paused *bool
	Delete bool
}

// Fire records one period of a schedule in one transaction: it submits
// Unit (nil: the period is skipped, for Reason), moves the schedule's
// cursor to the period (Nominal, Key), and appends a schedule_submitted
// or schedule_skipped event. With SkipIfRunning, a period whose previous
// unit (Prev) is queued or running is skipped instead (reason
// "overlap"). Skipped counts the earlier periods skipped with it
// (missed ones, from FirstSkipped). A period at or before the stored
// cursor, or of a schedule no longer stored, is ErrScheduleMoved and
// changes nothing. The unit's idempotency key makes a second submission
// of the period a duplicate whatever happens.
type Fire struct {
	Epoch         int64
	Schedule      string
	Key           string
	Nominal, At   time.Time
	Unit          *Unit
	Reason        string
	Prev          string
	SkipIfRunning bool
	Skipped       int
	FirstSkipped  string
}

// OwnerEpoch implements OwnerOp.
func (f *Fire) OwnerEpoch() int64 { return f.Epoch }

// ScheduleEventData is the Data of the schedule events.
type ScheduleEventData struct {
	Schedule string `json:"schedule"`
	// Period is the period's key (schedule_submitted, schedule_skipped).
	Period string `json:"period,omitempty"`
	// Reason says why periods were skipped: "missed" (they fell due while
	// no owner ran the schedule, or while it was paused), "overlap" (the
	// previous unit was still queued or running), "refused: " and why
	// (its unit was refused). Skipped counts the periods skipped, from
	// FirstSkipped to Period.
	Reason       string `json:"reason,omitempty"`
	Skipped      int    `json:"skipped,omitempty"`
	FirstSkipped string `json:"first_skipped,omitempty"`
	// Change says what schedule_changed changed: registered, retimed,
	// paused, resumed, deleted.
	Change string `json:"change,omitempty"`
}

// Result is the outcome of one op.
type Result struct {
	// Applied reports whether the op changed anything.
	Applied bool
	// State is the unit's state as found (Cancel).
	State State
	// Units are Insert's outcomes, one per unit in order.
	Units []InsertedUnit
	// IDs are the units Recover or Requeue moved; Held the running units
	// Recover left running (their leases hold).
	IDs  []string
	Held []string
	// Count is the number of units Prune deleted; More reports that some
	// part of a Prune stopped at its Limit, so there is more to delete.
	Count int
	More  bool
	// Events are the events the op appended, with their Seq.
	Events []Event
	// Err is the op's own failure; the op was rolled back.
	Err error
}

func (*Insert) isOp()        {}
func (*PutSchedule) isOp()   {}
func (*Fire) isOp()          {}
func (*SetPause) isOp()      {}
func (*Ack) isOp()           {}
func (*Claim) isOp()         {}
func (*Finish) isOp()        {}
func (*Recover) isOp()       {}
func (*Cancel) isOp()        {}
func (*Requeue) isOp()       {}
func (*Heartbeat) isOp()     {}
func (*PutTask) isOp()       {}
func (*PutService) isOp()    {}
func (*AppendEvent) isOp()   {}
func (*Prune) isOp()         {}
func (*FailQueued) isOp()    {}
func (*PutMeterState) isOp() {}
func (*Reconcile) isOp()     {}
func (*LogUsage) isOp()      {}
func (*LogStart) isOp()      {}

// Batch is the outcome of Apply: one Result per op, and Follows: every
// event with a Seq up to Follows was committed before the batch's events
// (by any writer), and none of the batch's events has a lower Seq. It is
// set when the batch appended events.
type Batch struct {
	Results []Result
	Follows int64
}

func (o *Claim) OwnerEpoch() int64         { return o.Epoch }
func (o *Finish) OwnerEpoch() int64        { return o.Epoch }
func (o *Recover) OwnerEpoch() int64       { return o.Epoch }
func (o *Heartbeat) OwnerEpoch() int64     { return o.Epoch }
func (o *FailQueued) OwnerEpoch() int64    { return o.Epoch }
func (o *PutMeterState) OwnerEpoch() int64 { return o.Epoch }
func (o *Reconcile) OwnerEpoch() int64     { return o.Epoch }
func (o *LogUsage) OwnerEpoch() int64      { return o.Epoch }
func (o *LogStart) OwnerEpoch() int64      { return o.Epoch }
func (o *AppendEvent) OwnerEpoch() int64   { return o.Epoch }
func (o *Prune) OwnerEpoch() int64         { return o.Epoch }

// Ask stores a question to the live owner (OwnerQuestion, its Nonce the
// ID) in the questions table: no event is appended, so no subscription
// sees it. Anyone may ask; it is not an owner op.
type Ask struct {
	Question OwnerQuestion
	At       time.Time
}

// AnswerQuestion stores the owner's answer to question ID (Answer: JSON,
// nil when it has none), and forgets every answered question asked before
// Forget (zero: none), whose asker read it or gave up. An ID no longer
// stored (its asker gave up and forgot it) changes nothing.
type AnswerQuestion struct {
	Epoch  int64
	ID     string
	Answer []byte
	Forget time.Time
}

// OwnerEpoch implements OwnerOp.
func (a *AnswerQuestion) OwnerEpoch() int64 { return a.Epoch }

// ForgetQuestion deletes question ID: its asker read the answer, or gave
// up.
type ForgetQuestion struct{ ID string }

func (*Ask) isOp()            {}
func (*AnswerQuestion) isOp() {}
func (*ForgetQuestion) isOp() {}
