package sqlite

import (
	"database/sql/driver"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Maintenance ops: service records (PutService, PutMeterState), pauses,
// subscriptions, and the storage primitives of retention (store.ApplyPrune).

// PruneFinished implements store.Tx.
func (t *txn) PruneFinished(before time.Time, limit int) (int, error) {
	lim := int64(limit)
	if lim <= 0 {
		lim = -1 // SQLite: no limit
	}
	rows, err := t.all(`SELECT id, task, state FROM work_units WHERE finished_at > 0 AND finished_at < ?
		AND state IN ('completed','failed','cancelled','skipped') ORDER BY finished_at LIMIT ?`, ns(before), lim)
	if err != nil {
		return 0, err
	}
	for _, row := range rows {
		id := asStr(row[0])
		if _, err := t.exec(`DELETE FROM work_units WHERE id=?`, id); err != nil {
			return 0, err
		}
		t.Moved(asStr(row[1]), store.State(asStr(row[2])), "")
		// Edges from and to the unit: a dependency that finished and was
		// pruned is satisfied, not unknown.
		if _, err := t.exec(`DELETE FROM dependencies WHERE unit_id=?1 OR depends_on=?1`, id); err != nil {
			return 0, err
		}
	}
	return len(rows), nil
}

// FirstEventAt implements store.Tx: the first block whose events reach
// at holds the event. (The caller flushed the transaction's events first.)
func (t *txn) FirstEventAt(at time.Time) (int64, error) {
	row, ok, err := t.one(`SELECT first, data FROM event_blocks WHERE max_at >= ? ORDER BY last LIMIT 1`, ns(at))
	if err != nil {
		return 0, err
	}
	if ok {
		if seq, err := sqlcommon.FirstAt(asInt(row[0]), asBytes(row[1]), at); err != nil || seq > 0 {
			return seq, err
		}
	}
	row, _, err = t.one(lastSeqQuery)
	if err != nil {
		return 0, err
	}
	return asInt(row[0]) + 1, nil
}

// SubscriptionPositions implements store.Tx.
func (t *txn) SubscriptionPositions() (map[string]int64, error) {
	rows, err := t.all(`SELECT name, acked FROM subscriptions`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, row := range rows {
		out[asStr(row[0])] = asInt(row[1])
	}
	return out, nil
}

// PruneEvents implements store.Tx: the blocks wholly below below (limit
// counts their events), the events below it in the block that straddles it
// (the block is written again without them), then the event ranges wholly
// before the oldest event left (they describe nothing). The highest
// sequence number deleted is kept (meta 'events_floor'), so that numbers
// continue after it when no block is left.
func (t *txn) PruneEvents(below int64, limit int) (bool, error) {
	rows, err := t.all(`SELECT first, last FROM event_blocks WHERE last < ? ORDER BY last`+limitClause(limit), below)
	if err != nil {
		return false, err
	}
	blocks := make([][2]int64, len(rows))
	for i, row := range rows {
		blocks[i] = [2]int64{asInt(row[0]), asInt(row[1])}
	}
	upto, more := sqlcommon.PrunePage(blocks, limit)
	if err := t.cutBlock(below, more); err != nil {
		return false, err
	}
	if upto > 0 {
		if _, err := t.exec(`DELETE FROM event_blocks WHERE last <= ?`, upto); err != nil {
			return false, err
		}
		if _, err := t.exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'events_floor'`, upto); err != nil {
			return false, err
		}
	}
	lim := int64(limit)
	if lim <= 0 {
		lim = -1
	}
	res, err := t.exec(`DELETE FROM event_ranges WHERE rowid IN (SELECT rowid FROM event_ranges WHERE last <
			coalesce((SELECT first FROM event_blocks ORDER BY last LIMIT 1), (SELECT max(last) + 1 FROM event_ranges)) LIMIT ?)`, lim)
	if err != nil {
		return false, err
	}
	return more || full(res, limit), nil
}

// limitClause is a LIMIT of limit rows, none when limit is 0 or less.
func limitClause(limit int) string {
	if limit <= 0 {
		return ""
	}
	return " LIMIT " + strconv.Itoa(limit)
}

// cutBlock writes the block that holds events both below and at or above
// below again, without those below.
func (t *txn) cutBlock(below int64, more bool) error {
	if more {
		return nil // the cut is not reached yet
	}
	row, ok, err := t.one(`SELECT first, last, data FROM event_blocks WHERE last >= ? ORDER BY last LIMIT 1`, below)
	if err != nil || !ok || asInt(row[0]) >= below {
		return err
	}
	b, err := sqlcommon.CutBlock(&t.s.enc, asInt(row[0]), asBytes(row[2]), below)
	if err != nil {
		return err
	}
	_, err = t.exec(`UPDATE event_blocks SET first=?, min_at=?, max_at=?, data=? WHERE last=?`, b.First, b.MinAt, b.MaxAt, b.Data, asInt(row[1]))
	return err
}

// full reports whether a delete of at most limit rows hit the limit.
func full(res driver.Result, limit int) bool {
	n, _ := res.RowsAffected()
	return limit > 0 && n == int64(limit)
}

// PruneActivity implements store.Tx. (A few rows per minute: no batch
// limit needed.)
func (t *txn) PruneActivity(before time.Time) error {
	minute := before.UnixNano() / int64(time.Minute)
	for _, table := range []string{"activity", "queue_wait"} {
		if _, err := t.exec(`DELETE FROM `+table+` WHERE minute < ?`, minute); err != nil {
			return err
		}
	}
	return nil
}

// PruneLog implements store.Tx. A class ("host:") is a range on the
// index: every keyed instance.
func (t *txn) PruneLog(service string, before time.Time, limit int) (bool, error) {
	lim := int64(limit)
	if lim <= 0 {
		lim = -1
	}
	var res driver.Result
	var err error
	if strings.HasSuffix(service, ":") {
		hi := service[:len(service)-1] + ";" // ';' follows ':'
		res, err = t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
				WHERE service >= ? AND service < ? AND started_at < ? LIMIT ?)`, service, hi, ns(before), lim)
	} else {
		res, err = t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
				WHERE service=? AND started_at < ? LIMIT ?)`, service, ns(before), lim)
	}
	if err != nil {
		return false, err
	}
	return full(res, limit), nil
}

// common is a transaction as sqlcommon's statements and ops use it.
type common struct{ *txn }

func (c common) Exec(q string, args ...any) error {
	_, err := c.exec(q, args...)
	return err
}

func (c common) Changed(q string, args ...any) (bool, error)            { return c.changed(q, args...) }
func (common) Greatest() string                                         { return "max" }
func (c common) Savepoint(r *store.Result, f func() error) error        { return c.savepoint(r, f) }
func (c common) Event(ev *store.Event, at time.Time) error              { return c.event(ev, at) }
func (c common) FlushEvents(mid bool) error                             { return c.flushEvents(mid) }
func (c common) ApplyRemote(op store.Op, r *store.Result) (bool, error) { return c.applyRemote(op, r) }
