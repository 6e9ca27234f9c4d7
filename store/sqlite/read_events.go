package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Reads of the event log, the tasks, the services and their log, and the
// pauses.

// EventsAfter returns up to limit events after the given sequence number.
// A work_completed event carries its unit's result if the unit is stored.
func (s *Store) EventsAfter(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	return s.MatchingEvents(ctx, store.EventQuery{After: after, Upto: math.MaxInt64, Limit: limit})
}

// MatchingEvents returns the events of q (see store.Store). A filtered
// query looks up the stretches of the log that can hold matching events
// (event_ranges, see migration 0003), then decodes only the blocks that
// overlap them.
func (s *Store) MatchingEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	if q.WorkID != "" {
		return s.unitEvents(ctx, q)
	}
	sel := store.EventSelector(q)
	if len(q.Types) == 0 && len(q.Tasks) == 0 {
		out, _, err := store.ScanLog(ctx, s.blocksFrom, q.After+1, q.Upto, q.Limit, nil, sel)
		if err != nil {
			return nil, err
		}
		return out, s.fillResults(ctx, out)
	}
	filter, fargs := "", []any{}
	if len(q.Types) > 0 {
		filter += ` AND type IN (` + placeholders(len(q.Types)) + `)`
		for _, t := range q.Types {
			fargs = append(fargs, t)
		}
	}
	if len(q.Tasks) > 0 {
		filter += ` AND task IN (` + placeholders(len(q.Tasks)) + `)`
		for _, t := range q.Tasks {
			fargs = append(fargs, t)
		}
	}
	ranges, err := s.ranges(ctx, `SELECT first, last FROM event_ranges WHERE last > ? AND first <= ?`+filter+` ORDER BY first`,
		append([]any{q.After, q.Upto}, fargs...)...)
	if err != nil {
		return nil, err
	}
	var out []store.Event
	next := q.After + 1 // every block ending before it is decoded
	for _, r := range ranges {
		lo, hi := max(r[0], next), min(r[1], q.Upto)
		if lo > hi {
			continue
		}
		out, next, err = store.ScanLog(ctx, s.blocksFrom, lo, hi, q.Limit, out, sel)
		if err != nil {
			return nil, err
		}
		if len(out) >= q.Limit {
			break
		}
	}
	return out, s.fillResults(ctx, out)
}

// blocksFromQuery reads the blocks from a sequence number on, through the
// table's key (TestEventReadsUseKeys).
const blocksFromQuery = `SELECT first, last, data FROM event_blocks WHERE last >= ? ORDER BY last`

// unitRecordQuery reads a unit's record of its events, by its ID.
const unitRecordQuery = `SELECT coalesce(events, x'') FROM work_units WHERE id = ?`

// blocksFrom reads the blocks that end at or after seq, in order, and
// calls fn with each until it returns false.
func (s *Store) blocksFrom(ctx context.Context, seq int64, fn func(first, last int64, data []byte) (bool, error)) error {
	rows, err := s.read.QueryContext(ctx, blocksFromQuery, seq)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var first, last int64
		var data []byte
		if err := rows.Scan(&first, &last, &data); err != nil {
			return err
		}
		more, err := fn(first, last, data)
		if err != nil || !more {
			return err
		}
	}
	return rows.Err()
}

// LastOfTypes returns the last retained event of one of types (see
// store.Store): the last range of those types (event_ranges) holds it, or
// the one before it if retention or a rollback emptied the last.
func (s *Store) LastOfTypes(ctx context.Context, types []string) (store.Event, bool, error) {
	if len(types) == 0 {
		return store.Event{}, false, nil
	}
	args := make([]any, 0, len(types)+1)
	for _, t := range types {
		args = append(args, t)
	}
	sel := store.EventSelector(store.EventQuery{Types: types})
	upto := int64(math.MaxInt64)
	for {
		var first, last int64
		err := s.read.QueryRowContext(ctx, `SELECT first, last FROM event_ranges WHERE type IN (`+placeholders(len(types))+`) AND last <= ? ORDER BY last DESC LIMIT 1`,
			append(args, upto)...).Scan(&first, &last)
		if errors.Is(err, sql.ErrNoRows) {
			return store.Event{}, false, nil
		}
		if err != nil {
			return store.Event{}, false, err
		}
		ev, ok, err := s.lastIn(ctx, first, last, sel)
		if err != nil || ok {
			if err == nil {
				evs := []store.Event{ev}
				err = s.fillResults(ctx, evs)
				ev = evs[0]
			}
			return ev, ok, err
		}
		upto = last - 1
	}
}

// lastIn returns the last event with Seq in [lo, hi] that sel accepts,
// reading the blocks from hi backwards and stopping at the first that
// holds one. (A range of a log migrated from schema 2 may span all of it.)
func (s *Store) lastIn(ctx context.Context, lo, hi int64, sel func(*store.Event) bool) (store.Event, bool, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT first, last, data FROM event_blocks
		WHERE last <= coalesce((SELECT last FROM event_blocks WHERE last >= ?1 ORDER BY last LIMIT 1), ?1)
		ORDER BY last DESC`, hi)
	if err != nil {
		return store.Event{}, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var first, last int64
		var data []byte
		if err := rows.Scan(&first, &last, &data); err != nil {
			return store.Event{}, false, err
		}
		if last < lo {
			break
		}
		if found, ok, err := store.LastInBlock(first, data, lo, hi, sel); err != nil || ok {
			return found, ok, err
		}
	}
	return store.Event{}, false, rows.Err()
}

// unitEvents returns the events of q.WorkID, filtered by q's types and
// tasks: those its record names (see store.UnitRecord), read from their
// blocks, and, when the record is full, those after its last entry, found
// by reading the log. A unit no longer stored has no record: its events
// are found by reading the log in q's range.
func (s *Store) unitEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	mine := store.UnitSelector(q)
	var rec []byte
	err := s.read.QueryRowContext(ctx, unitRecordQuery, q.WorkID).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		out, _, err := store.ScanLog(ctx, s.blocksFrom, q.After+1, q.Upto, q.Limit, nil, mine)
		if err != nil {
			return nil, err
		}
		return out, s.fillResults(ctx, out)
	}
	if err != nil {
		return nil, err
	}
	out, err := store.UnitLogEvents(ctx, s.blocksFrom, rec, q)
	if err != nil {
		return nil, err
	}
	return out, s.fillResults(ctx, out)
}

// fillResults sets the Result of each work_completed event in evs from its
// unit, if the unit is stored.
func (s *Store) fillResults(ctx context.Context, evs []store.Event) error {
	var ids []any
	for i := range evs {
		if evs[i].Type == "work_completed" && evs[i].WorkID != "" {
			ids = append(ids, evs[i].WorkID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	results := make(map[string][]byte, len(ids))
	const chunk = 64
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		rows, err := s.read.QueryContext(ctx, `SELECT id, result FROM work_units WHERE id IN (`+placeholders(len(part))+`)`, part...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var result []byte
			if err := rows.Scan(&id, &result); err != nil {
				rows.Close()
				return err
			}
			results[id] = result
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	for i := range evs {
		if evs[i].Type == "work_completed" {
			evs[i].Result = results[evs[i].WorkID]
		}
	}
	return nil
}

// ranges reads (first, last) pairs and merges the overlapping ones.
func (s *Store) ranges(ctx context.Context, query string, args ...any) ([][2]int64, error) {
	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][2]int64
	for rows.Next() {
		var first, last int64
		if err := rows.Scan(&first, &last); err != nil {
			return nil, err
		}
		if n := len(out); n > 0 && first <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], last)
			continue
		}
		out = append(out, [2]int64{first, last})
	}
	return out, rows.Err()
}

// LastSeq returns the highest event sequence number ever assigned.
func (s *Store) LastSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.read.QueryRowContext(ctx, lastSeqQuery).Scan(&seq)
	return seq, err
}

// FirstSeq returns the lowest event sequence number still stored.
func (s *Store) FirstSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.read.QueryRowContext(ctx, `SELECT first FROM event_blocks ORDER BY last LIMIT 1`).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

// Tasks returns the stored task definitions.
func (s *Store) Tasks(ctx context.Context) (map[string][]byte, error) {
	return sqlcommon.Tasks(ctx, s.query, `SELECT name, def FROM tasks`)
}

// Services returns the stored services with their meters' state (a
// service with a stored meter state but no record, such as a keyed
// instance, is listed too).
func (s *Store) Services(ctx context.Context) ([]store.ServiceRecord, error) {
	return sqlcommon.Services(ctx, s.query, `SELECT s.name, s.def, s.override, s.paused FROM services s
		UNION ALL
		SELECT DISTINCT m.service, NULL, NULL, 0 FROM meter_state m WHERE m.service NOT IN (SELECT name FROM services)
		ORDER BY 1`, `SELECT service, meter, state FROM meter_state`)
}

// Schedules returns the stored schedules, by name.
func (s *Store) Schedules(ctx context.Context) ([]store.ScheduleRecord, error) {
	return sqlcommon.Schedules(ctx, s.query, `SELECT name, def, timing, paused, created_at, last_at, last_key, last_unit
		FROM schedules ORDER BY name`)
}

// ServiceLog returns the starts logged for service since the given time.
func (s *Store) ServiceLog(ctx context.Context, service string, since time.Time) ([]store.Logged, error) {
	return sqlcommon.Logged(ctx, s.query, `SELECT started_at, meter, amount, reconciled FROM service_log
		WHERE service=? AND started_at >= ? ORDER BY started_at, rowid`, service, ns(since))
}

// ServiceLogPrefix returns the recent starts of every service whose name
// starts with prefix.
func (s *Store) ServiceLogPrefix(ctx context.Context, prefix string, since time.Time) (map[string][]store.Logged, error) {
	// A range on the index: prefix <= service < prefix with its last byte
	// incremented.
	hi := prefix + "\xff"
	if n := len(prefix); n > 0 && prefix[n-1] < 0xff {
		hi = prefix[:n-1] + string(rune(prefix[n-1]+1))
	}
	return sqlcommon.LoggedByService(ctx, s.query, `SELECT service, started_at, meter, amount, reconciled FROM service_log
		WHERE service >= ? AND service < ? AND started_at >= ? ORDER BY service, started_at, rowid`, prefix, hi, ns(since))
}

// Pauses returns the stored pauses of the queue and of task types.
func (s *Store) Pauses(ctx context.Context) (store.Pauses, error) {
	var p store.Pauses
	var q int
	switch err := s.read.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'paused'`).Scan(&q); {
	case err == nil:
		p.Queue = q != 0
	case !errors.Is(err, sql.ErrNoRows):
		return p, err
	}
	rows, err := s.read.QueryContext(ctx, `SELECT name FROM tasks WHERE paused <> 0 ORDER BY name`)
	if err != nil {
		return p, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return p, err
		}
		p.Tasks = append(p.Tasks, name)
	}
	return p, rows.Err()
}

// Questions returns the questions to the owner not yet answered, oldest
// first.
func (s *Store) Questions(ctx context.Context) ([]store.OwnerQuestion, error) {
	return sqlcommon.Questions(ctx, s.query, `SELECT id, question FROM questions WHERE answer IS NULL ORDER BY asked_at, id`)
}

// Answered reports the owner's answer to question id, once given.
func (s *Store) Answered(ctx context.Context, id string) ([]byte, bool, error) {
	return sqlcommon.Answered(ctx, s.query, `SELECT answer FROM questions WHERE id=?`, id)
}

// DebounceOf returns the debounce key unit id holds, if any.
func (s *Store) DebounceOf(ctx context.Context, id string) (string, time.Time, bool, error) {
	return sqlcommon.DebounceOf(ctx, s.query, `SELECT key, since FROM debounces WHERE unit_id=? LIMIT 1`, id)
}

// Debouncing counts the debounce keys a queued, never-started unit holds.
func (s *Store) Debouncing(ctx context.Context) (int, error) {
	return sqlcommon.Count(ctx, s.query, `SELECT count(*) FROM debounces d JOIN work_units w ON w.id = d.unit_id
		WHERE w.state = 'queued' AND w.runs = 0`)
}
