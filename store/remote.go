package store

import (
	"context"
	"errors"
	"time"
)

// Executors: handlers in other processes or on other hosts. The owner (the
// scheduler) still decides every start; it hands a run to a registered
// executor by an assignment (Assign), which the executor reads (Assigned),
// and the executor reports the handler's start and its end on it
// (ReportStart, ReportEnd), which the scheduler reads (Reported) and
// records as it records any run's (its Finish, with Unassign in the same
// transaction). An executor keeps its runs' leases alive with its own
// heartbeat (ExecutorBeat): those leases survive the scheduler's death and
// a new owner's recovery (ApplyRecover holds them while their executor
// lives). Every report is checked against the assignment's run number:
// one for a run the scheduler has since ended or requeued is not applied,
// whoever sends it, so a frozen executor that resumes stores nothing.

// ErrStaleRun is what an executor's report gets when its run is no longer
// the one assigned to it (the scheduler ended or requeued the run: its
// lease expired, the executor was judged gone, the unit was cancelled).
var ErrStaleRun = errors.New("runcue: the run is no longer assigned to this executor")

// ExecutorStore is implemented by backends that executors can work
// through (SQLite, with executors in other processes on its host;
// PostgreSQL, on any host). Its reads are safe for simultaneous use.
type ExecutorStore interface {
	// Now reads the store's clock, the one start deadlines are on
	// (PostgreSQL: the server's; SQLite: its host's).
	Now(ctx context.Context) (time.Time, error)
	// Executors returns the registered executors, with the store's clock
	// at the read (to judge Seen against).
	Executors(ctx context.Context) ([]ExecutorRecord, time.Time, error)
	// Assigned returns the assignments of executor not ended (pending or
	// started), with the pending ones' targets and params.
	Assigned(ctx context.Context, executor string) ([]Assignment, error)
	// Reported returns every assignment whose start or end was reported
	// (state AssignStarted or AssignEnded), with its report, except those
	// the reader already knows: an assignment that known names (its unit
	// and run) is left out while its state is at most the known one. A
	// scheduler reads the reports at each notification; without known,
	// every read returned every run started and not finished yet.
	Reported(ctx context.Context, known []Known) ([]Assignment, error)
}

// ExecutorWatcher is implemented by executor stores that push the
// protocol's notifications (PostgreSQL's LISTEN/NOTIFY), each to whom it
// concerns; without it, both sides read at their poll intervals (and at
// the store's Watcher, when it has one).
type ExecutorWatcher interface {
	// WatchAssigned receives (coalesced) after a commit assigned a run to
	// executor or asked one of its runs to stop, until ctx ends.
	WatchAssigned(ctx context.Context, executor string) (<-chan struct{}, error)
	// WatchReported receives (coalesced) after a commit reported a start
	// or an end, or registered or removed an executor, until ctx ends.
	WatchReported(ctx context.Context) (<-chan struct{}, error)
}

// ExecutorRecord is a registered executor.
type ExecutorRecord struct {
	ID   string `json:"id"`
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// Tasks are the task types it runs; Capacity how many handlers it runs
	// at once.
	Tasks    []string `json:"tasks"`
	Capacity int      `json:"capacity"`
	// Poll is how often it reads its assignments; TTL how long after its
	// last heartbeat (Seen, on the store's clock) it counts as gone.
	Poll time.Duration `json:"poll"`
	TTL  time.Duration `json:"ttl"`
	// Registered and Seen are on the store's clock.
	Registered time.Time `json:"registered"`
	Seen       time.Time `json:"seen"`
}

// Live reports whether the executor counts as alive at now (the store's
// clock): its last heartbeat is less than its TTL old.
func (e ExecutorRecord) Live(now time.Time) bool { return now.Before(e.Seen.Add(e.TTL)) }

// AssignState is where an assignment is.
type AssignState uint8

const (
	// AssignPending: written by the scheduler, not started yet.
	AssignPending AssignState = iota
	// AssignStarted: the executor reported the handler's start.
	AssignStarted
	// AssignEnded: the executor reported the run's end.
	AssignEnded
)

// Known is an assignment's state as a reader of the reports last read it
// (see ExecutorStore.Reported).
type Known struct {
	ID    string
	Run   int
	State AssignState
}

// Assignment is one run handed to an executor.
type Assignment struct {
	ID       string
	Run      int
	Executor string
	Task     string
	// Target and Params are the unit's (Assigned only).
	Target string
	Params []byte
	// StartBy is the last instant, on the store's clock, the handler may
	// start; Timeout bounds the run from its start.
	StartBy time.Time
	Timeout time.Duration
	State   AssignState
	// Cancel, when set, is why the scheduler asks the handler to stop
	// (shutdown, timeout, cancelled).
	Cancel string
	// Started is the reported start, on the store's clock (the latest
	// instant it can have been); Ending the reported end (the executor's
	// JSON, which the store does not read).
	Started time.Time
	Ending  []byte
}

// RegisterExecutor registers (or registers again) an executor, seen now
// on the store's clock. It is refused (Result.Err ErrExecutorTaken) while
// another process (another Host or PID) holds the ID with a heartbeat
// fresher than its TTL: two live processes never share an ID.
type RegisterExecutor struct {
	Executor ExecutorRecord
}

// ErrExecutorTaken: a live process of another host or PID is registered
// under the executor ID (its heartbeat is fresher than its TTL).
var ErrExecutorTaken = errors.New("runcue: another live process is registered under this executor ID")

// RemoveExecutor removes an executor's registration (it stopped); its
// runs' leases are no longer kept alive.
type RemoveExecutor struct {
	ID string
	// Host and PID, when PID is set, are the stopping process's: another
	// process's registration of the ID is left alone.
	Host string
	PID  int
}

// ExecutorBeat records that executor ID is alive now (the store's clock)
// and extends the lease of each of its runs not ended to at least now +
// TTL. It applies only to a registered executor (Result.Applied).
type ExecutorBeat struct {
	ID  string
	TTL time.Duration
	// Host and PID, when PID is set, are the beating process's: the beat
	// applies only to its own registration, not to another process's of
	// the same ID (which took the ID over once this one's heartbeat went
	// stale).
	Host string
	PID  int
}

// Assign hands run Run of a running unit, leased by Owner, to Executor.
// It applies only if the unit is running on that run and leased by Owner;
// an earlier run's assignment is replaced.
type Assign struct {
	Epoch    int64
	ID       string
	Task     string
	Owner    string
	Run      int
	Executor string
	StartBy  time.Time
	Timeout  time.Duration
}

// CancelAssigned asks the executor of run Run of unit ID to stop its
// handler, for Cause.
type CancelAssigned struct {
	Epoch int64
	ID    string
	Run   int
	Cause string
}

// Unassign deletes run Run's assignment of unit ID (the scheduler
// recorded the run's end).
type Unassign struct {
	Epoch int64
	ID    string
	Run   int
}

// ReportStart reports, for Executor, that run Run of unit ID started at At
// (the store's clock, the latest instant it can have been). It applies
// only if that run is still assigned to Executor and not reported started
// (otherwise the Result's Err is ErrStaleRun when the run is not assigned
// to it, nil when only the report is repeated).
type ReportStart struct {
	Executor string
	ID       string
	Run      int
	At       time.Time
}

// ReportEnd reports, for Executor, how run Run of unit ID ended (Ending,
// the executor's JSON). It applies only if that run is still assigned to
// Executor (the Result's Err is ErrStaleRun otherwise).
type ReportEnd struct {
	Executor string
	ID       string
	Run      int
	Ending   []byte
}

func (*RegisterExecutor) isOp() {}
func (*RemoveExecutor) isOp()   {}
func (*ExecutorBeat) isOp()     {}
func (*Assign) isOp()           {}
func (*CancelAssigned) isOp()   {}
func (*Unassign) isOp()         {}
func (*ReportStart) isOp()      {}
func (*ReportEnd) isOp()        {}

func (o *Assign) OwnerEpoch() int64         { return o.Epoch }
func (o *CancelAssigned) OwnerEpoch() int64 { return o.Epoch }
func (o *Unassign) OwnerEpoch() int64       { return o.Epoch }
