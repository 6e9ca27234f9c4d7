package engine

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// The unit index: queued, waiting and blocked units of registered tasks
// (d.units), orphans of unregistered ones (d.orphans), and how units come
// in (this Cue's inserts, other processes' commits, recovery) and leave.
// Owned by the dispatcher goroutine.

// unitIndex holds the units of this owner not yet finished: queued,
// waiting and running units of registered tasks (units) and queued units
// of tasks not registered here (orphans, by task). paramBytes is the size
// of the parameters kept in memory (see maxParamBytes).
//
// Its methods reach, besides its own fields, what it embeds: the resource
// table (lanes, and below it the environment, timeline and task table)
// and the scorer (a forgotten unit's score goes with it). keys calls the
// tasks' ServiceKeys callbacks as units are indexed.
type unitIndex struct {
	*resourceTable
	*scorer
	keys keysCaller

	units   map[string]*unit
	orphans map[string]map[string]*unit
	// seqs are the sequence keys' lines (sequences.go); seqReading the
	// HoldOnFailure tasks whose failed units are being read.
	seqs       map[string]*seqLine
	seqReading map[string]bool
	paramBytes int
	// noParams lists the units indexed without their params, in index
	// order (units that ran or left since are skipped when it is read);
	// withoutParams counts the indexed units without params, so that a
	// list mostly of units that left is compacted (see dropParamless).
	noParams      fifo[*unit]
	withoutParams int
	// backSeqs counts the units sent to the back of their lanes (backSeq).
	backSeqs int64
}

// backSeq returns an ordering key after every stored unit's: a unit given
// it goes behind the units queued now (and the units submitted later go
// before it, until they too are sent back). Stored sequence numbers stay
// far below 1<<62.
func (x *unitIndex) backSeq() int64 {
	x.backSeqs++
	return 1<<62 + x.backSeqs
}

// unit states inside the dispatcher.
const (
	uWaiting   = iota // until runAt (timer heap)
	uReady            // in its lane
	uRunning          //
	uOrphan           // task type not registered here
	uBlocked          // waiting for dependencies to complete
	uChecking         // dependencies complete, DependencySatisfied not yet true
	uSequenced        // waiting for its turn in its sequence (sequences.go)
)

// unit is a queued, waiting or running unit as the dispatcher holds it.
// Owned by the dispatcher goroutine; a handler goroutine gets copies (see
// run).
//
// A deep queue holds a unit per queued unit, so the record is kept small:
// counts in 32 bits, instants as Unix nanoseconds where they are only
// compared, and what few units have in unitMore.
type unit struct {
	id        string
	seq       int64
	task      string
	target    string
	params    []byte
	runAt     time.Time
	createdAt int64 // wall clock, Unix ns
	readyAt   int64 // when it last became eligible, scheduling timeline, Unix ns
	lane      *lane
	runs      int32
	failures  int32
	deferrals int32
	laneIdx   int32 // position in lane heap
	timerGen  uint32
	state     uint8
	// probeFails counts the unit's failed circuit probes in a row, which
	// spend no retry budget up to MaxFreeProbes (in this owner).
	probeFails uint8
	why        whyKind // why runAt is set
	hasParams  bool
	// With a priority function: the score u holds (if scored) since
	// scoredAt (scheduling timeline, Unix ns); scoreGen numbers u's lane
	// stays and scores (see unitRef).
	scored   bool
	scoreGen uint32
	score    float64
	scoredAt int64
	// pbatch, when set, is the read that will bring u's params.
	pbatch *paramBatch
	// more holds what most units lack (nil for them): a deep queue of
	// plain units costs only the fields above.
	more *unitMore
}

// unitMore is the part of a unit that only some units have: dependencies,
// keyed services, a retry policy of its own, a trace context. Owned, like
// unit, by the dispatcher goroutine.
type unitMore struct {
	retry    RetryPolicy   // the submission's own policy, if any
	keys     []string      // keyed services, sorted
	keyErr   error         // deriving keys failed: the run fails with it
	deps     []string      // dependencies
	pending  int           // dependencies not yet completed
	skipped  []string      // dependencies skipped and taken as satisfied (Explain)
	depsBy   time.Time     // DependencyDeadline
	checking bool          // a DependencySatisfied check is in flight
	trace    []byte        // the submitter's trace context
	timeout  time.Duration // the submission's own timeout
	costs    rt.Costs      // its costs by amount (stored at submit)
	// line is its sequence key's line (sequences.go), nil if none.
	line *seqLine
	// batch is its batch key (batches.go), "" if none.
	batch string
	// leaseRun is the run whose lease the unit waits for (the lease rule:
	// its Runner has not reported its end); backoffAt is when it may run
	// once that run's end is reported.
	leaseRun  *run
	backoffAt time.Time
	// due, depTimer and recheck are u's entries on the timer heap (its
	// runAt, its DependencyDeadline, its next DependencySatisfied check),
	// removed when u is forgotten so that no timer keeps it reachable.
	due, depTimer, recheck *timerEntry
}

// costs returns u's costs by amount (nil: one of each).
func (u *unit) costs() rt.Costs {
	if u.more == nil {
		return nil
	}
	return u.more.costs
}

// whyKind says why a unit's runAt is set.
type whyKind uint8

const (
	whyNone       whyKind = iota
	whyBackoff            // a retry's backoff
	whyRetryAfter         // a Retry-After deferral
	whyRunAt              // the submitter's RunAt
)

var whyNames = [...]string{"", "backoff", "retry_after", "run_at"}

func (w whyKind) String() string { return whyNames[w] }

// whyNamed is the whyKind named s.
func whyNamed(s string) whyKind {
	for i, n := range whyNames {
		if n == s {
			return whyKind(i)
		}
	}
	return whyNone
}

// intern returns s, or an equal string already held: task types repeat
// across a deep queue.
func (x *unitIndex) intern(s string) string {
	if rt, ok := x.tasks[s]; ok {
		return rt.name
	}
	return s
}

// ext returns u's unitMore, creating it.
func (u *unit) ext() *unitMore {
	if u.more == nil {
		u.more = &unitMore{}
	}
	return u.more
}

// deps, depsBy, traceCtx and skipped read u's unitMore, if any.
func (u *unit) deps() []string {
	if u.more == nil {
		return nil
	}
	return u.more.deps
}

func (u *unit) depsBy() time.Time {
	if u.more == nil {
		return time.Time{}
	}
	return u.more.depsBy
}

func (u *unit) traceCtx() []byte {
	if u.more == nil {
		return nil
	}
	return u.more.trace
}

func (u *unit) skipped() []string {
	if u.more == nil {
		return nil
	}
	return u.more.skipped
}

// noteSkipped records that dependency dep was skipped and satisfies u.
func (u *unit) noteSkipped(dep string) {
	if m := u.ext(); !slices.Contains(m.skipped, dep) {
		m.skipped = append(m.skipped, dep)
	}
}

// addUnits indexes queued units not yet known, then files each where it
// belongs: waiting for its dependencies, on the timer heap, or in its lane.
// Every unit is indexed before any unit's dependencies are looked at, so a
// dependency later in the same batch is known as queued (see resolveDeps).
func (d *Engine) addUnits(sus []*store.Unit) {
	units := make([]*unit, 0, len(sus))
	for _, su := range sus {
		if u := d.index(su); u != nil {
			units = append(units, u)
		}
	}
	d.file(units)
}

// file sends newly indexed units on: to wait for their dependencies, or to
// eligibility.
func (d *Engine) file(units []*unit) {
	var withDeps []*unit
	for _, u := range units {
		if len(u.deps()) > 0 {
			withDeps = append(withDeps, u)
		} else {
			d.makeEligible(u)
		}
	}
	d.resolveDeps(withDeps)
}

// index records a queued unit, unless it is already known. It returns nil
// for a known unit and for an orphan (its task type is not registered
// here), which is kept apart until its task is.
func (x *unitIndex) index(su *store.Unit) *unit {
	if _, ok := x.units[su.ID]; ok {
		return nil
	}
	if o := x.orphans[su.Task]; o != nil && o[su.ID] != nil {
		return nil
	}
	return x.register(x.build(su))
}

// build makes the in-memory record of stored unit su, retaining none of su
// but its strings and slices. It reads only what is fixed or safe anywhere
// (the clock, the logger), so the streamed load calls it off the loop.
func (x *unitIndex) build(su *store.Unit) *unit {
	u := &unit{id: su.ID, seq: su.Seq, task: su.Task, target: su.Target, params: su.Params, hasParams: true,
		runs: int32(su.Runs), failures: int32(su.Failures), deferrals: int32(su.Deferrals), runAt: su.RunAt, laneIdx: -1,
		createdAt: su.CreatedAt.UnixNano()}
	if len(su.DependsOn) > 0 || !su.DependencyDeadline.IsZero() || len(su.Trace) > 0 || su.Timeout != 0 {
		m := u.ext()
		m.deps, m.depsBy, m.trace, m.timeout = su.DependsOn, su.DependencyDeadline, su.Trace, su.Timeout
	}
	switch {
	case su.RunAt.IsZero():
	case su.ErrorKind == "retry_after":
		u.why = whyRetryAfter
	case su.Failures > 0:
		u.why = whyBackoff
	default:
		u.why = whyRunAt
	}
	if (u.why == whyRetryAfter || u.why == whyBackoff) && !su.StartedAt.IsZero() {
		// A retry time runcue chose is a hold that began after the last
		// run started: if the wall clock was set back since, the stored
		// instant lies further away than the hold was long. It never lasts
		// longer from now than it could have from that start. (A RunAt the
		// submitter chose keeps its wall-clock meaning.)
		if bound := x.wall().Add(su.RunAt.Sub(su.StartedAt)); u.runAt.After(bound) {
			u.runAt = bound
		}
	}
	if len(su.Costs) > 0 {
		u.ext().costs = rt.Costs(su.Costs)
	}
	if len(su.Retry) > 0 {
		if p, err := x.unitRetry(su.Retry); err == nil {
			u.ext().retry = p
		} else {
			x.log.Warn("runcue: ignoring a unit's unreadable retry policy", "work_id", su.ID, "error", err)
		}
	}
	return u
}

// register indexes u, built by build, unless a unit with its ID is already
// known (see index).
func (x *unitIndex) register(u *unit) *unit {
	if _, ok := x.units[u.id]; ok {
		return nil
	}
	if o := x.orphans[u.task]; o != nil && o[u.id] != nil {
		return nil
	}
	u.task = x.intern(u.task)
	rt, ok := x.tasks[u.task]
	if !ok {
		u.state = uOrphan
		o := x.orphans[u.task]
		if o == nil {
			o = make(map[string]*unit)
			x.orphans[u.task] = o
			x.log.Warn("runcue: queued units have a task type not registered here; they stay queued", "task_type", u.task)
		}
		o[u.id] = u
		return nil
	}
	x.deriveKeys(u, rt)
	x.joinSequence(u, rt)
	x.batchKey(u, rt)
	if x.paramBytes+paramCost(u.params) <= x.paramBudget() {
		x.paramBytes += paramCost(u.params)
	} else {
		u.params, u.hasParams = nil, false // read in a batch before it runs (params.go)
		x.noParams.push(u)
		x.withoutParams++
	}
	x.units[u.id] = u
	return u
}

// makeEligible puts u in its lane, or on the timer heap until its runAt.
func (x *unitIndex) makeEligible(u *unit) {
	if x.sequenced(u) {
		return // its turn comes when the unit before it leaves (leaveSequence)
	}
	if wall := x.wall(); u.runAt.After(wall) {
		// runAt is a wall-clock instant: it keeps its meaning as the wall
		// clock reads now, and the wait it implies is measured from now on
		// the monotonic clock.
		u.state = uWaiting
		u.timerGen++
		m := u.ext()
		x.dropTimer(m.due)
		m.due = &timerEntry{at: x.now().Add(u.runAt.Sub(wall)), kind: tUnitDue, u: u, gen: u.timerGen}
		x.pushTimer(m.due)
		return
	}
	u.state = uReady
	u.readyAt = x.now().UnixNano()
	rt := x.tasks[u.task]
	l := rt.base
	if m := u.more; m != nil && (len(m.keys) > 0 || m.keyErr != nil || m.batch != "") {
		l = x.laneFor(rt, m.keys, m.keyErr, m.batch)
	}
	u.lane = l
	if x.cfg.Priority != nil {
		x.joinScoring(u, l)
	}
	l.units.Push(u)
	x.laneChanged(l)
}

// laneChanged re-files l after its units changed.
func (t *resourceTable) laneChanged(l *lane) {
	switch {
	case l.units.Len() == 0:
		l.dropScoring()
		if l.inReady {
			t.ready.Remove(l.idx)
			l.inReady = false
		} else if l.parkedOn != nil {
			l.parkedOn.waiters.Remove(l.idx)
			l.parkedOn = nil
		}
		t.maybeDropLane(l)
	case l.inReady:
		t.ready.Fix(l.idx)
	case l.parkedOn != nil:
		l.parkedOn.waiters.Fix(l.idx)
	default:
		l.inReady = true
		t.tagLane(l)
		t.ready.Push(l)
		t.noteFresh(l)
	}
}

func (x *unitIndex) removeQueued(u *unit) {
	switch u.state {
	case uReady:
		l := u.lane
		l.units.Remove(int(u.laneIdx))
		x.laneChanged(l)
	case uWaiting:
		u.timerGen++ // its timer entry is now stale
	case uBlocked, uChecking:
		// Its entries in x.dependents and the timer heap are now stale.
	case uOrphan:
		delete(x.orphans[u.task], u.id)
		return
	}
	x.forget(u)
}

func (x *unitIndex) forget(u *unit) {
	x.leaveSequence(u, false)
	if u.hasParams {
		x.paramBytes -= paramCost(u.params)
		u.params, u.hasParams = nil, false
	} else if x.units[u.id] == u {
		delete(x.units, u.id)
		x.dropParamless()
	}
	delete(x.units, u.id)
	if m := u.more; m != nil {
		x.dropTimer(m.due)
		x.dropTimer(m.depTimer)
		x.dropTimer(m.recheck)
		m.due, m.depTimer, m.recheck = nil, nil, nil
	}
}

// external applies changes committed by other processes.
func (d *Engine) external(evs []store.Event) {
	var load []string
	for _, ev := range evs {
		switch ev.Type {
		case store.TypeWorkQueued:
			if !d.holdsOrEnds(ev.WorkID) {
				load = append(load, ev.WorkID)
			}
		case store.TypeWorkCancelled, store.TypeWorkFailed, store.TypeWorkSkipped:
			d.applyEnded([]store.Event{ev})
		case store.TypeWorkCancelRequested:
			if r := d.runs[ev.WorkID]; r != nil {
				var data struct {
					Cascade bool   `json:"cascade"`
					Reason  string `json:"reason"`
				}
				_ = json.Unmarshal(ev.Data, &data)
				d.cancelRun(r, rt.CancelOptions{Cascade: data.Cascade, Reason: data.Reason})
			}
		case store.TypeTaskChanged, store.TypeQueueChanged:
			d.reloadPauses(nil)
		case store.TypeServiceChanged:
			var data struct {
				Service string `json:"service"`
			}
			if json.Unmarshal(ev.Data, &data) == nil {
				d.reloadService(data.Service, nil)
			}
		}
	}
	if len(load) == 0 {
		return
	}
	d.read(func(ctx context.Context) func(*Engine) {
		units, err := d.st.ListUnits(ctx, store.ListFilter{IDs: load, States: []store.State{store.Queued}, Limit: len(load)})
		return func(d *Engine) {
			if err != nil {
				d.log.Error("runcue: load units submitted by another process", "units", len(load), "error", err)
				return
			}
			// A unit cancelled since it was read is skipped: its
			// cancellation event came before this answer. So is one
			// this engine ran meanwhile: the answer may come before the
			// commit of its outcome (a handler may end before its claim
			// commits, and the claim and outcome commit together), when
			// it is held as finishing and the store read it queued.
			units = slices.DeleteFunc(units, func(su *store.Unit) bool {
				_, gone := d.ended[su.ID]
				return gone || d.holdsOrEnds(su.ID)
			})
			d.addUnits(units)
		}
	})
}

// holdsOrEnds reports whether the engine holds unit id (queued or
// running) or is committing its terminal outcome.
func (d *Engine) holdsOrEnds(id string) bool {
	if _, ok := d.units[id]; ok {
		return true
	}
	_, ok := d.finishing[id]
	return ok
}

// applyEnded drops from memory the queued units that events report ended
// (cancelled, or failed by the store because a dependency died). Events
// about running units, or failures that will retry, are skipped.
func (d *Engine) applyEnded(evs []store.Event) {
	for _, ev := range evs {
		if ev.Type == store.TypeWorkSkipped {
			d.replaced(ev)
			continue
		}
		if ev.Type != store.TypeWorkCancelled && ev.Type != store.TypeWorkFailed {
			continue
		}
		if ev.Type == store.TypeWorkFailed && store.DecodeEventData(ev.Data).WillRetry {
			continue
		}
		st := store.Cancelled
		if ev.Type == store.TypeWorkFailed {
			st = store.Failed
		}
		d.noteEnded(ev.WorkID, st)
		if _, finishing := d.finishing[ev.WorkID]; !finishing {
			// Ended by another process or with another unit: the store
			// failed its dependents in the same transaction, and their own
			// events remove them.
			delete(d.dependents, ev.WorkID)
		}
		if u, ok := d.units[ev.WorkID]; ok && u.state != uRunning {
			d.removeQueued(u)
		} else if o := d.orphans[ev.Task]; o != nil {
			delete(o, ev.WorkID)
		}
	}
}

// leaseEnded lets a unit that waited for run r's lease (the lease rule) run
// at its backoff, now that r's Runner reported its end.
func (d *Engine) leaseEnded(r *run) {
	u := r.u
	m := u.more
	if m == nil || m.leaseRun != r {
		return
	}
	m.leaseRun = nil
	if d.units[u.id] != u || u.state != uWaiting {
		return
	}
	d.requeueLocal(u, m.backoffAt) // stored, its RunAt stays the lease's end: a restart waits for it
}

// requeueLocal requeues u in memory, eligible at at.
func (d *Engine) requeueLocal(u *unit, at time.Time) {
	u.runAt = at
	if d.stopping {
		d.forget(u) // it stays queued in the store for the next run
		return
	}
	d.makeEligible(u)
}

// replaced applies the skip of a queued unit that an insert ended (a
// later submission of its debounce key replaced it, see store.Debounce):
// it leaves the queue, and its dependents go on as after any skip.
func (d *Engine) replaced(ev store.Event) {
	if _, finishing := d.finishing[ev.WorkID]; finishing {
		return // a run of this engine's own ended skipped: its Finish applies it
	}
	u, ok := d.units[ev.WorkID]
	switch {
	case ok && u.state == uRunning:
		return // it started: the store skips only units that never did
	case ok:
		d.removeQueued(u)
	default:
		if o := d.orphans[ev.Task]; o != nil {
			delete(o, ev.WorkID)
		}
	}
	d.settled(ev.WorkID, store.Skipped, true)
}
