package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
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
	var args []any
	for _, c := range sqlcommon.CountChanges(t.Counted) {
		args = append(args, c.Task, string(c.State), c.N)
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
	return sqlcommon.Counts(ctx, s.query, `SELECT task, state, n FROM unit_counts WHERE n <> 0 ORDER BY task, state`)
}

// OldestQueued returns the submission time of the first queued unit, by
// the open-units index.
func (s *Store) OldestQueued(ctx context.Context) (time.Time, bool, error) {
	var created int64
	err := s.read.QueryRowContext(ctx, sqlcommon.OldestQueuedSQL).Scan(&created)
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
	return sqlcommon.Activity(ctx, s.query, `SELECT minute, task, kind, n FROM activity WHERE minute >= ? ORDER BY minute, task, kind`,
		since.UnixNano()/int64(time.Minute))
}

// QueueWaits returns the queue-wait histogram of the minutes from since.
func (s *Store) QueueWaits(ctx context.Context, since time.Time) ([]int64, error) {
	return sqlcommon.QueueWaits(ctx, s.query, `SELECT bucket, sum(n) FROM queue_wait WHERE minute >= ? GROUP BY bucket`,
		since.UnixNano()/int64(time.Minute))
}

// Subscriptions returns the named subscriptions.
func (s *Store) Subscriptions(ctx context.Context) ([]store.Subscription, error) {
	return sqlcommon.Subscriptions(ctx, s.query, `SELECT name, acked, created_at, acked_at, types, tasks FROM subscriptions ORDER BY name`)
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
