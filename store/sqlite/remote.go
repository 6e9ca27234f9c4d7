package sqlite

import (
	"context"
	"encoding/json"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Executors' ops and reads (store.ExecutorStore). The store's clock is
// this host's: every executor of a SQLite database runs on it.

// Now implements store.ExecutorStore.
func (s *Store) Now(context.Context) (time.Time, error) { return time.Now(), nil }

// applyRemote applies an executor's or an assignment's op; ok is false
// for any other op.
func (t *txn) applyRemote(op store.Op, r *store.Result) (ok bool, err error) {
	now := ns(time.Now())
	switch op := op.(type) {
	case *store.RegisterExecutor:
		e := op.Executor
		tasks := sqlcommon.TaskNames(e.Tasks)
		r.Applied, err = t.changed(`INSERT INTO executors(id, host, pid, tasks, capacity, poll_ns, ttl_ns, registered_at, seen_at) VALUES(?,?,?,?,?,?,?,?,?)
			ON CONFLICT(id) DO UPDATE SET host=excluded.host, pid=excluded.pid, tasks=excluded.tasks, capacity=excluded.capacity,
				poll_ns=excluded.poll_ns, ttl_ns=excluded.ttl_ns, registered_at=excluded.registered_at, seen_at=excluded.seen_at
			WHERE executors.seen_at + executors.ttl_ns <= excluded.seen_at OR (executors.host = excluded.host AND executors.pid = excluded.pid)`,
			e.ID, e.Host, e.PID, tasks, e.Capacity, int64(e.Poll), int64(e.TTL), now, now)
		if err == nil && !r.Applied {
			r.Err = store.ErrExecutorTaken
		}
		return true, err
	case *store.RemoveExecutor:
		if op.PID != 0 {
			r.Applied, err = t.changed(`DELETE FROM executors WHERE id=? AND host=? AND pid=?`, op.ID, op.Host, op.PID)
		} else {
			r.Applied, err = t.changed(`DELETE FROM executors WHERE id=?`, op.ID)
		}
		return true, err
	case *store.ExecutorBeat:
		if op.PID != 0 {
			r.Applied, err = t.changed(`UPDATE executors SET seen_at=? WHERE id=? AND host=? AND pid=?`, now, op.ID, op.Host, op.PID)
		} else {
			r.Applied, err = t.changed(`UPDATE executors SET seen_at=? WHERE id=?`, now, op.ID)
		}
		if err != nil || !r.Applied {
			return true, err
		}
		_, err = t.exec(`UPDATE work_units SET lease_expires_at=max(lease_expires_at, ?), heartbeat_at=?
			WHERE id IN (SELECT work_id FROM assignments WHERE executor=? AND state < 2) AND state='running'
				AND runs = (SELECT run FROM assignments WHERE work_id = work_units.id)`,
			now+int64(op.TTL), now, op.ID)
		return true, err
	case *store.Assign:
		r.Applied, err = t.changed(`INSERT INTO assignments(work_id, run, executor, task, start_by, timeout_ns)
			SELECT id, runs, ?, task, ?, ? FROM work_units WHERE id=? AND state='running' AND runs=? AND leased_by=?
			ON CONFLICT(work_id) DO UPDATE SET run=excluded.run, executor=excluded.executor, task=excluded.task,
				start_by=excluded.start_by, timeout_ns=excluded.timeout_ns, state=0, cancel=NULL, started_at=0, ending=NULL`,
			op.Executor, ns(op.StartBy), int64(op.Timeout), op.ID, op.Run, op.Owner)
		return true, err
	case *store.CancelAssigned:
		r.Applied, err = t.changed(`UPDATE assignments SET cancel=? WHERE work_id=? AND run=? AND cancel IS NULL`, op.Cause, op.ID, op.Run)
		return true, err
	case *store.Unassign:
		r.Applied, err = t.changed(`DELETE FROM assignments WHERE work_id=? AND run=?`, op.ID, op.Run)
		return true, err
	case *store.ReportStart:
		r.Applied, err = t.changed(`UPDATE assignments SET state=1, started_at=? WHERE work_id=? AND run=? AND executor=? AND state=0`,
			ns(op.At), op.ID, op.Run, op.Executor)
		if err == nil && !r.Applied {
			r.Err, err = t.assignedTo(op.Executor, op.ID, op.Run)
		}
		return true, err
	case *store.ReportEnd:
		r.Applied, err = t.changed(`UPDATE assignments SET state=2, ending=? WHERE work_id=? AND run=? AND executor=? AND state < 2`,
			nullBytes(op.Ending), op.ID, op.Run, op.Executor)
		if err == nil && !r.Applied {
			r.Err, err = t.assignedTo(op.Executor, op.ID, op.Run)
		}
		return true, err
	}
	return false, nil
}

// assignedTo is the Err of a report that did not apply: ErrStaleRun unless
// run is still assigned to executor (a repeated report).
func (t *txn) assignedTo(executor, id string, run int) (error, error) {
	_, ok, err := t.one(`SELECT 1 FROM assignments WHERE work_id=? AND run=? AND executor=?`, id, run, executor)
	return sqlcommon.StaleUnless(ok, err)
}

// Executors implements store.ExecutorStore.
func (s *Store) Executors(ctx context.Context) ([]store.ExecutorRecord, time.Time, error) {
	now := time.Now()
	rows, err := s.read.QueryContext(ctx, `SELECT id, host, pid, tasks, capacity, poll_ns, ttl_ns, registered_at, seen_at FROM executors ORDER BY id`)
	if err != nil {
		return nil, now, err
	}
	defer rows.Close()
	var out []store.ExecutorRecord
	for rows.Next() {
		var e store.ExecutorRecord
		var tasks string
		var poll, ttl, reg, seen int64
		if err := rows.Scan(&e.ID, &e.Host, &e.PID, &tasks, &e.Capacity, &poll, &ttl, &reg, &seen); err != nil {
			return nil, now, err
		}
		if err := json.Unmarshal([]byte(tasks), &e.Tasks); err != nil {
			return nil, now, err
		}
		e.Poll, e.TTL, e.Registered, e.Seen = time.Duration(poll), time.Duration(ttl), tm(reg), tm(seen)
		out = append(out, e)
	}
	return out, now, rows.Err()
}

// Assigned implements store.ExecutorStore.
func (s *Store) Assigned(ctx context.Context, executor string) ([]store.Assignment, error) {
	return s.assignments(ctx, `SELECT a.work_id, a.run, a.executor, a.task, a.start_by, a.timeout_ns, a.state, a.cancel, a.started_at, NULL,
			CASE WHEN a.state = 0 THEN w.target END, CASE WHEN a.state = 0 THEN w.params END
		FROM assignments a LEFT JOIN work_units w ON w.id = a.work_id WHERE a.executor = ? AND a.state < 2`, executor)
}

// Reported implements store.ExecutorStore.
func (s *Store) Reported(ctx context.Context, known []store.Known) ([]store.Assignment, error) {
	as, err := s.assignments(ctx, `SELECT work_id, run, executor, task, start_by, timeout_ns, state, cancel, started_at, ending, NULL, NULL
		FROM assignments WHERE state > 0`)
	if err != nil || len(known) == 0 {
		return as, err
	}
	// In process, the rows cost no transfer: those known are left out here.
	type key struct {
		id  string
		run int
	}
	seen := make(map[key]store.AssignState, len(known))
	for _, k := range known {
		seen[key{k.ID, k.Run}] = k.State
	}
	out := as[:0]
	for _, a := range as {
		if st, ok := seen[key{a.ID, a.Run}]; !ok || a.State > st {
			out = append(out, a)
		}
	}
	return out, nil
}

func (s *Store) assignments(ctx context.Context, query string, args ...any) ([]store.Assignment, error) {
	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Assignment
	for rows.Next() {
		var a store.Assignment
		var startBy, timeout, started int64
		var cancel, target *string
		if err := rows.Scan(&a.ID, &a.Run, &a.Executor, &a.Task, &startBy, &timeout, &a.State, &cancel, &started, &a.Ending, &target, &a.Params); err != nil {
			return nil, err
		}
		a.StartBy, a.Timeout, a.Started = tm(startBy), time.Duration(timeout), tm(started)
		a.Cancel, a.Target = sqlcommon.Str(cancel), sqlcommon.Str(target)
		out = append(out, a)
	}
	return out, rows.Err()
}

var _ store.ExecutorStore = (*Store)(nil)

// Unassign implements store.Tx.
func (t *txn) Unassign(id string, runs int) error {
	_, err := t.exec(`DELETE FROM assignments WHERE work_id=? AND run=?`, id, runs)
	return err
}
