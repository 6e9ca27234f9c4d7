package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Reads of the event log, the tasks, the services and their log, and the
// pauses.

// EventsAfter returns up to limit events after the given sequence number.
// A work_completed event carries its unit's result if the unit is stored.
func (s *Store) EventsAfter(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	return s.events(ctx, eventSelect+` WHERE e.seq > ? ORDER BY e.seq LIMIT ?`, after, limit)
}

// MatchingEvents returns the events of q (see store.Store). It looks up the
// stretches of the log that can hold matching events (event_ranges, see
// migration 0003), then reads events only inside them.
func (s *Store) MatchingEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	if q.WorkID != "" {
		return s.unitEvents(ctx, q)
	}
	if len(q.Types) == 0 && len(q.Tasks) == 0 {
		return s.events(ctx, eventSelect+` WHERE e.seq > ? AND e.seq <= ? ORDER BY e.seq LIMIT ?`, q.After, q.Upto, q.Limit)
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
	// The event table stores '' as NULL.
	efilter := strings.ReplaceAll(strings.ReplaceAll(filter, " type IN", " e.type IN"), " task IN", " coalesce(e.task, '') IN")
	var out []store.Event
	for _, r := range ranges {
		lo, hi := max(r[0], q.After+1), min(r[1], q.Upto)
		evs, err := s.events(ctx, eventSelect+` WHERE e.seq >= ? AND e.seq <= ?`+efilter+` ORDER BY e.seq LIMIT ?`,
			append(append([]any{lo, hi}, fargs...), q.Limit-len(out))...)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
		if len(out) >= q.Limit {
			break
		}
	}
	return out, nil
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
	in := placeholders(len(types))
	upto := int64(math.MaxInt64)
	for {
		var first, last int64
		err := s.read.QueryRowContext(ctx, `SELECT first, last FROM event_ranges WHERE type IN (`+in+`) AND last <= ? ORDER BY last DESC LIMIT 1`,
			append(args, upto)...).Scan(&first, &last)
		if errors.Is(err, sql.ErrNoRows) {
			return store.Event{}, false, nil
		}
		if err != nil {
			return store.Event{}, false, err
		}
		evs, err := s.events(ctx, eventSelect+` WHERE e.seq >= ? AND e.seq <= ? AND e.type IN (`+in+`) ORDER BY e.seq DESC LIMIT 1`,
			append([]any{first, last}, args...)...)
		if err != nil {
			return store.Event{}, false, err
		}
		if len(evs) == 1 {
			return evs[0], true, nil
		}
		upto = last - 1
	}
}

// unitEventsQuery reads a unit's events in a range of the log.
const unitEventsQuery = eventSelect + ` WHERE e.work_id = ? AND e.seq > ? AND e.seq <= ?`

// unitEvents returns the events of q.WorkID through the events_work index
// (migration 0009), filtered by q's types and tasks.
func (s *Store) unitEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	query := unitEventsQuery
	args := []any{q.WorkID, q.After, q.Upto}
	if len(q.Types) > 0 {
		query += ` AND e.type IN (` + placeholders(len(q.Types)) + `)`
		for _, t := range q.Types {
			args = append(args, t)
		}
	}
	if len(q.Tasks) > 0 {
		query += ` AND coalesce(e.task, '') IN (` + placeholders(len(q.Tasks)) + `)`
		for _, t := range q.Tasks {
			args = append(args, t)
		}
	}
	return s.events(ctx, query+` ORDER BY e.seq LIMIT ?`, append(args, q.Limit)...)
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

const eventSelect = `SELECT e.seq, e.type, e.at, coalesce(e.work_id, ''), coalesce(e.task, ''), coalesce(e.target, ''), e.attempt, e.data,
			CASE WHEN e.type = 'work_completed' THEN (SELECT result FROM work_units w WHERE w.id = e.work_id) END
		FROM events e`

func (s *Store) events(ctx context.Context, query string, args ...any) ([]store.Event, error) {
	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Event
	for rows.Next() {
		var e store.Event
		var at int64
		if err := rows.Scan(&e.Seq, &e.Type, &at, &e.WorkID, &e.Task, &e.Target, &e.Attempt, &e.Data, &e.Result); err != nil {
			return nil, err
		}
		e.Time = tm(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// LastSeq returns the highest event sequence number ever assigned.
func (s *Store) LastSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.read.QueryRowContext(ctx, `SELECT seq FROM sqlite_sequence WHERE name='events'`).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

// FirstSeq returns the lowest event sequence number still stored.
func (s *Store) FirstSeq(ctx context.Context) (int64, error) {
	var seq sql.NullInt64
	err := s.read.QueryRowContext(ctx, `SELECT min(seq) FROM events`).Scan(&seq)
	return seq.Int64, err
}

// Tasks returns the stored task definitions.
func (s *Store) Tasks(ctx context.Context) (map[string][]byte, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name, def FROM tasks`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string][]byte)
	for rows.Next() {
		var name string
		var def []byte
		if err := rows.Scan(&name, &def); err != nil {
			return nil, err
		}
		out[name] = def
	}
	return out, rows.Err()
}

// Services returns the stored services with their meters' state (a
// service with a stored meter state but no record, such as a keyed
// instance, is listed too).
func (s *Store) Services(ctx context.Context) ([]store.ServiceRecord, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT s.name, s.def, s.override, s.paused FROM services s
		UNION ALL
		SELECT DISTINCT m.service, NULL, NULL, 0 FROM meter_state m WHERE m.service NOT IN (SELECT name FROM services)
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	var out []store.ServiceRecord
	index := map[string]int{}
	for rows.Next() {
		var r store.ServiceRecord
		if err := rows.Scan(&r.Name, &r.Def, &r.Override, &r.Paused); err != nil {
			rows.Close()
			return nil, err
		}
		index[r.Name] = len(out)
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.read.QueryContext(ctx, `SELECT service, meter, state FROM meter_state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var svc, meter string
		var state []byte
		if err := rows.Scan(&svc, &meter, &state); err != nil {
			return nil, err
		}
		if i, ok := index[svc]; ok {
			r := &out[i]
			if r.Meters == nil {
				r.Meters = make(map[string][]byte, 1)
			}
			r.Meters[meter] = state
		}
	}
	return out, rows.Err()
}

// ServiceLog returns the starts logged for service since the given time.
func (s *Store) ServiceLog(ctx context.Context, service string, since time.Time) ([]store.Logged, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT started_at, meter, amount, reconciled FROM service_log
		WHERE service=? AND started_at >= ? ORDER BY started_at, rowid`, service, ns(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Logged
	for rows.Next() {
		var l store.Logged
		var at int64
		if err := rows.Scan(&at, &l.Meter, &l.Amount, &l.Reconciled); err != nil {
			return nil, err
		}
		l.At = tm(at)
		out = append(out, l)
	}
	return out, rows.Err()
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
	rows, err := s.read.QueryContext(ctx, `SELECT service, started_at, meter, amount, reconciled FROM service_log
		WHERE service >= ? AND service < ? AND started_at >= ? ORDER BY service, started_at, rowid`, prefix, hi, ns(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string][]store.Logged)
	for rows.Next() {
		var svc string
		var l store.Logged
		var at int64
		if err := rows.Scan(&svc, &at, &l.Meter, &l.Amount, &l.Reconciled); err != nil {
			return nil, err
		}
		l.At = tm(at)
		out[svc] = append(out[svc], l)
	}
	return out, rows.Err()
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
