package postgres

import (
	"bytes"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// The event log's write side: a transaction's events are numbered as they
// are appended, after the counter the transaction locked (see Apply), and
// written as blocks (store.EventBlock) with each unit's record of its own
// events and the ranges of the log by task and type.

// event appends ev, filling Seq, and Time from at when zero.
func (t *txn) event(ev *store.Event, at time.Time) error {
	sqlcommon.Stamp(ev, at)
	ev.Seq = t.nextSeq
	t.nextSeq++
	t.pending = append(t.pending, *ev)
	t.NoteActivity(ev)
	return nil
}

// flushEvents writes the pending events: as blocks of at most
// store.MaxBlockEvents (a block continues when more of the transaction's
// events follow it), the sequence numbers of each unit's events appended
// to its record, one event_ranges row per task and type, and the log's
// counter moved on. mid says that the transaction may append more events
// after these.
func (t *txn) flushEvents(mid bool) error {
	pending := t.pending
	if len(pending) == 0 {
		return nil
	}
	defer func() {
		clear(t.pending)
		t.pending = t.pending[:0]
		clear(t.recorded)
	}()
	// A block continues when more of the transaction's events follow it,
	// or (mid) a Prune reads the log and more may be appended after.
	_ = sqlcommon.Blocks(&t.enc, pending, mid, func(b store.EventBlock) error {
		// Its data is the encoder's, which the next block reuses.
		t.queue(`INSERT INTO event_blocks(last, first, min_at, max_at, data) VALUES($1, $2, $3, $4, $5)`,
			b.Last, b.First, b.MinAt, b.MaxAt, bytes.Clone(b.Data))
		return nil
	})
	// Units' records, in one statement.
	index := map[string]int{}
	var ids []string
	var recs [][]byte
	type rk struct{ task, typ string }
	ranges := map[rk][2]int64{}
	var order []rk
	for i := range pending {
		ev := &pending[i]
		k := rk{ev.Task, ev.Type}
		if r, ok := ranges[k]; ok {
			ranges[k] = [2]int64{r[0], ev.Seq}
		} else {
			ranges[k] = [2]int64{ev.Seq, ev.Seq}
			order = append(order, k)
		}
		if ev.WorkID == "" || t.recorded[ev.Seq] {
			continue
		}
		j, ok := index[ev.WorkID]
		if !ok {
			j = len(ids)
			index[ev.WorkID] = j
			ids = append(ids, ev.WorkID)
			recs = append(recs, nil)
		}
		recs[j] = store.AppendUnitRecord(recs[j], ev.Seq, false)
	}
	if len(ids) > 0 {
		// A record takes no more once it holds store.MaxUnitRecord bytes
		// (readers scan the log past its last entry).
		t.queue(`UPDATE work_units w SET events = CASE WHEN length(coalesce(w.events, '')) >= $3 THEN w.events
				ELSE coalesce(w.events, '') || v.rec END
			FROM unnest($1::text[], $2::bytea[]) AS v(id, rec) WHERE w.id = v.id`, ids, recs, store.MaxUnitRecord)
	}
	tasks, types := make([]string, len(order)), make([]string, len(order))
	firsts, lasts := make([]int64, len(order)), make([]int64, len(order))
	for i, k := range order {
		tasks[i], types[i], firsts[i], lasts[i] = k.task, k.typ, ranges[k][0], ranges[k][1]
	}
	t.queue(`INSERT INTO event_ranges(task, type, first, last)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])`, tasks, types, firsts, lasts)
	t.queue(`UPDATE meta SET value = $1 WHERE key = 'events_last'`, pending[len(pending)-1].Seq)
	return nil
}
