package postgres

import (
	"strings"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Maintenance ops: service records, pauses, subscriptions, and the storage
// primitives of retention (store.ApplyPrune).

// PruneFinished implements store.Tx.
func (t *txn) PruneFinished(before time.Time, limit int) (int, error) {
	q := `SELECT id, task, state FROM work_units WHERE finished_at > 0 AND finished_at < $1
		AND state IN ('completed','failed','cancelled','skipped') ORDER BY finished_at`
	args := []any{ns(before)}
	if limit > 0 {
		q += ` LIMIT $2`
		args = append(args, limit)
	}
	rows, err := t.query(q, args...)
	if err != nil {
		return 0, err
	}
	type gone struct{ id, task, state string }
	var units []gone
	for rows.Next() {
		var g gone
		if err := rows.Scan(&g.id, &g.task, &g.state); err != nil {
			rows.Close()
			return 0, err
		}
		units = append(units, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(units) == 0 {
		return 0, nil
	}
	ids := make([]string, len(units))
	for i, g := range units {
		ids[i] = g.id
		t.Moved(g.task, store.State(g.state), "")
	}
	if _, err := t.exec(`DELETE FROM work_units WHERE id = ANY($1)`, ids); err != nil {
		return 0, err
	}
	// Edges from and to the units: a dependency that finished and was
	// pruned is satisfied, not unknown.
	if _, err := t.exec(`DELETE FROM dependencies WHERE unit_id = ANY($1) OR depends_on = ANY($1)`, ids); err != nil {
		return 0, err
	}
	return len(units), nil
}

// FirstEventAt implements store.Tx: the first block whose events reach
// at holds the event. (The caller flushed the transaction's events first.)
func (t *txn) FirstEventAt(at time.Time) (int64, error) {
	var first int64
	var data []byte
	ok, err := t.one(`SELECT first, data FROM event_blocks WHERE max_at >= $1 ORDER BY last LIMIT 1`, []any{ns(at)}, &first, &data)
	if err != nil {
		return 0, err
	}
	if ok {
		if seq, err := sqlcommon.FirstAt(first, data, at); err != nil || seq > 0 {
			return seq, err
		}
	}
	return t.nextSeq, nil
}

// SubscriptionPositions implements store.Tx.
func (t *txn) SubscriptionPositions() (map[string]int64, error) {
	rows, err := t.query(`SELECT name, acked FROM subscriptions`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var acked int64
		if err := rows.Scan(&name, &acked); err != nil {
			return nil, err
		}
		out[name] = acked
	}
	return out, rows.Err()
}

// PruneEvents implements store.Tx: the blocks wholly below below (limit
// counts their events), the events below it in the block that straddles
// it (the block is written again without them), then the event ranges
// wholly before the oldest event left. The log's counter keeps the highest
// number ever assigned, so numbers continue after it when no block is
// left.
func (t *txn) PruneEvents(below int64, limit int) (bool, error) {
	q := `SELECT first, last FROM event_blocks WHERE last < $1 ORDER BY last`
	args := []any{below}
	if limit > 0 {
		q += ` LIMIT $2`
		args = append(args, limit)
	}
	rows, err := t.query(q, args...)
	if err != nil {
		return false, err
	}
	var blocks [][2]int64
	for rows.Next() {
		var b [2]int64
		if err := rows.Scan(&b[0], &b[1]); err != nil {
			rows.Close()
			return false, err
		}
		blocks = append(blocks, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	// The block the cut falls in is not among those deleted (they end
	// below it).
	upto, more := sqlcommon.PrunePage(blocks, limit)
	if err := t.cutBlock(below, more); err != nil {
		return false, err
	}
	if upto > 0 {
		if _, err := t.exec(`DELETE FROM event_blocks WHERE last <= $1`, upto); err != nil {
			return false, err
		}
	}
	q = `DELETE FROM event_ranges WHERE n IN (SELECT n FROM event_ranges WHERE last <
			coalesce((SELECT first FROM event_blocks ORDER BY last LIMIT 1), $1)`
	args = []any{t.nextSeq}
	if limit > 0 {
		q += ` LIMIT $2`
		args = append(args, limit)
	}
	deleted, err := t.exec(q+`)`, args...)
	if err != nil {
		return false, err
	}
	return more || (limit > 0 && deleted == int64(limit)), nil
}

// cutBlock writes the block that holds events both below and at or above
// below again, without those below.
func (t *txn) cutBlock(below int64, more bool) error {
	if more {
		return nil // the cut is not reached yet
	}
	var first, last int64
	var data []byte
	ok, err := t.one(`SELECT first, last, data FROM event_blocks WHERE last >= $1 ORDER BY last LIMIT 1`, []any{below}, &first, &last, &data)
	if err != nil || !ok || first >= below {
		return err
	}
	b, err := sqlcommon.CutBlock(&t.enc, first, data, below)
	if err != nil {
		return err
	}
	_, err = t.exec(`UPDATE event_blocks SET first=$1, min_at=$2, max_at=$3, data=$4 WHERE last=$5`, b.First, b.MinAt, b.MaxAt, b.Data, last)
	return err
}

// PruneActivity implements store.Tx.
func (t *txn) PruneActivity(before time.Time) error {
	minute := before.UnixNano() / int64(time.Minute)
	for _, table := range []string{"activity", "queue_wait"} {
		if _, err := t.exec(`DELETE FROM `+table+` WHERE minute < $1`, minute); err != nil {
			return err
		}
	}
	return nil
}

// PruneLog implements store.Tx. A class ("host:") is a range on the
// index: every keyed instance.
func (t *txn) PruneLog(service string, before time.Time, limit int) (bool, error) {
	var q string
	var args []any
	if strings.HasSuffix(service, ":") {
		hi := service[:len(service)-1] + ";" // ';' follows ':'
		q = `SELECT n FROM service_log WHERE service >= $1 AND service < $2 AND started_at < $3`
		args = []any{service, hi, ns(before)}
	} else {
		q = `SELECT n FROM service_log WHERE service = $1 AND started_at < $2`
		args = []any{service, ns(before)}
	}
	if limit > 0 {
		q += ` LIMIT ` + itoa(limit)
	}
	deleted, err := t.exec(`DELETE FROM service_log WHERE n IN (`+q+`)`, args...)
	if err != nil {
		return false, err
	}
	return limit > 0 && deleted == int64(limit), nil
}

// common is a transaction as sqlcommon's statements and ops use it.
type common struct{ *txn }

func (c common) Exec(q string, args ...any) error {
	_, err := c.exec(sqlcommon.Rebind(q), args...)
	return err
}

func (c common) Changed(q string, args ...any) (bool, error) {
	return c.changed(sqlcommon.Rebind(q), args...)
}
func (common) Greatest() string                                         { return "greatest" }
func (c common) Savepoint(r *store.Result, f func() error) error        { return c.savepoint(r, f) }
func (c common) Event(ev *store.Event, at time.Time) error              { return c.event(ev, at) }
func (c common) FlushEvents(mid bool) error                             { return c.flushEvents(mid) }
func (c common) ApplyRemote(op store.Op, r *store.Result) (bool, error) { return c.applyRemote(op, r) }
