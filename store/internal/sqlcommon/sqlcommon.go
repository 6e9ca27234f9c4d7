// Package sqlcommon holds what the SQL backends (store/sqlite,
// store/postgres) do alike, written once: reading rows into store's types,
// the conversions of times and empty values, and the statements that are
// the same in both dialects. Each backend passes its own SQL where the
// dialects differ (placeholders, collations, functions).
package sqlcommon

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Rows is what a backend's query returns: database/sql's rows (wrapped, for
// Close) and pgx's.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Query runs a query on a backend's read path.
type Query func(ctx context.Context, sql string, args ...any) (Rows, error)

// Nanos is t in Unix nanoseconds, as the backends store times; 0 for the
// zero time.
func Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time reads a stored time (0: the zero time).
func Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// NullString is s, or NULL when it is empty.
func NullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// NullBytes is b, or NULL when it is empty.
func NullBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// collect runs sql and scans each row with scan.
func collect(ctx context.Context, q Query, sql string, args []any, scan func(Rows) error) error {
	rows, err := q(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Tasks reads the stored task definitions (name, def).
func Tasks(ctx context.Context, q Query, sql string) (map[string][]byte, error) {
	out := make(map[string][]byte)
	err := collect(ctx, q, sql, nil, func(r Rows) error {
		var name string
		var def []byte
		err := r.Scan(&name, &def)
		out[name] = def
		return err
	})
	return out, err
}

// Services reads the stored services (records: name, def, override,
// paused) and their meters' states (meters: service, meter, state).
func Services(ctx context.Context, q Query, records, meters string) ([]store.ServiceRecord, error) {
	var out []store.ServiceRecord
	index := map[string]int{}
	err := collect(ctx, q, records, nil, func(r Rows) error {
		var rec store.ServiceRecord
		if err := r.Scan(&rec.Name, &rec.Def, &rec.Override, &rec.Paused); err != nil {
			return err
		}
		index[rec.Name] = len(out)
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = collect(ctx, q, meters, nil, func(r Rows) error {
		var svc, meter string
		var state []byte
		if err := r.Scan(&svc, &meter, &state); err != nil {
			return err
		}
		if i, ok := index[svc]; ok {
			rec := &out[i]
			if rec.Meters == nil {
				rec.Meters = make(map[string][]byte, 1)
			}
			rec.Meters[meter] = state
		}
		return nil
	})
	return out, err
}

// Logged reads a service log's starts (started_at, meter, amount,
// reconciled).
func Logged(ctx context.Context, q Query, sql string, args ...any) ([]store.Logged, error) {
	var out []store.Logged
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var l store.Logged
		var at int64
		err := r.Scan(&at, &l.Meter, &l.Amount, &l.Reconciled)
		l.At = Time(at)
		out = append(out, l)
		return err
	})
	return out, err
}

// LoggedByService reads several services' starts (service, started_at,
// meter, amount, reconciled).
func LoggedByService(ctx context.Context, q Query, sql string, args ...any) (map[string][]store.Logged, error) {
	out := make(map[string][]store.Logged)
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var svc string
		var l store.Logged
		var at int64
		err := r.Scan(&svc, &at, &l.Meter, &l.Amount, &l.Reconciled)
		l.At = Time(at)
		out[svc] = append(out[svc], l)
		return err
	})
	return out, err
}

// Counts reads the kept unit counts (task, state, n).
func Counts(ctx context.Context, q Query, sql string) ([]store.UnitCount, error) {
	var out []store.UnitCount
	err := collect(ctx, q, sql, nil, func(r Rows) error {
		var c store.UnitCount
		var st string
		var n int64
		err := r.Scan(&c.Task, &st, &n)
		c.State, c.N = store.State(st), int(n)
		out = append(out, c)
		return err
	})
	return out, err
}

// Activity reads the kept activity (minute, task, kind, n).
func Activity(ctx context.Context, q Query, sql string, args ...any) ([]store.ActivityCount, error) {
	var out []store.ActivityCount
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var minute, n int64
		var c store.ActivityCount
		err := r.Scan(&minute, &c.Task, &c.Kind, &n)
		c.Minute, c.N = time.Unix(0, minute*int64(time.Minute)), int(n)
		out = append(out, c)
		return err
	})
	return out, err
}

// QueueWaits reads the queue-wait histogram (bucket, n).
func QueueWaits(ctx context.Context, q Query, sql string, args ...any) ([]int64, error) {
	out := make([]int64, len(store.QueueWaitBounds)+1)
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var b, n int64
		if err := r.Scan(&b, &n); err != nil {
			return err
		}
		if b >= 0 && int(b) < len(out) {
			out[b] += n
		}
		return nil
	})
	return out, err
}

// Subscriptions reads the named subscriptions (name, acked, created_at,
// acked_at, types, tasks).
func Subscriptions(ctx context.Context, q Query, sql string) ([]store.Subscription, error) {
	var out []store.Subscription
	err := collect(ctx, q, sql, nil, func(r Rows) error {
		var sub store.Subscription
		var created, acked int64
		var types, tasks string
		if err := r.Scan(&sub.Name, &sub.Acked, &created, &acked, &types, &tasks); err != nil {
			return err
		}
		sub.CreatedAt, sub.AckedAt = Time(created), Time(acked)
		if err := store.DecodeSubscriptionFilter(&sub, types, tasks); err != nil {
			return err
		}
		out = append(out, sub)
		return nil
	})
	return out, err
}

// Row is one row to scan: a query's row, or the current row of Rows.
type Row interface {
	Scan(dest ...any) error
}

// Units reads the units sql selects, each with scan, then their
// dependencies with deps.
func Units(ctx context.Context, q Query, sql string, args []any, scan func(Row) (*store.Unit, error),
	deps func(context.Context, []*store.Unit) error) ([]*store.Unit, error) {
	var out []*store.Unit
	err := collect(ctx, q, sql, args, func(r Rows) error {
		u, err := scan(r)
		if err == nil {
			out = append(out, u)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := deps(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Unit reads the unit with ID id that sql selects, or store.ErrNotFound.
func Unit(ctx context.Context, q Query, sql string, id string, scan func(Row) (*store.Unit, error),
	deps func(context.Context, []*store.Unit) error) (*store.Unit, error) {
	us, err := Units(ctx, q, sql, []any{id}, scan, deps)
	if err != nil {
		return nil, err
	}
	if len(us) == 0 {
		return nil, fmt.Errorf("%w: %q", store.ErrNotFound, id)
	}
	return us[0], nil
}

// ListLimit is a ListFilter's Limit, 100 when it sets none.
func ListLimit(f store.ListFilter) int {
	if f.Limit <= 0 {
		return 100
	}
	return f.Limit
}

// Deliver calls fn for each unit of a page, in order, up to its first
// error.
func Deliver(page []*store.Unit, fn func(*store.Unit) error) error {
	for _, u := range page {
		if err := fn(u); err != nil {
			return err
		}
	}
	return nil
}

// DependsOn appends the dependencies sql reads (unit_id, depends_on, in
// their stored order) to the units of byID.
func DependsOn(ctx context.Context, q Query, byID map[string]*store.Unit, sql string, args ...any) error {
	return collect(ctx, q, sql, args, func(r Rows) error {
		var id, dep string
		if err := r.Scan(&id, &dep); err != nil {
			return err
		}
		if u := byID[id]; u != nil {
			u.DependsOn = append(u.DependsOn, dep)
		}
		return nil
	})
}

// States reads units' states (id, state) into out.
func States(ctx context.Context, q Query, out map[string]store.State, sql string, args ...any) error {
	return collect(ctx, q, sql, args, func(r Rows) error {
		var id, st string
		err := r.Scan(&id, &st)
		out[id] = store.State(st)
		return err
	})
}

// CountByTask reads counts by task (task, n).
func CountByTask(ctx context.Context, q Query, sql string, args ...any) (map[string]int, error) {
	out := make(map[string]int)
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var task string
		var n int64
		err := r.Scan(&task, &n)
		out[task] = int(n)
		return err
	})
	return out, err
}

// Strings reads one column of strings.
func Strings(ctx context.Context, q Query, sql string, args ...any) ([]string, error) {
	var out []string
	err := collect(ctx, q, sql, args, func(r Rows) error {
		var s string
		err := r.Scan(&s)
		out = append(out, s)
		return err
	})
	return out, err
}

// ListSQL is ListUnits' statement up to its LIMIT: the units of
// work_units (columns) that match every condition of where, by Seq
// (descending with desc).
func ListSQL(columns string, where []string, desc bool) string {
	q := `SELECT ` + columns + ` FROM work_units`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	if desc {
		return q + " ORDER BY seq DESC"
	}
	return q + " ORDER BY seq"
}

// OldestQueuedSQL selects the submission time of the first queued unit,
// through the open-units index.
const OldestQueuedSQL = `SELECT created_at FROM work_units
	WHERE state = 'queued' AND state NOT IN ('completed', 'skipped') ORDER BY seq LIMIT 1`

// CountActiveSQL selects the queued and running units by task, from the
// kept counts.
const CountActiveSQL = `SELECT task, sum(n) FROM unit_counts WHERE state IN ('queued','running') GROUP BY task HAVING sum(n) > 0`

// migrations lists the migrations of fsys's directory "migrations" (files
// named VERSION_name.sql), in version order.
func migrations(fsys fs.FS) ([]fs.DirEntry, []int, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, nil, err
	}
	versions := make([]int, len(entries))
	for i, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, nil, fmt.Errorf("bad migration name %q", e.Name())
		}
		versions[i] = v
	}
	sort.Sort(byVersion{entries, versions})
	return entries, versions, nil
}

type byVersion struct {
	e []fs.DirEntry
	v []int
}

func (b byVersion) Len() int           { return len(b.e) }
func (b byVersion) Less(i, j int) bool { return b.v[i] < b.v[j] }
func (b byVersion) Swap(i, j int) {
	b.e[i], b.e[j] = b.e[j], b.e[i]
	b.v[i], b.v[j] = b.v[j], b.v[i]
}

// SchemaVersion is the highest version of fsys's migrations: the schema
// version a backend writes (0 when they cannot be read).
func SchemaVersion(fsys fs.FS) int {
	n, _ := LatestMigration(fsys)
	return n
}

// LatestMigration is the highest version of fsys's migrations.
func LatestMigration(fsys fs.FS) (int, error) {
	_, versions, err := migrations(fsys)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range versions {
		n = max(n, v)
	}
	return n, nil
}

// Migrate applies, in version order, each migration of fsys above
// version, with apply (which runs its SQL and records its version, in the
// caller's transaction). A database whose version is above every
// migration's gives store.ErrSchemaTooNew.
func Migrate(fsys fs.FS, version int, apply func(v int, name, sql string) error) error {
	entries, versions, err := migrations(fsys)
	if err != nil {
		return err
	}
	latest := 0
	for i, e := range entries {
		v := versions[i]
		latest = max(latest, v)
		if v <= version {
			continue
		}
		body, err := fs.ReadFile(fsys, "migrations/"+e.Name())
		if err != nil {
			return err
		}
		if err := apply(v, e.Name(), string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", e.Name(), err)
		}
	}
	if version > latest {
		return fmt.Errorf("%w (the database has version %d, this runcue knows up to %d)", store.ErrSchemaTooNew, version, latest)
	}
	return nil
}

// UnitTimes are a unit's stored times and flags, as scanned.
type UnitTimes struct {
	Created, RunAt, Started, Finished, Timeout, LeaseExpires, Heartbeat, DependencyDeadline int64
	CancelRequested                                                                         int
}

// FillUnit sets u's times and flags from ts and decodes its costs and
// attempts columns.
func FillUnit(u *store.Unit, ts *UnitTimes, costs []byte, attempts string) error {
	u.CreatedAt, u.RunAt, u.StartedAt, u.FinishedAt = Time(ts.Created), Time(ts.RunAt), Time(ts.Started), Time(ts.Finished)
	u.Timeout = time.Duration(ts.Timeout)
	u.LeaseExpiresAt, u.DependencyDeadline, u.HeartbeatAt = Time(ts.LeaseExpires), Time(ts.DependencyDeadline), Time(ts.Heartbeat)
	u.CancelRequested = ts.CancelRequested != 0
	return store.DecodeUnitColumns(u, costs, attempts)
}

// ByID indexes units by ID, and lists their IDs in order.
func ByID(units []*store.Unit) (map[string]*store.Unit, []string) {
	byID := make(map[string]*store.Unit, len(units))
	ids := make([]string, 0, len(units))
	for _, u := range units {
		byID[u.ID] = u
		ids = append(ids, u.ID)
	}
	return byID, ids
}
