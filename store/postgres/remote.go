package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Executors' ops and reads (store.ExecutorStore). The store's clock is the
// server's (clock_timestamp(), not the transaction's start): every host's
// executors and the scheduler measure their offsets to it.

// nowNS is the server's clock in Unix nanoseconds (microsecond precision).
const nowNS = `(extract(epoch from clock_timestamp()) * 1000000000)::bigint`

// Now implements store.ExecutorStore.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT `+nowNS).Scan(&n)
	return tm(n), err
}

// applyRemote applies an executor's or an assignment's op; ok is false
// for any other op.
func (t *txn) applyRemote(op store.Op, r *store.Result) (ok bool, err error) {
	switch op := op.(type) {
	case *store.RegisterExecutor:
		e := op.Executor
		tasks := sqlcommon.TaskNames(e.Tasks)
		r.Applied, err = t.changed(`INSERT INTO executors(id, host, pid, tasks, capacity, poll_ns, ttl_ns, registered_at, seen_at)
			VALUES($1,$2,$3,$4,$5,$6,$7,`+nowNS+`,`+nowNS+`)
			ON CONFLICT(id) DO UPDATE SET host=excluded.host, pid=excluded.pid, tasks=excluded.tasks, capacity=excluded.capacity,
				poll_ns=excluded.poll_ns, ttl_ns=excluded.ttl_ns, registered_at=excluded.registered_at, seen_at=excluded.seen_at
			WHERE executors.seen_at + executors.ttl_ns <= excluded.seen_at OR (executors.host = excluded.host AND executors.pid = excluded.pid)`,
			e.ID, e.Host, e.PID, tasks, e.Capacity, int64(e.Poll), int64(e.TTL))
		if err == nil && !r.Applied {
			r.Err = store.ErrExecutorTaken
		}
		t.notifyReports = true
		return true, err
	case *store.RemoveExecutor:
		if op.PID != 0 {
			r.Applied, err = t.changed(`DELETE FROM executors WHERE id=$1 AND host=$2 AND pid=$3`, op.ID, op.Host, op.PID)
		} else {
			r.Applied, err = t.changed(`DELETE FROM executors WHERE id=$1`, op.ID)
		}
		t.notifyReports = true
		return true, err
	case *store.ExecutorBeat:
		if op.PID != 0 {
			r.Applied, err = t.changed(`UPDATE executors SET seen_at=`+nowNS+` WHERE id=$1 AND host=$2 AND pid=$3`, op.ID, op.Host, op.PID)
		} else {
			r.Applied, err = t.changed(`UPDATE executors SET seen_at=`+nowNS+` WHERE id=$1`, op.ID)
		}
		if err != nil || !r.Applied {
			return true, err
		}
		// The runs' IDs first: a semi-join may be planned as a scan of
		// every unit.
		rows, err := t.query(`SELECT work_id, run FROM assignments WHERE executor=$1 AND state < 2`, op.ID)
		if err != nil {
			return true, err
		}
		var ids []string
		var runs []int32
		for rows.Next() {
			var id string
			var run int32
			if err := rows.Scan(&id, &run); err != nil {
				rows.Close()
				return true, err
			}
			ids, runs = append(ids, id), append(runs, run)
		}
		if rows.Close(); rows.Err() != nil || len(ids) == 0 {
			return true, rows.Err()
		}
		_, err = t.exec(`UPDATE work_units w SET lease_expires_at=greatest(w.lease_expires_at, `+nowNS+` + $1), heartbeat_at=`+nowNS+`
			FROM unnest($2::text[], $3::int[]) AS v(id, run) WHERE w.id = ANY($2) AND w.id = v.id AND w.runs = v.run AND w.state='running'`,
			int64(op.TTL), ids, runs)
		return true, err
	case *store.Assign:
		r.Applied, err = t.changed(`INSERT INTO assignments(work_id, run, executor, task, start_by, timeout_ns)
			SELECT id, runs, $1, task, $2, $3 FROM work_units WHERE id=$4 AND state='running' AND runs=$5 AND leased_by=$6
			ON CONFLICT(work_id) DO UPDATE SET run=excluded.run, executor=excluded.executor, task=excluded.task,
				start_by=excluded.start_by, timeout_ns=excluded.timeout_ns, state=0, cancel=NULL, started_at=0, ending=NULL`,
			op.Executor, ns(op.StartBy), int64(op.Timeout), op.ID, op.Run, op.Owner)
		if r.Applied {
			t.notifyExecs = append(t.notifyExecs, op.Executor)
		}
		return true, err
	case *store.CancelAssigned:
		var executor string
		r.Applied, err = t.one(`UPDATE assignments SET cancel=$1 WHERE work_id=$2 AND run=$3 AND cancel IS NULL RETURNING executor`,
			[]any{op.Cause, op.ID, op.Run}, &executor)
		if r.Applied {
			t.notifyExecs = append(t.notifyExecs, executor)
		}
		return true, err
	case *store.Unassign:
		r.Applied, err = t.changed(`DELETE FROM assignments WHERE work_id=$1 AND run=$2`, op.ID, op.Run)
		if r.Applied {
			t.unassigned++
		}
		return true, err
	case *store.ReportStart:
		r.Applied, err = t.changed(`UPDATE assignments SET state=1, started_at=$1 WHERE work_id=$2 AND run=$3 AND executor=$4 AND state=0`,
			ns(op.At), op.ID, op.Run, op.Executor)
		if err == nil && !r.Applied {
			r.Err, err = t.assignedTo(op.Executor, op.ID, op.Run)
		}
		t.notifyReports = t.notifyReports || r.Applied
		return true, err
	case *store.ReportEnd:
		r.Applied, err = t.changed(`UPDATE assignments SET state=2, ending=$1 WHERE work_id=$2 AND run=$3 AND executor=$4 AND state < 2`,
			orNil(op.Ending), op.ID, op.Run, op.Executor)
		if err == nil && !r.Applied {
			r.Err, err = t.assignedTo(op.Executor, op.ID, op.Run)
		}
		t.notifyReports = t.notifyReports || r.Applied
		return true, err
	}
	return false, nil
}

// The executors' notifications go on channels of their own, so that
// neither the Cue reading the log nor an executor wakes for what is not
// its own: an executor listens on its own channel (execChannelOf: a run
// assigned to it, or asked to stop), the scheduler on Store.execChannel
// (a start or an end reported, an executor registered or gone). On one
// channel for all, each report woke every executor's listener, backend and
// process, to be dropped there.

// notifyRemote notifies what the transaction's executors' ops did, once
// per executor and once for the reports.
func (t *txn) notifyRemote() error {
	if len(t.notifyExecs) == 0 && !t.notifyReports {
		return nil
	}
	payloads := slices.Compact(slices.Sorted(slices.Values(t.notifyExecs)))
	channels := make([]string, len(payloads), len(payloads)+1)
	for i, e := range payloads {
		channels[i] = t.s.execChannelOf(e)
	}
	if t.notifyReports {
		channels, payloads = append(channels, t.s.execChannel), append(payloads, reportsPayload)
	}
	t.queue(`SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS v(c, p)`, channels, payloads)
	return nil
}

// reportsPayload is the notification of the reports; an executor's is its
// name, which cannot be empty.
const reportsPayload = ""

// execChannelOf is executor's notification channel: the schema's
// executors' channel and a hash of its name (a channel's name is at most
// 63 bytes; two executors that share one still tell theirs by payload).
func (s *Store) execChannelOf(executor string) string {
	h := fnv.New32a()
	h.Write([]byte(executor))
	return fmt.Sprintf("%s_%08x", s.execChannel, h.Sum32())
}

// WatchAssigned implements store.ExecutorWatcher.
func (s *Store) WatchAssigned(ctx context.Context, executor string) (<-chan struct{}, error) {
	return s.watch(ctx, s.execChannelOf(executor), executor)
}

// WatchReported implements store.ExecutorWatcher.
func (s *Store) WatchReported(ctx context.Context) (<-chan struct{}, error) {
	return s.watch(ctx, s.execChannel, reportsPayload)
}

// lockFree reports whether ops are all an executor's reports (see Apply):
// they lock assignment rows only, which the owner's transactions lock
// last, so no wait can go round. (A heartbeat locks units' rows too, and
// takes its turn.)
func lockFree(ops []store.Op) bool {
	for _, op := range ops {
		switch op.(type) {
		case *store.ReportStart, *store.ReportEnd:
		default:
			return false
		}
	}
	return true
}

// assignedTo is the Err of a report that did not apply: ErrStaleRun unless
// run is still assigned to executor (a repeated report).
func (t *txn) assignedTo(executor, id string, run int) (error, error) {
	var one int
	ok, err := t.one(`SELECT 1 FROM assignments WHERE work_id=$1 AND run=$2 AND executor=$3`, []any{id, run, executor}, &one)
	return sqlcommon.StaleUnless(ok, err)
}

// Unassign implements store.Tx.
func (t *txn) Unassign(id string, runs int) error {
	n, err := t.exec(`DELETE FROM assignments WHERE work_id=$1 AND run=$2`, id, runs)
	t.unassigned += int(n)
	return err
}

// Executors implements store.ExecutorStore.
func (s *Store) Executors(ctx context.Context) ([]store.ExecutorRecord, time.Time, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, host, pid, tasks, capacity, poll_ns, ttl_ns, registered_at, seen_at, `+nowNS+` FROM executors ORDER BY id`)
	if err != nil {
		return nil, time.Time{}, err
	}
	var now int64
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.ExecutorRecord, error) {
		var e store.ExecutorRecord
		var tasks string
		var poll, ttl, reg, seen int64
		if err := row.Scan(&e.ID, &e.Host, &e.PID, &tasks, &e.Capacity, &poll, &ttl, &reg, &seen, &now); err != nil {
			return e, err
		}
		e.Poll, e.TTL, e.Registered, e.Seen = time.Duration(poll), time.Duration(ttl), tm(reg), tm(seen)
		return e, json.Unmarshal([]byte(tasks), &e.Tasks)
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(out) == 0 {
		t, err := s.Now(ctx)
		return nil, t, err
	}
	return out, tm(now), nil
}

// Assigned implements store.ExecutorStore.
func (s *Store) Assigned(ctx context.Context, executor string) ([]store.Assignment, error) {
	// A lateral lookup by ID, for the pending ones only: a join may be
	// planned as a scan of every unit.
	return s.assignments(ctx, `SELECT a.work_id, a.run, a.executor, a.task, a.start_by, a.timeout_ns, a.state, a.cancel, a.started_at, NULL::bytea,
			w.target, w.params
		FROM assignments a LEFT JOIN LATERAL (SELECT target, params FROM work_units WHERE id = a.work_id AND a.state = 0) w ON true
		WHERE a.executor = $1 AND a.state < 2`, executor)
}

// Reported implements store.ExecutorStore.
func (s *Store) Reported(ctx context.Context, known []store.Known) ([]store.Assignment, error) {
	ids, runs, states := make([]string, len(known)), make([]int32, len(known)), make([]int32, len(known))
	for i, k := range known {
		ids[i], runs[i], states[i] = k.ID, int32(k.Run), int32(k.State)
	}
	return s.assignments(ctx, `SELECT work_id, run, executor, task, start_by, timeout_ns, state, cancel, started_at, ending, NULL::text, NULL::bytea
		FROM assignments a WHERE state > 0 AND NOT EXISTS (SELECT FROM unnest($1::text[], $2::int[], $3::int[]) AS k(id, run, state)
			WHERE k.id = a.work_id AND k.run = a.run AND a.state <= k.state)`, ids, runs, states)
}

func (s *Store) assignments(ctx context.Context, query string, args ...any) ([]store.Assignment, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Assignment, error) {
		var a store.Assignment
		var startBy, timeout, started int64
		var state int
		var cancel, target *string
		err := row.Scan(&a.ID, &a.Run, &a.Executor, &a.Task, &startBy, &timeout, &state, &cancel, &started, &a.Ending, &target, &a.Params)
		a.StartBy, a.Timeout, a.Started, a.State = tm(startBy), time.Duration(timeout), tm(started), store.AssignState(state)
		a.Cancel, a.Target = sqlcommon.Str(cancel), sqlcommon.Str(target)
		return a, err
	})
}

var (
	_ store.ExecutorStore   = (*Store)(nil)
	_ store.ExecutorWatcher = (*Store)(nil)
)

// remoteAll writes the executors' ops ops[idx] of a segment (see
// segment), a statement per kind, and sets their results: with assigns,
// the Assigns (after the segment's Claims, before its Finishes); without,
// the rest (after the Finishes). The Assigns and the Unassigns are queued
// (t.pipe), their results set when the queue is sent; the reports (in a
// segment only when an executor's reports could not go alone: see Apply)
// are written at once.
func (t *txn) remoteAll(ops []store.Op, idx []int, results []store.Result, assigns bool) error {
	type batch struct {
		ids     []string
		runs    []int32
		names   []string // the owner (Assign) or the executor
		execs   []string // an Assign's executor
		at      []int64  // StartBy, or the reported start
		timeout []int64
		endings [][]byte
		ops     []int // the ops' indexes
	}
	var as, un, st, en batch
	for _, i := range idx {
		switch op := ops[i].(type) {
		case *store.Assign:
			if assigns {
				as.ids, as.runs, as.names, as.execs = append(as.ids, op.ID), append(as.runs, int32(op.Run)), append(as.names, op.Owner), append(as.execs, op.Executor)
				as.at, as.timeout, as.ops = append(as.at, ns(op.StartBy)), append(as.timeout, int64(op.Timeout)), append(as.ops, i)
			}
		case *store.Unassign:
			if !assigns {
				un.ids, un.runs, un.ops = append(un.ids, op.ID), append(un.runs, int32(op.Run)), append(un.ops, i)
			}
		case *store.ReportStart:
			if !assigns {
				st.ids, st.runs, st.names, st.at, st.ops = append(st.ids, op.ID), append(st.runs, int32(op.Run)), append(st.names, op.Executor), append(st.at, ns(op.At)), append(st.ops, i)
			}
		case *store.ReportEnd:
			if !assigns {
				en.ids, en.runs, en.names, en.endings, en.ops = append(en.ids, op.ID), append(en.runs, int32(op.Run)), append(en.names, op.Executor), append(en.endings, orNil(op.Ending)), append(en.ops, i)
			}
		}
	}
	apply := func(b batch, query string, args ...any) (map[string]bool, error) {
		if len(b.ids) == 0 {
			return nil, nil
		}
		ids, err := t.strings(query, args...)
		done := make(map[string]bool, len(ids))
		for _, id := range ids {
			done[id] = true
		}
		return done, err
	}
	set := func(b batch, done map[string]bool, report bool) error {
		for k, i := range b.ops {
			r := &results[i]
			r.Applied = done[b.ids[k]]
			switch {
			case !r.Applied:
			case report:
				t.notifyReports = true
			default:
				t.notifyExecs = append(t.notifyExecs, b.execs[k])
			}
			if !r.Applied && report {
				var err error
				if r.Err, err = t.assignedTo(b.names[k], b.ids[k], int(b.runs[k])); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// The assignments' inserts and deletes are queued (t.pipe): sent with
	// the segment's claims and finishes, in one round trip.
	collect := func(b batch, after func(done map[string]bool) error) func(pgx.Rows) error {
		return func(rows pgx.Rows) error {
			done := make(map[string]bool, len(b.ids))
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					return err
				}
				done[id] = true
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return after(done)
		}
	}
	if assigns {
		if len(as.ids) > 0 {
			t.pipe(collect(as, func(done map[string]bool) error { return set(as, done, false) }),
				`INSERT INTO assignments(work_id, run, executor, task, start_by, timeout_ns)
			SELECT w.id, w.runs, v.executor, w.task, v.start_by, v.timeout
			FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS v(id, run, owner, executor, start_by, timeout)
			CROSS JOIN LATERAL (SELECT id, runs, task FROM work_units
				WHERE id = v.id AND (state = 'running' AND runs = v.run AND leased_by = v.owner) IS TRUE) w
			ON CONFLICT(work_id) DO UPDATE SET run=excluded.run, executor=excluded.executor, task=excluded.task,
				start_by=excluded.start_by, timeout_ns=excluded.timeout_ns, state=0, cancel=NULL, started_at=0, ending=NULL
			RETURNING work_id`, as.ids, as.runs, as.names, as.execs, as.at, as.timeout)
		}
		return nil
	}
	if len(un.ids) > 0 {
		t.pipe(collect(un, func(done map[string]bool) error {
			for k, i := range un.ops {
				results[i].Applied = done[un.ids[k]]
			}
			t.unassigned += len(done)
			return nil
		}), `DELETE FROM assignments a USING unnest($1::text[], $2::int[]) AS v(id, run)
		WHERE a.work_id = v.id AND a.run = v.run RETURNING a.work_id`, un.ids, un.runs)
	}
	var done map[string]bool
	var err error
	if done, err = apply(st, `UPDATE assignments a SET state = 1, started_at = v.at
		FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[]) AS v(id, run, executor, at)
		WHERE a.work_id = v.id AND a.run = v.run AND a.executor = v.executor AND a.state = 0 RETURNING a.work_id`,
		st.ids, st.runs, st.names, st.at); err != nil {
		return err
	}
	if err := set(st, done, true); err != nil {
		return err
	}
	if done, err = apply(en, `UPDATE assignments a SET state = 2, ending = v.ending
		FROM unnest($1::text[], $2::int[], $3::text[], $4::bytea[]) AS v(id, run, executor, ending)
		WHERE a.work_id = v.id AND a.run = v.run AND a.executor = v.executor AND a.state < 2 RETURNING a.work_id`,
		en.ids, en.runs, en.names, en.endings); err != nil {
		return err
	}
	return set(en, done, true)
}
