package sqlite

import (
	"database/sql/driver"
	"strconv"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Maintenance ops: service records (PutService, PutMeterState), pauses,
// subscriptions, and the storage primitives of retention (store.ApplyPrune).

func (t *txn) putService(op *store.PutService, r *store.Result) error {
	if _, err := t.exec(`INSERT INTO services(name, def) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET def=coalesce(excluded.def, def)`,
		op.Name, nullBytes(op.Def)); err != nil {
		return err
	}
	if op.Override != nil {
		if _, err := t.exec(`UPDATE services SET override=? WHERE name=?`, nullBytes(op.Override), op.Name); err != nil {
			return err
		}
	}
	if op.Paused != nil {
		if _, err := t.exec(`UPDATE services SET paused=? WHERE name=?`, *op.Paused, op.Name); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
}

func (t *txn) putMeterState(op *store.PutMeterState, r *store.Result) error {
	var err error
	if len(op.State) == 0 {
		_, err = t.exec(`DELETE FROM meter_state WHERE service=? AND meter=?`, op.Service, op.Meter)
	} else {
		_, err = t.exec(`INSERT INTO meter_state(service, meter, state) VALUES(?, ?, ?)
			ON CONFLICT(service, meter) DO UPDATE SET state=excluded.state`, op.Service, op.Meter, op.State)
	}
	r.Applied = err == nil
	return err
}

func (t *txn) setPause(op *store.SetPause, r *store.Result) error {
	paused := 0
	if op.Paused {
		paused = 1
	}
	if op.Task == "" {
		_, err := t.exec(`INSERT INTO meta(key, value) VALUES('paused', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value`, paused)
		r.Applied = err == nil
		return err
	}
	ok, err := t.changed(`UPDATE tasks SET paused=? WHERE name=?`, paused, op.Task)
	r.Applied = ok
	return err
}

func (t *txn) ack(op *store.Ack, r *store.Result) error {
	var err error
	switch {
	case op.Remove:
		r.Applied, err = t.changed(`DELETE FROM subscriptions WHERE name=?`, op.Name)
	case op.Create:
		r.Applied, err = t.changed(`INSERT OR IGNORE INTO subscriptions(name, acked, created_at, types, tasks) VALUES(?,?,?,?,?)`,
			op.Name, op.Seq, ns(op.At), store.EncodeNames(op.Types), store.EncodeNames(op.Tasks))
	case op.SetFilter:
		r.Applied, err = t.changed(`UPDATE subscriptions SET types = ?, tasks = ? WHERE name = ?`,
			store.EncodeNames(op.Types), store.EncodeNames(op.Tasks), op.Name)
	default:
		r.Applied, err = t.changed(`UPDATE subscriptions SET acked = max(acked, ?), acked_at = ? WHERE name = ?`, op.Seq, ns(op.At), op.Name)
	}
	return err
}

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
		seq := int64(0)
		err := store.DecodeBlock(asInt(row[0]), asBytes(row[1]), func(e store.Event) bool {
			if ns(e.Time) >= ns(at) {
				seq = e.Seq
				return false
			}
			return true
		})
		if err != nil || seq > 0 {
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
	// The limit counts events; the query's, blocks (each holds at least
	// one): a full page of blocks may have more below the cut after it.
	more, upto, n := limit > 0 && len(rows) == limit, int64(0), 0
	for _, row := range rows {
		if limit > 0 && n >= limit {
			more = true
			break
		}
		upto = asInt(row[1])
		n += int(upto - asInt(row[0]) + 1)
	}
	if upto > 0 {
		if _, err := t.exec(`DELETE FROM event_blocks WHERE last <= ?`, upto); err != nil {
			return false, err
		}
		if _, err := t.exec(`UPDATE meta SET value = max(value, ?) WHERE key = 'events_floor'`, upto); err != nil {
			return false, err
		}
	}
	if !more {
		if err := t.cutBlock(below); err != nil {
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
func (t *txn) cutBlock(below int64) error {
	row, ok, err := t.one(`SELECT first, last, data FROM event_blocks WHERE last >= ? ORDER BY last LIMIT 1`, below)
	if err != nil || !ok || asInt(row[0]) >= below {
		return err
	}
	enc := &t.s.enc
	enc.Reset()
	err = store.DecodeBlock(asInt(row[0]), asBytes(row[2]), func(e store.Event) bool {
		if e.Seq >= below {
			enc.Add(&e)
		}
		return true
	})
	if err != nil {
		return err
	}
	b := enc.Block(store.BlockContinues(asBytes(row[2])))
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
