package sqlite

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// txn is one Apply on the writer's driver connection. It talks to the
// driver directly: database/sql's per-statement bookkeeping is a large part
// of the writer's cost, and the writer is the one serial path.
type txn struct {
	s    *Store
	ctx  context.Context
	dc   driverConn
	args []driver.NamedValue // scratch, reused by every statement
	// merged maps a Finish to the outcome of the Claim it was merged into
	// (see mergeClaims).
	merged map[*store.Finish]bool
	pairs  map[*store.Claim]*store.Finish
	// queued is the change this transaction makes to the queued count; it
	// is written once, at commit.
	queued int
	// ranges are the sequence numbers this transaction used per task and
	// event type, written to event_ranges at commit (see migration 0003).
	ranges map[rangeKey]*seqRange
}

type rangeKey struct{ task, typ string }

type seqRange struct{ first, last int64 }

func (t *txn) bind(args []any) []driver.NamedValue {
	nv := t.args[:0]
	for i, a := range args {
		switch v := a.(type) {
		case int:
			a = int64(v)
		case bool:
			if v {
				a = int64(1)
			} else {
				a = int64(0)
			}
		}
		nv = append(nv, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	t.args = nv
	return nv
}

func (t *txn) exec(query string, args ...any) (driver.Result, error) {
	st, err := t.s.prepare(t.ctx, t.dc, query)
	if err != nil {
		return nil, err
	}
	return st.(driver.StmtExecContext).ExecContext(t.ctx, t.bind(args))
}

// changed runs an UPDATE or DELETE and reports whether it touched a row.
func (t *txn) changed(query string, args ...any) (bool, error) {
	res, err := t.exec(query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// all runs a query and returns every row.
func (t *txn) all(query string, args ...any) ([][]driver.Value, error) {
	st, err := t.s.prepare(t.ctx, t.dc, query)
	if err != nil {
		return nil, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(t.ctx, t.bind(args))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	n := len(rows.Columns())
	var out [][]driver.Value
	for {
		row := make([]driver.Value, n)
		if err := rows.Next(row); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
}

// one runs a query and returns its first row, if any.
func (t *txn) one(query string, args ...any) ([]driver.Value, bool, error) {
	rows, err := t.all(query, args...)
	if err != nil || len(rows) == 0 {
		return nil, false, err
	}
	return rows[0], true, nil
}

func asInt(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case float64:
		return int64(x)
	case bool:
		if x {
			return 1
		}
	}
	return 0
}

func asStr(v driver.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return ""
}

// Apply runs ops in one transaction. See store.Store.
func (s *Store) Apply(ctx context.Context, ops []store.Op) ([]store.Result, error) {
	results := make([]store.Result, len(ops))
	err := s.wconn.Raw(func(dc any) error {
		t := &txn{s: s, ctx: ctx, dc: dc.(driverConn), pairs: mergeClaims(ops)}
		if len(t.pairs) > 0 {
			t.merged = make(map[*store.Finish]bool, len(t.pairs))
		}
		tx, err := t.dc.BeginTx(ctx, driver.TxOptions{})
		if err != nil {
			return err
		}
		for i, op := range ops {
			if err := t.apply(op, &results[i]); err != nil {
				tx.Rollback()
				return err
			}
		}
		if t.queued != 0 {
			if _, err := t.exec(`UPDATE meta SET value = value + ? WHERE key = 'queued'`, int64(t.queued)); err != nil {
				tx.Rollback()
				return err
			}
		}
		for k, r := range t.ranges {
			if _, err := t.exec(`INSERT INTO event_ranges(task, type, first, last) VALUES(?,?,?,?)`, k.task, k.typ, r.first, r.last); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			tx.Rollback()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// opError is an op's own failure: roll back the op, keep the batch.
type opError struct{ err error }

func (e opError) Error() string { return e.err.Error() }

func (t *txn) apply(op store.Op, r *store.Result) error {
	switch op := op.(type) {
	case *store.Insert:
		if simpleInsert(op) {
			// One unit, no dependency, no idempotency key: its single
			// INSERT applies whole or fails whole, so no savepoint.
			err := t.insert(op, r)
			var oe opError
			if errors.As(err, &oe) {
				*r = store.Result{Err: oe.err}
				return nil
			}
			return err
		}
		return t.savepoint(r, func() error { return t.insert(op, r) })
	case *store.Claim:
		if f := t.pairs[op]; f != nil {
			return t.claimFinish(op, f, r)
		}
		return t.claim(op, r)
	case *store.Finish:
		if applied, ok := t.merged[op]; ok {
			return t.finishMerged(op, applied, r)
		}
		return t.finish(op, r)
	case *store.Recover:
		return t.recover(op, r)
	case *store.Cancel:
		return t.savepoint(r, func() error { return t.cancel(op, r) })
	case *store.Requeue:
		return t.requeue(op, r)
	case *store.Heartbeat:
		ok, err := t.changed(`UPDATE work_units SET heartbeat_at=?, lease_expires_at=max(lease_expires_at, ?)
			WHERE id=? AND state='running' AND leased_by=? AND runs=?`,
			ns(op.At), ns(op.LeaseExpires), op.ID, op.Owner, op.Run)
		r.Applied = ok
		return err
	case *store.PutTask:
		_, err := t.exec(`INSERT INTO tasks(name, def) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET def=excluded.def`, op.Name, nullBytes(op.Def))
		r.Applied = err == nil
		return err
	case *store.PutService:
		return t.putService(op, r)
	case *store.AppendEvent:
		ev := op.Event
		if err := t.event(&ev, op.Event.Time); err != nil {
			return err
		}
		r.Applied = true
		r.Events = append(r.Events, ev)
		return nil
	case *store.Prune:
		return t.prune(op, r)
	case *store.FailQueued:
		return t.failQueued(op, r)
	}
	return fmt.Errorf("runcue: sqlite: unknown op %T", op)
}

// savepoint runs f inside a savepoint; an opError rolls back only f's work
// and is reported on r.
func (t *txn) savepoint(r *store.Result, f func() error) error {
	if _, err := t.exec("SAVEPOINT op"); err != nil {
		return err
	}
	queued := t.queued
	err := f()
	var oe opError
	if errors.As(err, &oe) {
		if _, err := t.exec("ROLLBACK TO op"); err != nil {
			return err
		}
		t.queued = queued
		*r = store.Result{Err: oe.err}
	} else if err != nil {
		return err
	}
	_, err = t.exec("RELEASE op")
	return err
}

// event appends ev, filling Seq, and Time from at when zero.
func (t *txn) event(ev *store.Event, at time.Time) error {
	if ev.Time.IsZero() {
		ev.Time = at
	}
	res, err := t.exec(`INSERT INTO events(type, at, work_id, task, attempt, data) VALUES(?,?,?,?,?,?)`,
		ev.Type, ns(ev.Time), nullStr(ev.WorkID), nullStr(ev.Task), int64(ev.Attempt), nullBytes(ev.Data))
	if err != nil {
		return err
	}
	if ev.Seq, err = res.LastInsertId(); err != nil {
		return err
	}
	k := rangeKey{ev.Task, ev.Type}
	if r, ok := t.ranges[k]; ok {
		r.last = ev.Seq
	} else {
		if t.ranges == nil {
			t.ranges = make(map[rangeKey]*seqRange, 4)
		}
		t.ranges[k] = &seqRange{ev.Seq, ev.Seq}
	}
	return nil
}

func (t *txn) events(r *store.Result, evs []store.Event, id string, at time.Time) error {
	for _, e := range evs {
		if e.WorkID == "" {
			e.WorkID = id
		}
		if err := t.event(&e, at); err != nil {
			return err
		}
		r.Events = append(r.Events, e)
	}
	return nil
}

func nullBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

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

func (t *txn) claim(op *store.Claim, r *store.Result) error {
	ok, err := t.changed(`UPDATE work_units SET state='running', runs=?, started_at=?, leased_by=?, lease_expires_at=?, heartbeat_at=0
		WHERE id=? AND state='queued' AND cancel_requested=0`,
		op.Run, ns(op.At), op.Owner, ns(op.LeaseExpires), op.ID)
	if err != nil || !ok {
		return err
	}
	t.queued--
	return t.claimed(op, r)
}

// claimed records an applied Claim: one service_log row per service the
// unit holds, and the Claim's events.
func (t *txn) claimed(op *store.Claim, r *store.Result) error {
	r.Applied = true
	for _, svc := range op.ServiceLog {
		if _, err := t.exec(`INSERT INTO service_log(service, started_at, work_id) VALUES(?,?,?)`, svc, ns(op.At), op.ID); err != nil {
			return err
		}
	}
	return t.events(r, op.Events, op.ID, op.At)
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
	return string(append(b, '}'))
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

// appendAttempt is the SQL expression that appends ? (an attemptJSON) to the
// attempts column, a JSON array, by string operations.
const appendAttempt = `CASE WHEN attempts IS NULL THEN '[' || ? || ']'
	ELSE substr(attempts, 1, length(attempts) - 1) || ',' || ? || ']' END`

// finishArgs are the values a Finish writes: state, finished_at, result,
// error, error_kind, run_at, the failure and deferral increments, and the
// attempt (twice, for appendAttempt).
func finishArgs(f *store.Finish) []any {
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
	att := attemptJSON(f.Attempt)
	return []any{string(f.State), finished, result, nullStr(f.Error), nullStr(f.ErrorKind), ns(f.RunAt), spend, deferral, att, att}
}

func (t *txn) finish(op *store.Finish, r *store.Result) error {
	ok, err := t.changed(`UPDATE work_units SET state=?, finished_at=?, result=?, error=?, error_kind=?, run_at=?,
			failures=failures+?, deferrals=deferrals+?, leased_by=NULL, lease_expires_at=0, cancel_requested=0,
			attempts=`+appendAttempt+`
		WHERE id=? AND state='running' AND leased_by=? AND runs=?`,
		append(finishArgs(op), op.ID, op.Owner, op.Run)...)
	if err != nil || !ok {
		return err
	}
	if op.State == store.Queued {
		t.queued++
	}
	return t.finished(op, r)
}

// finished records an applied Finish: its events and, for a failed or
// cancelled unit, the propagation to its dependents.
func (t *txn) finished(op *store.Finish, r *store.Result) error {
	r.Applied = true
	if err := t.events(r, op.Events, op.ID, op.At); err != nil {
		return err
	}
	if op.Propagate && (op.State == store.Failed || op.State == store.Cancelled) {
		return t.propagate(op.ID, op.State, op.CascadeCancel, op.At, r)
	}
	return nil
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

func (t *txn) recover(op *store.Recover, r *store.Result) error {
	rows, err := t.all(`SELECT id, task, runs, started_at, cancel_requested FROM work_units WHERE state='running' ORDER BY seq`)
	if err != nil {
		return err
	}
	type run struct {
		id, task  string
		runs      int
		started   int64
		cancelReq bool
	}
	var runs []run
	for _, row := range rows {
		runs = append(runs, run{asStr(row[0]), asStr(row[1]), int(asInt(row[2])), asInt(row[3]), asInt(row[4]) != 0})
	}
	for _, x := range runs {
		att := attemptJSON(store.Attempt{Run: x.runs, Start: tm(x.started), End: op.At, Outcome: "abandoned",
			Error: "owner stopped before the run finished"})
		if x.cancelReq {
			if _, err := t.exec(`UPDATE work_units SET state='cancelled', finished_at=?, error='cancelled', error_kind='cancelled',
					leased_by=NULL, lease_expires_at=0, cancel_requested=0, attempts=`+appendAttempt+`
				WHERE id=?`, ns(op.At), att, att, x.id); err != nil {
				return err
			}
			ev := store.Event{Type: store.EventWorkCancelled, WorkID: x.id, Task: x.task, Attempt: x.runs}
			if err := t.event(&ev, op.At); err != nil {
				return err
			}
			r.Events = append(r.Events, ev)
			if err := t.propagate(x.id, store.Cancelled, false, op.At, r); err != nil {
				return err
			}
			continue
		}
		if _, err := t.exec(`UPDATE work_units SET state='queued', leased_by=NULL, lease_expires_at=0,
				attempts=`+appendAttempt+` WHERE id=?`, att, att, x.id); err != nil {
			return err
		}
		t.queued++
		ev := store.Event{Type: store.EventWorkRecovered, WorkID: x.id, Task: x.task, Attempt: x.runs}
		if err := t.event(&ev, op.At); err != nil {
			return err
		}
		r.Events = append(r.Events, ev)
		r.IDs = append(r.IDs, x.id)
	}
	r.Applied = len(runs) > 0
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

func (t *txn) stringList(query string, args ...any) ([]string, error) {
	rows, err := t.all(query, args...)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rows))
	for i, row := range rows {
		out[i] = asStr(row[0])
	}
	return out, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

func (t *txn) putService(op *store.PutService, r *store.Result) error {
	if _, err := t.exec(`INSERT INTO services(name, def) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET def=coalesce(excluded.def, def)`,
		op.Name, nullBytes(op.Def)); err != nil {
		return err
	}
	if op.Override != nil {
		if _, err := t.exec(`UPDATE services SET override=? WHERE name=?`, nullBytes(op.Override), op.Name); err != nil {
			return err
		}
	}
	if op.Paused != nil {
		if _, err := t.exec(`UPDATE services SET paused=? WHERE name=?`, *op.Paused, op.Name); err != nil {
			return err
		}
	}
	if op.Circuit != nil {
		if len(op.Circuit) == 0 {
			if _, err := t.exec(`DELETE FROM circuit_state WHERE service=?`, op.Name); err != nil {
				return err
			}
		} else if _, err := t.exec(`INSERT INTO circuit_state(service, state) VALUES(?, ?)
				ON CONFLICT(service) DO UPDATE SET state=excluded.state`, op.Name, op.Circuit); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
}

func (t *txn) prune(op *store.Prune, r *store.Result) error {
	limit := op.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	if !op.Before.IsZero() {
		ids, err := t.stringList(`SELECT id FROM work_units WHERE finished_at > 0 AND finished_at < ?
			AND state IN ('completed','failed','cancelled') ORDER BY finished_at LIMIT ?`, ns(op.Before), int64(limit))
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := t.exec(`DELETE FROM work_units WHERE id=?`, id); err != nil {
				return err
			}
			// Edges from and to the unit: a dependency that finished and
			// was pruned is satisfied, not unknown.
			if _, err := t.exec(`DELETE FROM dependencies WHERE unit_id=?1 OR depends_on=?1`, id); err != nil {
				return err
			}
		}
		r.Count = len(ids)
		r.More = limit > 0 && len(ids) == limit
	}
	more := func(res driver.Result) {
		if n, _ := res.RowsAffected(); limit > 0 && n == int64(limit) {
			r.More = true
		}
	}
	if !op.EventsBefore.IsZero() {
		// Events are appended in time order, so the old ones are a prefix.
		if res, err := t.exec(`DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq <
				coalesce((SELECT seq FROM events WHERE at >= ? ORDER BY seq LIMIT 1), (SELECT max(seq) + 1 FROM events)) ORDER BY seq LIMIT ?)`,
			ns(op.EventsBefore), int64(limit)); err != nil {
			return err
		} else {
			more(res)
		}
		// Ranges wholly before the oldest event left describe nothing.
		if res, err := t.exec(`DELETE FROM event_ranges WHERE rowid IN (SELECT rowid FROM event_ranges WHERE last <
				coalesce((SELECT min(seq) FROM events), (SELECT max(last) + 1 FROM event_ranges)) LIMIT ?)`, int64(limit)); err != nil {
			return err
		} else {
			more(res)
		}
	}
	if op.LogBefore != nil {
		for svc, before := range op.LogBefore {
			if strings.HasSuffix(svc, ":") {
				// A class: every keyed instance, by a range on the index.
				hi := svc[:len(svc)-1] + ";" // ';' follows ':'
				res, err := t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
						WHERE service >= ? AND service < ? AND started_at < ? LIMIT ?)`, svc, hi, ns(before), int64(limit))
				if err != nil {
					return err
				}
				more(res)
				continue
			}
			res, err := t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
					WHERE service=? AND started_at < ? LIMIT ?)`, svc, ns(before), int64(limit))
			if err != nil {
				return err
			}
			more(res)
		}
	}
	r.Applied = true
	return nil
}

func simpleInsert(op *store.Insert) bool {
	if len(op.Units) != 1 || op.MaxQueued > 0 {
		return false
	}
	u := op.Units[0]
	return len(u.DependsOn) == 0 && u.IdempotencyKey == ""
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
	args := append([]any{c.Run, ns(c.At)}, finishArgs(f)...)
	ok, err := t.changed(`UPDATE work_units SET runs=?, started_at=?, state=?, finished_at=?, result=?, error=?, error_kind=?, run_at=?,
			failures=failures+?, deferrals=deferrals+?, leased_by=NULL, lease_expires_at=0, attempts=`+appendAttempt+`
		WHERE id=? AND state='queued' AND cancel_requested=0`,
		append(args, c.ID)...)
	if err != nil {
		return err
	}
	t.merged[f] = ok
	if !ok {
		return nil
	}
	if f.State != store.Queued {
		t.queued--
	}
	return t.claimed(c, r)
}

// finishMerged completes a Finish already applied by claimFinish.
func (t *txn) finishMerged(op *store.Finish, applied bool, r *store.Result) error {
	if !applied {
		return nil
	}
	return t.finished(op, r)
}
