package sqlcommon

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runcue/runcue/store"
)

// Tx is a backend's write transaction as the statements written once here
// use it. They are written with SQLite's placeholders (?); PostgreSQL's
// Tx runs them through Rebind.
type Tx interface {
	// Exec runs a statement.
	Exec(sql string, args ...any) error
	// Changed runs an UPDATE, DELETE or INSERT and reports whether it
	// touched a row.
	Changed(sql string, args ...any) (bool, error)
	// Greatest names the dialect's two-argument maximum: max or greatest.
	Greatest() string
}

// rebound caches Rebind's answers: the statements are few and fixed.
var rebound sync.Map

// Rebind turns sql's ? placeholders into $1, $2, ... (PostgreSQL's). The
// statements here hold no ? in a literal.
func Rebind(sql string) string {
	if q, ok := rebound.Load(sql); ok {
		return q.(string)
	}
	var b strings.Builder
	n := 0
	for _, c := range sql {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	rebound.Store(sql, b.String())
	return b.String()
}

// PutService applies a store.PutService.
func PutService(t Tx, op *store.PutService, r *store.Result) error {
	if err := t.Exec(`INSERT INTO services(name, def) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET def=coalesce(excluded.def, services.def)`,
		op.Name, NullBytes(op.Def)); err != nil {
		return err
	}
	if op.Override != nil {
		if err := t.Exec(`UPDATE services SET override=? WHERE name=?`, NullBytes(op.Override), op.Name); err != nil {
			return err
		}
	}
	if op.Paused != nil {
		if err := t.Exec(`UPDATE services SET paused=? WHERE name=?`, *op.Paused, op.Name); err != nil {
			return err
		}
	}
	r.Applied = true
	return nil
}

// PutMeterState applies a store.PutMeterState (an empty state deletes).
func PutMeterState(t Tx, op *store.PutMeterState, r *store.Result) error {
	var err error
	if len(op.State) == 0 {
		err = t.Exec(`DELETE FROM meter_state WHERE service=? AND meter=?`, op.Service, op.Meter)
	} else {
		err = t.Exec(`INSERT INTO meter_state(service, meter, state) VALUES(?, ?, ?)
			ON CONFLICT(service, meter) DO UPDATE SET state=excluded.state`, op.Service, op.Meter, op.State)
	}
	r.Applied = err == nil
	return err
}

// SetPause applies a store.SetPause: the queue's pause in meta, a task's
// in tasks.
func SetPause(t Tx, op *store.SetPause, r *store.Result) error {
	if op.Task == "" {
		paused := 0
		if op.Paused {
			paused = 1
		}
		err := t.Exec(`INSERT INTO meta(key, value) VALUES('paused', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value`, paused)
		r.Applied = err == nil
		return err
	}
	ok, err := t.Changed(`UPDATE tasks SET paused=? WHERE name=?`, op.Paused, op.Task)
	r.Applied = ok
	return err
}

// Ack applies a store.Ack: a subscription created, removed, refiltered or
// acknowledged (its position never moves back).
func Ack(t Tx, op *store.Ack, r *store.Result) error {
	var err error
	switch {
	case op.Remove:
		r.Applied, err = t.Changed(`DELETE FROM subscriptions WHERE name=?`, op.Name)
	case op.Create:
		r.Applied, err = t.Changed(`INSERT INTO subscriptions(name, acked, created_at, types, tasks) VALUES(?, ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, op.Name, op.Seq, Nanos(op.At), store.EncodeNames(op.Types), store.EncodeNames(op.Tasks))
	case op.SetFilter:
		r.Applied, err = t.Changed(`UPDATE subscriptions SET types = ?, tasks = ? WHERE name = ?`,
			store.EncodeNames(op.Types), store.EncodeNames(op.Tasks), op.Name)
	default:
		r.Applied, err = t.Changed(`UPDATE subscriptions SET acked = `+t.Greatest()+`(acked, ?), acked_at = ? WHERE name = ?`,
			op.Seq, Nanos(op.At), op.Name)
	}
	return err
}

// FirstAt is the sequence number of the first event at or after at in an
// event block (first, data), or 0 when the block holds none.
func FirstAt(first int64, data []byte, at time.Time) (int64, error) {
	seq := int64(0)
	err := store.DecodeBlock(first, data, func(e store.Event) bool {
		if Nanos(e.Time) >= Nanos(at) {
			seq = e.Seq
			return false
		}
		return true
	})
	return seq, err
}

// CutBlock is the event block (first, data) without its events below
// below, encoded with enc.
func CutBlock(enc *store.BlockEncoder, first int64, data []byte, below int64) (store.EventBlock, error) {
	enc.Reset()
	err := store.DecodeBlock(first, data, func(e store.Event) bool {
		if e.Seq >= below {
			enc.Add(&e)
		}
		return true
	})
	return enc.Block(store.BlockContinues(data)), err
}

// PrunePage says how far one PruneEvents deletes: blocks are the event
// blocks wholly below the cut (first, last), by last, as many as the
// query's limit; the limit counts events. upto is the last event of the
// last block deleted (0: none); more, that blocks below the cut may
// remain.
func PrunePage(blocks [][2]int64, limit int) (upto int64, more bool) {
	more = limit > 0 && len(blocks) == limit
	n := 0
	for _, b := range blocks {
		if limit > 0 && n >= limit {
			return upto, true
		}
		upto = b[1]
		n += int(b[1] - b[0] + 1)
	}
	return upto, more
}

// TaskNames is an executor's task names as stored: a JSON array.
func TaskNames(tasks []string) string {
	b, _ := json.Marshal(tasks) // a []string always encodes
	return string(b)
}
