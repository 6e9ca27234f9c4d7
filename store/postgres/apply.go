package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// txn is one Apply: a transaction on a connection of the pool.
type txn struct {
	s   *Store
	ctx context.Context
	tx  pgx.Tx
	// Journal holds the count changes, written at commit (flushCounts,
	// flushActivity); a savepoint rolled back truncates it.
	store.Journal
	// The transaction's events, numbered as they are appended (follows
	// is the log's last number when the transaction began, nextSeq the
	// next to assign), written as blocks with their units' records and
	// the log's ranges at commit, or before a Prune reads the log.
	pending []store.Event
	nextSeq int64
	follows int64
	enc     store.BlockEncoder
	// recorded holds the sequence numbers of pending events already in
	// their unit's record (written with the unit's INSERT: insertRecords).
	recorded map[int64]bool
	// ins buffers the rows InsertUnit writes, until the next statement or
	// the end of the Insert op (flushInserts); seqs are sequence numbers
	// taken ahead for them (seqWant how many the op may need).
	ins     insertBuf
	seqs    []int64
	seqWant int
	// optimistic: the segment's plan takes every op to apply, unread
	// (see Apply).
	optimistic bool
	// noCopy: units are written with INSERT only, never COPY (see
	// flushInserts and Apply).
	noCopy bool
	// epoch is the stored owner epoch, read at the first owner op (-1
	// until then) with the lease row locked: no owner change commits
	// before this transaction does.
	epoch int64
	// notifyExecs are the executors an applied op assigned a run to (or
	// asked to stop one), notifyReports whether a report or a registration
	// applied: the other side waits for them (see remote.go).
	notifyExecs   []string
	notifyReports bool
	// unassigned counts the assignments deleted (see vacuum.go).
	unassigned int
	// later holds the statements whose results nothing reads (the log's
	// writes, the counts, the notifications): sent in one round trip
	// before the transaction's next statement, or before its commit.
	later *pgx.Batch
}

// Apply runs ops in one transaction. See store.Store.
//
// Without a deadline of ctx's, the transaction has TxTimeout: a
// connection cut off without a word (a blackhole) fails it then, as a
// reset one does at once, rather than when TCP gives up minutes later. A
// COMMIT whose answer is lost gives a *store.UnknownCommitError whose
// Resolve asks the server for the transaction's status (txid_status); a
// transaction refused because the server is a replica (25006) resets the
// pool, whose connections all reached the old primary.
func (s *Store) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.TxTimeout())
		defer cancel()
	}
	b, err := s.applyOps(ctx, ops)
	if err != nil && isReadOnly(err) {
		s.pool.Reset()
	}
	return b, err
}

// TxTimeout implements store.TxTimeouter: LeaseTTL/2, so that an owner
// whose connection is cut off knows it before its lease can expire.
func (s *Store) TxTimeout() time.Duration { return s.opts.LeaseTTL / 2 }

func (s *Store) applyOps(ctx context.Context, ops []store.Op) (store.Batch, error) {
	if startsOnly(ops) {
		return s.applyStarts(ctx, ops)
	}
	if lockFree(ops) {
		if b, ok, err := s.applyReports(ctx, ops); ok {
			return b, err
		}
	}
	// A transaction that is one segment is first written as if every op
	// in it applies (optimistic, runs.go): no read of which do. When one
	// did not, the transaction is rolled back and written again with that
	// read, as are the next carefulAfterMiss ones.
	first := segment(ops)
	optimistic := first > 1 && first == len(ops)
	if optimistic && s.careful.Load() > 0 {
		s.careful.Add(-1)
		optimistic = false
	}
	// A transaction whose COPY met a unit already stored is written again
	// with INSERT (flushInserts). Each retry turns one of the two off: at
	// most three attempts.
	noCopy := false
	for {
		b, err := s.apply(ctx, ops, first, optimistic, noCopy)
		switch {
		case optimistic && errors.Is(err, errMispredicted):
			s.careful.Store(carefulAfterMiss)
			optimistic = false
		case !noCopy && errors.Is(err, errCopyConflict):
			noCopy = true
		default:
			return b, err
		}
	}
}

// carefulAfterMiss is how many one-segment transactions after a
// misprediction read which of their ops apply before writing them.
const carefulAfterMiss = 16

// apply runs ops in one transaction; first is segment(ops), optimistic
// and noCopy see Apply.
func (s *Store) apply(ctx context.Context, ops []store.Op, first int, optimistic, noCopy bool) (store.Batch, error) {
	results := make([]store.Result, len(ops))
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return store.Batch{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t := &txn{s: s, ctx: ctx, tx: tx, epoch: -1, optimistic: optimistic, noCopy: noCopy || s.opts.noCopy}
	// The transaction's ID and its server's start, to ask whether it
	// committed if its COMMIT's answer is lost (xactCommitted).
	var x xact
	// The log's counter row is locked first, for the whole transaction:
	// writers to one database take turns, as SQLite's do, so that every
	// rule's reads (a key's holder, a dependency's state, the queue's
	// count) hold until commit, and the event numbers are assigned in
	// commit order (see the package comment).
	//
	// An executor's batch of reports (lockFree) takes no turn: each is one
	// conditional write of an assignment's row, and it appends no event,
	// so it need not wait for the owner's transactions nor make them
	// wait.
	//
	// A transaction with an owner's op reads the stored epoch (fenced) in
	// the same statement, a round trip less on the writer's serial path.
	if lockFree(ops) {
		t.follows = 0
	} else if !slices.ContainsFunc(ops, ownerOp) {
		if err := tx.QueryRow(ctx, `SELECT value, txid_current(), pg_postmaster_start_time() FROM meta WHERE key = 'events_last' FOR UPDATE`).
			Scan(&t.follows, &x.id, &x.server); err != nil {
			return store.Batch{}, err
		}
	} else if err := tx.QueryRow(ctx, `SELECT m.value, txid_current(), pg_postmaster_start_time(), (`+epochQuery+`)
		FROM meta m WHERE m.key = 'events_last' FOR UPDATE OF m`).Scan(&t.follows, &x.id, &x.server, &t.epoch); err != nil {
		return store.Batch{}, err
	}
	t.nextSeq = t.follows + 1
	for i := 0; i < len(ops); {
		// A segment of Claims and Finishes is written by a statement per
		// kind (runs.go): a round trip or two instead of one per op. Each
		// op's outcome and events are as if applied alone, in order.
		n := first
		if i > 0 {
			n = segment(ops[i:])
		}
		if n > 1 {
			if err := t.segmentApply(ops[i:i+n], results[i:i+n]); err != nil {
				return store.Batch{}, err
			}
			i += n
			continue
		}
		r := &results[i]
		if fenced, err := t.fenced(ops[i]); err != nil {
			return store.Batch{}, err
		} else if fenced {
			*r = store.Result{Err: store.ErrNotOwner}
			i++
			continue
		}
		if err := t.apply(ops[i], r); err != nil {
			return store.Batch{}, err
		}
		i++
	}
	if err := t.flushEvents(false); err != nil {
		return store.Batch{}, err
	}
	if err := t.flushCounts(); err != nil {
		return store.Batch{}, err
	}
	if err := t.flushActivity(); err != nil {
		return store.Batch{}, err
	}
	if err := t.notifyRemote(); err != nil {
		return store.Batch{}, err
	}
	if t.nextSeq > t.follows+1 {
		// One notification per commit, never per unit (NOTIFY takes a
		// lock at commit): the listeners read the log themselves.
		t.queue(`SELECT pg_notify($1, '')`, s.channel)
	}
	if err := t.flushLater(); err != nil {
		return store.Batch{}, err
	}
	b := store.Batch{Results: results, Follows: t.follows}
	if err := tx.Commit(ctx); err != nil {
		if x.id == 0 || !commitUnknown(err) {
			return store.Batch{}, err
		}
		if t.nextSeq > t.follows+1 {
			x.last = t.nextSeq - 1
		}
		return store.Batch{}, &store.UnknownCommitError{Err: err, Batch: b, Resolve: func(ctx context.Context) (bool, error) {
			committed, err := s.xactCommitted(ctx, x)
			if committed && t.nextSeq > t.follows+1 {
				s.noteCommit(t.follows, t.nextSeq-1)
			}
			return committed, err
		}}
	}
	if t.nextSeq > t.follows+1 {
		s.noteCommit(t.follows, t.nextSeq-1)
	}
	s.unassigned(ctx, t.unassigned)
	return b, nil
}

// fenced reports whether op is an owner's op whose epoch is no longer the
// stored one. The lease row is share-locked at the first owner op, so no
// takeover commits between the check and this transaction's commit: a
// deposed owner's write either commits before the new owner's epoch does
// or fails here.
func (t *txn) fenced(op store.Op) (bool, error) {
	return sqlcommon.Fenced(op, &t.epoch, func() (epoch int64, err error) {
		err = t.tx.QueryRow(t.ctx, epochQuery).Scan(&epoch)
		return epoch, err
	})
}

// epochQuery reads the stored owner epoch, share-locking the lease row
// (see fenced).
const epochQuery = `SELECT epoch FROM owner_lease WHERE id = 1 FOR SHARE`

// ownerOp reports whether op is an owner's op (fenced by its epoch).
func ownerOp(op store.Op) bool {
	_, ok := sqlcommon.OwnerEpoch(op)
	return ok
}

// queue adds a statement whose result nothing reads to t.later.
func (t *txn) queue(query string, args ...any) {
	if t.later == nil {
		t.later = &pgx.Batch{}
	}
	t.later.Queue(query, args...)
}

// pipe queues a statement to t.later whose rows fn reads when the batch
// is sent: a statement whose result is read, but not before the next
// statement is written (the segment's claims, assignments and finishes:
// runs.go).
func (t *txn) pipe(fn func(pgx.Rows) error, query string, args ...any) {
	if t.later == nil {
		t.later = &pgx.Batch{}
	}
	t.later.Queue(query, args...).Query(fn)
}

// flushLater sends the queued statements, in one round trip, and runs
// their readers (pipe) in order. An error of one is the batch's error.
func (t *txn) flushLater() error {
	b := t.later
	if b == nil || b.Len() == 0 {
		return nil
	}
	t.later = nil
	return t.tx.SendBatch(t.ctx, b).Close()
}

func (t *txn) exec(query string, args ...any) (int64, error) {
	if err := t.flushInserts(); err != nil {
		return 0, err
	}
	tag, err := t.tx.Exec(t.ctx, query, args...)
	return tag.RowsAffected(), err
}

// changed runs an UPDATE or DELETE and reports whether it touched a row.
func (t *txn) changed(query string, args ...any) (bool, error) {
	n, err := t.exec(query, args...)
	return n > 0, err
}

// one runs a query and scans its first row into dest; ok is false when
// there is none.
func (t *txn) one(query string, args []any, dest ...any) (bool, error) {
	if err := t.flushInserts(); err != nil {
		return false, err
	}
	err := t.tx.QueryRow(t.ctx, query, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (t *txn) strings(query string, args ...any) ([]string, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (t *txn) int64s(query string, args ...any) ([]int64, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// query runs a query, after the buffered inserts (see InsertUnit).
func (t *txn) query(query string, args ...any) (pgx.Rows, error) {
	if err := t.flushInserts(); err != nil {
		return nil, err
	}
	return t.tx.Query(t.ctx, query, args...)
}

func (t *txn) apply(op store.Op, r *store.Result) error {
	switch op := op.(type) {
	case *store.Insert:
		return t.savepoint(r, func() error { return t.insert(op, r) })
	case *store.PutSchedule:
		return t.savepoint(r, func() error { return sqlcommon.PutSchedule(common{t}, op, r) })
	case *store.Fire:
		return t.savepoint(r, func() error { return sqlcommon.Fire(common{t}, op, r, t.insert) })
	case *store.Claim:
		return t.claim(op, r)
	case *store.Finish:
		return t.finish(op, r)
	}
	if ok, err := sqlcommon.Apply(common{t}, op, r); ok {
		return err
	}
	return fmt.Errorf("runcue: postgres: unknown op %T", op)
}

// insert applies an Insert, its units' rows written at its end
// (flushInserts).
func (t *txn) insert(op *store.Insert, r *store.Result) error {
	t.seqWant = len(op.Units)
	defer func() { t.seqs, t.seqWant = t.seqs[:0], 0 }()
	if err := store.ApplyInsert(t, op, r); err != nil {
		t.ins.reset()
		return err
	}
	return t.flushInserts()
}

// savepoint runs f inside a savepoint; an *store.OpError rolls back only
// f's work (in the database and in the transaction's journals) and is
// reported on r.
func (t *txn) savepoint(r *store.Result, f func() error) error {
	if _, err := t.exec(`SAVEPOINT op`); err != nil {
		return err
	}
	mark, pending, nextSeq := t.Journal.Mark(), len(t.pending), t.nextSeq
	err := f()
	var oe *store.OpError
	if errors.As(err, &oe) {
		if _, err := t.exec(`ROLLBACK TO SAVEPOINT op`); err != nil {
			return err
		}
		t.Journal.Rollback(mark)
		clear(t.pending[pending:])
		t.pending = t.pending[:pending]
		t.nextSeq = nextSeq
		for seq := range t.recorded {
			if seq >= nextSeq { // rolled back: the numbers are given again
				delete(t.recorded, seq)
			}
		}
		*r = store.Result{Err: oe.Err}
	} else if err != nil {
		return err
	}
	_, err = t.exec(`RELEASE SAVEPOINT op`)
	return err
}
