package sqlite

import (
	"fmt"
	"time"

	"github.com/runcue/runcue/store"
)

// Ends and returns of queued units: FailQueued, Cancel, the propagation of
// a unit's failure or cancellation to its dependents, and Requeue.

func (t *txn) failQueued(op *store.FailQueued, r *store.Result) error {
	ok, err := t.changed(`UPDATE work_units SET state='failed', finished_at=?, error=?, error_kind=? WHERE id=? AND state='queued'`,
		ns(op.At), nullStr(op.Error), nullStr(op.ErrorKind), op.ID)
	if err != nil || !ok {
		return err
	}
	t.queued--
	r.Applied = true
	if err := t.events(r, op.Events, op.ID, op.At); err != nil {
		return err
	}
	return t.propagate(op.ID, store.Failed, false, op.At, r)
}

// propagate ends the queued dependents of id, transitively: cancelled when
// cascade is set, otherwise failed with prerequisite_cancelled (direct
// dependents of a cancelled unit) or prerequisite_failed.
func (t *txn) propagate(id string, rootState store.State, cascade bool, at time.Time, r *store.Result) error {
	type item struct {
		id   string
		kind string
	}
	frontier := []item{{id: id}}
	for len(frontier) > 0 {
		cur := frontier[0]
		frontier = frontier[1:]
		rows, err := t.all(`SELECT w.id, w.task FROM dependencies d JOIN work_units w ON w.id = d.unit_id
			WHERE d.depends_on = ? AND w.state = 'queued' ORDER BY d.rowid`, cur.id)
		if err != nil {
			return err
		}
		for _, row := range rows {
			d := struct{ id, task string }{asStr(row[0]), asStr(row[1])}
			var state store.State
			var kind, evType string
			switch {
			case cascade:
				state, kind, evType = store.Cancelled, "cancelled", store.EventWorkCancelled
			case cur.id == id && rootState == store.Cancelled:
				state, kind, evType = store.Failed, "prerequisite_cancelled", store.EventWorkFailed
			default:
				state, kind, evType = store.Failed, "prerequisite_failed", store.EventWorkFailed
			}
			ok, err := t.changed(`UPDATE work_units SET state=?, finished_at=?, error=?, error_kind=? WHERE id=? AND state='queued'`,
				string(state), ns(at), "prerequisite "+cur.id+": "+kind, kind, d.id)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			t.queued--
			var b []byte
			if state == store.Failed {
				b = store.PrerequisiteFailedData(kind, cur.id)
			} else {
				b = store.CascadeCancelledData(kind, cur.id)
			}
			ev := store.Event{Type: evType, WorkID: d.id, Task: d.task, Data: b}
			if err := t.event(&ev, at); err != nil {
				return err
			}
			r.Events = append(r.Events, ev)
			frontier = append(frontier, item{id: d.id, kind: kind})
		}
	}
	return nil
}

func (t *txn) cancel(op *store.Cancel, r *store.Result) error {
	row, found, err := t.one(`SELECT state, task, cancel_requested FROM work_units WHERE id=?`, op.ID)
	if err != nil {
		return err
	}
	if !found {
		return opError{fmt.Errorf("%w: %q", store.ErrNotFound, op.ID)}
	}
	state, task, cancelReq := store.State(asStr(row[0])), asStr(row[1]), asInt(row[2]) != 0
	r.State = state
	switch state {
	case store.Queued:
		reason := op.Reason
		if reason == "" {
			reason = "cancelled"
		}
		if _, err := t.exec(`UPDATE work_units SET state='cancelled', finished_at=?, error=?, error_kind='cancelled' WHERE id=?`,
			ns(op.At), reason, op.ID); err != nil {
			return err
		}
		t.queued--
		r.Applied = true
		evs := op.Events
		if len(evs) == 0 {
			evs = []store.Event{{Type: store.EventWorkCancelled, Task: task}}
		}
		if err := t.events(r, evs, op.ID, op.At); err != nil {
			return err
		}
		return t.propagate(op.ID, store.Cancelled, op.Cascade, op.At, r)
	case store.Running:
		if !cancelReq {
			if _, err := t.exec(`UPDATE work_units SET cancel_requested=? WHERE id=?`, cancelFlag(op.Cascade), op.ID); err != nil {
				return err
			}
			data := store.CancelRequestedData(op.Cascade, op.Reason)
			ev := store.Event{Type: store.EventWorkCancelRequested, WorkID: op.ID, Task: task, Data: data}
			if err := t.event(&ev, op.At); err != nil {
				return err
			}
			r.Events = append(r.Events, ev)
		}
	}
	return nil
}

// cancelFlag encodes a cancellation request: 1 plain, 2 cascading.
func cancelFlag(cascade bool) int {
	if cascade {
		return 2
	}
	return 1
}

func (t *txn) requeue(op *store.Requeue, r *store.Result) error {
	var roots []string
	if len(op.IDs) > 0 {
		roots = op.IDs
	} else {
		q := `SELECT id FROM work_units WHERE state='failed'`
		var args []any
		if len(op.Tasks) > 0 {
			q += ` AND task IN (` + placeholders(len(op.Tasks)) + `)`
			for _, t := range op.Tasks {
				args = append(args, t)
			}
		}
		if !op.FinishedBefore.IsZero() {
			q += ` AND finished_at < ?`
			args = append(args, ns(op.FinishedBefore))
		}
		q += ` ORDER BY seq`
		var err error
		if roots, err = t.stringList(q, args...); err != nil {
			return err
		}
	}
	requeued := make(map[string]bool)
	var frontier []string
	for _, id := range roots {
		ok, err := t.requeueOne(id, op.At, r)
		if err != nil {
			return err
		}
		if ok {
			requeued[id] = true
			frontier = append(frontier, id)
		}
	}
	// Dependents that failed only because of a requeued unit: every one of
	// their dependencies is now alive.
	for len(frontier) > 0 {
		cur := frontier[0]
		frontier = frontier[1:]
		deps, err := t.stringList(`SELECT d.unit_id FROM dependencies d JOIN work_units w ON w.id = d.unit_id
			WHERE d.depends_on=? AND w.state='failed' AND w.error_kind IN ('prerequisite_failed','prerequisite_cancelled')`, cur)
		if err != nil {
			return err
		}
		for _, dep := range deps {
			if requeued[dep] {
				continue
			}
			row, _, err := t.one(`SELECT count(*) FROM dependencies d JOIN work_units w ON w.id = d.depends_on
				WHERE d.unit_id=? AND w.state IN ('failed','cancelled')`, dep)
			if err != nil {
				return err
			}
			if asInt(row[0]) > 0 {
				continue
			}
			ok, err := t.requeueOne(dep, op.At, r)
			if err != nil {
				return err
			}
			if ok {
				requeued[dep] = true
				frontier = append(frontier, dep)
			}
		}
	}
	r.Applied = len(r.IDs) > 0
	return nil
}

func (t *txn) requeueOne(id string, at time.Time, r *store.Result) (bool, error) {
	row, found, err := t.one(`UPDATE work_units SET state='queued', failures=0, deferrals=0, run_at=0, finished_at=0,
			error=NULL, error_kind=NULL, leased_by=NULL, lease_expires_at=0
		WHERE id=? AND state='failed' RETURNING task`, id)
	if err != nil || !found {
		return false, err
	}
	t.queued++
	task := asStr(row[0])
	ev := store.Event{Type: store.EventWorkQueued, WorkID: id, Task: task, Data: []byte(`{"reason":"retry"}`)}
	if err := t.event(&ev, at); err != nil {
		return false, err
	}
	r.Events = append(r.Events, ev)
	r.IDs = append(r.IDs, id)
	return true, nil
}
