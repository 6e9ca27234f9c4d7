package sqlcommon

import (
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
)

// Applier is a backend's write transaction as Apply uses it: the rules'
// primitives (store.Tx), the statements' (Tx), and the backend's own
// savepoints, event log and executor ops.
type Applier interface {
	store.Tx
	Tx
	// Savepoint runs f inside a savepoint: an *store.OpError rolls back
	// only f's work and is reported on r.
	Savepoint(r *store.Result, f func() error) error
	// Event appends ev to the log, numbered, at time at.
	Event(ev *store.Event, at time.Time) error
	// FlushEvents writes the events appended so far.
	FlushEvents(mid bool) error
	// ApplyRemote applies an executor's op; false when op is none.
	ApplyRemote(op store.Op, r *store.Result) (bool, error)
}

// Apply applies the ops both backends apply alike: every op but Insert,
// Claim and Finish, which each backend applies its own way. ok is
// false for an op it does not know.
func Apply(t Applier, op store.Op, r *store.Result) (ok bool, err error) {
	if ok, err := applyQuestion(t, op, r); ok {
		return true, err
	}
	switch op := op.(type) {
	case *store.Recover:
		return true, store.ApplyRecover(t, op, r)
	case *store.Cancel:
		return true, t.Savepoint(r, func() error { return store.ApplyCancel(t, op, r) })
	case *store.Requeue:
		return true, store.ApplyRequeue(t, op, r)
	case *store.Heartbeat:
		r.Applied, err = t.Changed(`UPDATE work_units SET heartbeat_at=?, lease_expires_at=`+t.Greatest()+`(lease_expires_at, ?)
			WHERE id=? AND state='running' AND leased_by=? AND runs=?`,
			Nanos(op.At), Nanos(op.LeaseExpires), op.ID, op.Owner, op.Run)
		return true, err
	case *store.PutTask:
		err = t.Exec(`INSERT INTO tasks(name, def) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET def=excluded.def`, op.Name, NullBytes(op.Def))
		r.Applied = err == nil
		return true, err
	case *store.PutService:
		return true, PutService(t, op, r)
	case *store.PutMeterState:
		return true, PutMeterState(t, op, r)
	case *store.Reconcile:
		r.Applied, err = t.Changed(`UPDATE service_log SET amount=?, reconciled=?
			WHERE service=? AND meter=? AND work_id=? AND started_at=? AND reconciled=?`,
			op.Amount, true, op.Service, op.Meter, op.WorkID, Nanos(op.At), false)
		return true, err
	case *store.LogStart:
		for _, e := range op.Log {
			if err := t.Exec(`INSERT INTO service_log(service, meter, amount, started_at, work_id) SELECT ?, ?, ?, ?, ?
				WHERE NOT EXISTS (SELECT 1 FROM service_log WHERE service=? AND started_at=? AND meter=? AND work_id=?)`,
				e.Service, e.Meter, e.Amount, Nanos(op.At), op.WorkID, e.Service, Nanos(op.At), e.Meter, op.WorkID); err != nil {
				return true, err
			}
		}
		r.Applied = true
		return true, nil
	case *store.LogUsage:
		err = t.Exec(`INSERT INTO service_log(service, meter, amount, started_at, work_id) VALUES(?, ?, ?, ?, NULL)`,
			op.Service, op.Meter, op.Amount, Nanos(op.At))
		r.Applied = err == nil
		return true, err
	case *store.SetPause:
		return true, SetPause(t, op, r)
	case *store.Ack:
		return true, Ack(t, op, r)
	case *store.AppendEvent:
		ev := op.Event
		if err := t.Event(&ev, op.Event.Time); err != nil {
			return true, err
		}
		r.Applied = true
		r.Events = append(r.Events, ev)
		return true, nil
	case *store.Prune:
		// The log's end is read (FirstEventAt): the events this
		// transaction appended so far are written first.
		if err := t.FlushEvents(true); err != nil {
			return true, err
		}
		return true, store.ApplyPrune(t, op, r)
	case *store.FailQueued:
		return true, store.ApplyFailQueued(t, op, r)
	}
	return t.ApplyRemote(op, r)
}

// CountChange is the net change of the units of a task in a state.
type CountChange struct {
	Task  string
	State store.State
	N     int64
}

// CountChanges sums a transaction's count deltas by task and state, in
// the order each pair first changed, leaving out the pairs whose changes
// cancel.
func CountChanges(counted []store.CountDelta) []CountChange {
	index := make(map[[2]string]int, 4)
	var out []CountChange
	for _, c := range counted {
		k := [2]string{c.Task, string(c.State)}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, CountChange{Task: c.Task, State: c.State})
		}
		out[i].N += int64(c.D)
	}
	kept := out[:0]
	for _, c := range out {
		if c.N != 0 {
			kept = append(kept, c)
		}
	}
	return kept
}

// Stamp fills an event about to be appended: its Time from at when zero,
// its Data from its Detail when it has none.
func Stamp(ev *store.Event, at time.Time) {
	if ev.Time.IsZero() {
		ev.Time = at
	}
	if ev.Data == nil && ev.Detail != nil {
		ev.Data = ev.Detail.Encode()
	}
}

// Blocks encodes pending events with enc as blocks of at most
// store.MaxBlockEvents and hands each to write; a block continues when
// more events follow it, or, with mid, when the transaction may append
// more. A block's data is enc's, which the next block reuses.
func Blocks(enc *store.BlockEncoder, pending []store.Event, mid bool, write func(store.EventBlock) error) error {
	for start := 0; start < len(pending); start += store.MaxBlockEvents {
		enc.Reset()
		end := min(start+store.MaxBlockEvents, len(pending))
		for i := start; i < end; i++ {
			enc.Add(&pending[i])
		}
		if err := write(enc.Block(mid || end < len(pending))); err != nil {
			return err
		}
	}
	return nil
}

// OwnerEpoch is the epoch op carries when it is an owner's op that is
// fenced (a nonzero epoch); ok is false otherwise.
func OwnerEpoch(op store.Op) (epoch int64, ok bool) {
	o, isOwner := op.(store.OwnerOp)
	if !isOwner || o.OwnerEpoch() == 0 {
		return 0, false
	}
	return o.OwnerEpoch(), true
}

// FinishedAt is the finished_at a run's end to state st at at stores: at
// for a terminal state, else 0.
func FinishedAt(st store.State, at time.Time) int64 {
	if st.Terminal() {
		return Nanos(at)
	}
	return 0
}

// CancelFlag is cancel_requested's value for a cancellation: 2 with
// cascade, else 1.
func CancelFlag(cascade bool) int {
	if cascade {
		return 2
	}
	return 1
}

// EncodeCosts is a unit's costs as stored: their JSON, nil for none.
func EncodeCosts(costs map[string]int64) ([]byte, error) {
	if len(costs) == 0 {
		return nil, nil
	}
	return json.Marshal(costs)
}

// Mover is a transaction that keeps the units' counts (store.Journal).
type Mover interface {
	store.Tx
	Moved(task string, from, to store.State)
}

// Finished records a Finish the backend applied to a running unit of
// task: its count moves from running to the op's state, and the rules
// that follow a Finish run (store.FinishApplied).
func Finished(t Mover, task string, op *store.Finish, r *store.Result) error {
	t.Moved(task, store.Running, op.State)
	return store.FinishApplied(t, op, r)
}

// Fenced reports whether op is an owner's op whose epoch is not the stored
// one. *stored caches the stored epoch for the transaction (negative: not
// read yet); read reads it.
func Fenced(op store.Op, stored *int64, read func() (int64, error)) (bool, error) {
	epoch, ok := OwnerEpoch(op)
	if !ok {
		return false, nil
	}
	if *stored < 0 {
		e, err := read()
		if err != nil {
			return false, err
		}
		*stored = e
	}
	return epoch != *stored, nil
}

// StaleUnless is the Err of an executor's report that did not apply:
// store.ErrStaleRun unless its run is still assigned to it (assigned: a
// repeated report); err is the read's.
func StaleUnless(assigned bool, err error) (error, error) {
	if err != nil || assigned {
		return nil, err
	}
	return store.ErrStaleRun, nil
}

// Str is *p, or "" for nil (a NULL column).
func Str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
