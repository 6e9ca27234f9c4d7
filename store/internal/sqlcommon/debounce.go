package sqlcommon

import (
	"context"
	"time"
)

// DebounceOf reads the debounce key a unit holds (sql selects key and
// since of the unit given as its one argument).
func DebounceOf(ctx context.Context, q Query, sql, id string) (string, time.Time, bool, error) {
	var key string
	var since int64
	var found bool
	err := collect(ctx, q, sql, []any{id}, func(r Rows) error {
		found = true
		return r.Scan(&key, &since)
	})
	if err != nil || !found {
		return "", time.Time{}, false, err
	}
	return key, Time(since), true, nil
}

// Count runs a query of one count (sql selects count(*)).
func Count(ctx context.Context, q Query, sql string, args ...any) (int, error) {
	var n int64
	err := collect(ctx, q, sql, args, func(r Rows) error { return r.Scan(&n) })
	return int(n), err
}
