package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The rules that must read state inside the op's transaction, written once
// here against Tx and called by every backend from inside its transaction:
// inserting a batch (idempotency keys, dependencies dead or alive, the
// queue bound with drop-oldest), cancelling, failing a queued unit,
// requeueing failed units, the propagation of a failure or cancellation
// to queued dependents, a new owner's recovery, and retention. A backend
// implements Tx (storage) and calls these; the same-transaction guarantees
// follow from the backend running them, and the events they append, inside
// the one transaction of the op.
//
// Like the rest of the package, Tx is unstable for outside implementers.

// Tx is a backend's open transaction as the shared rules use it. Every
// method reads or writes inside that transaction, seeing its earlier
// writes. Errors are fatal to the batch unless wrapped in an *OpError.
//
// Isolation. The rules read, then write on what they read. A backend runs
// them either serializably (SQLite: one writer at a time), or at READ
// COMMITTED with the locks the methods below name, held to the end of the
// transaction, so that what a rule read stays true until it commits:
//
//   - a unit's row: UnitState, DeadDependencies and FailedByPrerequisite
//     share-lock the rows they read (a dependency that is alive when a
//     dependent is inserted cannot end, and miss that dependent in its
//     QueuedDependents, before the insert commits); CancelTarget,
//     RunningUnits and the methods that move a unit (EndQueued,
//     RequeueFailed, EndRunning) lock the row for update;
//   - an idempotency key: UnitByKey locks the key itself, found or not
//     (an advisory lock on it, say), so that two inserts of one key take
//     turns;
//   - the queue's count: QueuedCount locks the count, so that two inserts
//     under one MaxQueued count one after the other;
//   - the event log: AppendEvent holds the log's append lock from a
//     transaction's first append to its commit, so that events become
//     visible in Seq order (see Store).
//
// The conformance suite runs every rule with two writers at once
// (storetest's TwoWriters).
type Tx interface {
	// UnitState returns the state of unit id; found is false if no unit
	// has that ID. Share-locks the row.
	UnitState(id string) (st State, found bool, err error)
	// UnitByKey returns the unit holding an idempotency key. Locks the key.
	UnitByKey(key string) (id string, st State, seq int64, found bool, err error)
	// ReleaseKey clears the idempotency key of unit id, so that a new unit
	// may take it.
	ReleaseKey(id string) error
	// SkipDebounced skips the unit that holds debounce key (see Debounce)
	// if it is queued and never started, with the error "replaced by "+by
	// at at; it returns that unit and the burst's first insert (since),
	// and skipped false (since zero) when no unit was skipped. Locks the
	// key.
	SkipDebounced(key, by string, at time.Time) (ref UnitRef, since time.Time, skipped bool, err error)
	// HoldDebounce gives debounce key to unit id, its burst begun at since.
	HoldDebounce(key, id string, since time.Time) error
	// InsertUnit stores u as it stands (u.State is Queued or Failed; a
	// failed one has finished, errKind as its error and kind) with its
	// dependency edges, and returns its Seq. An ID already stored is an
	// *OpError wrapping ErrDuplicateID.
	InsertUnit(u *Unit, finished time.Time, errKind string) (seq int64, err error)
	// EndQueued moves unit id from queued to st (Failed or Cancelled) with
	// the error and kind, and reports whether it was queued.
	EndQueued(id string, st State, at time.Time, errMsg, errKind string) (bool, error)
	// QueuedDependents lists the queued units with a dependency on id, in
	// the order their dependencies were stored.
	QueuedDependents(id string) ([]UnitRef, error)
	// QueuedCount is the number of queued units, this transaction's
	// changes included. Locks the count.
	QueuedCount() (int, error)
	// OldestQueued lists up to n queued units by Seq, oldest first.
	OldestQueued(n int) ([]UnitRef, error)
	// CancelTarget returns unit id's state, its task and target, and
	// whether its cancellation was already requested. Locks the row.
	CancelTarget(id string) (st State, ref UnitRef, requested, found bool, err error)
	// RequestCancel records that cancellation of running unit id is
	// requested (cascading or not).
	RequestCancel(id string, cascade bool) error
	// FailedUnits lists the failed units of the tasks (all when empty)
	// finished before a time (any when zero), by Seq.
	FailedUnits(tasks []string, finishedBefore time.Time) ([]string, error)
	// RequeueFailed moves failed unit id back to queued with fresh counters
	// and returns its task and target; ok is false if it was not failed.
	RequeueFailed(id string) (ref UnitRef, ok bool, err error)
	// FailedByPrerequisite lists the failed units with a dependency on id
	// whose error kind is prerequisite_failed or prerequisite_cancelled.
	FailedByPrerequisite(id string) ([]string, error)
	// DeadDependencies counts unit id's dependencies that are failed or
	// cancelled. Share-locks them.
	DeadDependencies(id string) (int, error)
	// AppendEvent stores ev, setting its Seq, and its Time from at when
	// zero (and its Data from its Detail). Holds the log's append lock.
	AppendEvent(ev *Event, at time.Time) error

	// RunningUnits lists the running units (those of ids; all when ids is
	// empty), by Seq. Locks their rows.
	RunningUnits(ids []string) ([]RunningRef, error)
	// EndRunning moves running unit id, on run runs, to st (Queued, or
	// Cancelled with the error and kind, finished at at), clearing its
	// lease and appending attempt to its history; it reports whether the
	// unit was running on that run.
	EndRunning(id string, runs int, st State, at time.Time, attempt Attempt, errMsg, errKind string) (bool, error)
	// Unassign deletes the assignment of run runs of unit id (see Assign),
	// if any.
	Unassign(id string, runs int) error

	// PruneFinished deletes up to limit units (all when limit is 0) that
	// finished before before, with their history and dependency edges,
	// oldest first; n is how many.
	PruneFinished(before time.Time, limit int) (n int, err error)
	// FirstEventAt returns the Seq of the first event at or after t, or
	// one past the last event's when none is (the transaction's own
	// appends included).
	FirstEventAt(t time.Time) (int64, error)
	// SubscriptionPositions returns the named subscriptions' acknowledged
	// positions.
	SubscriptionPositions() (map[string]int64, error)
	// PruneEvents deletes up to limit events with a Seq below below (and
	// what indexes only them); more reports that the limit stopped it.
	PruneEvents(below int64, limit int) (more bool, err error)
	// PruneActivity deletes the per-minute counts of minutes before
	// before.
	PruneActivity(before time.Time) error
	// PruneLog deletes up to limit service log entries of service (of
	// every service named with the prefix, when service ends in ":")
	// logged before before.
	PruneLog(service string, before time.Time, limit int) (more bool, err error)
}

// RunningRef is a running unit as recovery sees it.
type RunningRef struct {
	UnitRef
	Runs            int
	Started         time.Time
	Epoch           int64
	LeaseExpires    time.Time
	CancelRequested bool
	// Executor is the executor the run is assigned to ("" when none), and
	// ExecutorSeen and ExecutorTTL its registration's last heartbeat and
	// TTL (ExecutorSeen zero when it is not registered).
	Executor     string
	ExecutorSeen time.Time
	ExecutorTTL  time.Duration
}

// UnitRef names a unit, its task and its target.
type UnitRef struct {
	ID, Task, Target string
}

// OpError is an op's own failure: the backend rolls back that op's work
// alone and reports Err on its Result; the rest of the batch commits.
type OpError struct{ Err error }

func (e *OpError) Error() string { return e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

func refuse(err error) error { return &OpError{Err: err} }

// AppendEvents appends evs to the transaction and to r, naming unit id
// where an event names none.
func AppendEvents(tx Tx, r *Result, evs []Event, id, target string, at time.Time) error {
	r.Events = slices.Grow(r.Events, len(evs))
	for _, e := range evs {
		if e.WorkID == "" {
			e.WorkID = id
		}
		if e.Target == "" {
			e.Target = target
		}
		// Appended first, so that the pointer the Tx gets is into r.Events,
		// not a copy that escapes.
		r.Events = append(r.Events, e)
		if err := tx.AppendEvent(&r.Events[len(r.Events)-1], at); err != nil {
			r.Events = r.Events[:len(r.Events)-1]
			return err
		}
	}
	return nil
}

// ApplyInsert applies an Insert: the batch in topological order, each
// unit's idempotency key resolved against stored units, units with a dead
// dependency stored failed, and the queue bound enforced after.
func ApplyInsert(tx Tx, op *Insert, r *Result) error {
	units := op.Units
	inBatch := make(map[string]int, len(units))
	for i, u := range units {
		if u.ID == "" || u.Task == "" {
			return refuse(errors.New("runcue: store: unit without ID or task"))
		}
		if _, dup := inBatch[u.ID]; dup {
			return refuse(fmt.Errorf("%w: %q appears twice in the batch", ErrDuplicateID, u.ID))
		}
		inBatch[u.ID] = i
	}
	if err := CheckCycles(units, inBatch); err != nil {
		return refuse(err)
	}
	r.Units = make([]InsertedUnit, len(units))
	// Units stored in this op, by ID, with their state, so dependencies
	// inside the batch resolve; duplicates (by idempotency key) resolve to
	// the existing unit's state.
	state := make(map[string]State, len(units))
	// alias maps a duplicate's ID in the batch to the existing unit's, so
	// its dependents depend on that unit; refused marks units not stored.
	alias := map[string]string{}
	refused := map[string]bool{}
outer:
	for _, i := range TopoOrder(units, inBatch) {
		u := units[i]
		out := &r.Units[i]
		out.ID = u.ID
		for j, d := range u.DependsOn {
			if refused[d] {
				out.Refused = fmt.Errorf("%w: %q depends on %q", ErrDependencyRefused, u.ID, d)
				refused[u.ID] = true
				continue outer
			}
			if a, ok := alias[d]; ok {
				u.DependsOn[j] = a
			}
		}
		if u.IdempotencyKey != "" {
			id, st, seq, found, err := tx.UnitByKey(u.IdempotencyKey)
			if err != nil {
				return err
			}
			switch {
			case !found:
			case st != Failed && st != Cancelled:
				*out = InsertedUnit{ID: id, Seq: seq, Duplicate: true, State: st}
				state[id] = st
				if id != u.ID {
					alias[u.ID] = id
				}
				continue
			case op.OnFailedDuplicate == RejectFailedDuplicate:
				out.Refused = fmt.Errorf("%w: key %q (unit %s)", ErrDuplicate, u.IdempotencyKey, id)
				refused[u.ID] = true
				continue
			default:
				if err := tx.ReleaseKey(id); err != nil {
					return err
				}
			}
		}
		// Dependencies: known, and dead or alive.
		deadKind := ""
		for _, d := range u.DependsOn {
			st, ok := state[d]
			if !ok {
				if _, inb := inBatch[d]; inb {
					// A dependency later in topological order cannot happen.
					return fmt.Errorf("runcue: store: dependency %q not ordered", d)
				}
				var found bool
				var err error
				if st, found, err = tx.UnitState(d); err != nil {
					return err
				}
				if !found {
					return refuse(fmt.Errorf("%w: %q (needed by %q)", ErrUnknownDependency, d, u.ID))
				}
			}
			switch {
			case st == Failed && deadKind == "":
				deadKind = "prerequisite_failed"
			case st == Cancelled && deadKind == "":
				deadKind = "prerequisite_cancelled"
			}
		}
		u.State = Queued
		var finished time.Time
		if deadKind != "" {
			u.State, finished = Failed, op.At
		}
		if u.CreatedAt.IsZero() {
			u.CreatedAt = op.At
		}
		since, err := debounce(tx, u, op.At, r)
		if err != nil {
			return err
		}
		seq, err := tx.InsertUnit(u, finished, deadKind)
		if err != nil {
			return err
		}
		if u.Debounce != nil && u.State == Queued {
			if err := tx.HoldDebounce(u.Debounce.Key, u.ID, since); err != nil {
				return err
			}
		}
		u.Seq = seq
		*out = InsertedUnit{ID: u.ID, Seq: u.Seq, State: u.State}
		state[u.ID] = u.State
		evs := []Event{{Type: EventWorkQueued, Task: u.Task}}
		if u.State == Failed {
			evs = append(evs, Event{Type: EventWorkFailed, Task: u.Task, Data: PrerequisiteFailedData(deadKind, "")})
		}
		if err := AppendEvents(tx, r, evs, u.ID, u.Target, op.At); err != nil {
			return err
		}
	}
	if op.MaxQueued > 0 {
		if err := makeRoom(tx, op, inBatch, r); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
}

// debounce applies unit u's Debounce, if it has one and is to be stored
// queued: the unit holding its key is skipped if it may be, and u's RunAt
// moved to the end of the burst. It returns the burst's first insert.
func debounce(tx Tx, u *Unit, at time.Time, r *Result) (time.Time, error) {
	db := u.Debounce
	if db == nil || u.State != Queued {
		return time.Time{}, nil
	}
	since := at
	ref, first, skipped, err := tx.SkipDebounced(db.Key, u.ID, at)
	if err != nil {
		return time.Time{}, err
	}
	if skipped {
		since = first
		data, _ := json.Marshal(EventData{Reason: "debounced: replaced by " + u.ID})
		ev := []Event{{Type: EventWorkSkipped, Task: ref.Task, Data: data}}
		if err := AppendEvents(tx, r, ev, ref.ID, ref.Target, at); err != nil {
			return time.Time{}, err
		}
	}
	runAt := at.Add(db.Period)
	if db.MaxWait > 0 && since.Add(db.MaxWait).Before(runAt) {
		runAt = since.Add(db.MaxWait)
	}
	if u.RunAt.Before(runAt) {
		u.RunAt = runAt
	}
	return since, nil
}

// makeRoom enforces Insert.MaxQueued after the units went in: it refuses
// the op, or cancels the oldest queued units stored before it, one at a
// time, until the bound holds. A dropped unit's queued dependents fail with
// it, and count towards the room made.
func makeRoom(tx Tx, op *Insert, inBatch map[string]int, r *Result) error {
	queued, err := tx.QueuedCount()
	if err != nil {
		return err
	}
	over := queued - op.MaxQueued
	if over <= 0 {
		return nil
	}
	full := refuse(fmt.Errorf("%w: %d queued units at most", ErrBackpressure, op.MaxQueued))
	if !op.DropOldest {
		return full
	}
	oldest, err := tx.OldestQueued(over + len(inBatch))
	if err != nil {
		return err
	}
	for _, v := range oldest {
		if queued <= op.MaxQueued {
			break
		}
		if _, mine := inBatch[v.ID]; mine {
			continue
		}
		ok, err := tx.EndQueued(v.ID, Cancelled, op.At, "dropped", "dropped")
		if err != nil {
			return err
		}
		if !ok {
			continue // failed with a unit dropped before it
		}
		ev := []Event{{Type: EventWorkCancelled, Task: v.Task, Data: []byte(`{"reason":"dropped"}`)}}
		if err := AppendEvents(tx, r, ev, v.ID, v.Target, op.At); err != nil {
			return err
		}
		if err := Propagate(tx, v.ID, Cancelled, false, op.At, r); err != nil {
			return err
		}
		if queued, err = tx.QueuedCount(); err != nil {
			return err
		}
	}
	if queued > op.MaxQueued {
		return full
	}
	return nil
}

// ApplyFailQueued applies a FailQueued: the unit, if still queued, fails
// with its events, and so do its queued dependents.
func ApplyFailQueued(tx Tx, op *FailQueued, r *Result) error {
	ok, err := tx.EndQueued(op.ID, Failed, op.At, op.Error, op.ErrorKind)
	if err != nil || !ok {
		return err
	}
	r.Applied = true
	if err := AppendEvents(tx, r, op.Events, op.ID, "", op.At); err != nil {
		return err
	}
	return Propagate(tx, op.ID, Failed, false, op.At, r)
}

// ApplyCancel applies a Cancel: a queued unit is cancelled with its
// dependents (failed, or cancelled with Cascade); a running one has its
// cancellation requested, once; an ended one is left as it is. r.State is
// the state the unit was found in.
func ApplyCancel(tx Tx, op *Cancel, r *Result) error {
	st, ref, requested, found, err := tx.CancelTarget(op.ID)
	task := ref.Task
	if err != nil {
		return err
	}
	if !found {
		return refuse(fmt.Errorf("%w: %q", ErrNotFound, op.ID))
	}
	r.State = st
	switch st {
	case Queued:
		reason := op.Reason
		if reason == "" {
			reason = "cancelled"
		}
		if _, err := tx.EndQueued(op.ID, Cancelled, op.At, reason, "cancelled"); err != nil {
			return err
		}
		r.Applied = true
		evs := op.Events
		if len(evs) == 0 {
			evs = []Event{{Type: EventWorkCancelled, Task: task}}
		}
		if err := AppendEvents(tx, r, evs, op.ID, ref.Target, op.At); err != nil {
			return err
		}
		return Propagate(tx, op.ID, Cancelled, op.Cascade, op.At, r)
	case Running:
		if requested {
			return nil
		}
		if err := tx.RequestCancel(op.ID, op.Cascade); err != nil {
			return err
		}
		ev := []Event{{Type: EventWorkCancelRequested, Task: task, Data: CancelRequestedData(op.Cascade, op.Reason)}}
		return AppendEvents(tx, r, ev, op.ID, ref.Target, op.At)
	}
	return nil
}

// Propagate ends the queued dependents of id, transitively, appending their
// events to r: cancelled when cascade is set, otherwise failed with
// prerequisite_cancelled (direct dependents of a cancelled root) or
// prerequisite_failed.
func Propagate(tx Tx, id string, rootState State, cascade bool, at time.Time, r *Result) error {
	frontier := []string{id}
	for len(frontier) > 0 {
		cur := frontier[0]
		frontier = frontier[1:]
		deps, err := tx.QueuedDependents(cur)
		if err != nil {
			return err
		}
		for _, d := range deps {
			state, kind, evType := Failed, "prerequisite_failed", EventWorkFailed
			switch {
			case cascade:
				state, kind, evType = Cancelled, "cancelled", EventWorkCancelled
			case cur == id && rootState == Cancelled:
				kind = "prerequisite_cancelled"
			}
			ok, err := tx.EndQueued(d.ID, state, at, "prerequisite "+cur+": "+kind, kind)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			data := PrerequisiteFailedData(kind, cur)
			if state == Cancelled {
				data = CascadeCancelledData(kind, cur)
			}
			if err := AppendEvents(tx, r, []Event{{Type: evType, Task: d.Task, Data: data}}, d.ID, d.Target, at); err != nil {
				return err
			}
			frontier = append(frontier, d.ID)
		}
	}
	return nil
}

// ApplyRequeue applies a Requeue: the failed units it names (or selects)
// go back to the queue, and so, transitively, do the dependents that
// failed only because of them (every dependency of theirs alive again).
func ApplyRequeue(tx Tx, op *Requeue, r *Result) error {
	roots := op.IDs
	if len(roots) == 0 {
		var err error
		if roots, err = tx.FailedUnits(op.Tasks, op.FinishedBefore); err != nil {
			return err
		}
	}
	requeued := make(map[string]bool)
	var frontier []string
	one := func(id string) error {
		ref, ok, err := tx.RequeueFailed(id)
		if err != nil || !ok {
			return err
		}
		ev := []Event{{Type: EventWorkQueued, Task: ref.Task, Data: []byte(`{"reason":"retry"}`)}}
		if err := AppendEvents(tx, r, ev, id, ref.Target, op.At); err != nil {
			return err
		}
		r.IDs = append(r.IDs, id)
		requeued[id] = true
		frontier = append(frontier, id)
		return nil
	}
	for _, id := range roots {
		if err := one(id); err != nil {
			return err
		}
	}
	for len(frontier) > 0 {
		cur := frontier[0]
		frontier = frontier[1:]
		deps, err := tx.FailedByPrerequisite(cur)
		if err != nil {
			return err
		}
		for _, dep := range deps {
			if requeued[dep] {
				continue
			}
			dead, err := tx.DeadDependencies(dep)
			if err != nil {
				return err
			}
			if dead > 0 {
				continue
			}
			if err := one(dep); err != nil {
				return err
			}
		}
	}
	r.Applied = len(r.IDs) > 0
	return nil
}

// FinishApplied records what follows a Finish the backend applied: its
// events and, for a failed or cancelled unit whose Finish asks for it, the
// propagation to its queued dependents.
func FinishApplied(tx Tx, op *Finish, r *Result) error {
	r.Applied = true
	if err := AppendEvents(tx, r, op.Events, op.ID, "", op.At); err != nil {
		return err
	}
	if op.Propagate && (op.State == Failed || op.State == Cancelled) {
		return Propagate(tx, op.ID, op.State, op.CascadeCancel, op.At, r)
	}
	return nil
}
