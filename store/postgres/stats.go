package postgres

import (
	"strconv"
	"time"

	"github.com/runcue/runcue/store"
)

// The counts Stats reads: units by task and state, per-minute activity and
// queue-wait histograms, counted by each transaction and added at its
// commit.

// countDelta is a change of one unit count.
type countDelta struct {
	task  string
	state store.State
	d     int
}

// moved records that a unit of task went from state from to state to (""
// for a unit inserted or deleted).
func (t *txn) moved(task string, from, to store.State) {
	if from == to {
		return
	}
	if from != "" {
		t.counted = append(t.counted, countDelta{task, from, -1})
		if from == store.Queued {
			t.queued--
		}
	}
	if to != "" {
		t.counted = append(t.counted, countDelta{task, to, 1})
		if to == store.Queued {
			t.queued++
		}
	}
}

// flushCounts writes the transaction's count changes, in one statement.
func (t *txn) flushCounts() error {
	if len(t.counted) == 0 {
		return nil
	}
	type key struct {
		task  string
		state store.State
	}
	sum := map[key]int64{}
	var order []key
	for _, c := range t.counted {
		k := key{c.task, c.state}
		if _, ok := sum[k]; !ok {
			order = append(order, k)
		}
		sum[k] += int64(c.d)
	}
	var tasks, states []string
	var ns []int64
	for _, k := range order {
		if n := sum[k]; n != 0 {
			tasks, states, ns = append(tasks, k.task), append(states, string(k.state)), append(ns, n)
		}
	}
	t.counted = t.counted[:0]
	if len(tasks) == 0 {
		return nil
	}
	_, err := t.exec(`INSERT INTO unit_counts(task, state, n) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
		ON CONFLICT(task, state) DO UPDATE SET n = unit_counts.n + excluded.n`, tasks, states, ns)
	return err
}

// activityKey is one row of activity or (bucket > 0) queue_wait.
type activityKey struct {
	minute int64
	task   string
	kind   string
	bucket int
}

// noteActivity counts ev in the transaction's activity (store.ActivityOf).
func (t *txn) noteActivity(ev *store.Event) {
	kind, classes, ok := store.ActivityOf(ev)
	if !ok {
		return
	}
	minute := ev.Time.UnixNano() / int64(time.Minute)
	for _, class := range classes {
		t.activity = append(t.activity, activityKey{minute: minute, task: class, kind: store.ActivityServiceDeferred})
	}
	t.activity = append(t.activity, activityKey{minute: minute, task: ev.Task, kind: kind})
}

// noteWait counts a dispatch's queue wait.
func (t *txn) noteWait(at time.Time, wait time.Duration) {
	t.activity = append(t.activity, activityKey{minute: at.UnixNano() / int64(time.Minute), bucket: store.WaitBucket(wait) + 1})
}

// flushActivity adds the transaction's counts.
func (t *txn) flushActivity() error {
	if len(t.activity) == 0 {
		return nil
	}
	counts := map[activityKey]int64{}
	var order []activityKey
	for _, k := range t.activity {
		if _, ok := counts[k]; !ok {
			order = append(order, k)
		}
		counts[k]++
	}
	t.activity = t.activity[:0]
	var aMin, aN, wMin, wBucket, wN []int64
	var aTask, aKind []string
	for _, k := range order {
		if k.bucket > 0 {
			wMin, wBucket, wN = append(wMin, k.minute), append(wBucket, int64(k.bucket-1)), append(wN, counts[k])
		} else {
			aMin, aTask, aKind, aN = append(aMin, k.minute), append(aTask, k.task), append(aKind, k.kind), append(aN, counts[k])
		}
	}
	if len(aMin) > 0 {
		if _, err := t.exec(`INSERT INTO activity(minute, task, kind, n) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[])
			ON CONFLICT(minute, task, kind) DO UPDATE SET n = activity.n + excluded.n`, aMin, aTask, aKind, aN); err != nil {
			return err
		}
	}
	if len(wMin) > 0 {
		if _, err := t.exec(`INSERT INTO queue_wait(minute, bucket, n) SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[])
			ON CONFLICT(minute, bucket) DO UPDATE SET n = queue_wait.n + excluded.n`, wMin, wBucket, wN); err != nil {
			return err
		}
	}
	return nil
}

func itoa(n int) string { return strconv.Itoa(n) }
