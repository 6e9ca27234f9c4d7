package sqlite

import (
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// The event log's write side: a transaction's events are numbered as they
// are appended and written at commit as blocks (store.EventBlock, see
// migration 0012), with each unit's record of its own events.

// lastSeqQuery reads the highest sequence number ever assigned: the last
// block's, or the highest pruned (meta 'events_floor') when pruning
// deleted every block.
const lastSeqQuery = `SELECT max(coalesce((SELECT max(last) FROM event_blocks), 0),
	coalesce((SELECT value FROM meta WHERE key = 'events_floor'), 0))`

// event appends ev, filling Seq, and Time from at when zero. The events
// are written at commit (flushEvents), with the other events of the
// transaction: the sequence number is assigned here, the next after the
// highest the log ever used, so that numbers stay strictly increasing
// over the database's life. SQLite has one writer at a time: every lower
// number is committed (Batch.Follows), and the numbers are contiguous.
func (t *txn) event(ev *store.Event, at time.Time) error {
	sqlcommon.Stamp(ev, at)
	if err := t.numbered(); err != nil {
		return err
	}
	ev.Seq = t.nextSeq
	t.nextSeq++
	t.s.pending = append(t.s.pending, *ev)
	rec := ev.WorkID != "" && t.inRecord(ev)
	t.s.recorded = append(t.s.recorded, rec)
	if ev.WorkID != "" && !rec {
		if t.generic == nil {
			t.generic = make(map[string]bool)
		}
		t.generic[ev.WorkID] = true
	}
	t.NoteActivity(ev)
	k := rangeKey{ev.Task, ev.Type}
	if r, ok := t.ranges[k]; ok {
		r.last = ev.Seq
	} else {
		if t.ranges == nil {
			t.ranges = make(map[rangeKey]*seqRange, 4)
		}
		t.ranges[k] = &seqRange{ev.Seq, ev.Seq}
	}
	return nil
}

// numbered makes sure nextSeq is set: the first event of a transaction,
// or the first prediction of one, reads the log's last number.
func (t *txn) numbered() error {
	if t.nextSeq != 0 {
		return nil
	}
	row, _, err := t.one(lastSeqQuery)
	if err != nil {
		return err
	}
	last := asInt(row[0])
	t.nextSeq, t.follows = last+1, last
	return nil
}

// inRecord reports whether the statement that wrote ev's unit recorded
// ev's number in the unit's record already.
func (t *txn) inRecord(ev *store.Event) bool {
	if e := &t.expect; ev.Seq >= e.first && ev.Seq <= e.last && ev.WorkID == e.id {
		return true
	}
	if t.more != nil {
		if first, ok := t.more[ev.WorkID]; ok && ev.Seq >= first {
			return true
		}
	}
	return false
}

// recordArg predicts the sequence numbers of the n events of unit id that
// the op about to write its row appends next, right after that write, and
// returns the record entries to append in the same statement (see
// recordSet); the events then need no write of their own. With more, it is
// one entry saying that every later event of the unit in this transaction
// is the unit's (a claim whose finish was merged into its write). An
// entry that names no event of the unit (the statement changed nothing, a
// later append failed) is harmless: readers check each event's unit.
// Entries stay in Seq order: a unit with events waiting for the commit's
// records has its later ones recorded there too.
func (t *txn) recordArg(id string, n int, more bool) (any, error) {
	if t.generic[id] {
		// The unit has events this transaction records at commit: its
		// later ones are recorded there too, so that its record stays
		// in Seq order.
		return nil, nil
	}
	if err := t.numbered(); err != nil {
		return nil, err
	}
	first := t.nextSeq
	t.recBuf = t.recBuf[:0]
	if more {
		if t.more == nil {
			t.more = make(map[string]int64)
		}
		t.more[id] = first
		t.recBuf = store.AppendUnitRecord(t.recBuf, first, true)
	} else {
		if n == 0 {
			return nil, nil
		}
		t.expect = expectation{id: id, first: first, last: first + int64(n) - 1}
		for i := range int64(n) {
			t.recBuf = store.AppendUnitRecord(t.recBuf, first+i, false)
		}
	}
	return t.recBuf, nil
}

// recordSet is the SET term of a unit's write that appends recordArg's
// entries to its record, unless the record is full.
var recordSet = `events = CASE WHEN length(events) >= ` + strconv.Itoa(store.MaxUnitRecord) + ` THEN events
	ELSE CAST(coalesce(events, x'') || coalesce(?, x'') AS BLOB) END`

// flushEvents writes the transaction's pending events as blocks of at
// most store.MaxBlockEvents, then appends to their units' records the
// numbers their own writes did not record. mid says that the transaction
// may append more events after these (a Prune reads the log).
func (t *txn) flushEvents(mid bool) error {
	pending := t.s.pending
	if len(pending) == 0 {
		return nil
	}
	defer func() {
		clear(t.s.pending)
		t.s.pending = t.s.pending[:0]
		t.s.recorded = t.s.recorded[:0]
	}()
	err := sqlcommon.Blocks(&t.s.enc, pending, mid, func(b store.EventBlock) error {
		_, err := t.exec(`INSERT INTO event_blocks(last, first, min_at, max_at, data) VALUES(?,?,?,?,?)`,
			b.Last, b.First, b.MinAt, b.MaxAt, b.Data)
		return err
	})
	if err != nil {
		return err
	}
	return t.flushRecords(pending)
}

// unitRecords gathers, per unit, the sequence numbers a transaction
// appends to its record (store.AppendUnitRecord): recs[index[id]].
type unitRecords struct {
	index map[string]int
	ids   []string
	recs  [][]byte
	vals  []any
}

// maxRecordRows is the most units one UPDATE of records writes; more are
// written in UPDATEs of powers of two rows up to it (few statements to
// prepare).
const maxRecordRows = 16

// flushRecords appends the events' sequence numbers to their units'
// records, in as few statements as it can. A unit's record takes no more
// once it holds store.MaxUnitRecord bytes (a unit with thousands of runs
// keeps a bounded record; readers scan the log past its last entry).
func (t *txn) flushRecords(pending []store.Event) error {
	u := &t.s.records
	if u.index == nil {
		u.index = make(map[string]int)
	}
	defer func() {
		clear(u.index)
		clear(u.ids)
		u.ids = u.ids[:0]
		for i := range u.recs {
			u.recs[i] = u.recs[i][:0]
		}
		u.recs = u.recs[:0]
		clear(u.vals)
		u.vals = u.vals[:0]
	}()
	for i := range pending {
		ev := &pending[i]
		if ev.WorkID == "" || t.s.recorded[i] {
			continue
		}
		k, ok := u.index[ev.WorkID]
		if !ok {
			k = len(u.ids)
			u.index[ev.WorkID] = k
			u.ids = append(u.ids, ev.WorkID)
			if k < cap(u.recs) {
				u.recs = u.recs[:k+1]
			} else {
				u.recs = append(u.recs, nil)
			}
		}
		u.recs[k] = store.AppendUnitRecord(u.recs[k], ev.Seq, false)
	}
	for done := 0; done < len(u.ids); {
		n := maxRecordRows
		for n > len(u.ids)-done {
			n /= 2
		}
		u.vals = u.vals[:0]
		for k := done; k < done+n; k++ {
			u.vals = append(u.vals, u.ids[k], u.recs[k])
		}
		if _, err := t.exec(recordUpdates[n], u.vals...); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// recordUpdates are the UPDATEs that append n units' new sequence numbers
// to their records, by n. (SQLite's || makes text of blobs: the CAST makes
// the record a blob again, whose length() counts bytes.)
var recordUpdates = func() (q [maxRecordRows + 1]string) {
	for n := 1; n <= maxRecordRows; n++ {
		q[n] = `WITH v(id, rec) AS (VALUES ` + rowsOf(n, "(?,?)") + `)
		UPDATE work_units SET ` + strings.Replace(recordSet, "?", "v.rec", 1) + `
		FROM v WHERE work_units.id = v.id`
	}
	return q
}()
