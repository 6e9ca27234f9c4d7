package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// txn is one Apply on the writer's driver connection. It talks to the
// driver directly: database/sql's per-statement bookkeeping is a large part
// of the writer's cost, and the writer is the one serial path.
type txn struct {
	s    *Store
	ctx  context.Context
	dc   driverConn
	args []driver.NamedValue // scratch, reused by every statement
	vals []any               // scratch for building a statement's arguments
	// merged maps a Finish to the outcome of the Claim it was merged into
	// (see mergeClaims).
	merged map[*store.Finish]bool
	pairs  map[*store.Claim]*store.Finish
	// Journal holds the count changes, written at commit (flushCounts,
	// flushActivity); a savepoint rolled back truncates it.
	store.Journal
	// ranges are the sequence numbers this transaction used per task and
	// event type, written to event_ranges at commit (see migration 0003).
	ranges map[rangeKey]*seqRange
	// nextSeq is the sequence number of the next event (0 until the first
	// event reads it); the events themselves wait in Store.pending.
	nextSeq int64
	// follows is the last sequence number committed before this
	// transaction's events (read with the first of them); epoch the stored
	// owner epoch (read at the first owner op, -1 until then).
	follows int64
	epoch   int64
	// expect and more say which of the events about to be appended the
	// statement that wrote their unit's row recorded already (see
	// recordArg): expect the next few of one unit, more every later event
	// of a unit whose claim and finish were merged (by unit ID, from that
	// Seq on).
	expect expectation
	more   map[string]int64
	recBuf []byte
	// generic lists the units with events recorded at commit
	// (flushRecords).
	generic map[string]bool
}

// expectation is a range of sequence numbers predicted for a unit's
// events.
type expectation struct {
	id          string
	first, last int64
}

type rangeKey struct{ task, typ string }

type seqRange struct{ first, last int64 }

func (t *txn) bind(args []any) []driver.NamedValue {
	nv := t.args[:0]
	for i, a := range args {
		switch v := a.(type) {
		case int:
			a = int64(v)
		case bool:
			if v {
				a = int64(1)
			} else {
				a = int64(0)
			}
		}
		nv = append(nv, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	t.args = nv
	return nv
}

// maxBoxes bounds Store.boxes: a store with more distinct task names than
// this starts its cache again, rather than grow it without bound.
const maxBoxes = 4096

// box returns s as an interface value for a statement's argument, from the
// store's cache when s is one of the strings that repeat (an event type, a
// task name, a state): boxing a string otherwise allocates. Values unique
// to a unit (IDs, targets) are bound as they are.
func (t *txn) box(s string) any {
	if v, ok := t.s.boxes[s]; ok {
		return v
	}
	if len(t.s.boxes) >= maxBoxes {
		clear(t.s.boxes)
	}
	v := any(s)
	t.s.boxes[s] = v
	return v
}

func (t *txn) exec(query string, args ...any) (driver.Result, error) {
	st, err := t.s.prepare(t.ctx, t.dc, query)
	if err != nil {
		return nil, err
	}
	return st.(driver.StmtExecContext).ExecContext(t.ctx, t.bind(args))
}

// changed runs an UPDATE or DELETE and reports whether it touched a row.
func (t *txn) changed(query string, args ...any) (bool, error) {
	res, err := t.exec(query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// all runs a query and returns every row.
func (t *txn) all(query string, args ...any) ([][]driver.Value, error) {
	st, err := t.s.prepare(t.ctx, t.dc, query)
	if err != nil {
		return nil, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(t.ctx, t.bind(args))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	n := len(rows.Columns())
	var out [][]driver.Value
	for {
		row := make([]driver.Value, n)
		if err := rows.Next(row); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
}

// one runs a query and returns its first row, if any.
func (t *txn) one(query string, args ...any) ([]driver.Value, bool, error) {
	rows, err := t.all(query, args...)
	if err != nil || len(rows) == 0 {
		return nil, false, err
	}
	return rows[0], true, nil
}

func asInt(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case float64:
		return int64(x)
	case bool:
		if x {
			return 1
		}
	}
	return 0
}

func asBytes(v driver.Value) []byte {
	switch x := v.(type) {
	case []byte:
		return x
	case string:
		return []byte(x)
	}
	return nil
}

func asStr(v driver.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return ""
}

// Apply runs ops in one transaction. See store.Store.
func (s *Store) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	results := make([]store.Result, len(ops))
	var follows int64
	err := s.wconn.Raw(func(dc any) error {
		t := &txn{s: s, ctx: ctx, dc: dc.(driverConn), pairs: mergeClaims(ops), epoch: -1}
		clear(s.pending)
		s.pending = s.pending[:0] // a failed transaction's, if any
		s.recorded = s.recorded[:0]
		if len(t.pairs) > 0 {
			t.merged = make(map[*store.Finish]bool, len(t.pairs))
		}
		tx, err := t.dc.BeginTx(ctx, driver.TxOptions{})
		if err != nil {
			return err
		}
		// The results' events share one array, grown as needed: an op's
		// Events start empty with room after the previous op's.
		arena := make([]store.Event, 0, 2*len(ops))
		for i, op := range ops {
			r := &results[i]
			t.expect = expectation{}
			r.Events = arena[len(arena):len(arena):cap(arena)]
			if fenced, err := t.fenced(op); err != nil {
				tx.Rollback()
				return err
			} else if fenced {
				*r = store.Result{Err: store.ErrNotOwner}
				continue
			}
			if err := t.apply(op, r); err != nil {
				tx.Rollback()
				return err
			}
			if n := len(r.Events); n == 0 {
				r.Events = nil
			} else {
				r.Events = r.Events[:n:n]
				if cap(arena)-len(arena) >= n && &arena[:len(arena)+1][len(arena)] == &r.Events[0] {
					arena = arena[:len(arena)+n] // written in place
				} else {
					arena = make([]store.Event, 0, 2*(len(ops)-i)) // it outgrew the array: a new one for the rest
				}
			}
		}
		if err := t.flushEvents(false); err != nil {
			tx.Rollback()
			return err
		}
		if err := t.flushCounts(); err != nil {
			tx.Rollback()
			return err
		}
		if err := t.flushActivity(); err != nil {
			tx.Rollback()
			return err
		}
		for k, r := range t.ranges {
			if _, err := t.exec(`INSERT INTO event_ranges(task, type, first, last) VALUES(?,?,?,?)`, k.task, k.typ, r.first, r.last); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			tx.Rollback()
			return err
		}
		follows = t.follows
		return nil
	})
	if err != nil {
		return store.Batch{}, err
	}
	return store.Batch{Results: results, Follows: follows}, nil
}

// fenced reports whether op is an owner's op whose epoch is no longer the
// stored one. The epoch is read once per transaction: the transaction
// holds SQLite's write lock, so no Acquire moves it meanwhile.
func (t *txn) fenced(op store.Op) (bool, error) {
	return sqlcommon.Fenced(op, &t.epoch, func() (int64, error) {
		row, _, err := t.one(`SELECT epoch FROM owner_epoch WHERE id = 1`)
		if err != nil {
			return 0, err
		}
		return asInt(row[0]), nil
	})
}

func (t *txn) apply(op store.Op, r *store.Result) error {
	switch op := op.(type) {
	case *store.Insert:
		if simpleInsert(op) {
			// One unit, no dependency, no idempotency key: its single
			// INSERT applies whole or fails whole, so no savepoint.
			err := store.ApplyInsert(t, op, r)
			var oe *store.OpError
			if errors.As(err, &oe) {
				*r = store.Result{Err: oe.Err}
				return nil
			}
			return err
		}
		return t.savepoint(r, func() error { return store.ApplyInsert(t, op, r) })
	case *store.PutSchedule:
		return t.savepoint(r, func() error { return sqlcommon.PutSchedule(common{t}, op, r) })
	case *store.Fire:
		return t.savepoint(r, func() error {
			return sqlcommon.Fire(common{t}, op, r, func(ins *store.Insert, ir *store.Result) error { return store.ApplyInsert(t, ins, ir) })
		})
	case *store.Claim:
		if f := t.pairs[op]; f != nil {
			return t.claimFinish(op, f, r)
		}
		return t.claim(op, r)
	case *store.Finish:
		if applied, ok := t.merged[op]; ok {
			return t.finishMerged(op, applied, r)
		}
		return t.finish(op, r)
	}
	if ok, err := sqlcommon.Apply(common{t}, op, r); ok {
		return err
	}
	return fmt.Errorf("runcue: sqlite: unknown op %T", op)
}

// savepoint runs f inside a savepoint; an *store.OpError rolls back only f's work
// and is reported on r.
func (t *txn) savepoint(r *store.Result, f func() error) error {
	if _, err := t.exec("SAVEPOINT op"); err != nil {
		return err
	}
	mark, pending, nextSeq := t.Journal.Mark(), len(t.s.pending), t.nextSeq
	err := f()
	var oe *store.OpError
	if errors.As(err, &oe) {
		if _, err := t.exec("ROLLBACK TO op"); err != nil {
			return err
		}
		t.Journal.Rollback(mark)
		clear(t.s.pending[pending:])
		t.s.pending, t.s.recorded, t.nextSeq = t.s.pending[:pending], t.s.recorded[:pending], nextSeq
		t.expect = expectation{}
		*r = store.Result{Err: oe.Err}
	} else if err != nil {
		return err
	}
	_, err = t.exec("RELEASE op")
	return err
}

// nullBox is box, with NULL for "".
func (t *txn) nullBox(s string) any {
	if s == "" {
		return nil
	}
	return t.box(s)
}

// appendAttempt is the SQL expression that appends ? (an attemptJSON) to the
// attempts column, a JSON array, by string operations.
const appendAttempt = `coalesce(substr(attempts, 1, length(attempts) - 1) || ',', '[') || ? || ']'`

func (t *txn) stringList(query string, args ...any) ([]string, error) {
	rows, err := t.all(query, args...)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rows))
	for i, row := range rows {
		out[i] = asStr(row[0])
	}
	return out, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

func simpleInsert(op *store.Insert) bool {
	if len(op.Units) != 1 || op.MaxQueued > 0 {
		return false
	}
	u := op.Units[0]
	return len(u.DependsOn) == 0 && u.IdempotencyKey == ""
}
