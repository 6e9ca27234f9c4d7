package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Reads of units, their counts and the stored definitions. Each runs on a
// pool connection of its own, outside the writer's transactions.

const unitColumns = `seq, id, task, target, params, state, runs, failures, deferrals, created_at, run_at, started_at,
	finished_at, timeout, coalesce(leased_by, ''), lease_expires_at, heartbeat_at, result, coalesce(error, ''), coalesce(error_kind, ''),
	coalesce(idempotency_key, ''), dependency_deadline, retry, trace, cancel_requested, coalesce(attempts, ''), costs, epoch`

func scanUnit(row sqlcommon.Row) (*store.Unit, error) {
	var u store.Unit
	var ts sqlcommon.UnitTimes
	var attempts, state string
	var costs []byte
	if err := row.Scan(&u.Seq, &u.ID, &u.Task, &u.Target, &u.Params, &state, &u.Runs, &u.Failures, &u.Deferrals,
		&ts.Created, &ts.RunAt, &ts.Started, &ts.Finished, &ts.Timeout, &u.LeasedBy, &ts.LeaseExpires, &ts.Heartbeat, &u.Result,
		&u.Error, &u.ErrorKind, &u.IdempotencyKey, &ts.DependencyDeadline, &u.Retry, &u.Trace, &ts.CancelRequested, &attempts, &costs,
		&u.Epoch); err != nil {
		return nil, err
	}
	u.State = store.State(state)
	return &u, sqlcommon.FillUnit(&u, &ts, costs, attempts)
}

// dependsOn fills the units' dependencies, in the order they were given.
func (s *Store) dependsOn(ctx context.Context, units []*store.Unit) error {
	if len(units) == 0 {
		return nil
	}
	byID, ids := sqlcommon.ByID(units)
	return sqlcommon.DependsOn(ctx, s.query, byID, `SELECT unit_id, depends_on FROM dependencies WHERE unit_id = ANY($1) ORDER BY n`, ids)
}

// UnitStates returns the state of each unit of ids that is stored.
func (s *Store) UnitStates(ctx context.Context, ids []string) (map[string]store.State, error) {
	out := make(map[string]store.State, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	if err := sqlcommon.States(ctx, s.query, out, `SELECT id, state FROM work_units WHERE id = ANY($1)`, ids); err != nil {
		return nil, err
	}
	return out, nil
}

// GetUnit returns the unit with the given ID, or store.ErrNotFound.
func (s *Store) GetUnit(ctx context.Context, id string) (*store.Unit, error) {
	return sqlcommon.Unit(ctx, s.query, `SELECT `+unitColumns+` FROM work_units WHERE id=$1`, id, scanUnit, s.dependsOn)
}

// ListUnits returns units matching f.
func (s *Store) ListUnits(ctx context.Context, f store.ListFilter) ([]*store.Unit, error) {
	limit := sqlcommon.ListLimit(f)
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if len(f.IDs) > 0 {
		where = append(where, "id = ANY("+arg(f.IDs)+")")
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = append(where, "state = ANY("+arg(states)+")")
	}
	if len(f.Tasks) > 0 {
		where = append(where, "task = ANY("+arg(f.Tasks)+")")
	}
	if f.AfterSeq > 0 {
		where = append(where, "seq > "+arg(f.AfterSeq))
	}
	if f.BeforeSeq > 0 {
		where = append(where, "seq < "+arg(f.BeforeSeq))
	}
	if !f.FinishedBefore.IsZero() {
		where = append(where, "finished_at > 0 AND finished_at < "+arg(ns(f.FinishedBefore)))
	}
	if !f.FinishedAfter.IsZero() {
		where = append(where, "finished_at >= "+arg(ns(f.FinishedAfter)))
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, "created_at >= "+arg(ns(f.CreatedAfter)))
	}
	if !f.CreatedBefore.IsZero() {
		where = append(where, "created_at < "+arg(ns(f.CreatedBefore)))
	}
	if f.TargetPrefix != "" {
		where = append(where, "left(target, "+arg(len([]rune(f.TargetPrefix)))+") = "+arg(f.TargetPrefix))
	}
	if f.ErrorContains != "" {
		where = append(where, "strpos(coalesce(error, ''), "+arg(f.ErrorContains)+") > 0")
	}
	q := sqlcommon.ListSQL(unitColumns, where, f.Desc) + " LIMIT " + arg(limit)
	return sqlcommon.Units(ctx, s.query, q, args, scanUnit, s.dependsOn)
}

// LoadActive calls fn for every queued or running unit after seq after, in
// Seq order, a page at a time (no transaction stays open across calls to
// fn), through the open-units index.
func (s *Store) LoadActive(ctx context.Context, after int64, fn func(*store.Unit) error) error {
	const size = 1000
	for {
		rows, err := s.pool.Query(ctx, `SELECT `+unitColumns+` FROM work_units
			WHERE state IN ('queued', 'running') AND state NOT IN ('completed', 'skipped') AND seq > $1 ORDER BY seq LIMIT $2`, after, size)
		if err != nil {
			return err
		}
		var page []*store.Unit
		for rows.Next() {
			u, err := scanUnit(rows)
			if err != nil {
				rows.Close()
				return err
			}
			u.Result, u.Error, u.Attempts = nil, "", nil
			page = append(page, u)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		if err := s.dependsOn(ctx, page); err != nil {
			return err
		}
		if err := sqlcommon.Deliver(page, fn); err != nil {
			return err
		}
		if len(page) < size {
			return nil
		}
		after = page[len(page)-1].Seq
	}
}

// CountActive returns the number of queued and running units per task.
func (s *Store) CountActive(ctx context.Context) (map[string]int, error) {
	return sqlcommon.CountByTask(ctx, s.query, sqlcommon.CountActiveSQL)
}

// Dependents returns the IDs of the units that depend on id.
func (s *Store) Dependents(ctx context.Context, id string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT unit_id FROM dependencies WHERE depends_on=$1 ORDER BY unit_id COLLATE "C"`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// QueuedCount returns the number of queued units, from the count every
// transaction maintains.
func (s *Store) QueuedCount(ctx context.Context) (int, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0)::bigint FROM unit_counts WHERE state = 'queued'`).Scan(&n)
	return int(n), err
}

// Counts returns the kept unit counts.
func (s *Store) Counts(ctx context.Context) ([]store.UnitCount, error) {
	return sqlcommon.Counts(ctx, s.query, `SELECT task, state, n FROM unit_counts WHERE n <> 0 ORDER BY task COLLATE "C", state COLLATE "C"`)
}

// OldestQueued returns the submission time of the first queued unit.
func (s *Store) OldestQueued(ctx context.Context) (time.Time, bool, error) {
	var created int64
	err := s.pool.QueryRow(ctx, sqlcommon.OldestQueuedSQL).Scan(&created)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return tm(created), true, nil
}

// Activity returns the kept activity of the minutes from since.
func (s *Store) Activity(ctx context.Context, since time.Time) ([]store.ActivityCount, error) {
	return sqlcommon.Activity(ctx, s.query, `SELECT minute, task, kind, n FROM activity WHERE minute >= $1
		ORDER BY minute, task COLLATE "C", kind COLLATE "C"`, since.UnixNano()/int64(time.Minute))
}

// QueueWaits returns the queue-wait histogram of the minutes from since.
func (s *Store) QueueWaits(ctx context.Context, since time.Time) ([]int64, error) {
	return sqlcommon.QueueWaits(ctx, s.query, `SELECT bucket, sum(n)::bigint FROM queue_wait WHERE minute >= $1 GROUP BY bucket`,
		since.UnixNano()/int64(time.Minute))
}

// Subscriptions returns the named subscriptions.
func (s *Store) Subscriptions(ctx context.Context) ([]store.Subscription, error) {
	return sqlcommon.Subscriptions(ctx, s.query, `SELECT name, acked, created_at, acked_at, types, tasks FROM subscriptions ORDER BY name COLLATE "C"`)
}

// Tasks returns the stored task definitions.
func (s *Store) Tasks(ctx context.Context) (map[string][]byte, error) {
	return sqlcommon.Tasks(ctx, s.query, `SELECT name, def FROM tasks`)
}

// Services returns the stored services with their meters' state (a service
// with a stored meter state but no record, such as a keyed instance, is
// listed too).
func (s *Store) Services(ctx context.Context) ([]store.ServiceRecord, error) {
	return sqlcommon.Services(ctx, s.query, `SELECT name, def, override, paused FROM (
			SELECT s.name, s.def, s.override, s.paused FROM services s
			UNION ALL
			SELECT DISTINCT m.service, NULL::bytea, NULL::bytea, false FROM meter_state m WHERE m.service NOT IN (SELECT name FROM services)
		) x ORDER BY name COLLATE "C"`, `SELECT service, meter, state FROM meter_state`)
}

// Schedules returns the stored schedules, by name.
func (s *Store) Schedules(ctx context.Context) ([]store.ScheduleRecord, error) {
	return sqlcommon.Schedules(ctx, s.query, `SELECT name, def, timing, paused, created_at, last_at, last_key, last_unit
		FROM schedules ORDER BY name COLLATE "C"`)
}

// ServiceLog returns the starts logged for service since the given time.
func (s *Store) ServiceLog(ctx context.Context, service string, since time.Time) ([]store.Logged, error) {
	return sqlcommon.Logged(ctx, s.query, `SELECT started_at, meter, amount, reconciled FROM service_log
		WHERE service=$1 AND started_at >= $2 ORDER BY started_at, n`, service, ns(since))
}

// ServiceLogPrefix returns the recent starts of every service whose name
// starts with prefix (a range on the index: the column sorts bytewise).
func (s *Store) ServiceLogPrefix(ctx context.Context, prefix string, since time.Time) (map[string][]store.Logged, error) {
	q := `SELECT service, started_at, meter, amount, reconciled FROM service_log WHERE service >= $1 AND started_at >= $2`
	args := []any{prefix, ns(since)}
	if n := len(prefix); n > 0 && prefix[n-1] < 0x7f {
		q += ` AND service < $3`
		args = append(args, prefix[:n-1]+string(rune(prefix[n-1]+1)))
	} else if n > 0 {
		q += ` AND left(service, $3) = $1`
		args = append(args, len([]rune(prefix)))
	}
	return sqlcommon.LoggedByService(ctx, s.query, q+` ORDER BY service, started_at, n`, args...)
}

// Pauses returns the stored pauses of the queue and of task types.
func (s *Store) Pauses(ctx context.Context) (store.Pauses, error) {
	var p store.Pauses
	var q int64
	switch err := s.pool.QueryRow(ctx, `SELECT value FROM meta WHERE key = 'paused'`).Scan(&q); {
	case err == nil:
		p.Queue = q != 0
	case !errors.Is(err, pgx.ErrNoRows):
		return p, err
	}
	rows, err := s.pool.Query(ctx, `SELECT name FROM tasks WHERE paused ORDER BY name COLLATE "C"`)
	if err != nil {
		return p, err
	}
	p.Tasks, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if len(p.Tasks) == 0 {
		p.Tasks = nil
	}
	return p, err
}

// query runs a read on the pool (sqlcommon.Query).
func (s *Store) query(ctx context.Context, q string, args ...any) (sqlcommon.Rows, error) {
	return s.pool.Query(ctx, q, args...)
}

// Questions returns the questions to the owner not yet answered, oldest
// first.
func (s *Store) Questions(ctx context.Context) ([]store.OwnerQuestion, error) {
	return sqlcommon.Questions(ctx, s.query, `SELECT id, question FROM questions WHERE answer IS NULL ORDER BY asked_at, id`)
}

// Answered reports the owner's answer to question id, once given.
func (s *Store) Answered(ctx context.Context, id string) ([]byte, bool, error) {
	return sqlcommon.Answered(ctx, s.query, `SELECT answer FROM questions WHERE id=$1`, id)
}

// DebounceOf returns the debounce key unit id holds, if any.
func (s *Store) DebounceOf(ctx context.Context, id string) (string, time.Time, bool, error) {
	return sqlcommon.DebounceOf(ctx, s.query, `SELECT key, since FROM debounces WHERE unit_id=$1 LIMIT 1`, id)
}

// Debouncing counts the debounce keys a queued, never-started unit holds.
func (s *Store) Debouncing(ctx context.Context) (int, error) {
	return sqlcommon.Count(ctx, s.query, `SELECT count(*) FROM debounces d JOIN work_units w ON w.id = d.unit_id
		WHERE w.state = 'queued' AND w.runs = 0`)
}
