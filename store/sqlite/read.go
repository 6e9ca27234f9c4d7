package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"math"
	"slices"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

const unitColumns = `seq, id, task, target, params, state, runs, failures, deferrals, created_at, run_at, started_at,
	finished_at, timeout, coalesce(leased_by, ''), lease_expires_at, heartbeat_at, result, coalesce(error, ''), coalesce(error_kind, ''),
	coalesce(idempotency_key, ''), dependency_deadline, retry, trace, cancel_requested, attempts, costs, epoch`

func scanUnit(sc sqlcommon.Row) (*store.Unit, error) {
	var u store.Unit
	var ts sqlcommon.UnitTimes
	var attempts sql.NullString
	var costs []byte
	if err := sc.Scan(&u.Seq, &u.ID, &u.Task, &u.Target, &u.Params, &u.State, &u.Runs, &u.Failures, &u.Deferrals,
		&ts.Created, &ts.RunAt, &ts.Started, &ts.Finished, &ts.Timeout, &u.LeasedBy, &ts.LeaseExpires, &ts.Heartbeat, &u.Result,
		&u.Error, &u.ErrorKind, &u.IdempotencyKey, &ts.DependencyDeadline, &u.Retry, &u.Trace, &ts.CancelRequested, &attempts, &costs,
		&u.Epoch); err != nil {
		return nil, err
	}
	return &u, sqlcommon.FillUnit(&u, &ts, costs, attempts.String)
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
		err := sqlcommon.DependsOn(ctx, s.query, byID, `SELECT unit_id, depends_on FROM dependencies WHERE unit_id IN (`+placeholders(n)+`) ORDER BY rowid`, args[:n]...)
		if err != nil {
			return err
		}
		args = args[n:]
	}
	return nil
}

// pageDependsOn fills the dependencies of the units of a page of
// LoadActive that have any (need: the page's reads found their rows), in
// the order they were stored. Units without dependencies, most of a deep
// queue, cost no read here.
func (s *Store) pageDependsOn(ctx context.Context, need []*store.Unit) error {
	for len(need) > 0 {
		n := min(len(need), maxIDs)
		byID := make(map[string]*store.Unit, n)
		args := make([]any, n)
		for i, u := range need[:n] {
			byID[u.ID] = u
			args[i] = u.ID
		}
		need = need[n:]
		err := sqlcommon.DependsOn(ctx, s.query, byID, `SELECT unit_id, depends_on FROM dependencies
			WHERE unit_id IN (`+placeholders(n)+`) ORDER BY rowid`, args...)
		if err != nil {
			return err
		}
	}
	return nil
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
		if err := sqlcommon.States(ctx, s.query, out, `SELECT id, state FROM work_units WHERE id IN (`+placeholders(n)+`)`, args...); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// GetUnit returns the unit with the given ID, or store.ErrNotFound.
func (s *Store) GetUnit(ctx context.Context, id string) (*store.Unit, error) {
	return sqlcommon.Unit(ctx, s.query, `SELECT `+unitColumns+` FROM work_units WHERE id=?`, id, scanUnit, s.dependsOn)
}

// ListUnits returns units matching f.
func (s *Store) ListUnits(ctx context.Context, f store.ListFilter) ([]*store.Unit, error) {
	limit := sqlcommon.ListLimit(f)
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
	q := sqlcommon.ListSQL(unitColumns, where, f.Desc) + " LIMIT ?"
	return sqlcommon.Units(ctx, s.query, q, append(args, limit), scanUnit, s.dependsOn)
}

// LoadActive calls fn for every queued or running unit, in Seq order,
// without Result, Error and Attempts. It reads in pages, so no read
// transaction stays open across calls to fn.
//
// Each state is read through the open-units index (work_units_open), so a
// database with a long history of finished units loads in time that
// follows its active units; the two states' pages are merged by Seq.
func (s *Store) LoadActive(ctx context.Context, after int64, fn func(*store.Unit) error) error {
	const size = 1000
	// Each state's page records are reused from page to page (fn keeps
	// none): a deep queue's load makes little garbage.
	queued := activePages{state: store.Queued, recs: make([]store.Unit, size), deps: map[*store.Unit]struct{}{}}
	running := activePages{state: store.Running, recs: make([]store.Unit, size), deps: map[*store.Unit]struct{}{}}
	var need []*store.Unit
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
		need = need[:0]
		for _, u := range page {
			if _, ok := queued.deps[u]; ok {
				need = append(need, u)
			} else if _, ok := running.deps[u]; ok {
				need = append(need, u)
			}
		}
		if err := s.pageDependsOn(ctx, need); err != nil {
			return err
		}
		if err := sqlcommon.Deliver(page, fn); err != nil {
			return err
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
	// deps holds the units of page that have dependencies.
	deps map[*store.Unit]struct{}
}

// activePage reads p's next page: up to size units of p's state after
// seq after, in Seq order. A queued unit's run columns (the lease, the
// run's epoch, a cancellation request) are not read: a queued unit has
// none.
func (s *Store) activePage(ctx context.Context, p *activePages, after int64, size int) error {
	p.page = p.page[:0]
	clear(p.deps)
	// The state NOT IN term is the open-units index's own condition: it
	// lets SQLite use that partial index.
	const cols = `seq, id, task, target, params, runs, failures, deferrals, created_at, run_at,
			started_at, timeout, coalesce(idempotency_key, ''), dependency_deadline,
			retry, trace, coalesce(error_kind, ''), costs,
			EXISTS (SELECT 1 FROM dependencies d WHERE d.unit_id = work_units.id)`
	const from = ` FROM work_units INDEXED BY work_units_open
		WHERE state = ? AND state NOT IN ('completed', 'skipped') AND seq > ? ORDER BY seq LIMIT ?`
	running := p.state == store.Running
	q := `SELECT ` + cols + from
	if running {
		q = `SELECT ` + cols + `, coalesce(leased_by, ''), lease_expires_at, cancel_requested, epoch` + from
	}
	rows, err := s.read.QueryContext(ctx, q, string(p.state), after, size)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		u := &p.recs[len(p.page)]
		*u = store.Unit{State: p.state}
		var created, runAt, started, timeout, leaseExp, depDeadline int64
		var cancelReq int
		var costs []byte
		var hasDeps bool
		dest := []any{&u.Seq, &u.ID, &u.Task, &u.Target, &u.Params, &u.Runs, &u.Failures, &u.Deferrals, &created,
			&runAt, &started, &timeout, &u.IdempotencyKey, &depDeadline, &u.Retry, &u.Trace,
			&u.ErrorKind, &costs, &hasDeps}
		if running {
			dest = append(dest, &u.LeasedBy, &leaseExp, &cancelReq, &u.Epoch)
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if err := store.DecodeUnitColumns(u, costs, ""); err != nil {
			return err
		}
		u.CreatedAt, u.RunAt, u.StartedAt = tm(created), tm(runAt), tm(started)
		u.Timeout, u.LeaseExpiresAt, u.DependencyDeadline = time.Duration(timeout), tm(leaseExp), tm(depDeadline)
		u.CancelRequested = cancelReq != 0
		if hasDeps {
			p.deps[u] = struct{}{}
		}
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
	return sqlcommon.CountByTask(ctx, s.query, sqlcommon.CountActiveSQL)
}

// Dependents returns the IDs of the units that depend on id.
func (s *Store) Dependents(ctx context.Context, id string) ([]string, error) {
	return sqlcommon.Strings(ctx, s.query, `SELECT unit_id FROM dependencies WHERE depends_on=? ORDER BY unit_id`, id)
}

// QueuedCount returns the number of queued units, from the count every
// transaction maintains.
func (s *Store) QueuedCount(ctx context.Context) (int, error) {
	var n int
	err := s.read.QueryRowContext(ctx, `SELECT coalesce(sum(n), 0) FROM unit_counts WHERE state = 'queued'`).Scan(&n)
	return n, err
}

// query runs a read on the read connections (sqlcommon.Query).
func (s *Store) query(ctx context.Context, q string, args ...any) (sqlcommon.Rows, error) {
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

// sqlRows are database/sql's rows as sqlcommon reads them.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
