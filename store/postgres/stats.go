package postgres

import (
	"strconv"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// The counts Stats reads: units by task and state, per-minute activity and
// queue-wait histograms, counted by each transaction and added at its
// commit.

// flushCounts writes the transaction's count changes, in one statement.
func (t *txn) flushCounts() error {
	if len(t.Counted) == 0 {
		return nil
	}
	var tasks, states []string
	var ns []int64
	for _, c := range sqlcommon.CountChanges(t.Counted) {
		tasks, states, ns = append(tasks, c.Task), append(states, string(c.State)), append(ns, c.N)
	}
	t.Counted = t.Counted[:0]
	if len(tasks) == 0 {
		return nil
	}
	t.queue(`INSERT INTO unit_counts(task, state, n) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
		ON CONFLICT(task, state) DO UPDATE SET n = unit_counts.n + excluded.n`, tasks, states, ns)
	return nil
}

// flushActivity adds the transaction's counts.
func (t *txn) flushActivity() error {
	if len(t.Activity) == 0 {
		return nil
	}
	counts := map[store.ActivityKey]int64{}
	var order []store.ActivityKey
	for _, k := range t.Activity {
		if _, ok := counts[k]; !ok {
			order = append(order, k)
		}
		counts[k]++
	}
	t.Activity = t.Activity[:0]
	var aMin, aN, wMin, wBucket, wN []int64
	var aTask, aKind []string
	for _, k := range order {
		if k.Bucket > 0 {
			wMin, wBucket, wN = append(wMin, k.Minute), append(wBucket, int64(k.Bucket-1)), append(wN, counts[k])
		} else {
			aMin, aTask, aKind, aN = append(aMin, k.Minute), append(aTask, k.Task), append(aKind, k.Kind), append(aN, counts[k])
		}
	}
	if len(aMin) > 0 {
		t.queue(`INSERT INTO activity(minute, task, kind, n) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[])
			ON CONFLICT(minute, task, kind) DO UPDATE SET n = activity.n + excluded.n`, aMin, aTask, aKind, aN)
	}
	if len(wMin) > 0 {
		t.queue(`INSERT INTO queue_wait(minute, bucket, n) SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[])
			ON CONFLICT(minute, bucket) DO UPDATE SET n = queue_wait.n + excluded.n`, wMin, wBucket, wN)
	}
	return nil
}

func itoa(n int) string { return strconv.Itoa(n) }
