package sqlite

import (
	"errors"
	"fmt"

	"github.com/runcue/runcue/store"
)

// Insert: storing new units with their dependencies, idempotency keys
// and the queue bound (MaxQueued, drop-oldest), in the op's transaction.

func (t *txn) insert(op *store.Insert, r *store.Result) error {
	units := op.Units
	inBatch := make(map[string]int, len(units))
	for i, u := range units {
		if u.ID == "" || u.Task == "" {
			return opError{errors.New("runcue: sqlite: unit without ID or task")}
		}
		if _, dup := inBatch[u.ID]; dup {
			return opError{fmt.Errorf("%w: %q appears twice in the batch", store.ErrDuplicateID, u.ID)}
		}
		inBatch[u.ID] = i
	}
	if err := store.CheckCycles(units, inBatch); err != nil {
		return opError{err}
	}
	r.Units = make([]store.InsertedUnit, len(units))
	// Units stored in this op, by ID, with their state, so dependencies
	// inside the batch resolve; duplicates (by idempotency key) resolve to
	// the existing unit's state.
	state := make(map[string]store.State, len(units))
	// alias maps a duplicate's ID in the batch to the existing unit's, so
	// its dependents depend on that unit; refused marks units not stored.
	alias := map[string]string{}
	refused := map[string]bool{}
	order := store.TopoOrder(units, inBatch)
outer:
	for _, i := range order {
		u := units[i]
		out := &r.Units[i]
		out.ID = u.ID
		for j, d := range u.DependsOn {
			if refused[d] {
				out.Refused = fmt.Errorf("%w: %q depends on %q", store.ErrDependencyRefused, u.ID, d)
				refused[u.ID] = true
				continue outer
			}
			if a, ok := alias[d]; ok {
				u.DependsOn[j] = a
			}
		}
		if u.IdempotencyKey != "" {
			row, found, err := t.one(`SELECT id, state, seq FROM work_units WHERE idempotency_key=?`, u.IdempotencyKey)
			if err != nil {
				return err
			}
			var id string
			var st store.State
			var seq int64
			if found {
				id, st, seq = asStr(row[0]), store.State(asStr(row[1])), asInt(row[2])
			}
			switch {
			case !found:
			case st != store.Failed && st != store.Cancelled:
				*out = store.InsertedUnit{ID: id, Seq: seq, Duplicate: true, State: st}
				state[id] = st
				if id != u.ID {
					alias[u.ID] = id
				}
				continue
			case op.OnFailedDuplicate == store.RejectFailedDuplicate:
				out.Refused = fmt.Errorf("%w: key %q (unit %s)", store.ErrDuplicate, u.IdempotencyKey, id)
				refused[u.ID] = true
				continue
			default:
				if _, err := t.exec(`UPDATE work_units SET idempotency_key=NULL WHERE id=?`, id); err != nil {
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
					return fmt.Errorf("runcue: sqlite: dependency %q not ordered", d)
				}
				row, found, err := t.one(`SELECT state FROM work_units WHERE id=?`, d)
				if err != nil {
					return err
				}
				if !found {
					return opError{fmt.Errorf("%w: %q (needed by %q)", store.ErrUnknownDependency, d, u.ID)}
				}
				st = store.State(asStr(row[0]))
			}
			switch {
			case st == store.Failed && deadKind == "":
				deadKind = "prerequisite_failed"
			case st == store.Cancelled && deadKind == "":
				deadKind = "prerequisite_cancelled"
			}
		}
		u.State = store.Queued
		var finished int64
		var errMsg, errKind any = nil, nil
		if deadKind != "" {
			u.State = store.Failed
			finished = ns(op.At)
			errMsg, errKind = deadKind, deadKind
		}
		if u.CreatedAt.IsZero() {
			u.CreatedAt = op.At
		}
		res, err := t.exec(`INSERT INTO work_units(id, task, target, params, state, created_at, run_at, timeout, idempotency_key,
				dependency_deadline, retry, trace, finished_at, error, error_kind)
			VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			u.ID, u.Task, u.Target, nullBytes(u.Params), string(u.State), ns(u.CreatedAt), ns(u.RunAt), int64(u.Timeout),
			nullStr(u.IdempotencyKey), ns(u.DependencyDeadline), nullBytes(u.Retry), nullBytes(u.Trace), finished, errMsg, errKind)
		if err != nil {
			if isUnique(err) {
				return opError{fmt.Errorf("%w: %q", store.ErrDuplicateID, u.ID)}
			}
			return err
		}
		u.Seq, _ = res.LastInsertId()
		if u.State == store.Queued {
			t.queued++
		}
		*out = store.InsertedUnit{ID: u.ID, Seq: u.Seq, State: u.State}
		state[u.ID] = u.State
		for _, d := range u.DependsOn {
			if _, err := t.exec(`INSERT OR IGNORE INTO dependencies(unit_id, depends_on) VALUES(?,?)`, u.ID, d); err != nil {
				return err
			}
		}
		ev := store.Event{Type: store.EventWorkQueued, WorkID: u.ID, Task: u.Task}
		if err := t.event(&ev, op.At); err != nil {
			return err
		}
		r.Events = append(r.Events, ev)
		if u.State == store.Failed {
			data := store.PrerequisiteFailedData(deadKind, "")
			ev := store.Event{Type: store.EventWorkFailed, WorkID: u.ID, Task: u.Task, Data: data}
			if err := t.event(&ev, op.At); err != nil {
				return err
			}
			r.Events = append(r.Events, ev)
		}
	}
	if op.MaxQueued > 0 {
		if err := t.makeRoom(op, inBatch, r); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
}

// makeRoom enforces Insert.MaxQueued after the units went in.
func (t *txn) makeRoom(op *store.Insert, inBatch map[string]int, r *store.Result) error {
	row, _, err := t.one(`SELECT value FROM meta WHERE key = 'queued'`)
	if err != nil {
		return err
	}
	over := int(asInt(row[0])) + t.queued - op.MaxQueued
	if over <= 0 {
		return nil
	}
	if !op.DropOldest {
		return opError{fmt.Errorf("%w: %d queued units at most", store.ErrBackpressure, op.MaxQueued)}
	}
	rows, err := t.all(`SELECT id, task FROM work_units WHERE state = 'queued' ORDER BY seq LIMIT ?`, int64(over+len(inBatch)))
	if err != nil {
		return err
	}
	var victims [][2]string
	for _, row := range rows {
		if id := asStr(row[0]); len(victims) < over {
			if _, mine := inBatch[id]; !mine {
				victims = append(victims, [2]string{id, asStr(row[1])})
			}
		}
	}
	if len(victims) < over {
		return opError{fmt.Errorf("%w: %d queued units at most", store.ErrBackpressure, op.MaxQueued)}
	}
	for _, v := range victims {
		if _, err := t.exec(`UPDATE work_units SET state='cancelled', finished_at=?, error='dropped', error_kind='dropped' WHERE id=?`,
			ns(op.At), v[0]); err != nil {
			return err
		}
		t.queued--
		ev := store.Event{Type: store.EventWorkCancelled, WorkID: v[0], Task: v[1], Data: []byte(`{"reason":"dropped"}`)}
		if err := t.event(&ev, op.At); err != nil {
			return err
		}
		r.Events = append(r.Events, ev)
		if err := t.propagate(v[0], store.Cancelled, false, op.At, r); err != nil {
			return err
		}
	}
	return nil
}

func simpleInsert(op *store.Insert) bool {
	if len(op.Units) != 1 || op.MaxQueued > 0 {
		return false
	}
	u := op.Units[0]
	return len(u.DependsOn) == 0 && u.IdempotencyKey == ""
}
