package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// What Stats reads: unit counts (kept by triggers, see migration 0006),
// per-minute activity and queue-wait histograms (counted by each
// transaction and added at its commit).

// update runs an UPDATE of one unit and returns the unit's task: task if
// the caller knew it, else read back (RETURNING).
func (t *txn) update(task, query string, args ...any) (string, bool, error) {
	if task != "" {
		ok, err := t.changed(query, args...)
		return task, ok, err
	}
	row, ok, err := t.one(query+` RETURNING task`, args...)
	if !ok {
		return "", false, err
	}
	return asStr(row[0]), true, err
}

// flushCounts writes the transaction's count changes, in one statement.
func (t *txn) flushCounts() error {
	if len(t.Counted) == 0 {
		return nil
	}
	type key struct {
		Task  string
		State store.State
	}
	sum := make(map[key]int, 4)
	for _, c := range t.Counted {
		sum[key{c.Task, c.State}] += c.D
	}
	var args []any
	for k, n := range sum {
		if n != 0 {
			args = append(args, k.Task, string(k.State), int64(n))
		}
	}
	if len(args) == 0 {
		return nil
	}
	_, err := t.exec(`INSERT INTO unit_counts(task, state, n) VALUES `+rowsOf(len(args)/3, "(?,?,?)")+`
		ON CONFLICT(task, state) DO UPDATE SET n = n + excluded.n`, args...)
	return err
}

// rowsOf returns n copies of row, comma-separated (VALUES lists).
func rowsOf(n int, row string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(row)
	}
	return b.String()
}

// flushActivity adds the transaction's counts, one statement per row.
func (t *txn) flushActivity() error {
	if len(t.Activity) == 0 {
		return nil
	}
	counts := make(map[store.ActivityKey]int64, 8)
	for _, k := range t.Activity {
		counts[k]++
	}
	var acts, waits []any
	for k, n := range counts {
		if k.Bucket > 0 {
			waits = append(waits, k.Minute, int64(k.Bucket-1), n)
		} else {
			acts = append(acts, k.Minute, k.Task, k.Kind, n)
		}
	}
	if len(acts) > 0 {
		if _, err := t.exec(`INSERT INTO activity(minute, task, kind, n) VALUES `+rowsOf(len(acts)/4, "(?,?,?,?)")+`
			ON CONFLICT(minute, task, kind) DO UPDATE SET n = n + excluded.n`, acts...); err != nil {
			return err
		}
	}
	if len(waits) > 0 {
		if _, err := t.exec(`INSERT INTO queue_wait(minute, bucket, n) VALUES `+rowsOf(len(waits)/3, "(?,?,?)")+`
			ON CONFLICT(minute, bucket) DO UPDATE SET n = n + excluded.n`, waits...); err != nil {
			return err
		}
	}
	return nil
}

// Counts returns the kept unit counts.
func (s *Store) Counts(ctx context.Context) ([]store.UnitCount, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT task, state, n FROM unit_counts WHERE n <> 0 ORDER BY task, state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.UnitCount
	for rows.Next() {
		var c store.UnitCount
		if err := rows.Scan(&c.Task, &c.State, &c.N); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// OldestQueued returns the submission time of the first queued unit, by
// the open-units index.
func (s *Store) OldestQueued(ctx context.Context) (time.Time, bool, error) {
	var created int64
	err := s.read.QueryRowContext(ctx, `SELECT created_at FROM work_units
		WHERE state = 'queued' AND state NOT IN ('completed', 'skipped') ORDER BY seq LIMIT 1`).Scan(&created)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, err
	}
	return tm(created), true, nil
}

// Activity returns the kept activity of the minutes from since.
func (s *Store) Activity(ctx context.Context, since time.Time) ([]store.ActivityCount, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT minute, task, kind, n FROM activity WHERE minute >= ? ORDER BY minute, task, kind`,
		since.UnixNano()/int64(time.Minute))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.ActivityCount
	for rows.Next() {
		var minute int64
		var c store.ActivityCount
		if err := rows.Scan(&minute, &c.Task, &c.Kind, &c.N); err != nil {
			return nil, err
		}
		c.Minute = time.Unix(0, minute*int64(time.Minute))
		out = append(out, c)
	}
	return out, rows.Err()
}

// QueueWaits returns the queue-wait histogram of the minutes from since.
func (s *Store) QueueWaits(ctx context.Context, since time.Time) ([]int64, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT bucket, sum(n) FROM queue_wait WHERE minute >= ? GROUP BY bucket`,
		since.UnixNano()/int64(time.Minute))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]int64, len(store.QueueWaitBounds)+1)
	for rows.Next() {
		var b, n int64
		if err := rows.Scan(&b, &n); err != nil {
			return nil, err
		}
		if b >= 0 && int(b) < len(out) {
			out[b] += n
		}
	}
	return out, rows.Err()
}

// Subscriptions returns the named subscriptions.
func (s *Store) Subscriptions(ctx context.Context) ([]store.Subscription, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name, acked, created_at, acked_at, types, tasks FROM subscriptions ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Subscription
	for rows.Next() {
		var sub store.Subscription
		var created, acked int64
		var types, tasks string
		if err := rows.Scan(&sub.Name, &sub.Acked, &created, &acked, &types, &tasks); err != nil {
			return nil, err
		}
		sub.CreatedAt, sub.AckedAt = tm(created), tm(acked)
		if err := store.DecodeSubscriptionFilter(&sub, types, tasks); err != nil {
			return nil, err
		}
		out = append(out, sub)
	}
	return out, rows.Err()
}

// Backup writes a consistent copy of the database to path (which must not
// exist), from one read transaction: writers go on meanwhile. The copy is
// compacted (VACUUM INTO).
func (s *Store) Backup(ctx context.Context, path string) error {
	conn, err := s.read.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A read connection refuses writes (query_only); VACUUM INTO writes
	// only the new file, but SQLite counts it as a write: lift the guard
	// on this connection for the statement.
	if _, err := conn.ExecContext(ctx, `PRAGMA query_only = 0`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA query_only = 1`)
	_, err = conn.ExecContext(ctx, `VACUUM INTO ?`, path)
	return err
}
