package sqlite

import (
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// A run's ops: Claim, Finish (and a Claim and Finish of one run merged
// into one update), Recover; the attempt history they append.

func (t *txn) claim(op *store.Claim, r *store.Result) error {
	rec, err := t.recordArg(op.ID, len(op.Events), false)
	if err != nil {
		return err
	}
	task, ok, err := t.update(op.Task, `UPDATE work_units SET state='running', runs=?, started_at=?, leased_by=?, lease_expires_at=?, heartbeat_at=0,
			epoch=?, `+recordSet+`
		WHERE id=? AND state='queued' AND cancel_requested=0`,
		op.Run, ns(op.At), t.box(op.Owner), ns(op.LeaseExpires), op.Epoch, rec, op.ID)
	if err != nil || !ok {
		t.expect = expectation{}
		return err
	}
	t.Moved(task, store.Queued, store.Running)
	return t.claimed(op, r)
}

// claimed records an applied Claim: one service_log row per entry of its
// Log, and the Claim's events.
func (t *txn) claimed(op *store.Claim, r *store.Result) error {
	r.Applied = true
	t.NoteWait(op.At, op.Wait)
	for _, e := range op.Log {
		if _, err := t.exec(`INSERT INTO service_log(service, meter, amount, started_at, work_id) VALUES(?,?,?,?,?)`,
			t.box(e.Service), t.box(e.Meter), e.Amount, ns(op.At), op.ID); err != nil {
			return err
		}
	}
	return store.AppendEvents(t, r, op.Events, op.ID, "", op.At)
}

// A Finish's write binds only what the outcome has: the common one (a
// completion with or without a result, no error, no retry time, nothing
// to count) is written with its constants in the statement, a few values
// bound, instead of every column the other outcomes need. finishForm is
// the shape of a Finish's SET terms, and keys the statements prepared for
// it (Store.finishSQL).
type finishForm uint16

const (
	formCompleted finishForm = 1 << iota // state is 'completed' (else bound)
	formResult                           // a result to store (else NULL)
	formError                            // an error or its kind (else NULL)
	formRunAt                            // a retry time (else 0)
	formSpend                            // a failure to count
	formDeferral                         // a deferral to count
	formTerminal                         // finished_at is set (else 0)
	formRecord                           // entries for the unit's record
	formMerged                           // the Claim's columns too (claimFinish)
)

// finishShape returns f's form and appends the values it binds, in the
// order of finishSet's terms.
func (t *txn) finishShape(args []any, f *store.Finish, rec any, merged bool) (finishForm, []any) {
	var form finishForm
	if merged {
		form |= formMerged
	}
	if f.State == store.Completed {
		form |= formCompleted
	} else {
		args = append(args, t.box(string(f.State)))
	}
	if f.State.Terminal() {
		form |= formTerminal
		args = append(args, ns(f.At))
	}
	if f.State == store.Completed && len(f.Result) > 0 {
		form |= formResult
		args = append(args, f.Result)
	}
	if f.Error != "" || f.ErrorKind != "" {
		form |= formError
		args = append(args, nullStr(f.Error), t.nullBox(f.ErrorKind))
	}
	if !f.RunAt.IsZero() {
		form |= formRunAt
		args = append(args, ns(f.RunAt))
	}
	if f.SpendBudget {
		form |= formSpend
	}
	if f.Deferral {
		form |= formDeferral
	}
	args = append(args, store.AttemptJSON(f.Attempt))
	if rec != nil {
		form |= formRecord
		args = append(args, rec)
	}
	return form, args
}

// finishSet returns the SET terms of a Finish of form, for finishShape's
// values.
func finishSet(form finishForm) string {
	var b strings.Builder
	if form&formMerged != 0 {
		b.WriteString("runs=?, started_at=?, epoch=?, ")
	}
	if form&formCompleted != 0 {
		b.WriteString("state='completed', ")
	} else {
		b.WriteString("state=?, ")
	}
	if form&formTerminal != 0 {
		b.WriteString("finished_at=?, ")
	} else {
		b.WriteString("finished_at=0, ")
	}
	if form&formResult != 0 {
		b.WriteString("result=?, ")
	} else {
		b.WriteString("result=NULL, ")
	}
	if form&formError != 0 {
		b.WriteString("error=?, error_kind=?, ")
	} else {
		b.WriteString("error=NULL, error_kind=NULL, ")
	}
	if form&formRunAt != 0 {
		b.WriteString("run_at=?, ")
	} else {
		b.WriteString("run_at=0, ")
	}
	if form&formSpend != 0 {
		b.WriteString("failures=failures+1, ")
	}
	if form&formDeferral != 0 {
		b.WriteString("deferrals=deferrals+1, ")
	}
	b.WriteString("leased_by=NULL, lease_expires_at=0, attempts=" + appendAttempt)
	if form&formRecord != 0 {
		b.WriteString(", " + recordSet)
	}
	return b.String()
}

// finishSQL returns the statement of form: a Finish of a run (merged:
// with its Claim, under the Claim's precondition).
func (s *Store) finishSQL(form finishForm) string {
	if q, ok := s.finishStmts[form]; ok {
		return q
	}
	q := `UPDATE work_units SET ` + finishSet(form)
	if form&formMerged != 0 {
		q += ` WHERE id=? AND state='queued' AND cancel_requested=0`
	} else {
		q += `, cancel_requested=0 WHERE id=? AND state='running' AND leased_by=? AND runs=?`
	}
	if s.finishStmts == nil {
		s.finishStmts = make(map[finishForm]string)
	}
	s.finishStmts[form] = q
	return q
}

func (t *txn) finish(op *store.Finish, r *store.Result) error {
	rec, err := t.recordArg(op.ID, len(op.Events), false)
	if err != nil {
		return err
	}
	form, args := t.finishShape(t.vals[:0], op, rec, false)
	t.vals = append(args, op.ID, t.box(op.Owner), op.Run)
	task, ok, err := t.update(op.Task, t.s.finishSQL(form), t.vals...)
	if err != nil || !ok {
		t.expect = expectation{}
		return err
	}
	return sqlcommon.Finished(t, task, op, r)
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
	// The Finish's events come later in the batch, at numbers not known
	// yet: one entry records every event of the unit from the Claim's on.
	rec, err := t.recordArg(c.ID, 0, true)
	if err != nil {
		return err
	}
	form, args := t.finishShape(append(t.vals[:0], c.Run, ns(c.At), c.Epoch), f, rec, true)
	t.vals = append(args, c.ID)
	task, ok, err := t.update(c.Task, t.s.finishSQL(form), t.vals...)
	if err != nil || !ok {
		delete(t.more, c.ID)
	}
	if err != nil {
		return err
	}
	t.merged[f] = ok
	if !ok {
		return nil
	}
	t.Moved(task, store.Queued, f.State)
	return t.claimed(c, r)
}

// finishMerged completes a Finish already applied by claimFinish.
func (t *txn) finishMerged(op *store.Finish, applied bool, r *store.Result) error {
	if !applied {
		return nil
	}
	return store.FinishApplied(t, op, r)
}

// runningQuery reads the running units a new owner looks at. Its state
// NOT IN term is the open-units index's condition: a long history of
// finished units is not walked at every start (TestOpenUnitQueriesUseIndex).
const runningQuery = `SELECT w.id, w.task, w.target, w.runs, w.started_at, w.epoch, w.lease_expires_at, w.cancel_requested,
		coalesce(a.executor, ''), coalesce(e.seen_at, 0), coalesce(e.ttl_ns, 0)
	FROM work_units w LEFT JOIN assignments a ON a.work_id = w.id AND a.run = w.runs LEFT JOIN executors e ON e.id = a.executor
	WHERE w.state='running' AND w.state NOT IN ('completed', 'skipped') ORDER BY w.seq`

// RunningUnits implements store.Tx. (SQLite's writer holds the database:
// no row lock is needed.)
func (t *txn) RunningUnits(ids []string) ([]store.RunningRef, error) {
	rows, err := t.all(runningQuery)
	if err != nil {
		return nil, err
	}
	var only map[string]bool
	if len(ids) > 0 {
		only = make(map[string]bool, len(ids))
		for _, id := range ids {
			only[id] = true
		}
	}
	var out []store.RunningRef
	for _, row := range rows {
		id := asStr(row[0])
		if only != nil && !only[id] {
			continue
		}
		out = append(out, store.RunningRef{UnitRef: store.UnitRef{ID: id, Task: asStr(row[1]), Target: asStr(row[2])},
			Runs: int(asInt(row[3])), Started: tm(asInt(row[4])), Epoch: asInt(row[5]), LeaseExpires: tm(asInt(row[6])),
			CancelRequested: asInt(row[7]) != 0, Executor: asStr(row[8]), ExecutorSeen: tm(asInt(row[9])), ExecutorTTL: time.Duration(asInt(row[10]))})
	}
	return out, nil
}

// EndRunning implements store.Tx.
func (t *txn) EndRunning(id string, runs int, st store.State, at time.Time, attempt store.Attempt, errMsg, errKind string) (bool, error) {
	finished := sqlcommon.FinishedAt(st, at)
	row, ok, err := t.one(`UPDATE work_units SET state=?, finished_at=?, error=coalesce(?, error), error_kind=coalesce(?, error_kind),
			leased_by=NULL, lease_expires_at=0, cancel_requested=0, attempts=`+appendAttempt+`
		WHERE id=? AND state='running' AND runs=? RETURNING task`,
		t.box(string(st)), finished, nullStr(errMsg), nullStr(errKind), store.AttemptJSON(attempt), id, runs)
	if err != nil || !ok {
		return false, err
	}
	t.Moved(asStr(row[0]), store.Running, st)
	return true, nil
}
