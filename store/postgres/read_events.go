package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
)

// Reads of the event log (the same block format and algorithms as the
// SQLite backend's).

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
	filter, fargs := "", []any{q.After, q.Upto}
	if len(q.Types) > 0 {
		fargs = append(fargs, q.Types)
		filter += fmt.Sprintf(` AND type = ANY($%d)`, len(fargs))
	}
	if len(q.Tasks) > 0 {
		fargs = append(fargs, q.Tasks)
		filter += fmt.Sprintf(` AND task = ANY($%d)`, len(fargs))
	}
	ranges, err := s.ranges(ctx, `SELECT first, last FROM event_ranges WHERE last > $1 AND first <= $2`+filter+` ORDER BY first`, fargs...)
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
const blocksFromQuery = `SELECT first, last, data FROM event_blocks WHERE last >= $1 ORDER BY last`

// unitRecordQuery reads a unit's record of its events, by its ID.
const unitRecordQuery = `SELECT coalesce(events, ''::bytea) FROM work_units WHERE id = $1`

// blocksFrom reads the blocks that end at or after seq, in order, and
// calls fn with each until it returns false.
func (s *Store) blocksFrom(ctx context.Context, seq int64, fn func(first, last int64, data []byte) (bool, error)) error {
	rows, err := s.pool.Query(ctx, blocksFromQuery, seq)
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
	sel := store.EventSelector(store.EventQuery{Types: types})
	upto := int64(math.MaxInt64)
	for {
		var first, last int64
		err := s.pool.QueryRow(ctx, `SELECT first, last FROM event_ranges WHERE type = ANY($1) AND last <= $2 ORDER BY last DESC LIMIT 1`,
			types, upto).Scan(&first, &last)
		if errors.Is(err, pgx.ErrNoRows) {
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
	rows, err := s.pool.Query(ctx, `SELECT first, last, data FROM event_blocks
		WHERE last <= coalesce((SELECT last FROM event_blocks WHERE last >= $1 ORDER BY last LIMIT 1), $1)
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
	err := s.pool.QueryRow(ctx, unitRecordQuery, q.WorkID).Scan(&rec)
	if errors.Is(err, pgx.ErrNoRows) {
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
	var ids []string
	for i := range evs {
		if evs[i].Type == "work_completed" && evs[i].WorkID != "" {
			ids = append(ids, evs[i].WorkID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	results := make(map[string][]byte, len(ids))
	rows, err := s.pool.Query(ctx, `SELECT id, result FROM work_units WHERE id = ANY($1)`, ids)
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
	for i := range evs {
		if evs[i].Type == "work_completed" {
			evs[i].Result = results[evs[i].WorkID]
		}
	}
	return nil
}

// ranges reads (first, last) pairs and merges the overlapping ones.
func (s *Store) ranges(ctx context.Context, query string, args ...any) ([][2]int64, error) {
	rows, err := s.pool.Query(ctx, query, args...)
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

// LastSeq returns the highest event sequence number committed: the log's
// counter, which a transaction moves on only in its commit (see Apply).
func (s *Store) LastSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT value FROM meta WHERE key = 'events_last'`).Scan(&seq)
	return seq, err
}

// FirstSeq returns the lowest event sequence number still stored.
func (s *Store) FirstSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT first FROM event_blocks ORDER BY last LIMIT 1`).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}
