package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
	"go.opentelemetry.io/otel/trace"
)

// A run's life, in one place: from its dispatch (start: the claim is
// written) through its Runner (launch; the start is reported by Begin or
// Started; progress and heartbeats) to its end (Done, its deadline or its
// cancellation grace; conclude decides and writes the Finish) and the
// commit of that Finish (runWritten). Claim and Finish take one write path
// (write, runWritten). The dispatcher goroutine owns a run's fields but
// those its comments give to its Runner's goroutines.

// runTable holds the runs whose outcome is not decided (runs, by unit ID)
// and those that ended but hold their slots until their handlers return
// (held), with the counts the loop's exit and the caps read.
type runTable struct {
	runs map[string]*run
	held map[*run]struct{}
	// inflight counts the runs whose slots are taken (in runs or held),
	// live the runs launched whose Runner has not reported their end
	// (liveLocal those of in-process Runners: Stop waits for them; a
	// remote run decided over is not waited for),
	// claims the write-ahead claims not yet committed, uncommitted the
	// runs whose Finish is queued for the writer and not yet reported
	// committed (Config.MaxUncommitted).
	inflight    int
	live        int
	liveLocal   int
	claims      int
	uncommitted int
	// startMu guards noStarts, set at exit: once it is set Begin refuses
	// every start, so that none starts after ownership is released (an
	// abandoned handler goroutine that had not yet started, say). Runner
	// goroutines read it; the dispatcher goroutine sets it.
	startMu  sync.RWMutex
	noStarts bool
}

// closeStarts makes every later Begin refuse.
func (t *runTable) closeStarts() {
	t.startMu.Lock()
	t.noStarts = true
	t.startMu.Unlock()
}

// runState is where a run is in its life. A run starts claiming, or
// launched when its claim need not commit first; it ends (its outcome
// decided by its end, its deadline or its cancellation grace) from either,
// and an ended run whose task holds its slots until its handler returns
// holds them until then:
//
//	runClaiming ──claim committed──▶ runLaunched ──end──▶ runEnded
//	     │                                │                  ▲
//	     └──────────end─────────▶ runEnded└──end──▶ runHolding ─┘ handler returned
type runState uint8

const (
	// runClaiming: dispatched; it launches only once its claim (and its
	// service log entry) is committed.
	runClaiming runState = iota
	// runLaunched: handed to its Runner, which reports whether the handler
	// started (Begin or Started, or Done with NotStarted) and how it ended.
	runLaunched
	// runHolding: ended before its handler returned; it holds its slots
	// until the handler returns (Task.HoldSlotsUntilReturn).
	runHolding
	// runEnded: its outcome is decided and its slots are released.
	runEnded
)

// over reports whether r's outcome is decided.
func (r *run) over() bool { return r.state >= runHolding }

type run struct {
	d *Engine
	// pub is what its Runner sees.
	pub  Run
	u    *unit
	lane *lane
	no   int
	// start and deadline are the dispatch and the timeout, on the wall
	// clock.
	start, deadline time.Time
	// pbatch, when set, is the read that brings the unit's params (they
	// were not in memory); the Runner waits for it (Run.Params).
	pbatch *paramBatch
	params []byte
	// probes are the resources whose half-open circuit this run probes.
	probes []*resource
	// cause is why the engine stopped the run (ErrShutdown, ErrTimeout,
	// ErrCancelled), nil if it did not.
	cause error
	// state is where the run is in its life (see runState).
	state runState
	// claimFailed: the store refused the run's claim, or could not take it.
	// ahead: its claim is written ahead of its start (it logs a start in
	// the service log), so it launches once the claim commits.
	// logAhead: its start is logged ahead instead (see startLogAhead).
	claimFailed bool
	ahead       bool
	logAhead    bool
	// entered: its start was reported (Begin or Started); set on the
	// Runner's goroutine, read when it reports the end.
	entered atomic.Bool
	// local: its Runner runs handlers in this process (InProcess): Settle
	// waits for it to reach its handler. Set before it is launched.
	local bool
	// endReported: its Runner reported its end (any goroutine), end; the
	// Runner's goroutine writes end before it pushes msgDone, the
	// dispatcher reads it after.
	endReported atomic.Bool
	end         Ending
	// decided is when the dispatch was decided, on the timeline; startBy
	// the latest start it allows (decided + MaxStartDelay). A run of a
	// lane whose meters count starts (rate windows, budgets) holds its
	// charge in them from its decision until its start is counted
	// (msgStarted, or at startBy if its Runner is silent) or it is known
	// never to start: counted is set until then.
	decided, startBy time.Time
	counted          bool
	// countedAt is the instant its charges count at, on the timeline, once
	// counted (zero if they were given back). used are the amounts its
	// Runner reported before its start was counted (a Runner that reports
	// its start late or never), applied when it is; reconciles are the
	// ops that replace its logged charges, written with its Finish.
	countedAt  time.Time
	used       map[string]int64
	reconciles []store.Op
	// told lists, by adaptive resource, what the run's reports said of its
	// limits: the ones they named, and of those the ones with less left
	// than the unit costs (see observe, adaptRun).
	told []toldLimits
	// cancelled holds the options of a Cancel that reached the run.
	cancelled *rt.CancelOptions
	// lastBeat is the time of the last heartbeat written (Unix ns).
	lastBeat atomic.Int64
	// span is the run's trace span.
	span trace.Span
	// progress is the latest value the handler reported, throttled.
	progress progress
	// deadlineTimer, graceTimer, progressTimer and startByTimer are r's
	// entries on the timer heap, removed when r ends so that no timer
	// keeps a finished run (its unit, contexts and span) reachable until it
	// would have fired.
	deadlineTimer, graceTimer, progressTimer, startByTimer *timerEntry
	// charge, when set, is what r holds of its lane's resources: a
	// batch's costs (r leads the batch; see costs). batch are the runs of
	// the units that follow it in its batch; leader, of such a unit, is
	// the batch's leader (batches.go).
	charge rt.Costs
	batch  []*run
	leader *run
	// mem holds what start makes for every run, allocated with it: its
	// timer entries, its claim and its Finish and the requests that write
	// them.
	mem struct {
		deadline, startBy timerEntry
		claim             store.Claim
		started           [1]store.Event
		claimReq          writer.Request
		claimOps          [1]store.Op
		logStart          store.LogStart
		logReq            writer.Request
		logOps            [1]store.Op
		fin               store.Finish
		finReq            writer.Request
		finOps            [1]store.Op
	}
}

// start runs u on l, whose resources acquire took at now; spent are the
// budget_exhausted events of that dispatch, stored with its claim.
func (d *Engine) start(u *unit, l *lane, now time.Time, probes []*resource, spent []store.Event) {
	r := d.newRun(u, l, now, probes, spent, nil, nil)
	// A dispatch counted in a rate window is logged before the handler
	// starts, so that a crash cannot forget a request the service saw;
	// so is one of a task whose queued units the store may end on its own
	// (ClaimAhead: a debounced unit replaced meanwhile runs nothing).
	// Other claims are written behind the handler's start: a crash before
	// the commit leaves the unit queued, and it runs again.
	ahead := len(r.mem.claim.Log) > 0 || l.task.spec.ClaimAhead
	r.ahead = ahead
	if ahead {
		d.claims++
	}
	if ahead && d.sw != nil && !l.task.spec.ClaimAhead {
		d.startLogAhead(r)
		return
	}
	if err := d.write(r, &r.mem.claim); err != nil {
		// The writer is closed or failed: the run cannot be recorded.
		d.failed = err
		r.claimFailed = true
		if ahead {
			d.claims--
			d.claimed(r, false)
			return
		}
	}
	if !ahead {
		d.launch(r)
	}
}

// newRun makes u's run on l, dispatched at now, with its timers and its
// claim. A batch's leader (leader nil, charge set) holds what the batch
// was admitted with (charge); a unit that follows it in the batch
// (leader set) holds nothing, counts nothing and logs no start.
func (d *Engine) newRun(u *unit, l *lane, now time.Time, probes []*resource, spent []store.Event, charge rt.Costs, leader *run) *run {
	for i := range spent {
		spent[i].Task, spent[i].Target = u.task, u.target
	}
	t := l.task
	var timeout time.Duration
	if u.more != nil {
		timeout = u.more.timeout
	}
	if timeout <= 0 {
		timeout = t.spec.Timeout
	}
	if timeout <= 0 {
		timeout = d.cfg.DefaultTimeout
	}
	u.runs++
	u.state = uRunning
	wall := d.wall()
	r := &run{d: d, u: u, lane: l, no: int(u.runs), start: wall, deadline: wall.Add(timeout), params: u.params, probes: probes,
		charge: charge, leader: leader}
	if !u.hasParams {
		r.pbatch = d.paramsOf(u)
	}
	ctx, span := d.tel.startSpan(context.Background(), u.traceCtx(), u.task, u.id, r.no)
	r.span = span
	r.pub = Run{ID: u.id, Task: u.task, Target: u.target, Attempt: r.no, Deadline: r.deadline, Ctx: ctx, Owner: d.owner, Epoch: d.epoch, r: r}
	tel := d.tel
	tel.queueWait.Record(bg, seconds(now.Sub(time.Unix(0, u.readyAt))), t.attrs.rec...)
	for _, res := range l.resources {
		if res.class != "" && leader == nil {
			tel.requests.Add(bg, 1, res.attrs())
		}
	}
	if d.log.Enabled(bg, slog.LevelDebug) {
		d.log.Debug("work_started", "work_unit_id", u.id, "task_type", u.task, "attempt", r.no)
	}
	r.decided, r.startBy = now, now.Add(d.cfg.MaxStartDelay)
	for _, res := range l.resources {
		r.counted = r.counted || (res.Counted() && leader == nil) // charged by acquire, counted at the start
	}
	if r.counted {
		// A start not reported by then counts at startBy.
		r.pub.StartBy = r.startBy
		r.mem.startBy = timerEntry{at: r.startBy, kind: tStartBy, r: r}
		r.startByTimer = &r.mem.startBy
		d.pushTimer(r.startByTimer)
	}
	d.runs[u.id] = r
	if leader == nil {
		d.inflight++
	}
	d.stats.Dispatches.Add(1)
	r.mem.deadline = timerEntry{at: now.Add(timeout), kind: tDeadline, r: r}
	r.deadlineTimer = &r.mem.deadline
	d.pushTimer(r.deadlineTimer)
	r.mem.started[0] = store.Event{Type: store.TypeWorkStarted, Task: u.task, Target: u.target, Attempt: r.no}
	events := r.mem.started[:]
	if len(spent) > 0 {
		events = append(events[:1:1], spent...)
	}
	var logged []store.LogEntry
	if leader == nil {
		logged = d.loggedOf(l, r.costs())
	}
	r.mem.claim = store.Claim{Epoch: d.epoch, ID: u.id, Task: u.task, Owner: d.owner, Run: r.no, At: wall,
		LeaseExpires: r.deadline.Add(d.cfg.LeaseBuffer), Log: logged, Events: events, Wait: now.Sub(time.Unix(0, u.readyAt))}
	return r
}

// costs returns what r holds of its lane's resources: its unit's costs,
// or a batch's (charge) for the batch's leader.
func (r *run) costs() rt.Costs {
	if r.charge != nil {
		return r.charge
	}
	return r.u.costs()
}

// write hands r's claim or Finish to the writer; runWritten hears of its
// commit. The one write path of a run.
func (d *Engine) write(r *run, op store.Op) error {
	var req *writer.Request
	switch op := op.(type) {
	case *store.Claim:
		r.mem.claimOps[0] = op
		r.mem.claimReq = writer.Request{Ops: r.mem.claimOps[:], Sink: (*claimSink)(r)}
		req = &r.mem.claimReq
	case *store.Finish:
		r.mem.finOps[0] = op
		r.mem.finReq = writer.Request{Ops: r.mem.finOps[:], Sink: (*finishSink)(r)}
		if len(r.reconciles) > 0 {
			// In the Finish's transaction: a crash keeps both or neither.
			r.mem.finReq.Ops = append(r.mem.finOps[:1:1], r.reconciles...)
			r.reconciles = nil
		}
		if ew, ok := r.lane.task.spec.Runner.(EndWriter); ok {
			r.mem.finReq.Ops = append(r.mem.finReq.Ops[:len(r.mem.finReq.Ops):len(r.mem.finReq.Ops)], ew.EndOps(&r.pub)...)
		}
		req = &r.mem.finReq
		d.uncommitted++
		if op.State.Terminal() {
			d.finishing[op.ID] = struct{}{} // its dependents wait for the commit
		}
	}
	return d.w.Submit(req)
}

// runWritten continues a run whose claim or Finish the writer committed
// (applied) or not.
func (d *Engine) runWritten(m msgRunWritten) {
	r := m.run
	switch {
	case m.logged || (m.claim && r.logAhead):
		d.logWritten(m)
	case m.claim && r.ahead && m.each != nil:
		d.claims--
		d.batchClaimed(r, m.each)
	case m.claim && r.ahead:
		d.claims--
		d.claimed(r, m.applied)
	case m.claim:
		// Written behind the start: only a refusal matters.
		if !m.applied {
			r.claimFailed = true
			if !r.over() {
				d.stopRun(r, ErrCancelled)
			}
		}
	default:
		d.uncommitted--
		delete(d.finPending, r)
		if !m.applied {
			d.noteUnwritten(r)
		}
		if fin := &r.mem.fin; fin.State.Terminal() {
			d.settled(fin.ID, fin.State, m.applied)
		}
		d.applyEnded(m.derived)
	}
}

// claimed continues a run whose write-ahead claim has committed.
func (d *Engine) claimed(r *run, applied bool) {
	switch {
	case !applied:
		r.claimFailed = true
		if !r.over() {
			d.end(r, true, verdictNone)
			d.forget(r.u)
			endSpan(r.span, "abandoned", nil)
		}
	case r.over():
		// Its deadline passed first; nothing to run.
	case r.cause != nil:
		// Shutdown or cancellation came first: do not start the handler.
		d.finished(r, Ending{Err: r.cause, NotStarted: true, At: d.wall()})
	case !r.pub.StartBy.IsZero() && d.now().After(r.startBy):
		// Committed too late for its handler to start within
		// MaxStartDelay of the decision: it is requeued, nothing ran.
		d.finished(r, Ending{Err: ErrLateStart, Class: ClassLateStart, NotStarted: true, At: d.wall()})
	default:
		d.launch(r)
	}
}

// launch hands r to its task's Runner.
func (d *Engine) launch(r *run) {
	r.state = runLaunched
	d.live++
	if d.localRun(r) {
		r.local = true
		d.liveLocal++
		d.launching.Add(1)
	}
	d.activity.Add(1)
	if r.batch != nil {
		d.launchBatch(r)
	}
	if err := r.lane.keyErr; err != nil {
		// Its keyed services could not be derived: it fails permanently,
		// its handler never called.
		for _, p := range r.pub.Batch {
			d.reportEnd(p, Ending{Err: err, Permanent: true, NotStarted: true, At: d.wall()})
		}
		d.reportEnd(&r.pub, Ending{Err: err, Permanent: true, NotStarted: true, At: d.wall()})
		return
	}
	r.lane.task.spec.Runner.Launch(&r.pub)
}

// stopRun asks r's Runner to stop its handler, for cause (the first cause
// given is kept). A run not launched yet is not launched (claimed).
func (d *Engine) stopRun(r *run, cause error) {
	if r.cause == nil {
		r.cause = cause
	}
	if r.state == runLaunched {
		r.lane.task.spec.Runner.Cancel(&r.pub, cause)
	}
}

// settleReservations counts r's charges in the meters that count starts
// (windows, budgets, any meter of an amount) at its handler's start (start
// on the timeline, wall on the wall clock), or gives them back (start
// zero) if the handler never started. A start outside [decision, startBy]
// counts at startBy.
func (d *Engine) settleReservations(r *run, start, wall time.Time) {
	if !r.counted {
		return
	}
	r.counted = false
	d.dropTimer(r.startByTimer)
	r.startByTimer = nil
	if !start.IsZero() && (start.Before(r.decided) || start.After(r.startBy)) {
		start, wall = r.startBy, d.toWall(r.startBy)
	}
	costs := r.costs()
	for _, res := range r.lane.resources {
		if !res.Counted() {
			continue
		}
		if start.IsZero() {
			res.Release(costs)
		} else {
			res.Start(start, wall, costs)
		}
		d.markStatus(res)
		d.wake(res) // a place freed, or its time is known now
	}
	r.countedAt = start
	if used := r.used; used != nil && !start.IsZero() {
		r.used = nil
		if ops := d.reconcile(r, used); len(ops) > 0 {
			d.submit(ops...)
		}
	}
}

// end decides that r is over and its unit leaves the running set. The
// verdict goes to the circuits of the run's services. Its resources are
// released now, unless its handler has not returned and its task holds
// slots until then.
func (d *Engine) end(r *run, returned bool, v verdict) {
	if r.state == runClaiming {
		d.settleReservations(r, time.Time{}, time.Time{}) // it never starts
	}
	r.state = runEnded
	delete(d.runs, r.u.id)
	d.dropTimer(r.deadlineTimer)
	d.dropTimer(r.graceTimer)
	r.deadlineTimer, r.graceTimer = nil, nil
	if r.leader != nil {
		return // its batch's leader holds the resources, and is judged
	}
	d.judge(r, v)
	if !returned && r.lane.task.spec.HoldSlotsUntilReturn {
		r.state = runHolding
		d.held[r] = struct{}{}
		return
	}
	d.inflight--
	d.release(r.lane, r.costs())
}

// finished handles a run's end as its Runner reported it (or a run that
// never launched because shutdown or cancellation came first).
func (d *Engine) finished(r *run, e Ending) {
	if e.NotStarted {
		d.settleReservations(r, time.Time{}, time.Time{})
	} else {
		d.noteUsed(r, e.Used)
		d.shareUsed(r, e.Used)
	}
	if r.over() {
		// Decided at its deadline or grace: a late result is discarded,
		// and a unit that waited for this run's lease need wait no more.
		d.leaseEnded(r)
		if r.state == runHolding {
			r.state = runEnded
			delete(d.held, r)
			d.inflight--
			d.release(r.lane, r.costs())
		}
		return
	}
	d.conclude(r, ending{returned: true, err: e.Err, class: e.Class, permanent: e.Permanent, skipReason: e.SkipReason, delay: e.Delay, services: e.Services,
		result: e.Result, cancelled: r.cancelled, shutdown: errors.Is(r.cause, ErrShutdown), at: e.At, overload: e.Overload, used: e.Used})
}

// conclude ends r as e says: the run leaves the running set (its
// resources are released, unless it holds them until its handler
// returns), the decision is applied to its unit, and its Finish is
// written. It is the only place a run's Finish is made.
func (d *Engine) conclude(r *run, e ending) {
	u := r.u
	if r.claimFailed {
		// The store refused the claim (the unit was cancelled elsewhere,
		// or the store failed): there is nothing to record.
		d.end(r, e.returned, verdictNone)
		d.forget(u)
		endSpan(r.span, "abandoned", nil)
		return
	}
	o := decide(d.facts(r), e, d.rnd.Float64())
	if r.lane.adaptive() && r.leader == nil {
		if sig, success := overloadOf(e, o); sig != OverloadNone || success {
			held, _ := heldServices(r.lane.serviceNames(), e.services)
			o.fin.Events = append(o.fin.Events, d.adaptRun(r, sig, success, held)...)
		}
	}
	d.end(r, e.returned, o.verdict)
	u.failures, u.deferrals, u.probeFails = int32(o.failures), int32(o.deferrals), uint8(o.probeFails)
	if o.hold > 0 && r.leader == nil {
		d.blockServices(r.lane, o.holdServices, o.holdUnknown, o.hold)
	}
	if o.requeue {
		u.why = whyNamed(o.why)
		if o.toBack {
			u.seq = d.backSeq()
		}
		if o.leaseHeld {
			m := u.ext()
			m.leaseRun, m.backoffAt = r, o.backoffAt
		}
		d.requeueLocal(u, o.runAt)
	} else {
		if t := d.tasks[u.task]; t != nil && t.spec.HoldOnFailure && o.fin.State == store.Failed {
			d.leaveSequence(u, true) // its key waits until it is retried
		}
		d.forget(u)
	}
	if o.fin.Attempt.Outcome == "late_start" && r.leader == nil {
		d.log.Warn("runcue: a rate-limited run would have started too long after its dispatch was decided; requeued",
			"work_unit_id", u.id, "task_type", u.task, "max_start_delay", d.cfg.MaxStartDelay)
	}
	recorded := e.err
	if !e.returned && e.cancelled != nil {
		recorded = ErrCancelled
	}
	r.mem.fin = o.fin
	fin := &r.mem.fin
	fin.Epoch = d.epoch
	d.record(r, fin, recorded, e.at)
	if d.localRun(r) {
		d.finPending[r] = struct{}{}
	}
	if err := d.write(r, fin); err != nil && d.failed == nil {
		d.failed = err
	}
	if h := d.hooks.Concluded; h != nil {
		h(&r.pub)
	}
}
