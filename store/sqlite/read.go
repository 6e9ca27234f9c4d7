package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

const unitColumns = `seq, id, task, target, params, state, runs, failures, deferrals, created_at, run_at, started_at,
	finished_at, timeout, coalesce(leased_by, ''), lease_expires_at, heartbeat_at, result, coalesce(error, ''), coalesce(error_kind, ''),
	coalesce(idempotency_key, ''), dependency_deadline, retry, trace, cancel_requested, attempts`

type scanner interface{ Scan(dest ...any) error }

func scanUnit(sc scanner) (*store.Unit, error) {
	var u store.Unit
	var created, runAt, started, finished, timeout, leaseExp, heartbeat, depDeadline int64
	var cancelReq int
	var attempts sql.NullString
	if err := sc.Scan(&u.Seq, &u.ID, &u.Task, &u.Target, &u.Params, &u.State, &u.Runs, &u.Failures, &u.Deferrals,
		&created, &runAt, &started, &finished, &timeout, &u.LeasedBy, &leaseExp, &heartbeat, &u.Result, &u.Error, &u.ErrorKind,
		&u.IdempotencyKey, &depDeadline, &u.Retry, &u.Trace, &cancelReq, &attempts); err != nil {
		return nil, err
	}
	u.CreatedAt, u.RunAt, u.StartedAt, u.FinishedAt = tm(created), tm(runAt), tm(started), tm(finished)
	u.Timeout = time.Duration(timeout)
	u.LeaseExpiresAt, u.DependencyDeadline, u.HeartbeatAt = tm(leaseExp), tm(depDeadline), tm(heartbeat)
	u.CancelRequested = cancelReq != 0
	if attempts.Valid && attempts.String != "" {
		var recs []attemptRec
		if err := json.Unmarshal([]byte(attempts.String), &recs); err != nil {
			return nil, fmt.Errorf("unit %s: attempts: %w", u.ID, err)
		}
		u.Attempts = make([]store.Attempt, len(recs))
		for i, a := range recs {
			u.Attempts[i] = store.Attempt{Run: a.Run, Start: tm(a.Start), End: tm(a.End), Outcome: a.Outcome, Error: a.Error}
		}
	}
	return &u, nil
}

// attemptRec is an attempt as stored (see attemptJSON).
type attemptRec struct {
	Run     int    `json:"run"`
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	Outcome string `json:"outcome"`
	Error   string `json:"error"`
}

func (s *Store) dependsOn(ctx context.Context, units []*store.Unit) error {
	if len(units) == 0 {
		return nil
	}
	byID := make(map[string]*store.Unit, len(units))
	args := make([]any, 0, len(units))
	for _, u := range units {
		byID[u.ID] = u
		args = append(args, u.ID)
	}
	// Chunk to stay under SQLite's host-parameter limit.
	for len(args) > 0 {
		n := min(len(args), maxIDs)
		rows, err := s.read.QueryContext(ctx, `SELECT unit_id, depends_on FROM dependencies WHERE unit_id IN (`+placeholders(n)+`) ORDER BY rowid`, args[:n]...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id, dep string
			if err := rows.Scan(&id, &dep); err != nil {
				rows.Close()
				return err
			}
			byID[id].DependsOn = append(byID[id].DependsOn, dep)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		args = args[n:]
	}
	return nil
}

// pageDependsOn fills the dependencies of a page of LoadActive (units in
// Seq order, all active) with one query on the page's Seq range: no
// argument per unit.
func (s *Store) pageDependsOn(ctx context.Context, page []*store.Unit) error {
	rows, err := s.read.QueryContext(ctx, `SELECT w.seq, d.depends_on FROM work_units w JOIN dependencies d ON d.unit_id = w.id
		WHERE w.seq BETWEEN ? AND ? AND w.state IN ('queued','running') ORDER BY w.seq, d.rowid`, page[0].Seq, page[len(page)-1].Seq)
	if err != nil {
		return err
	}
	defer rows.Close()
	i := 0
	for rows.Next() {
		var seq int64
		var dep string
		if err := rows.Scan(&seq, &dep); err != nil {
			return err
		}
		for i < len(page) && page[i].Seq < seq {
			i++
		}
		if i < len(page) && page[i].Seq == seq {
			page[i].DependsOn = append(page[i].DependsOn, dep)
		}
	}
	return rows.Err()
}

// maxIDs caps the IDs bound in one query, under SQLite's host-parameter
// limit.
const maxIDs = 500

// UnitStates returns the state of each unit of ids that is stored.
func (s *Store) UnitStates(ctx context.Context, ids []string) (map[string]store.State, error) {
	out := make(map[string]store.State, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), maxIDs)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		rows, err := s.read.QueryContext(ctx, `SELECT id, state FROM work_units WHERE id IN (`+placeholders(n)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id, state string
			if err := rows.Scan(&id, &state); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = store.State(state)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// GetUnit returns the unit with the given ID, or store.ErrNotFound.
func (s *Store) GetUnit(ctx context.Context, id string) (*store.Unit, error) {
	u, err := scanUnit(s.read.QueryRowContext(ctx, `SELECT `+unitColumns+` FROM work_units WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", store.ErrNotFound, id)
	} else if err != nil {
		return nil, err
	}
	if err := s.dependsOn(ctx, []*store.Unit{u}); err != nil {
		return nil, err
	}
	return u, nil
}

// ListUnits returns units matching f.
func (s *Store) ListUnits(ctx context.Context, f store.ListFilter) ([]*store.Unit, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	if len(f.IDs) > maxIDs {
		// Chunk to stay under SQLite's host-parameter limit, then merge.
		var out []*store.Unit
		ids := f.IDs
		for len(ids) > 0 {
			n := min(len(ids), maxIDs)
			f.IDs, ids = ids[:n], ids[n:]
			part, err := s.ListUnits(ctx, f)
			if err != nil {
				return nil, err
			}
			out = append(out, part...)
		}
		slices.SortFunc(out, func(a, b *store.Unit) int {
			if f.Desc {
				return cmp.Compare(b.Seq, a.Seq)
			}
			return cmp.Compare(a.Seq, b.Seq)
		})
		return out[:min(len(out), limit)], nil
	}
	var where []string
	var args []any
	if len(f.IDs) > 0 {
		where = append(where, "id IN ("+placeholders(len(f.IDs))+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		open := true
		for _, st := range f.States {
			args = append(args, string(st))
			open = open && st != store.Completed && st != store.Skipped
		}
		if open {
			// The open-units index's own condition, so that SQLite may
			// use that partial index instead of walking the history.
			where = append(where, "state NOT IN ('completed', 'skipped')")
		}
	}
	if len(f.Tasks) > 0 {
		where = append(where, "task IN ("+placeholders(len(f.Tasks))+")")
		for _, t := range f.Tasks {
			args = append(args, t)
		}
	}
	if f.AfterSeq > 0 {
		where = append(where, "seq > ?")
		args = append(args, f.AfterSeq)
	}
	if f.BeforeSeq > 0 {
		where = append(where, "seq < ?")
		args = append(args, f.BeforeSeq)
	}
	if !f.FinishedBefore.IsZero() {
		where = append(where, "finished_at > 0 AND finished_at < ?")
		args = append(args, ns(f.FinishedBefore))
	}
	if !f.FinishedAfter.IsZero() {
		where = append(where, "finished_at >= ?")
		args = append(args, ns(f.FinishedAfter))
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, ns(f.CreatedAfter))
	}
	if !f.CreatedBefore.IsZero() {
		where = append(where, "created_at < ?")
		args = append(args, ns(f.CreatedBefore))
	}
	if f.TargetPrefix != "" {
		where = append(where, "substr(target, 1, ?) = ?")
		args = append(args, len([]rune(f.TargetPrefix)), f.TargetPrefix)
	}
	if f.ErrorContains != "" {
		where = append(where, "instr(coalesce(error, ''), ?) > 0")
		args = append(args, f.ErrorContains)
	}
	q := `SELECT ` + unitColumns + ` FROM work_units`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Desc {
		q += " ORDER BY seq DESC"
	} else {
		q += " ORDER BY seq"
	}
	q += " LIMIT ?"
	args = append(args, limit)
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Unit
	for rows.Next() {
		u, err := scanUnit(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := s.dependsOn(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// LoadActive calls fn for every queued or running unit, in Seq order,
// without Result, Error and Attempts. It reads in pages, so no read
// transaction stays open across calls to fn.
//
// Each state is read through the open-units index (work_units_open), so a
// database with a long history of finished units loads in time that
// follows its active units; the two states' pages are merged by Seq.
func (s *Store) LoadActive(ctx context.Context, fn func(*store.Unit) error) error {
	const size = 1000
	// Each state's page records are reused from page to page (fn keeps
	// none): a deep queue's load makes little garbage.
	queued := activePages{state: store.Queued, recs: make([]store.Unit, size)}
	running := activePages{state: store.Running, recs: make([]store.Unit, size)}
	var after int64
	for {
		if err := s.activePage(ctx, &queued, after, size); err != nil {
			return err
		}
		if err := s.activePage(ctx, &running, after, size); err != nil {
			return err
		}
		// Every unit up to bound is in one of the two pages: a full page
		// may have more after its last unit.
		bound := int64(math.MaxInt64)
		for _, p := range []*activePages{&queued, &running} {
			if len(p.page) == size {
				bound = min(bound, p.page[len(p.page)-1].Seq)
			}
		}
		page := mergeBySeq(queued.page, running.page, bound)
		if len(page) == 0 {
			return nil
		}
		if err := s.pageDependsOn(ctx, page); err != nil {
			return err
		}
		for _, u := range page {
			if err := fn(u); err != nil {
				return err
			}
		}
		if bound == math.MaxInt64 {
			return nil
		}
		after = bound
	}
}

// activePages reads one state's active units, a page at a time, into
// reused records.
type activePages struct {
	state store.State
	recs  []store.Unit
	page  []*store.Unit
}

// activePage reads p's next page: up to size units of p's state after
// seq after, in Seq order.
func (s *Store) activePage(ctx context.Context, p *activePages, after int64, size int) error {
	p.page = p.page[:0]
	// The state NOT IN term is the open-units index's own condition: it
	// lets SQLite use that partial index.
	rows, err := s.read.QueryContext(ctx, `SELECT seq, id, task, target, params, state, runs, failures, deferrals, created_at, run_at,
			started_at, timeout, coalesce(leased_by, ''), lease_expires_at, coalesce(idempotency_key, ''), dependency_deadline,
			retry, trace, cancel_requested, coalesce(error_kind, '')
		FROM work_units INDEXED BY work_units_open
		WHERE state = ? AND state NOT IN ('completed', 'skipped') AND seq > ? ORDER BY seq LIMIT ?`, string(p.state), after, size)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		u := &p.recs[len(p.page)]
		*u = store.Unit{}
		var created, runAt, started, timeout, leaseExp, depDeadline int64
		var cancelReq int
		if err := rows.Scan(&u.Seq, &u.ID, &u.Task, &u.Target, &u.Params, &u.State, &u.Runs, &u.Failures, &u.Deferrals, &created,
			&runAt, &started, &timeout, &u.LeasedBy, &leaseExp, &u.IdempotencyKey, &depDeadline, &u.Retry, &u.Trace,
			&cancelReq, &u.ErrorKind); err != nil {
			return err
		}
		u.CreatedAt, u.RunAt, u.StartedAt = tm(created), tm(runAt), tm(started)
		u.Timeout, u.LeaseExpiresAt, u.DependencyDeadline = time.Duration(timeout), tm(leaseExp), tm(depDeadline)
		u.CancelRequested = cancelReq != 0
		p.page = append(p.page, u)
	}
	return rows.Err()
}

// mergeBySeq merges two pages in Seq order, keeping the units up to bound.
func mergeBySeq(a, b []*store.Unit, bound int64) []*store.Unit {
	out := make([]*store.Unit, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		var u *store.Unit
		if len(b) == 0 || (len(a) > 0 && a[0].Seq < b[0].Seq) {
			u, a = a[0], a[1:]
		} else {
			u, b = b[0], b[1:]
		}
		if u.Seq > bound {
			break
		}
		out = append(out, u)
	}
	return out
}

// CountActive returns queued plus running units per task, from the kept
// counts.
func (s *Store) CountActive(ctx context.Context) (map[string]int, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT task, sum(n) FROM unit_counts WHERE state IN ('queued','running') GROUP BY task HAVING sum(n) > 0`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]int)
	for rows.Next() {
		var task string
		var n int
		if err := rows.Scan(&task, &n); err != nil {
			return nil, err
		}
		out[task] = n
	}
	return out, rows.Err()
}

// Dependents returns the IDs of the units that depend on id.
func (s *Store) Dependents(ctx context.Context, id string) ([]string, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT unit_id FROM dependencies WHERE depends_on=? ORDER BY unit_id`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

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

// Services returns the stored services with their circuit state.
func (s *Store) Services(ctx context.Context) ([]store.ServiceRecord, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT s.name, s.def, s.override, s.paused, c.state
		FROM services s LEFT JOIN circuit_state c ON c.service = s.name
		UNION ALL
		SELECT c.service, NULL, NULL, 0, c.state FROM circuit_state c WHERE c.service NOT IN (SELECT name FROM services)
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.ServiceRecord
	for rows.Next() {
		var r store.ServiceRecord
		if err := rows.Scan(&r.Name, &r.Def, &r.Override, &r.Paused, &r.Circuit); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ServiceLog returns the dispatch times of service since the given time.
func (s *Store) ServiceLog(ctx context.Context, service string, since time.Time) ([]time.Time, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT started_at FROM service_log WHERE service=? AND started_at >= ? ORDER BY started_at`,
		service, ns(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at); err != nil {
			return nil, err
		}
		out = append(out, tm(at))
	}
	return out, rows.Err()
}

// ServiceLogPrefix returns the recent dispatch times of every service whose
// name starts with prefix.
func (s *Store) ServiceLogPrefix(ctx context.Context, prefix string, since time.Time) (map[string][]time.Time, error) {
	// A range on the index: prefix <= service < prefix with its last byte
	// incremented.
	hi := prefix + "\xff"
	if n := len(prefix); n > 0 && prefix[n-1] < 0xff {
		hi = prefix[:n-1] + string(rune(prefix[n-1]+1))
	}
	rows, err := s.read.QueryContext(ctx, `SELECT service, started_at FROM service_log
		WHERE service >= ? AND service < ? AND started_at >= ? ORDER BY service, started_at`, prefix, hi, ns(since))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string][]time.Time)
	for rows.Next() {
		var svc string
		var at int64
		if err := rows.Scan(&svc, &at); err != nil {
			return nil, err
		}
		out[svc] = append(out[svc], tm(at))
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

// QueuedCount returns the number of queued units, from the count every
// transaction maintains.
func (s *Store) QueuedCount(ctx context.Context) (int, error) {
	var n int
	err := s.read.QueryRowContext(ctx, `SELECT coalesce(sum(n), 0) FROM unit_counts WHERE state = 'queued'`).Scan(&n)
	return n, err
}
