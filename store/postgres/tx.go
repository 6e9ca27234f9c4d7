package postgres

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
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

// InsertUnit buffers u's row (and its dependency edges) for one
// multi-row INSERT at the next statement or the op's end (flushInserts),
// with a sequence number taken ahead (an Insert of 1,000 units is a few
// round trips, not 1,000). An ID already stored is found at the flush: an
// *OpError wrapping ErrDuplicateID, which rolls the op back.
func (t *txn) InsertUnit(u *store.Unit, finished time.Time, errKind string) (int64, error) {
	costs, err := sqlcommon.EncodeCosts(u.Costs)
	if err != nil {
		return 0, err
	}
	if len(t.seqs) == 0 {
		// The numbers are taken as one block: the sequence moved on once
		// (a nextval a number wrote the sequence's page each time). No
		// other transaction takes numbers meanwhile: inserts are writers'
		// ops, which take turns (see Apply).
		n := int64(max(t.seqWant-t.ins.len(), 1))
		var last int64
		if err := t.tx.QueryRow(t.ctx, `SELECT setval(s, nextval(s) + $1 - 1) FROM pg_get_serial_sequence('work_units', 'seq') AS s`,
			n).Scan(&last); err != nil {
			return 0, err
		}
		for v := last - n + 1; v <= last; v++ {
			t.seqs = append(t.seqs, v)
		}
	}
	seq := t.seqs[0]
	t.seqs = t.seqs[1:]
	b := &t.ins
	b.seq = append(b.seq, seq)
	b.id = append(b.id, u.ID)
	b.task = append(b.task, u.Task)
	b.target = append(b.target, u.Target)
	b.created = append(b.created, ns(u.CreatedAt))
	b.state = append(b.state, string(u.State))
	b.params = append(b.params, orNil(u.Params))
	b.runAt = append(b.runAt, ns(u.RunAt))
	b.timeout = append(b.timeout, int64(u.Timeout))
	b.key = append(b.key, strPtr(u.IdempotencyKey))
	b.deadline = append(b.deadline, ns(u.DependencyDeadline))
	b.retry = append(b.retry, orNil(u.Retry))
	b.trace = append(b.trace, orNil(u.Trace))
	b.finished = append(b.finished, ns(finished))
	b.errKind = append(b.errKind, strPtr(errKind))
	b.costs = append(b.costs, costs)
	for _, d := range u.DependsOn {
		b.depUnit, b.depOn = append(b.depUnit, u.ID), append(b.depOn, d)
	}
	t.Moved(u.Task, "", u.State)
	return seq, nil
}

// insertBuf holds the rows InsertUnit buffered, a slice per column.
type insertBuf struct {
	seq, created, runAt, timeout, deadline, finished []int64
	id, task, target, state                          []string
	key, errKind                                     []*string
	params, retry, trace, costs                      [][]byte
	depUnit, depOn                                   []string
}

func (b *insertBuf) len() int { return len(b.id) }

func (b *insertBuf) reset() {
	*b = insertBuf{seq: b.seq[:0], created: b.created[:0], runAt: b.runAt[:0], timeout: b.timeout[:0], deadline: b.deadline[:0],
		finished: b.finished[:0], id: b.id[:0], task: b.task[:0], target: b.target[:0], state: b.state[:0], key: b.key[:0],
		errKind: b.errKind[:0], params: b.params[:0], retry: b.retry[:0], trace: b.trace[:0], costs: b.costs[:0],
		depUnit: b.depUnit[:0], depOn: b.depOn[:0]}
}

// flushInserts writes the buffered rows: the units in one statement, then
// their dependency edges. A unit whose ID is already stored is an
// *OpError wrapping ErrDuplicateID (the op is rolled back).
//
// copyMin rows or more are written with COPY (copyUnits) unless t.noCopy:
// a row then costs the writer less than by INSERT (BenchmarkInsertCopy,
// docs/performance.md). COPY has no ON CONFLICT: a unit already stored
// fails the transaction with errCopyConflict, and Apply writes it again
// with the INSERT, which finds the unit.
func (t *txn) flushInserts() error {
	if err := t.flushLater(); err != nil {
		return err
	}
	b := &t.ins
	if b.len() == 0 {
		return nil
	}
	defer b.reset()
	var stored []string
	var err error
	if b.len() >= copyMin && !t.noCopy {
		err = t.copyUnits()
		stored = b.id
	} else {
		stored, err = t.insertUnits()
	}
	if err != nil {
		return err
	}
	if len(stored) < b.len() {
		in := make(map[string]bool, len(stored))
		for _, id := range stored {
			in[id] = true
		}
		for _, id := range b.id {
			if !in[id] {
				// A conflict on the ID (a key's conflict was found by
				// UnitByKey first, under the writers' lock).
				return &store.OpError{Err: fmt.Errorf("%w: %q", store.ErrDuplicateID, id)}
			}
		}
	}
	if len(b.depUnit) > 0 {
		if _, err := t.tx.Exec(t.ctx, `INSERT INTO dependencies(unit_id, depends_on)
			SELECT u, d FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS v(u, d, i) ORDER BY i ON CONFLICT DO NOTHING`,
			b.depUnit, b.depOn); err != nil {
			return err
		}
	}
	return nil
}

// insertUnits writes the buffered rows with an INSERT and returns the IDs
// of those it stored: not those already stored.
func (t *txn) insertUnits() ([]string, error) {
	b := &t.ins
	rows, err := t.tx.Query(t.ctx, `INSERT INTO work_units(seq, id, task, target, created_at, state, params, run_at, timeout,
			idempotency_key, dependency_deadline, retry, trace, finished_at, error, error_kind, costs, events)
		SELECT seq, id, task, target, created_at, state, params, run_at, timeout, key, deadline, retry, trace, finished, kind, kind, costs, rec
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bytea[], $8::bigint[], $9::bigint[],
			$10::text[], $11::bigint[], $12::bytea[], $13::bytea[], $14::bigint[], $15::text[], $16::bytea[], $17::bytea[])
			WITH ORDINALITY AS v(seq, id, task, target, created_at, state, params, run_at, timeout, key, deadline, retry, trace, finished, kind, costs,
				rec, i)
		ORDER BY i
		ON CONFLICT DO NOTHING RETURNING id`,
		b.seq, b.id, b.task, b.target, b.created, b.state, b.params, b.runAt, b.timeout, b.key, b.deadline, b.retry, b.trace,
		b.finished, b.errKind, b.costs, t.insertRecords())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// copyMin is the fewest buffered rows flushInserts writes with COPY. A
// unit's write by COPY, commit included, against by INSERT, as measured
// on this project's 2-core machine when it was chosen: 16 rows 37-39
// against 41-42 µs, 64 rows 13-15 against 18.5-18.9, 1,000 rows 5.9
// against 9.1. Fewer rows were not measured ahead.
const copyMin = 16

// insertColumns are the columns a unit's row is written with, as
// insertUnits and copyUnits write them.
var insertColumns = []string{"seq", "id", "task", "target", "created_at", "state", "params", "run_at", "timeout",
	"idempotency_key", "dependency_deadline", "retry", "trace", "finished_at", "error", "error_kind", "costs", "events"}

// errCopyConflict is copyUnits' error when a row's ID or key is already
// stored: the transaction is rolled back, and Apply writes it again with
// INSERT (t.noCopy).
var errCopyConflict = errors.New("runcue: postgres: a unit COPY wrote is already stored")

// copyUnits writes the buffered rows with COPY, all or none.
func (t *txn) copyUnits() error {
	b := &t.ins
	recs := t.insertRecords()
	row := make([]any, len(insertColumns))
	n, err := t.tx.CopyFrom(t.ctx, pgx.Identifier{"work_units"}, insertColumns, pgx.CopyFromSlice(b.len(), func(i int) ([]any, error) {
		// The row's values are encoded before the next call: one slice
		// serves every row.
		row[0], row[1], row[2], row[3], row[4], row[5] = b.seq[i], b.id[i], b.task[i], b.target[i], b.created[i], b.state[i]
		row[6], row[7], row[8], row[9], row[10], row[11] = b.params[i], b.runAt[i], b.timeout[i], b.key[i], b.deadline[i], b.retry[i]
		row[12], row[13], row[14], row[15], row[16], row[17] = b.trace[i], b.finished[i], b.errKind[i], b.errKind[i], b.costs[i], recs[i]
		return row, nil
	}))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
		return fmt.Errorf("%w: %w", errCopyConflict, err)
	}
	if err == nil && n != int64(b.len()) {
		err = fmt.Errorf("runcue: postgres: COPY wrote %d of %d units", n, b.len())
	}
	return err
}

// insertRecords returns the records of their events (store.UnitRecord)
// for the buffered units, from the transaction's pending events, and marks
// those events recorded (flushEvents does not append them again): a new
// unit's row is written once, not inserted and then updated at commit.
// ApplyInsert appends a unit's events right after it buffers the unit,
// before any statement, so they are all pending here.
func (t *txn) insertRecords() [][]byte {
	b := &t.ins
	recs := make([][]byte, b.len())
	if len(t.pending) == 0 {
		return recs
	}
	at := make(map[string]int, b.len())
	for i, id := range b.id {
		at[id] = i
	}
	for i := range t.pending {
		ev := &t.pending[i]
		k, ok := at[ev.WorkID]
		if !ok || t.recorded[ev.Seq] {
			continue
		}
		recs[k] = store.AppendUnitRecord(recs[k], ev.Seq, false)
		if t.recorded == nil {
			t.recorded = map[int64]bool{}
		}
		t.recorded[ev.Seq] = true
	}
	return recs
}

// strPtr is s, or nil (NULL) when empty.
func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// orNil is b, or nil (NULL) when empty.
func orNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func (t *txn) EndQueued(id string, st store.State, at time.Time, errMsg, errKind string) (bool, error) {
	var task string
	ok, err := t.one(`UPDATE work_units SET state=$1, finished_at=$2, error=$3, error_kind=$4 WHERE id=$5 AND state='queued' RETURNING task`,
		[]any{string(st), ns(at), nullStr(errMsg), nullStr(errKind), id}, &task)
	if ok {
		t.Moved(task, store.Queued, st)
	}
	return ok, err
}

func (t *txn) QueuedDependents(id string) ([]store.UnitRef, error) {
	return t.refs(`SELECT w.id, w.task, w.target FROM dependencies d JOIN work_units w ON w.id = d.unit_id
		WHERE d.depends_on = $1 AND w.state = 'queued' ORDER BY d.n FOR UPDATE OF w`, id)
}

func (t *txn) refs(query string, args ...any) ([]store.UnitRef, error) {
	rows, err := t.query(query, args...)
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
	return int(n) + t.Queued, nil
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
	t.Moved(ref.Task, store.Failed, store.Queued)
	return ref, true, nil
}

func (t *txn) RequestCancel(id string, cascade bool) error {
	_, err := t.exec(`UPDATE work_units SET cancel_requested=$1 WHERE id=$2`, sqlcommon.CancelFlag(cascade), id)
	return err
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
	q := `SELECT w.id, w.task, w.target, w.runs, w.started_at, w.epoch, w.lease_expires_at, w.cancel_requested,
			coalesce(a.executor, ''), coalesce(e.seen_at, 0), coalesce(e.ttl_ns, 0)
		FROM work_units w LEFT JOIN assignments a ON a.work_id = w.id AND a.run = w.runs LEFT JOIN executors e ON e.id = a.executor
		WHERE w.state='running'`
	args := []any{}
	if len(ids) > 0 {
		q += ` AND w.id = ANY($1)`
		args = append(args, ids)
	}
	rows, err := t.query(q+` ORDER BY w.seq FOR UPDATE OF w`, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.RunningRef, error) {
		var r store.RunningRef
		var started, expires, seen, ttl int64
		var cancel int
		err := row.Scan(&r.ID, &r.Task, &r.Target, &r.Runs, &started, &r.Epoch, &expires, &cancel, &r.Executor, &seen, &ttl)
		r.Started, r.LeaseExpires, r.CancelRequested = tm(started), tm(expires), cancel != 0
		r.ExecutorSeen, r.ExecutorTTL = tm(seen), time.Duration(ttl)
		return r, err
	})
}

// EndRunning implements store.Tx.
func (t *txn) EndRunning(id string, runs int, st store.State, at time.Time, attempt store.Attempt, errMsg, errKind string) (bool, error) {
	finished := sqlcommon.FinishedAt(st, at)
	var task string
	ok, err := t.one(`UPDATE work_units SET state=$1, finished_at=$2, error=coalesce($3, error), error_kind=coalesce($4, error_kind),
			leased_by=NULL, lease_expires_at=0, cancel_requested=0, attempts=`+appendAttempt(5)+`
		WHERE id=$6 AND state='running' AND runs=$7 RETURNING task`,
		[]any{string(st), finished, nullStr(errMsg), nullStr(errKind), store.AttemptJSON(attempt), id, runs}, &task)
	if err != nil || !ok {
		return false, err
	}
	t.Moved(task, store.Running, st)
	return true, nil
}

// appendAttempt is the SQL expression that appends parameter $n (an
// AttemptJSON) to the attempts column, a JSON array kept as text.
func appendAttempt(n int) string {
	p := fmt.Sprintf("$%d::text", n)
	return `CASE WHEN attempts IS NULL OR attempts = '' THEN '[' || ` + p + ` || ']'
		ELSE left(attempts, length(attempts) - 1) || ',' || ` + p + ` || ']' END`
}

func (t *txn) SkipDebounced(key, by string, at time.Time) (store.UnitRef, time.Time, bool, error) {
	var holder string
	var since int64
	ok, err := t.one(`SELECT unit_id, since FROM debounces WHERE key=$1 FOR UPDATE`, []any{key}, &holder, &since)
	if err != nil || !ok {
		return store.UnitRef{}, time.Time{}, false, err
	}
	var ref store.UnitRef
	ok, err = t.one(`UPDATE work_units SET state='skipped', finished_at=$1, error=$2, error_kind=$3
		WHERE id=$4 AND state='queued' AND runs=0 RETURNING id, task, target`,
		[]any{ns(at), "replaced by " + by, store.DebounceKind, holder}, &ref.ID, &ref.Task, &ref.Target)
	if err != nil || !ok {
		return store.UnitRef{}, time.Time{}, false, err
	}
	t.Moved(ref.Task, store.Queued, store.Skipped)
	return ref, time.Unix(0, since), true, nil
}

func (t *txn) HoldDebounce(key, id string, since time.Time) error {
	_, err := t.exec(`INSERT INTO debounces(key, unit_id, since) VALUES($1, $2, $3)
		ON CONFLICT(key) DO UPDATE SET unit_id=excluded.unit_id, since=excluded.since`, key, id, ns(since))
	return err
}
