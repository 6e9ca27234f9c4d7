package sqlite

import (
	"encoding/json"
	"strconv"
	"unsafe"

	"github.com/runcue/runcue/store"
)

// A run's ops: Claim, Finish (and a Claim and Finish of one run merged
// into one update), Recover; the attempt history they append.

func (t *txn) claim(op *store.Claim, r *store.Result) error {
	task, ok, err := t.update(op.Task, `UPDATE work_units SET state='running', runs=?, started_at=?, leased_by=?, lease_expires_at=?, heartbeat_at=0
		WHERE id=? AND state='queued' AND cancel_requested=0`,
		op.Run, ns(op.At), t.box(op.Owner), ns(op.LeaseExpires), op.ID)
	if err != nil || !ok {
		return err
	}
	t.moved(task, store.Queued, store.Running)
	return t.claimed(op, r)
}

// claimed records an applied Claim: one service_log row per service the
// unit holds, and the Claim's events.
func (t *txn) claimed(op *store.Claim, r *store.Result) error {
	r.Applied = true
	t.noteWait(op.At, op.Wait)
	for _, svc := range op.ServiceLog {
		if _, err := t.exec(`INSERT INTO service_log(service, started_at, work_id) VALUES(?,?,?)`, t.box(svc), ns(op.At), op.ID); err != nil {
			return err
		}
	}
	return store.AppendEvents(t, r, op.Events, op.ID, "", op.At)
}

// attemptJSON formats an attempt as its history entry:
// {"run":N,"start":ns,"end":ns,"outcome":"...","error":"..."}.
func attemptJSON(a store.Attempt) string {
	b := make([]byte, 0, 96+len(a.Error))
	b = append(b, `{"run":`...)
	b = strconv.AppendInt(b, int64(a.Run), 10)
	b = append(b, `,"start":`...)
	b = strconv.AppendInt(b, ns(a.Start), 10)
	b = append(b, `,"end":`...)
	b = strconv.AppendInt(b, ns(a.End), 10)
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, a.Outcome)
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, a.Error)
	}
	b = append(b, '}')
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again
}

func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// finishArgs appends to args the values a Finish writes: state,
// finished_at, result, error, error_kind, run_at, the failure and deferral
// increments, and the attempt (for appendAttempt).
func (t *txn) finishArgs(args []any, f *store.Finish) []any {
	var finished int64
	if f.State.Terminal() {
		finished = ns(f.At)
	}
	var result any = nil
	if f.State == store.Completed {
		result = nullBytes(f.Result)
	}
	spend, deferral := 0, 0
	if f.SpendBudget {
		spend = 1
	}
	if f.Deferral {
		deferral = 1
	}
	return append(args, t.box(string(f.State)), finished, result, nullStr(f.Error), t.nullBox(f.ErrorKind), ns(f.RunAt), spend, deferral, attemptJSON(f.Attempt))
}

func (t *txn) finish(op *store.Finish, r *store.Result) error {
	t.vals = append(t.finishArgs(t.vals[:0], op), op.ID, t.box(op.Owner), op.Run)
	task, ok, err := t.update(op.Task, `UPDATE work_units SET state=?, finished_at=?, result=?, error=?, error_kind=?, run_at=?,
			failures=failures+?, deferrals=deferrals+?, leased_by=NULL, lease_expires_at=0, cancel_requested=0,
			attempts=`+appendAttempt+`
		WHERE id=? AND state='running' AND leased_by=? AND runs=?`,
		t.vals...)
	if err != nil || !ok {
		return err
	}
	t.moved(task, store.Running, op.State)
	return store.FinishApplied(t, op, r)
}

func (t *txn) recover(op *store.Recover, r *store.Result) error {
	rows, err := t.all(runningQuery)
	if err != nil {
		return err
	}
	type run struct {
		id, task  string
		target    string
		runs      int
		started   int64
		cancelReq bool
	}
	var runs []run
	for _, row := range rows {
		runs = append(runs, run{asStr(row[0]), asStr(row[1]), asStr(row[5]), int(asInt(row[2])), asInt(row[3]), asInt(row[4]) != 0})
	}
	for _, x := range runs {
		att := attemptJSON(store.Attempt{Run: x.runs, Start: tm(x.started), End: op.At, Outcome: "abandoned",
			Error: "owner stopped before the run finished"})
		if x.cancelReq {
			if _, err := t.exec(`UPDATE work_units SET state='cancelled', finished_at=?, error='cancelled', error_kind='cancelled',
					leased_by=NULL, lease_expires_at=0, cancel_requested=0, attempts=`+appendAttempt+`
				WHERE id=?`, ns(op.At), att, x.id); err != nil {
				return err
			}
			t.moved(x.task, store.Running, store.Cancelled)
			ev := store.Event{Type: store.EventWorkCancelled, WorkID: x.id, Task: x.task, Target: x.target, Attempt: x.runs}
			if err := t.event(&ev, op.At); err != nil {
				return err
			}
			r.Events = append(r.Events, ev)
			if err := store.Propagate(t, x.id, store.Cancelled, false, op.At, r); err != nil {
				return err
			}
			continue
		}
		if _, err := t.exec(`UPDATE work_units SET state='queued', leased_by=NULL, lease_expires_at=0,
				attempts=`+appendAttempt+` WHERE id=?`, att, x.id); err != nil {
			return err
		}
		t.moved(x.task, store.Running, store.Queued)
		ev := store.Event{Type: store.EventWorkRecovered, WorkID: x.id, Task: x.task, Target: x.target, Attempt: x.runs}
		if err := t.event(&ev, op.At); err != nil {
			return err
		}
		r.Events = append(r.Events, ev)
		r.IDs = append(r.IDs, x.id)
	}
	r.Applied = len(runs) > 0
	return nil
}

// mergeClaims finds each Claim followed in the same batch by the Finish of
// the same run, with no op between them that could touch the unit. Such a
// pair is applied as one UPDATE (claimFinish): with fast handlers, a unit's
// claim and its outcome often share a group commit, and merging saves a
// write of the row and its index entries. Each op's events still go at its
// own place, so the event log is the same as without merging.
func mergeClaims(ops []store.Op) map[*store.Claim]*store.Finish {
	var open map[string]*store.Claim // claims waiting for their finish
	var pairs map[*store.Claim]*store.Finish
	for _, op := range ops {
		switch op := op.(type) {
		case *store.Claim:
			if open == nil {
				open = make(map[string]*store.Claim)
			}
			open[op.ID] = op
		case *store.Finish:
			if c := open[op.ID]; c != nil && c.Run == op.Run && c.Owner == op.Owner {
				if pairs == nil {
					pairs = make(map[*store.Claim]*store.Finish)
				}
				pairs[c] = op
			}
			delete(open, op.ID)
		case *store.Heartbeat:
			delete(open, op.ID)
		case *store.Cancel:
			delete(open, op.ID)
		case *store.Insert, *store.AppendEvent, *store.PutTask, *store.PutService:
			// Cannot touch a claimed unit.
		default:
			// Recover, Requeue, Prune may touch any unit.
			clear(open)
		}
	}
	return pairs
}

// claimFinish applies a Claim and its later Finish as one update, with the
// Claim's precondition.
func (t *txn) claimFinish(c *store.Claim, f *store.Finish, r *store.Result) error {
	t.vals = append(t.finishArgs(append(t.vals[:0], c.Run, ns(c.At)), f), c.ID)
	task, ok, err := t.update(c.Task, `UPDATE work_units SET runs=?, started_at=?, state=?, finished_at=?, result=?, error=?, error_kind=?, run_at=?,
			failures=failures+?, deferrals=deferrals+?, leased_by=NULL, lease_expires_at=0, attempts=`+appendAttempt+`
		WHERE id=? AND state='queued' AND cancel_requested=0`,
		t.vals...)
	if err != nil {
		return err
	}
	t.merged[f] = ok
	if !ok {
		return nil
	}
	t.moved(task, store.Queued, f.State)
	return t.claimed(c, r)
}

// finishMerged completes a Finish already applied by claimFinish.
func (t *txn) finishMerged(op *store.Finish, applied bool, r *store.Result) error {
	if !applied {
		return nil
	}
	return store.FinishApplied(t, op, r)
}

// runningQuery reads the running units a new owner requeues. Its state
// NOT IN term is the open-units index's condition: a long history of
// finished units is not walked at every start (TestOpenUnitQueriesUseIndex).
const runningQuery = `SELECT id, task, runs, started_at, cancel_requested, target FROM work_units
	WHERE state='running' AND state NOT IN ('completed', 'skipped') ORDER BY seq`
