package sqlite

import (
	"database/sql/driver"
	"encoding/json"
	"strings"
	"time"

	"github.com/runcue/runcue/store"
)

// Maintenance ops: service records (PutService) and retention (Prune).

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
	if op.Circuit != nil {
		if len(op.Circuit) == 0 {
			if _, err := t.exec(`DELETE FROM circuit_state WHERE service=?`, op.Name); err != nil {
				return err
			}
		} else if _, err := t.exec(`INSERT INTO circuit_state(service, state) VALUES(?, ?)
				ON CONFLICT(service) DO UPDATE SET state=excluded.state`, op.Name, op.Circuit); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
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

func (t *txn) prune(op *store.Prune, r *store.Result) error {
	// The log's end is read below: the events this transaction appended
	// so far are written first.
	if err := t.flushEvents(); err != nil {
		return err
	}
	limit := op.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	if !op.Before.IsZero() {
		rows, err := t.all(`SELECT id, task, state FROM work_units WHERE finished_at > 0 AND finished_at < ?
			AND state IN ('completed','failed','cancelled','skipped') ORDER BY finished_at LIMIT ?`, ns(op.Before), int64(limit))
		if err != nil {
			return err
		}
		ids := make([]string, len(rows))
		for i, row := range rows {
			id := asStr(row[0])
			ids[i] = id
			if _, err := t.exec(`DELETE FROM work_units WHERE id=?`, id); err != nil {
				return err
			}
			t.moved(asStr(row[1]), store.State(asStr(row[2])), "")
			// Edges from and to the unit: a dependency that finished and
			// was pruned is satisfied, not unknown.
			if _, err := t.exec(`DELETE FROM dependencies WHERE unit_id=?1 OR depends_on=?1`, id); err != nil {
				return err
			}
		}
		r.Count = len(ids)
		r.More = limit > 0 && len(ids) == limit
	}
	more := func(res driver.Result) {
		if n, _ := res.RowsAffected(); limit > 0 && n == int64(limit) {
			r.More = true
		}
	}
	if !op.EventsBefore.IsZero() {
		// Events are appended in time order, so the old ones are a prefix:
		// those before the first at or after EventsBefore, and (with
		// EventsHardBefore) at or before every named subscription's
		// position, or before the first at or after EventsHardBefore.
		cut := `coalesce((SELECT seq FROM events WHERE at >= ?1 ORDER BY seq LIMIT 1), (SELECT max(seq) + 1 FROM events))`
		args := []any{ns(op.EventsBefore), int64(limit)}
		if !op.EventsHardBefore.IsZero() {
			floor, err := t.subscriptionFloor(op.Passed)
			if err != nil {
				return err
			}
			cut = `max(min(` + cut + `, ?4),
				coalesce((SELECT seq FROM events WHERE at >= ?3 ORDER BY seq LIMIT 1), (SELECT max(seq) + 1 FROM events)))`
			args = append(args, ns(op.EventsHardBefore), floor)
		}
		if res, err := t.exec(`DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < `+cut+` ORDER BY seq LIMIT ?2)`,
			args...); err != nil {
			return err
		} else {
			more(res)
		}
		// Ranges wholly before the oldest event left describe nothing.
		if res, err := t.exec(`DELETE FROM event_ranges WHERE rowid IN (SELECT rowid FROM event_ranges WHERE last <
				coalesce((SELECT min(seq) FROM events), (SELECT max(last) + 1 FROM event_ranges)) LIMIT ?)`, int64(limit)); err != nil {
			return err
		} else {
			more(res)
		}
	}
	if !op.ActivityBefore.IsZero() {
		minute := op.ActivityBefore.UnixNano() / int64(time.Minute)
		// A few rows per minute: no batch limit needed.
		for _, table := range []string{"activity", "queue_wait"} {
			if _, err := t.exec(`DELETE FROM `+table+` WHERE minute < ?`, minute); err != nil {
				return err
			}
		}
	}
	if op.LogBefore != nil {
		for svc, before := range op.LogBefore {
			if strings.HasSuffix(svc, ":") {
				// A class: every keyed instance, by a range on the index.
				hi := svc[:len(svc)-1] + ";" // ';' follows ':'
				res, err := t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
						WHERE service >= ? AND service < ? AND started_at < ? LIMIT ?)`, svc, hi, ns(before), int64(limit))
				if err != nil {
					return err
				}
				more(res)
				continue
			}
			res, err := t.exec(`DELETE FROM service_log WHERE rowid IN (SELECT rowid FROM service_log
					WHERE service=? AND started_at < ? LIMIT ?)`, svc, ns(before), int64(limit))
			if err != nil {
				return err
			}
			more(res)
		}
	}
	r.Applied = true
	return nil
}

// subscriptionFloor returns the first event a named subscription still
// needs: the least position (its acknowledgement, or what passed says it
// may pass) plus one; 1<<62 without subscriptions.
func (t *txn) subscriptionFloor(passed map[string]int64) (int64, error) {
	rows, err := t.all(`SELECT name, acked FROM subscriptions`)
	if err != nil {
		return 0, err
	}
	floor := int64(1 << 62)
	for _, row := range rows {
		pos := asInt(row[1])
		if p, ok := passed[asStr(row[0])]; ok && p > pos {
			pos = p
		}
		floor = min(floor, pos+1)
	}
	return floor, nil
}
