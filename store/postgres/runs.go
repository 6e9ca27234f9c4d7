package postgres

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/internal/sqlcommon"
)

// Segments of Claims and Finishes written a statement per kind: with fast
// handlers, the writer's batches are mostly claims and finishes, and on
// PostgreSQL a statement is a round trip. The claims, the assignments, the
// finishes and the assignments' deletes are sent together (t.pipe), in one
// round trip (after the segment's read of which apply, when it makes one:
// see plan): the writer is the scheduler's one serial path, and each round
// trip of its transaction waits for two processes to be scheduled.

// segment returns how many ops from the first form a segment that
// segmentApply writes with one statement per kind of op: Claims and
// Finishes, each unit claimed at most once and finished at most once, no
// Claim of a unit after its Finish (a retry claimed again in the same
// batch), and no Finish that propagates a failure to dependents (its rules
// read what the segment's later claims would already have written); and
// the executors' ops (remote.go), each unit's at most once per kind, no
// Assign of a unit after its Finish or Unassign, no start reported after
// its end.
func segment(ops []store.Op) int {
	claimed, finished := map[string]bool{}, map[string]bool{}
	var assigned, unassigned, started, ended map[string]bool
	once := func(m *map[string]bool, id string) bool {
		if *m == nil {
			*m = map[string]bool{}
		}
		if (*m)[id] {
			return false
		}
		(*m)[id] = true
		return true
	}
	for n, op := range ops {
		switch op := op.(type) {
		case *store.Claim:
			if claimed[op.ID] || finished[op.ID] {
				return n
			}
			claimed[op.ID] = true
		case *store.Finish:
			if finished[op.ID] || (op.Propagate && (op.State == store.Failed || op.State == store.Cancelled)) {
				return n
			}
			finished[op.ID] = true
		case *store.Assign:
			// Written after the Claims, before the Finishes.
			if finished[op.ID] || unassigned[op.ID] || !once(&assigned, op.ID) {
				return n
			}
		case *store.Unassign:
			if !once(&unassigned, op.ID) {
				return n
			}
		case *store.ReportStart:
			if !once(&started, op.ID) || ended[op.ID] {
				return n
			}
		case *store.ReportEnd:
			if !once(&ended, op.ID) {
				return n
			}
		default:
			return n
		}
	}
	return len(ops)
}

// segmentApply applies a segment (see segment): the fenced ops fail with
// store.ErrNotOwner; the Claims are written by one statement, then the
// Assigns, then the Finishes by another (a unit's Claim comes before its
// Finish), then the Unassigns, all sent at once; then each
// applied op's bookkeeping and events follow in the ops' order, so the log
// is the same as when each is applied alone.
func (t *txn) segmentApply(ops []store.Op, results []store.Result) error {
	var claims, finishes, remote []int
	for i, op := range ops {
		fenced, err := t.fenced(op)
		if err != nil {
			return err
		}
		if fenced {
			results[i] = store.Result{Err: store.ErrNotOwner}
			continue
		}
		switch op.(type) {
		case *store.Claim:
			claims = append(claims, i)
		case *store.Finish:
			finishes = append(finishes, i)
		default:
			remote = append(remote, i)
		}
	}
	p, err := t.plan(ops, claims, finishes)
	if err != nil {
		return err
	}
	claimed, finished := map[string]string{}, map[string]string{}
	pairs, alone := paired(ops, claims, finishes, remote)
	t.claimAll(ops, alone[0], p, claimed)
	t.claimFinishAll(ops, pairs, p, claimed, finished)
	if err := t.remoteAll(ops, remote, results, true); err != nil {
		return err
	}
	t.finishAll(ops, alone[1], p, finished)
	if err := t.remoteAll(ops, remote, results, false); err != nil {
		return err
	}
	if err := t.flushLater(); err != nil {
		return err
	}
	if err := p.check(ops, slices.Concat(claims, finishes), claimed, finished); err != nil {
		return err
	}
	var services, meters, workIDs []string
	var amounts, at []int64
	for i, op := range ops {
		switch op := op.(type) {
		case *store.Claim:
			task, ok := claimed[op.ID]
			if !ok || results[i].Err != nil {
				continue
			}
			if err := p.numbered(t, i); err != nil {
				return err
			}
			t.Moved(task, store.Queued, store.Running)
			results[i].Applied = true
			t.NoteWait(op.At, op.Wait)
			for _, e := range op.Log {
				services, meters, workIDs = append(services, e.Service), append(meters, e.Meter), append(workIDs, op.ID)
				amounts, at = append(amounts, e.Amount), append(at, ns(op.At))
			}
			if err := store.AppendEvents(t, &results[i], op.Events, op.ID, "", op.At); err != nil {
				return err
			}
		case *store.Finish:
			task, ok := finished[op.ID]
			if !ok || results[i].Err != nil {
				continue
			}
			if err := p.numbered(t, i); err != nil {
				return err
			}
			if err := sqlcommon.Finished(t, task, op, &results[i]); err != nil {
				return err
			}
		}
	}
	if len(services) > 0 {
		// Sent with the transaction's next statement (a later op's read of
		// the log comes after it), not a round trip of its own.
		t.queue(`INSERT INTO service_log(service, meter, amount, started_at, work_id)
			SELECT s, m, a, t, w FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
				WITH ORDINALITY AS v(s, m, a, t, w, i) ORDER BY i`,
			services, meters, amounts, at, workIDs)
	}
	return nil
}

// applied queues an UPDATE ... RETURNING id, task (see pipe); out holds
// the tasks of the units it changed, by ID, once sent.
func (t *txn) applied(out map[string]string, query string, args ...any) {
	t.pipe(func(rows pgx.Rows) error {
		for rows.Next() {
			var id, task string
			if err := rows.Scan(&id, &task); err != nil {
				return err
			}
			out[id] = task
		}
		return rows.Err()
	}, query, args...)
}

// claimAll queues the statement writing the Claims ops[idx], with the
// records of their events (p); once it is sent, out holds the tasks of the
// units it claimed, by ID.
//
// The batched statements find their units by ID only (byID). Their
// conditions on state are also wrapped in IS TRUE, which no index serves:
// with the statistics of a young table (a handful of queued units when last
// analyzed), PostgreSQL's cached generic plan scanned the queue's index
// for state = 'queued' and joined every queued unit against the batch:
// 178 ms for a claim of 40 among 10,365 queued units (auto_explain,
// BenchmarkExecutors), where the lookup by ID found 182 units in 5 ms.
func (t *txn) claimAll(ops []store.Op, idx []int, p *segPlan, out map[string]string) {
	n := len(idx)
	if n == 0 {
		return
	}
	ids, owners := make([]string, n), make([]string, n)
	runs := make([]int32, n)
	ats, leases, epochs := make([]int64, n), make([]int64, n), make([]int64, n)
	for k, i := range idx {
		c := ops[i].(*store.Claim)
		ids[k], owners[k], runs[k] = c.ID, c.Owner, int32(c.Run)
		ats[k], leases[k], epochs[k] = ns(c.At), ns(c.LeaseExpires), c.Epoch
	}
	const set = `UPDATE work_units w SET state='running', runs=v.run, started_at=v.at, leased_by=v.owner,
			lease_expires_at=v.lease, heartbeat_at=0, epoch=v.epoch`
	const rows = `unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[]`
	t.applied(out, set+`, `+recordSet(8)+` FROM `+byID(rows+`, $7::bytea[]) AS v(id, run, at, owner, lease, epoch, rec)`, claimCond)+
		` RETURNING w.id, w.task`, ids, runs, ats, owners, leases, epochs, p.records(idx), store.MaxUnitRecord)
}

// paired splits a segment's Claims and Finishes: pairs are the [Claim,
// Finish] op indexes of units claimed and finished in the segment, by the
// same owner and run, with no executor's op of theirs in it; alone[0] and
// alone[1] the other Claims and Finishes. A short run that is not logged
// ahead of its start (no rate window) is claimed and finished in one
// transaction, and its row is then written once (claimFinishAll), not
// twice: each write of a row is a new version of it with an entry in each
// of its indexes.
func paired(ops []store.Op, claims, finishes, remote []int) (pairs [][2]int, alone [2][]int) {
	claimAt := make(map[string]int, len(claims))
	for _, i := range claims {
		claimAt[ops[i].(*store.Claim).ID] = i
	}
	for _, i := range remote {
		delete(claimAt, opID(ops[i]))
	}
	paired := map[int]bool{}
	for _, i := range finishes {
		f := ops[i].(*store.Finish)
		if c, ok := claimAt[f.ID]; ok {
			if cl := ops[c].(*store.Claim); cl.Owner == f.Owner && cl.Run == f.Run {
				pairs = append(pairs, [2]int{c, i})
				paired[c] = true
				continue
			}
		}
		alone[1] = append(alone[1], i)
	}
	for _, i := range claims {
		if !paired[i] {
			alone[0] = append(alone[0], i)
		}
	}
	return pairs, alone
}

// opID is the unit an executor's op of a segment names.
func opID(op store.Op) string {
	switch op := op.(type) {
	case *store.Assign:
		return op.ID
	case *store.Unassign:
		return op.ID
	case *store.ReportStart:
		return op.ID
	case *store.ReportEnd:
		return op.ID
	}
	return ""
}

// claimFinishAll queues the statement writing each pair's Claim and
// Finish (see paired) as one write of the unit's row, where the Claim
// applies: the row takes the Finish's end and the Claim's run, start and
// epoch, and both ops' records (p). Once it is sent, claimed and finished
// both hold the tasks of the units it wrote, by ID: as when the two are
// written one after the other (the Finish applies exactly when its
// unit's Claim of the same owner and run just did).
func (t *txn) claimFinishAll(ops []store.Op, pairs [][2]int, p *segPlan, claimed, finished map[string]string) {
	n := len(pairs)
	if n == 0 {
		return
	}
	f := finishCols(ops, pairs, func(pr [2]int) int { return pr[1] })
	runs := make([]int32, n)
	ats, epochs := make([]int64, n), make([]int64, n)
	recs := make([][]byte, n)
	for k, pr := range pairs {
		c := ops[pr[0]].(*store.Claim)
		runs[k], ats[k], epochs[k] = int32(c.Run), ns(c.At), c.Epoch
		recs[k] = append(slices.Clip(p.rec[pr[0]]), p.rec[pr[1]]...)
		if len(recs[k]) == 0 {
			recs[k] = nil
		}
	}
	const rows = `unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::int[], $8::int[], $9::text[],
			$10::text[], $11::int[], $12::bigint[], $13::bigint[]`
	const cols = `state, fin, result, err, kind, run_at, spend, defer, attempt, id, run, at, epoch`
	t.pipe(func(rows pgx.Rows) error {
		for rows.Next() {
			var id, task string
			if err := rows.Scan(&id, &task); err != nil {
				return err
			}
			claimed[id], finished[id] = task, task
		}
		return rows.Err()
	}, finishSet+`, runs=v.run, started_at=v.at, heartbeat_at=0, epoch=v.epoch, `+recordSet(15)+` FROM `+
		byID(rows+`, $14::bytea[]) AS v(`+cols+`, rec)`, claimCond)+` RETURNING w.id, w.task`,
		f.states, f.fins, f.res, f.errs, f.kinds, f.runAts, f.spends, f.defers, f.attempts, f.ids, runs, ats, epochs, recs, store.MaxUnitRecord)
}

// finishColumns are the columns of a batched write of Finishes.
type finishColumns struct {
	states, attempts, ids, owners []string
	errs, kinds                   []*string
	fins, runAts                  []int64
	spends, defers, runs          []int32
	res                           [][]byte
}

// finishCols is the columns of the Finishes at(x) of xs.
func finishCols[X any](ops []store.Op, xs []X, at func(X) int) finishColumns {
	n := len(xs)
	c := finishColumns{states: make([]string, n), attempts: make([]string, n), ids: make([]string, n), owners: make([]string, n),
		errs: make([]*string, n), kinds: make([]*string, n), fins: make([]int64, n), runAts: make([]int64, n),
		spends: make([]int32, n), defers: make([]int32, n), runs: make([]int32, n), res: make([][]byte, n)}
	for k, x := range xs {
		f := ops[at(x)].(*store.Finish)
		c.states[k], c.ids[k], c.owners[k], c.runs[k] = string(f.State), f.ID, f.Owner, int32(f.Run)
		if f.State.Terminal() {
			c.fins[k] = ns(f.At)
		}
		c.runAts[k] = ns(f.RunAt)
		if f.State == store.Completed && len(f.Result) > 0 {
			c.res[k] = f.Result
		}
		if f.Error != "" {
			e := f.Error
			c.errs[k] = &e
		}
		if f.ErrorKind != "" {
			e := f.ErrorKind
			c.kinds[k] = &e
		}
		if f.SpendBudget {
			c.spends[k] = 1
		}
		if f.Deferral {
			c.defers[k] = 1
		}
		c.attempts[k] = store.AttemptJSON(f.Attempt)
	}
	return c
}

// finishSet is the SET clause of a batched write of Finishes (v: the
// columns of finishCols).
const finishSet = `UPDATE work_units w SET state=v.state, finished_at=v.fin, result=v.result, error=v.err, error_kind=v.kind,
			run_at=v.run_at, failures=w.failures+v.spend, deferrals=w.deferrals+v.defer, leased_by=NULL, lease_expires_at=0,
			cancel_requested=0, attempts=CASE WHEN w.attempts IS NULL OR w.attempts = '' THEN '[' || v.attempt || ']'
				ELSE left(w.attempts, length(w.attempts) - 1) || ',' || v.attempt || ']' END`

// claimCond is the condition under which a Claim applies.
const claimCond = `state='queued' AND cancel_requested=0`

// finishAll queues the statement writing the Finishes ops[idx], with the
// records of their events (p); once it is sent, out holds the tasks of the
// units it finished, by ID.
func (t *txn) finishAll(ops []store.Op, idx []int, p *segPlan, out map[string]string) {
	n := len(idx)
	if n == 0 {
		return
	}
	f := finishCols(ops, idx, func(i int) int { return i })
	const rows = `unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::int[], $8::int[], $9::text[],
			$10::text[], $11::text[], $12::int[]`
	const cols = `state, fin, result, err, kind, run_at, spend, defer, attempt, id, owner, run`
	const cond = `state='running' AND leased_by=v.owner AND runs=v.run`
	t.applied(out, finishSet+`, `+recordSet(14)+` FROM `+byID(rows+`, $13::bytea[]) AS v(`+cols+`, rec)`, cond)+` RETURNING w.id, w.task`,
		f.states, f.fins, f.res, f.errs, f.kinds, f.runAts, f.spends, f.defers, f.attempts, f.ids, f.owners, f.runs, p.records(idx), store.MaxUnitRecord)
}

// byID is the FROM and WHERE of a batched UPDATE of work_units (aliased
// w) by the IDs of rows (a set aliased v, with a column id): each row's
// unit is looked up by its ID alone, where cond (on the unit's columns,
// and v's) holds, and the update joins it by its row's address. The
// lookup is a parameterized index scan whatever the statistics say: with
// a join of w and v the planner chose, early in a run (the table's
// statistics from when it held a few units), a scan of every unit with a
// nested loop over the batch, 200-470 ms for a claim of 192 among 4,000
// units, where the lookup takes a few (auto_explain, BenchmarkExecutors).
// The writers take turns (the log's lock), so the rows found are those
// updated.
func byID(rows, cond string) string {
	return `(SELECT v.*, x.tid FROM ` + rows + ` CROSS JOIN LATERAL
			(SELECT ctid AS tid FROM work_units WHERE id = v.id AND (` + cond + `) IS TRUE OFFSET 0) x) v
		WHERE w.ctid = v.tid`
}

// A segment's Claims and Finishes write their units' records of their
// events themselves (segPlan), instead of a second write of each row at
// commit (flushEvents): that write was a new version of the row, with an
// entry in each of its indexes, for every claim and every finish. The
// events' numbers follow from which ops apply, so plan reads that first
// (a read of each row by ID, no write): the writers take turns (the log's
// lock, see Apply), so what it reads holds when the statements write, and
// the statements' results are checked against it. A transaction that is
// one segment skips the read and takes every op to apply (optimistic:
// nearly always so, a round trip less on the writer's serial path); when
// one did not, the check fails and Apply writes the transaction again with
// the read. A unit's record stays in the order of its events: one with an
// event of the transaction not recorded yet is left to flushEvents.

// segPlan is a segment's plan: the numbers and records of the events of
// its Claims and Finishes that apply, by op index.
type segPlan struct {
	optimistic bool            // every op taken to apply, unread (see Apply)
	first      map[int]int64   // the number of the op's first event; the ops that apply
	rec        map[int][]byte  // the op's entries in its unit's record
	seqs       map[int][]int64 // the numbers rec holds
}

// recordSet is the SET clause appending v.rec to a unit's record (bounded
// as flushEvents bounds it), its bound the statement's parameter $n.
func recordSet(n int) string {
	return `events = CASE WHEN v.rec IS NULL OR length(coalesce(w.events, '')) >= $` + strconv.Itoa(n) + ` THEN w.events
			ELSE coalesce(w.events, '') || v.rec END`
}

// plan reads which of the segment's Claims (ops[claims]) and Finishes
// (ops[finishes]) apply, and numbers their events as the segment will.
// A unit both claimed and finished in the segment (claimed first: see
// segment) is finished when its claim applies and the finish names the
// claim's owner and run, else as its stored row says.
func (t *txn) plan(ops []store.Op, claims, finishes []int) (*segPlan, error) {
	p := &segPlan{optimistic: t.optimistic, first: map[int]int64{}, rec: map[int][]byte{}, seqs: map[int][]int64{}}
	order := slices.Concat(claims, finishes)
	if len(order) == 0 {
		return p, nil
	}
	slices.Sort(order)
	ids, owners := make([]string, len(order)), make([]string, len(order))
	isClaim, runs := make([]bool, len(order)), make([]int32, len(order))
	claimOf := map[string]*store.Claim{}
	for k, i := range order {
		switch op := ops[i].(type) {
		case *store.Claim:
			ids[k], isClaim[k] = op.ID, true
			claimOf[op.ID] = op
		case *store.Finish:
			ids[k], owners[k], runs[k] = op.ID, op.Owner, int32(op.Run)
		}
	}
	stored := make(map[int]bool, len(order)) // by op index: its condition holds on the stored row
	if t.optimistic {
		// Taken to hold for every op; check finds out otherwise.
		for _, i := range order {
			stored[i] = true
		}
	} else {
		ks, err := t.int64s(`SELECT v.k FROM unnest($1::text[], $2::bool[], $3::text[], $4::int[]) WITH ORDINALITY AS v(id, claim, owner, run, k)
		WHERE EXISTS (SELECT FROM work_units WHERE id = v.id AND (CASE WHEN v.claim
			THEN state='queued' AND cancel_requested=0 ELSE state='running' AND leased_by=v.owner AND runs=v.run END) IS TRUE OFFSET 0)`,
			ids, isClaim, owners, runs)
		if err != nil {
			return nil, err
		}
		for _, k := range ks {
			stored[order[k-1]] = true
		}
	}
	// A unit with an event of this transaction not in its record yet keeps
	// its record in order: flushEvents writes all of them.
	later := map[string]bool{}
	for i := range t.pending {
		if ev := &t.pending[i]; !t.recorded[ev.Seq] && ev.WorkID != "" {
			later[ev.WorkID] = true
		}
	}
	claimed := map[string]bool{}
	seq := t.nextSeq
	for _, i := range order {
		var id string
		var evs []store.Event
		applies := stored[i]
		switch op := ops[i].(type) {
		case *store.Claim:
			id, evs = op.ID, op.Events
			claimed[id] = applies
		case *store.Finish:
			id, evs = op.ID, op.Events
			if c := claimOf[id]; c != nil && claimed[id] {
				applies = c.Owner == op.Owner && c.Run == op.Run
			}
		}
		if !applies {
			continue
		}
		p.first[i] = seq
		for _, ev := range evs {
			if (ev.WorkID == "" || ev.WorkID == id) && !later[id] {
				p.rec[i] = store.AppendUnitRecord(p.rec[i], seq, false)
				p.seqs[i] = append(p.seqs[i], seq)
			}
			seq++
		}
	}
	return p, nil
}

// records is the records of the ops idx, for a statement (nil for none).
func (p *segPlan) records(idx []int) [][]byte {
	recs := make([][]byte, len(idx))
	for k, i := range idx {
		recs[k] = p.rec[i]
	}
	return recs
}

// errMispredicted is check's error for an optimistic plan some op of
// which did not apply: Apply writes the transaction again, with the read.
var errMispredicted = errors.New("runcue: postgres: an op of an optimistic segment did not apply")

// check reports an error unless the statements applied exactly the ops
// of idx the plan read would (the writers' turns make that so), or, for an
// optimistic plan, unless every op applied (errMispredicted).
func (p *segPlan) check(ops []store.Op, idx []int, claimed, finished map[string]string) error {
	for _, i := range idx {
		var ok bool
		switch op := ops[i].(type) {
		case *store.Claim:
			_, ok = claimed[op.ID]
		case *store.Finish:
			_, ok = finished[op.ID]
		}
		if _, want := p.first[i]; ok != want {
			if p.optimistic {
				return errMispredicted
			}
			return fmt.Errorf("runcue: postgres: op %d of a segment applied %v, where the plan read %v", i, ok, want)
		}
	}
	return nil
}

// numbered checks that op i's events take the numbers the plan gave them,
// and marks those in its unit's record as recorded.
func (p *segPlan) numbered(t *txn, i int) error {
	first, ok := p.first[i]
	if !ok || first != t.nextSeq {
		return fmt.Errorf("runcue: postgres: op %d of a segment applied unplanned, or its events numbered otherwise", i)
	}
	for _, seq := range p.seqs[i] {
		if t.recorded == nil {
			t.recorded = map[int64]bool{}
		}
		t.recorded[seq] = true
	}
	return nil
}
