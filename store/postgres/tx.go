package postgres

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
)

// txn as a store.Tx: the storage the shared rules in package store read
// and write inside the op's transaction. Rows the rules decide on are
// locked (FOR UPDATE, FOR SHARE), so that a rule's read holds until
// commit against other processes' writers.

var _ store.Tx = (*txn)(nil)

func (t *txn) UnitState(id string) (store.State, bool, error) {
	var st string
	ok, err := t.one(`SELECT state FROM work_units WHERE id=$1 FOR SHARE`, []any{id}, &st)
	return store.State(st), ok, err
}

func (t *txn) UnitByKey(key string) (string, store.State, int64, bool, error) {
	// The key's unique index makes a concurrent insert of the same key
	// wait for this transaction, or this one for it.
	var id, st string
	var seq int64
	ok, err := t.one(`SELECT id, state, seq FROM work_units WHERE idempotency_key=$1 FOR UPDATE`, []any{key}, &id, &st, &seq)
	return id, store.State(st), seq, ok, err
}

func (t *txn) ReleaseKey(id string) error {
	_, err := t.exec(`UPDATE work_units SET idempotency_key=NULL WHERE id=$1`, id)
	return err
}

func (t *txn) InsertUnit(u *store.Unit, finished time.Time, errKind string) (int64, error) {
	var costs any
	if len(u.Costs) > 0 {
		b, err := json.Marshal(u.Costs)
		if err != nil {
			return 0, err
		}
		costs = b
	}
	var seq int64
	ok, err := t.one(`INSERT INTO work_units(id, task, target, created_at, state, params, run_at, timeout, idempotency_key,
			dependency_deadline, retry, trace, finished_at, error, error_kind, costs)
		VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15)
		ON CONFLICT DO NOTHING RETURNING seq`,
		[]any{u.ID, u.Task, u.Target, ns(u.CreatedAt), string(u.State), nullBytes(u.Params), ns(u.RunAt), int64(u.Timeout),
			nullStr(u.IdempotencyKey), ns(u.DependencyDeadline), nullBytes(u.Retry), nullBytes(u.Trace), ns(finished),
			nullStr(errKind), costs}, &seq)
	if err != nil {
		return 0, err
	}
	if !ok {
		// A conflict on the ID (a key's conflict was found by UnitByKey
		// first, under its lock).
		return 0, &store.OpError{Err: fmt.Errorf("%w: %q", store.ErrDuplicateID, u.ID)}
	}
	t.moved(u.Task, "", u.State)
	for _, d := range u.DependsOn {
		if _, err := t.exec(`INSERT INTO dependencies(unit_id, depends_on) VALUES($1, $2) ON CONFLICT DO NOTHING`, u.ID, d); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

func (t *txn) EndQueued(id string, st store.State, at time.Time, errMsg, errKind string) (bool, error) {
	var task string
	ok, err := t.one(`UPDATE work_units SET state=$1, finished_at=$2, error=$3, error_kind=$4 WHERE id=$5 AND state='queued' RETURNING task`,
		[]any{string(st), ns(at), nullStr(errMsg), nullStr(errKind), id}, &task)
	if ok {
		t.moved(task, store.Queued, st)
	}
	return ok, err
}

func (t *txn) QueuedDependents(id string) ([]store.UnitRef, error) {
	return t.refs(`SELECT w.id, w.task, w.target FROM dependencies d JOIN work_units w ON w.id = d.unit_id
		WHERE d.depends_on = $1 AND w.state = 'queued' ORDER BY d.n FOR UPDATE OF w`, id)
}

func (t *txn) refs(query string, args ...any) ([]store.UnitRef, error) {
	rows, err := t.tx.Query(t.ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.UnitRef, error) {
		var r store.UnitRef
		err := row.Scan(&r.ID, &r.Task, &r.Target)
		return r, err
	})
}

func (t *txn) QueuedCount() (int, error) {
	// The queued counts' rows are locked: two processes' inserts against
	// MaxQueued count one after the other.
	var n int64
	if _, err := t.exec(`SELECT 1 FROM unit_counts WHERE state = 'queued' FOR UPDATE`); err != nil {
		return 0, err
	}
	if _, err := t.one(`SELECT coalesce(sum(n), 0) FROM unit_counts WHERE state = 'queued'`, nil, &n); err != nil {
		return 0, err
	}
	return int(n) + t.queued, nil
}

func (t *txn) OldestQueued(n int) ([]store.UnitRef, error) {
	return t.refs(`SELECT id, task, target FROM work_units WHERE state = 'queued' ORDER BY seq LIMIT $1 FOR UPDATE`, n)
}

func (t *txn) CancelTarget(id string) (store.State, store.UnitRef, bool, bool, error) {
	var st string
	var ref store.UnitRef
	var req int
	ok, err := t.one(`SELECT state, task, cancel_requested, target FROM work_units WHERE id=$1 FOR UPDATE`, []any{id},
		&st, &ref.Task, &req, &ref.Target)
	ref.ID = id
	return store.State(st), ref, req != 0, ok, err
}

func (t *txn) RequestCancel(id string, cascade bool) error {
	flag := 1
	if cascade {
		flag = 2
	}
	_, err := t.exec(`UPDATE work_units SET cancel_requested=$1 WHERE id=$2`, flag, id)
	return err
}

func (t *txn) FailedUnits(tasks []string, finishedBefore time.Time) ([]string, error) {
	q := `SELECT id FROM work_units WHERE state='failed'`
	var args []any
	if len(tasks) > 0 {
		args = append(args, tasks)
		q += fmt.Sprintf(` AND task = ANY($%d)`, len(args))
	}
	if !finishedBefore.IsZero() {
		args = append(args, ns(finishedBefore))
		q += fmt.Sprintf(` AND finished_at < $%d`, len(args))
	}
	return t.strings(q+` ORDER BY seq`, args...)
}

func (t *txn) RequeueFailed(id string) (store.UnitRef, bool, error) {
	ref := store.UnitRef{ID: id}
	ok, err := t.one(`UPDATE work_units SET state='queued', failures=0, deferrals=0, run_at=0, finished_at=0,
			error=NULL, error_kind=NULL, leased_by=NULL, lease_expires_at=0
		WHERE id=$1 AND state='failed' RETURNING task, target`, []any{id}, &ref.Task, &ref.Target)
	if err != nil || !ok {
		return store.UnitRef{}, false, err
	}
	t.moved(ref.Task, store.Failed, store.Queued)
	return ref, true, nil
}

func (t *txn) FailedByPrerequisite(id string) ([]string, error) {
	return t.strings(`SELECT d.unit_id FROM dependencies d JOIN work_units w ON w.id = d.unit_id
		WHERE d.depends_on=$1 AND w.state='failed' AND w.error_kind IN ('prerequisite_failed','prerequisite_cancelled')
		ORDER BY d.n`, id)
}

func (t *txn) DeadDependencies(id string) (int, error) {
	// The dependencies are share-locked: one ending meanwhile in another
	// process waits for this transaction (the dependent's insert), and
	// then finds the dependent.
	var n int
	if _, err := t.exec(`SELECT 1 FROM dependencies d JOIN work_units w ON w.id = d.depends_on WHERE d.unit_id=$1 FOR SHARE OF w`, id); err != nil {
		return 0, err
	}
	_, err := t.one(`SELECT count(*) FROM dependencies d JOIN work_units w ON w.id = d.depends_on
		WHERE d.unit_id=$1 AND w.state IN ('failed','cancelled')`, []any{id}, &n)
	return n, err
}

func (t *txn) AppendEvent(ev *store.Event, at time.Time) error { return t.event(ev, at) }

// RunningUnits implements store.Tx.
func (t *txn) RunningUnits(ids []string) ([]store.RunningRef, error) {
	q := `SELECT id, task, target, runs, started_at, epoch, lease_expires_at, cancel_requested FROM work_units
		WHERE state='running'`
	args := []any{}
	if len(ids) > 0 {
		q += ` AND id = ANY($1)`
		args = append(args, ids)
	}
	rows, err := t.tx.Query(t.ctx, q+` ORDER BY seq FOR UPDATE`, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.RunningRef, error) {
		var r store.RunningRef
		var started, expires int64
		var cancel int
		err := row.Scan(&r.ID, &r.Task, &r.Target, &r.Runs, &started, &r.Epoch, &expires, &cancel)
		r.Started, r.LeaseExpires, r.CancelRequested = tm(started), tm(expires), cancel != 0
		return r, err
	})
}

// EndRunning implements store.Tx.
func (t *txn) EndRunning(id string, runs int, st store.State, at time.Time, attempt store.Attempt, errMsg, errKind string) (bool, error) {
	var finished int64
	if st.Terminal() {
		finished = ns(at)
	}
	var task string
	ok, err := t.one(`UPDATE work_units SET state=$1, finished_at=$2, error=coalesce($3, error), error_kind=coalesce($4, error_kind),
			leased_by=NULL, lease_expires_at=0, cancel_requested=0, attempts=`+appendAttempt(5)+`
		WHERE id=$6 AND state='running' AND runs=$7 RETURNING task`,
		[]any{string(st), finished, nullStr(errMsg), nullStr(errKind), store.AttemptJSON(attempt), id, runs}, &task)
	if err != nil || !ok {
		return false, err
	}
	t.moved(task, store.Running, st)
	return true, nil
}

// appendAttempt is the SQL expression that appends parameter $n (an
// AttemptJSON) to the attempts column, a JSON array kept as text.
func appendAttempt(n int) string {
	p := fmt.Sprintf("$%d::text", n)
	return `CASE WHEN attempts IS NULL OR attempts = '' THEN '[' || ` + p + ` || ']'
		ELSE left(attempts, length(attempts) - 1) || ',' || ` + p + ` || ']' END`
}
