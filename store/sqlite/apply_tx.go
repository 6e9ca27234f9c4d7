package sqlite

import (
	"database/sql/driver"
	"fmt"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// txn as a store.Tx: the storage the shared rules in package store (Insert,
// Cancel, FailQueued, Requeue, propagation to dependents) read and write
// inside the op's transaction. Each keeps the queued count in step.

var _ store.Tx = (*txn)(nil)

func (t *txn) UnitState(id string) (store.State, bool, error) {
	row, found, err := t.one(`SELECT state FROM work_units WHERE id=?`, id)
	if err != nil || !found {
		return "", false, err
	}
	return store.State(asStr(row[0])), true, nil
}

func (t *txn) UnitByKey(key string) (string, store.State, int64, bool, error) {
	row, found, err := t.one(`SELECT id, state, seq FROM work_units WHERE idempotency_key=?`, key)
	if err != nil || !found {
		return "", "", 0, false, err
	}
	return asStr(row[0]), store.State(asStr(row[1])), asInt(row[2]), true, nil
}

func (t *txn) ReleaseKey(id string) error {
	_, err := t.exec(`UPDATE work_units SET idempotency_key=NULL WHERE id=?`, id)
	return err
}

// insertForm says which of a unit's optional columns its INSERT binds, and
// keys the statements prepared for it (Store.insertSQL).
type insertForm uint16

const (
	insState insertForm = 1 << iota // state (else 'queued')
	insParams
	insRunAt
	insTimeout
	insKey
	insDeadline
	insRetry
	insTrace
	insFailed // finished_at, error, error_kind
	insCosts
	insRecord // events
)

// insertCols are the optional columns by insertForm bit, in that order.
var insertCols = [...]string{"state", "params", "run_at", "timeout", "idempotency_key", "dependency_deadline",
	"retry", "trace", "finished_at, error, error_kind", "costs", "events"}

// insertSQL returns the INSERT of a unit of form.
func (s *Store) insertSQL(form insertForm) string {
	if s.insertStmts == nil {
		s.insertStmts = make(map[insertForm]string)
	}
	if q, ok := s.insertStmts[form]; ok {
		return q
	}
	cols, n := "id, task, target, created_at", 4
	state := ""
	if form&insState == 0 {
		state = ", 'queued'"
	}
	for i, c := range insertCols {
		if form&(1<<i) != 0 {
			cols += ", " + c
			n += strings.Count(c, ",") + 1
		}
	}
	if state != "" {
		cols += ", state"
	}
	q := `INSERT INTO work_units(` + cols + `) VALUES(` + placeholders(n) + state + `)`
	s.insertStmts[form] = q
	return q
}

func (t *txn) InsertUnit(u *store.Unit, finished time.Time, errKind string) (int64, error) {
	b, err := sqlcommon.EncodeCosts(u.Costs)
	if err != nil {
		return 0, err
	}
	costs := nullBytes(b)
	// The rules append the unit's work_queued event right after, and its
	// work_failed when it is stored failed (store.ApplyInsert).
	n := 1
	if u.State == store.Failed {
		n = 2
	}
	rec, err := t.recordArg(u.ID, n, false)
	if err != nil {
		return 0, err
	}
	// Only the columns the unit has are bound (a plain queued unit: ID,
	// task, target, creation time and record); the rest keep their
	// defaults.
	t.vals = append(t.vals[:0], u.ID, t.box(u.Task), u.Target, ns(u.CreatedAt))
	var form insertForm
	add := func(f insertForm, v any) {
		form |= f
		t.vals = append(t.vals, v)
	}
	if u.State != store.Queued {
		add(insState, t.box(string(u.State)))
	}
	if len(u.Params) > 0 {
		add(insParams, u.Params)
	}
	if !u.RunAt.IsZero() {
		add(insRunAt, ns(u.RunAt))
	}
	if u.Timeout != 0 {
		add(insTimeout, int64(u.Timeout))
	}
	if u.IdempotencyKey != "" {
		add(insKey, u.IdempotencyKey)
	}
	if !u.DependencyDeadline.IsZero() {
		add(insDeadline, ns(u.DependencyDeadline))
	}
	if len(u.Retry) > 0 {
		add(insRetry, u.Retry)
	}
	if len(u.Trace) > 0 {
		add(insTrace, u.Trace)
	}
	if !finished.IsZero() || errKind != "" {
		add(insFailed, ns(finished))
		t.vals = append(t.vals, nullStr(errKind), nullStr(errKind))
	}
	if costs != nil {
		add(insCosts, costs)
	}
	if rec != nil {
		add(insRecord, rec)
	}
	res, err := t.exec(t.s.insertSQL(form), t.vals...)
	if err != nil {
		t.expect = expectation{}
		if isUnique(err) {
			return 0, &store.OpError{Err: fmt.Errorf("%w: %q", store.ErrDuplicateID, u.ID)}
		}
		return 0, err
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	t.Moved(u.Task, "", u.State)
	for _, d := range u.DependsOn {
		if _, err := t.exec(`INSERT OR IGNORE INTO dependencies(unit_id, depends_on) VALUES(?,?)`, u.ID, d); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

func (t *txn) EndQueued(id string, st store.State, at time.Time, errMsg, errKind string) (bool, error) {
	row, ok, err := t.one(`UPDATE work_units SET state=?, finished_at=?, error=?, error_kind=? WHERE id=? AND state='queued' RETURNING task`,
		string(st), ns(at), nullStr(errMsg), nullStr(errKind), id)
	if ok {
		t.Moved(asStr(row[0]), store.Queued, st)
	}
	return ok, err
}

func (t *txn) QueuedDependents(id string) ([]store.UnitRef, error) {
	rows, err := t.all(`SELECT w.id, w.task, w.target FROM dependencies d JOIN work_units w ON w.id = d.unit_id
		WHERE d.depends_on = ? AND w.state = 'queued' ORDER BY d.rowid`, id)
	return unitRefs(rows), err
}

func (t *txn) QueuedCount() (int, error) {
	row, _, err := t.one(`SELECT coalesce(sum(n), 0) FROM unit_counts WHERE state = 'queued'`)
	if err != nil {
		return 0, err
	}
	return int(asInt(row[0])) + t.Queued, nil
}

func (t *txn) OldestQueued(n int) ([]store.UnitRef, error) {
	rows, err := t.all(oldestQueuedQuery, int64(n))
	return unitRefs(rows), err
}

func unitRefs(rows [][]driver.Value) []store.UnitRef {
	out := make([]store.UnitRef, len(rows))
	for i, row := range rows {
		out[i] = store.UnitRef{ID: asStr(row[0]), Task: asStr(row[1]), Target: asStr(row[2])}
	}
	return out
}

func (t *txn) CancelTarget(id string) (store.State, store.UnitRef, bool, bool, error) {
	row, found, err := t.one(`SELECT state, task, cancel_requested, target FROM work_units WHERE id=?`, id)
	if err != nil || !found {
		return "", store.UnitRef{}, false, false, err
	}
	return store.State(asStr(row[0])), store.UnitRef{ID: id, Task: asStr(row[1]), Target: asStr(row[3])}, asInt(row[2]) != 0, true, nil
}

func (t *txn) RequestCancel(id string, cascade bool) error {
	_, err := t.exec(`UPDATE work_units SET cancel_requested=? WHERE id=?`, sqlcommon.CancelFlag(cascade), id)
	return err
}

func (t *txn) FailedUnits(tasks []string, finishedBefore time.Time) ([]string, error) {
	q, args := `SELECT id FROM work_units WHERE state='failed'`, make([]any, 0, len(tasks)+1)
	if len(tasks) > 0 {
		q += ` AND task IN (` + placeholders(len(tasks)) + `)`
		for _, t := range tasks {
			args = append(args, t)
		}
	}
	if !finishedBefore.IsZero() {
		q += ` AND finished_at < ?`
		args = append(args, ns(finishedBefore))
	}
	return t.stringList(q+` ORDER BY seq`, args...)
}

func (t *txn) RequeueFailed(id string) (store.UnitRef, bool, error) {
	row, found, err := t.one(`UPDATE work_units SET state='queued', failures=0, deferrals=0, run_at=0, finished_at=0,
			error=NULL, error_kind=NULL, leased_by=NULL, lease_expires_at=0
		WHERE id=? AND state='failed' RETURNING task, target`, id)
	if err != nil || !found {
		return store.UnitRef{}, false, err
	}
	t.Moved(asStr(row[0]), store.Failed, store.Queued)
	return store.UnitRef{ID: id, Task: asStr(row[0]), Target: asStr(row[1])}, true, nil
}

func (t *txn) FailedByPrerequisite(id string) ([]string, error) {
	return t.stringList(`SELECT d.unit_id FROM dependencies d JOIN work_units w ON w.id = d.unit_id
		WHERE d.depends_on=? AND w.state='failed' AND w.error_kind IN ('prerequisite_failed','prerequisite_cancelled')`, id)
}

func (t *txn) DeadDependencies(id string) (int, error) {
	row, _, err := t.one(`SELECT count(*) FROM dependencies d JOIN work_units w ON w.id = d.depends_on
		WHERE d.unit_id=? AND w.state IN ('failed','cancelled')`, id)
	if err != nil {
		return 0, err
	}
	return int(asInt(row[0])), nil
}

func (t *txn) AppendEvent(ev *store.Event, at time.Time) error { return t.event(ev, at) }

// oldestQueuedQuery reads the oldest queued units. Its state NOT IN term is
// the open-units index's condition: the units are found through that
// partial index, without walking finished ones (TestOpenUnitQueriesUseIndex).
const oldestQueuedQuery = `SELECT id, task, target FROM work_units WHERE state = 'queued' AND state NOT IN ('completed', 'skipped')
	ORDER BY seq LIMIT ?`

func (t *txn) SkipDebounced(key, by string, at time.Time) (store.UnitRef, time.Time, bool, error) {
	row, ok, err := t.one(`SELECT unit_id, since FROM debounces WHERE key=?`, key)
	if err != nil || !ok {
		return store.UnitRef{}, time.Time{}, false, err
	}
	since := time.Unix(0, asInt(row[1]))
	row, ok, err = t.one(`UPDATE work_units SET state='skipped', finished_at=?, error=?, error_kind=?
		WHERE id=? AND state='queued' AND runs=0 RETURNING id, task, target`,
		ns(at), "replaced by "+by, store.DebounceKind, asStr(row[0]))
	if err != nil || !ok {
		return store.UnitRef{}, time.Time{}, false, err
	}
	ref := store.UnitRef{ID: asStr(row[0]), Task: asStr(row[1]), Target: asStr(row[2])}
	t.Moved(ref.Task, store.Queued, store.Skipped)
	return ref, since, true, nil
}

func (t *txn) HoldDebounce(key, id string, since time.Time) error {
	_, err := t.exec(`INSERT INTO debounces(key, unit_id, since) VALUES(?, ?, ?)
		ON CONFLICT(key) DO UPDATE SET unit_id=excluded.unit_id, since=excluded.since`, key, id, ns(since))
	return err
}
