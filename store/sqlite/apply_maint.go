package sqlite

import (
	"database/sql/driver"
	"encoding/json"
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
			op.Name, op.Seq, ns(op.At), namesJSON(op.Types), namesJSON(op.Tasks))
	case op.SetFilter:
		r.Applied, err = t.changed(`UPDATE subscriptions SET types = ?, tasks = ? WHERE name = ?`,
			namesJSON(op.Types), namesJSON(op.Tasks), op.Name)
	default:
		r.Applied, err = t.changed(`UPDATE subscriptions SET acked = max(acked, ?), acked_at = ? WHERE name = ?`, op.Seq, ns(op.At), op.Name)
	}
	return err
}

// namesJSON encodes a filter's names as a JSON array, ” when empty.
func namesJSON(names []string) string {
	if len(names) == 0 {
		return ""
	}
	b, _ := json.Marshal(names)
	return string(b)
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
		t.moved(asStr(row[1]), store.State(asStr(row[2])), "")
		// Edges from and to the unit: a dependency that finished and was
		// pruned is satisfied, not unknown.
		if _, err := t.exec(`DELETE FROM dependencies WHERE unit_id=?1 OR depends_on=?1`, id); err != nil {
			return 0, err
		}
	}
	return len(rows), nil
}

// FirstEventAt implements store.Tx. (The caller flushed the transaction's
// events first.)
func (t *txn) FirstEventAt(at time.Time) (int64, error) {
	row, _, err := t.one(`SELECT coalesce((SELECT seq FROM events WHERE at >= ? ORDER BY seq LIMIT 1),
		(SELECT coalesce(max(seq), 0) + 1 FROM events))`, ns(at))
	if err != nil {
		return 0, err
	}
	return asInt(row[0]), nil
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

// PruneEvents implements store.Tx: the events, then the event ranges
// wholly before the oldest event left (they describe nothing).
func (t *txn) PruneEvents(below int64, limit int) (bool, error) {
	lim := int64(limit)
	if lim <= 0 {
		lim = -1
	}
	res, err := t.exec(`DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < ? ORDER BY seq LIMIT ?)`, below, lim)
	if err != nil {
		return false, err
	}
	more := full(res, limit)
	res, err = t.exec(`DELETE FROM event_ranges WHERE rowid IN (SELECT rowid FROM event_ranges WHERE last <
			coalesce((SELECT min(seq) FROM events), (SELECT max(last) + 1 FROM event_ranges)) LIMIT ?)`, lim)
	if err != nil {
		return false, err
	}
	return more || full(res, limit), nil
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
