package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/heaps"
	"github.com/runcue/runcue/internal/inbox"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// The dispatcher is the one goroutine that makes scheduling decisions. It
// wakes on a message (a commit, a handler's return, a control request) or
// on its timer, and never polls.
//
// Queued units live in lanes: one per task type and set of keyed services
// (see broker.go), each a heap by submission order, so choosing the next
// unit costs no query. A lane is ready when it has units; the ready lanes
// form a heap by their oldest unit. Dispatch pops the oldest ready lane and
// acquires every resource it needs (the task's cap, each service, each keyed
// service) at once, or none: a lane that cannot have one of them parks on
// it and is woken when that resource has room again.

// unit states inside the dispatcher.
const (
	uWaiting  = iota // until runAt (timer heap)
	uReady           // in its lane
	uRunning         //
	uOrphan          // task type not registered here
	uBlocked         // waiting for dependencies to complete
	uChecking        // dependencies complete, DependencySatisfied not yet true
)

type unit struct {
	id        string
	seq       int64
	task      string
	target    string
	params    []byte
	hasParams bool
	runs      int
	failures  int
	deferrals int
	runAt     time.Time
	timeout   time.Duration
	retry     *RetryPolicy // the submission's own policy, if any
	keys      []string     // keyed services, sorted
	keyErr    error        // deriving keys failed: the run fails with it
	createdAt time.Time
	deps      []string  // dependencies
	pending   int       // dependencies not yet completed
	depsBy    time.Time // DependencyDeadline
	checking  bool      // a DependencySatisfied check is in flight
	why       string    // why runAt is set: "backoff", "retry_after", "run_at"
	trace     []byte    // the submitter's trace context
	readyAt   time.Time // when it last became eligible
	state     int
	lane      *lane
	laneIdx   int // position in lane heap
	timerGen  uint64
	// due, depTimer and recheck are u's entries on the timer heap (its
	// runAt, its DependencyDeadline, its next DependencySatisfied check),
	// removed when u is forgotten so that no timer keeps it reachable.
	due, depTimer, recheck *timerEntry
}

type run struct {
	u        *unit
	lane     *lane
	no       int
	start    time.Time
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopDL   context.CancelFunc
	handler  Handler
	// target, params and load are the unit's, copied at the start: the
	// handler goroutine must not read the unit, which the dispatcher keeps
	// changing. load: the params were not in memory; read them.
	target string
	params []byte
	load   bool
	// id and task are the unit's, for the handler goroutine.
	id, task string
	// probes are the resources whose half-open circuit this run probes.
	probes []*resource
	// cause is why runcue cancelled the run (ErrShutdown, ErrTimeout,
	// ErrCancelled), nil if it did not.
	cause error
	// ended: the run's outcome is decided (by its return, its deadline or
	// its cancellation grace); its resources are released, unless holding.
	ended bool
	// holding: ended before its handler returned, by a task that holds its
	// slots until then.
	holding     bool
	claimFailed bool
	// waitClaim: the handler starts only once the claim (and its service
	// log entry) is committed.
	waitClaim bool
	// decided is when the dispatch was decided, on the monotonic timeline
	// (d.now). A run of a rate-limited lane holds a reservation in each of
	// its windows (reserved) from then until its handler's start is
	// committed to them (mStarted) or it is known never to start.
	decided  time.Time
	reserved []*broker.Window
	// launched: the handler goroutine was started; it reports whether the
	// handler started (mStarted, or mDone with notStarted).
	launched bool
	// cancelled holds the options of a Cancel that reached the run.
	cancelled *CancelOptions
	// lastBeat is the time of the last heartbeat written (Unix ns).
	lastBeat atomic.Int64
	// span is the run's trace span.
	span trace.Span
	// progress is the latest value the handler reported, throttled.
	progress progress
	// deadlineTimer, graceTimer and progressTimer are r's entries on the
	// timer heap, removed when r ends so that no timer keeps a finished run
	// (its unit, contexts and span) reachable until it would have fired.
	deadlineTimer, graceTimer, progressTimer *timerEntry
}

type progress struct {
	mu       sync.Mutex
	latest   []byte
	lastEmit time.Time
	pending  bool // an emission is scheduled
}

type taskRT struct {
	name     string
	def      *Task
	cap      *resource
	services []*resource
	base     *lane // the lane of units without keyed services
	retry    RetryPolicy
	// attrs and byOutcome are the task's metric attributes, built once.
	attrs     metric.MeasurementOption
	byOutcome map[string]metric.MeasurementOption
}

func (rt *taskRT) outcomeAttrs(outcome string) metric.MeasurementOption {
	o, ok := rt.byOutcome[outcome]
	if !ok {
		o = taskOutcome(rt.name, outcome)
		rt.byOutcome[outcome] = o
	}
	return o
}

type timerKind uint8

const (
	tUnitDue     timerKind = iota
	tDeadline              // a run's timeout
	tGrace                 // a cancelled run's grace period ends
	tPrune                 // time for a retention pass
	tResource              // a resource may have room again
	tStatus                // a coalesced service_status is due
	tEvict                 // a keyed service may be idle
	tDepDeadline           // a unit's DependencyTimeout
	tRecheck               // ask DependencySatisfied again
	tFeed                  // call Feed again
	tProgress              // a run's throttled progress is due
	tQueueStatus           // time for a queue_status event
)

type timerEntry struct {
	at   time.Time
	n    uint64 // tie-break: insertion order
	kind timerKind
	u    *unit
	gen  uint64
	r    *run
	res  *resource
	idx  int
}

type dispatcher struct {
	c     *Cue
	owner string
	own   store.Ownership
	clock clock.Clock
	in    *inbox.Inbox[message]
	done  chan struct{}
	// stopReq is set once Stop or StopAndCancel has been called.
	stopReq atomic.Bool

	tasks    map[string]*taskRT
	regs     map[string]Service   // registered limits, copied under c.mu
	services map[string]*resource // registered services
	keyed    map[string]*resource // keyed service instances, created on demand
	lanes    map[string]*lane
	stored   map[string]store.ServiceRecord // persisted service state, by name
	// started is when this owner started, on the wall clock and on the
	// monotonic timeline; monoBase turns monotonic readings into that
	// timeline (see now). classLogs caches, per class of keyed services,
	// the log entries of the previous owner (see priorLog).
	started   time.Time
	startMono time.Time
	monoBase  time.Time
	classLogs map[string]map[string][]time.Time
	units     map[string]*unit // queued, waiting and running units of registered tasks
	orphans   map[string]map[string]*unit
	runs      map[string]*run
	// held are the runs that ended before their handlers returned and
	// hold their slots until then (Task.HoldSlotsUntilReturn).
	held     map[*run]struct{}
	ready    *heaps.Heap[*lane]
	timers   *heaps.Heap[*timerEntry]
	timerN   uint64
	timer    clock.Timer
	armedAt  time.Time
	inflight int // runs whose outcome is not decided
	live     int // handler goroutines not yet returned
	claims   int // write-ahead claims not yet committed
	handlers sync.WaitGroup
	dirty    map[*resource]struct{} // resources whose status may have changed

	// dependents maps a unit to the units waiting for it to complete;
	// finishing holds units whose terminal outcome is decided but not yet
	// committed: their dependents wait for the commit.
	dependents map[string][]*unit
	finishing  map[string]struct{}
	checks     *inbox.Inbox[checkJob]
	aux        sync.WaitGroup // the checker and feeder goroutines
	auxStop    chan struct{}
	auxCtx     context.Context // cancelled at exit, for Feed calls
	auxCancel  context.CancelFunc

	scores   map[string]scoreEntry // priority scores, by unit
	scoring  bool                  // a scoring pass is still running
	overruns int                   // consecutive scoring passes that overran

	// queued mirrors queuedCount for the metrics goroutine.
	queued atomic.Int64

	feeding   bool
	feedWait  bool // Feed returned nothing or failed: wait FeedInterval
	exhausted bool
	bpActive  bool

	paramBytes int
	pruning    bool
	stopping   bool
	abandon    bool
	failed     error
	drains     []chan drainReply
	syncs      []chan struct{}
	rnd        *rand.Rand

	// startMu guards noStarts, set at exit: once it is set no handler may
	// start, so that none starts after ownership is released (an abandoned
	// handler goroutine that had not yet started, say). Handler goroutines
	// read it; the dispatcher goroutine sets it.
	startMu  sync.RWMutex
	noStarts bool

	// checkInvariants, set by tests, verifies the broker's bookkeeping after
	// every loop iteration.
	checkInvariants func(d *dispatcher)
}

// maxParamBytes bounds the parameters kept in memory for queued units;
// beyond it, a unit's parameters are read from the store when it runs.
const maxParamBytes = 64 << 20

// now returns the current instant on the dispatcher's scheduling timeline:
// the clock's monotonic reading, as a time.Time that read as the wall clock
// when the dispatcher started. Every duration the dispatcher measures
// (timers, rate windows, circuit cooldowns, holds) is on this timeline, so
// a step of the wall clock changes none of them. It is safe to call from
// any goroutine.
func (d *dispatcher) now() time.Time { return d.monoBase.Add(d.clock.Monotonic()) }

// wall returns the wall-clock time: what is stored and reported.
func (d *dispatcher) wall() time.Time { return d.clock.Now() }

// toWall converts an instant of the scheduling timeline to the wall clock
// as it reads now; fromWall converts back. The zero time stays zero.
func (d *dispatcher) toWall(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return d.wall().Add(t.Sub(d.now()))
}

func (d *dispatcher) fromWall(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return d.now().Add(t.Sub(d.wall()))
}

// newDispatcher is called with c.mu held.
func newDispatcher(c *Cue, owner string, own store.Ownership, stored []store.ServiceRecord) *dispatcher {
	d := &dispatcher{
		c: c, owner: owner, own: own, clock: c.clock, in: inbox.New[message](), done: make(chan struct{}),
		tasks: make(map[string]*taskRT), regs: make(map[string]Service), services: make(map[string]*resource), keyed: make(map[string]*resource),
		lanes: make(map[string]*lane), stored: make(map[string]store.ServiceRecord),
		units: make(map[string]*unit), orphans: make(map[string]map[string]*unit), runs: make(map[string]*run), held: make(map[*run]struct{}),
		dirty: make(map[*resource]struct{}), started: c.clock.Now(), classLogs: make(map[string]map[string][]time.Time),
		dependents: make(map[string][]*unit), finishing: make(map[string]struct{}), auxStop: make(chan struct{}),
		scores: make(map[string]scoreEntry),
		rnd:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x9e3779b97f4a7c15)),
	}
	for _, rec := range stored {
		d.stored[rec.Name] = rec
	}
	// The scheduling timeline reads as the wall clock at the start, then
	// moves with the monotonic clock only.
	d.monoBase = d.started.Round(0).Add(-c.clock.Monotonic())
	d.startMono = d.now()
	d.auxCtx, d.auxCancel = context.WithCancel(context.Background())
	d.ready = heaps.New(laneLess, func(l *lane, i int) { l.idx = i })
	d.timers = heaps.New(func(a, b *timerEntry) bool {
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return a.n < b.n
	}, func(e *timerEntry, i int) { e.idx = i })
	d.checkInvariants = c.testHooks.checkInvariants
	d.refreshRegistry(c.services, c.tasks)
	return d
}

// refreshRegistry brings the dispatcher's view of tasks and services up to
// date with the Cue's registrations, and adopts orphans whose task type is
// now registered. The caller holds c.mu.
func (d *dispatcher) refreshRegistry(services map[string]Service, tasks map[string]*Task) {
	now := d.now()
	for name, s := range services {
		d.regs[name] = s
	}
	for name, s := range services {
		if _, ok := d.services[name]; !ok {
			d.services[name] = d.newServiceResource(name, name, s, now)
		}
	}
	for name, t := range tasks {
		if _, ok := d.tasks[name]; ok {
			continue
		}
		rt := &taskRT{name: name, def: t, cap: newResource("task "+name, "", t.MaxConcurrent), retry: t.Retry.withDefaults(),
			attrs: taskAttr(name), byOutcome: map[string]metric.MeasurementOption{}}
		for _, s := range t.Services {
			rt.services = append(rt.services, d.services[s])
		}
		d.tasks[name] = rt
		rt.base = d.laneFor(rt, nil, nil)
		if orphans := d.orphans[name]; orphans != nil {
			delete(d.orphans, name)
			var withDeps []*unit
			for _, u := range orphans {
				d.deriveKeys(u, rt)
				d.units[u.id] = u
				if len(u.deps) > 0 {
					withDeps = append(withDeps, u)
				} else {
					d.makeEligible(u)
				}
			}
			d.resolveDeps(withDeps)
		}
	}
}

// addUnits indexes queued units not yet known, then files each where it
// belongs: waiting for its dependencies, on the timer heap, or in its lane.
// Every unit is indexed before any unit's dependencies are looked at, so a
// dependency later in the same batch is known as queued (see resolveDeps).
func (d *dispatcher) addUnits(sus []*store.Unit, keepParams bool) {
	units := make([]*unit, 0, len(sus))
	for _, su := range sus {
		if u := d.index(su, keepParams); u != nil {
			units = append(units, u)
		}
	}
	d.file(units)
}

// file sends newly indexed units on: to wait for their dependencies, or to
// eligibility.
func (d *dispatcher) file(units []*unit) {
	var withDeps []*unit
	for _, u := range units {
		if len(u.deps) > 0 {
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
func (d *dispatcher) index(su *store.Unit, keepParams bool) *unit {
	if _, ok := d.units[su.ID]; ok {
		return nil
	}
	if o := d.orphans[su.Task]; o != nil && o[su.ID] != nil {
		return nil
	}
	u := &unit{id: su.ID, seq: su.Seq, task: su.Task, target: su.Target, params: su.Params, hasParams: true,
		runs: su.Runs, failures: su.Failures, deferrals: su.Deferrals, runAt: su.RunAt, timeout: su.Timeout, laneIdx: -1,
		createdAt: su.CreatedAt, deps: su.DependsOn, depsBy: su.DependencyDeadline, trace: su.Trace}
	switch {
	case su.RunAt.IsZero():
	case su.ErrorKind == "retry_after":
		u.why = "retry_after"
	case su.Failures > 0:
		u.why = "backoff"
	default:
		u.why = "run_at"
	}
	if (u.why == "retry_after" || u.why == "backoff") && !su.StartedAt.IsZero() {
		// A retry time runcue chose is a hold that began after the last
		// run started: if the wall clock was set back since, the stored
		// instant lies further away than the hold was long. It never lasts
		// longer from now than it could have from that start. (A RunAt the
		// submitter chose keeps its wall-clock meaning.)
		if bound := d.wall().Add(su.RunAt.Sub(su.StartedAt)); u.runAt.After(bound) {
			u.runAt = bound
		}
	}
	if len(su.Retry) > 0 {
		if p, err := decodeRetry(su.Retry); err == nil {
			u.retry = &p
		} else {
			d.c.log.Warn("runcue: ignoring a unit's unreadable retry policy", "work_id", su.ID, "error", err)
		}
	}
	rt, ok := d.tasks[u.task]
	if !ok {
		u.state = uOrphan
		o := d.orphans[u.task]
		if o == nil {
			o = make(map[string]*unit)
			d.orphans[u.task] = o
			d.c.log.Warn("runcue: queued units have a task type not registered here; they stay queued", "task_type", u.task)
		}
		o[u.id] = u
		return nil
	}
	d.deriveKeys(u, rt)
	if keepParams && d.paramBytes+len(u.params) <= maxParamBytes {
		d.paramBytes += len(u.params)
	} else {
		u.params, u.hasParams = nil, false // read again when it runs
	}
	d.units[u.id] = u
	return u
}

// makeEligible puts u in its lane, or on the timer heap until its runAt.
func (d *dispatcher) makeEligible(u *unit) {
	if wall := d.wall(); u.runAt.After(wall) {
		// runAt is a wall-clock instant: it keeps its meaning as the wall
		// clock reads now, and the wait it implies is measured from now on
		// the monotonic clock.
		u.state = uWaiting
		u.timerGen++
		d.dropTimer(u.due)
		u.due = &timerEntry{at: d.now().Add(u.runAt.Sub(wall)), kind: tUnitDue, u: u, gen: u.timerGen}
		d.pushTimer(u.due)
		return
	}
	u.state = uReady
	u.readyAt = d.now()
	rt := d.tasks[u.task]
	l := rt.base
	if len(u.keys) > 0 || u.keyErr != nil {
		l = d.laneFor(rt, u.keys, u.keyErr)
	}
	u.lane = l
	l.units.Push(u)
	d.laneChanged(l)
}

// laneChanged re-files l after its units changed.
func (d *dispatcher) laneChanged(l *lane) {
	switch {
	case l.units.Len() == 0:
		if l.inReady {
			d.ready.Remove(l.idx)
			l.inReady = false
		} else if l.parkedOn != nil {
			l.parkedOn.waiters.Remove(l.idx)
			l.parkedOn = nil
		}
		d.maybeDropLane(l)
	case l.inReady:
		d.ready.Fix(l.idx)
	case l.parkedOn != nil:
		l.parkedOn.waiters.Fix(l.idx)
	default:
		l.inReady = true
		d.ready.Push(l)
	}
}

func (d *dispatcher) removeQueued(u *unit) {
	switch u.state {
	case uReady:
		l := u.lane
		l.units.Remove(u.laneIdx)
		d.laneChanged(l)
	case uWaiting:
		u.timerGen++ // its timer entry is now stale
	case uBlocked, uChecking:
		// Its entries in d.dependents and the timer heap are now stale.
	case uOrphan:
		delete(d.orphans[u.task], u.id)
		return
	}
	d.forget(u)
}

func (d *dispatcher) forget(u *unit) {
	if u.hasParams {
		d.paramBytes -= len(u.params)
		u.params, u.hasParams = nil, false
	}
	delete(d.units, u.id)
	delete(d.scores, u.id)
	d.dropTimer(u.due)
	d.dropTimer(u.depTimer)
	d.dropTimer(u.recheck)
	u.due, u.depTimer, u.recheck = nil, nil, nil
}

func (d *dispatcher) pushTimer(e *timerEntry) {
	d.timerN++
	e.n = d.timerN
	d.timers.Push(e)
}

// dropTimer removes e from the timer heap if it is still there.
func (d *dispatcher) dropTimer(e *timerEntry) {
	if e != nil && e.idx >= 0 && e.idx < d.timers.Len() && d.timers.Items()[e.idx] == e {
		d.timers.Remove(e.idx)
	}
}

func (d *dispatcher) run() {
	for {
		for _, m := range d.in.Take() {
			d.handle(m)
		}
		d.fireTimers()
		d.queued.Store(int64(d.queuedCount()))
		d.backpressure() // the queue as the messages left it, then as dispatch leaves it
		d.dispatch()
		d.backpressure()
		d.maybeFeed()
		d.flushStatus()
		if d.checkInvariants != nil {
			d.checkInvariants(d)
		}
		if d.idle() && len(d.drains) > 0 {
			orphans := make(map[string]int)
			for task, o := range d.orphans {
				if len(o) > 0 {
					orphans[task] = len(o)
				}
			}
			for _, ch := range d.drains {
				ch <- drainReply{orphans: orphans}
			}
			d.drains = d.drains[:0]
		}
		for _, ch := range d.syncs {
			close(ch)
		}
		d.syncs = d.syncs[:0]
		if d.abandon || (d.stopping && d.live == 0 && d.claims == 0) {
			d.exit()
			return
		}
		var timerC <-chan time.Time
		if d.timers.Len() > 0 {
			next := d.timers.Peek().at
			if d.timer == nil {
				d.timer = d.clock.NewTimer(next.Sub(d.now()))
			} else if !next.Equal(d.armedAt) {
				d.timer.Reset(next.Sub(d.now()))
			}
			d.armedAt = next
			timerC = d.timer.C()
		}
		select {
		case <-d.in.Wake():
		case <-timerC:
			d.armedAt = time.Time{}
		}
	}
}

// idle reports that no work of registered task types is queued, waiting or
// running, and the feed (if any) has no more.
func (d *dispatcher) idle() bool {
	return len(d.units) == 0 && len(d.finishing) == 0 && (d.c.cfg.Feed == nil || (d.exhausted && !d.feeding))
}

func (d *dispatcher) exit() {
	// No handler starts from here on: ownership is about to be released,
	// and a new owner counts only the starts it can bound.
	d.startMu.Lock()
	d.noStarts = true
	d.startMu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
	close(d.auxStop)
	d.auxCancel()
	d.aux.Wait()
	for _, ch := range d.drains {
		ch <- drainReply{stopped: true}
	}
	d.drains = nil
	_ = d.c.w.Sync(context.Background())
	_ = d.own.Release()
	d.c.disp.CompareAndSwap(d, nil)
	if d.abandon && d.live > 0 {
		d.c.log.Warn("runcue: abandoned handlers that ignored cancellation", "handlers", d.live)
	}
	d.c.log.Info("runcue: stopped", "owner", d.owner)
	close(d.done)
}

// handle applies one message. The message types are in messages.go.
func (d *dispatcher) handle(m message) {
	switch m := m.(type) {
	case msgInserted:
		d.applyEnded(m.ended)
		d.addUnits(m.units, true)
	case msgExternal:
		d.external(m.events)
	case msgDone:
		d.live--
		d.finished(m)
	case msgClaimFailed:
		r := m.run
		r.claimFailed = true
		if !r.ended {
			r.cause = ErrCancelled
			r.cancel(ErrCancelled)
		}
	case msgClaimed:
		d.claims--
		d.claimed(m.run, m.applied)
	case msgStop:
		if !d.stopping {
			d.stopping = true
			d.c.log.Info("runcue: stopping", "owner", d.owner, "running", d.inflight, "cancel", m.cancel)
		}
		if m.cancel {
			for _, r := range d.runs {
				if r.cause == nil {
					r.cause = ErrShutdown
				}
				r.cancel(ErrShutdown)
			}
		}
	case msgAbandon:
		d.abandon = true
	case msgRegistry:
		d.c.mu.Lock()
		d.refreshRegistry(d.c.services, d.c.tasks)
		d.c.mu.Unlock()
	case msgStoreFailed:
		d.failed = m.err
	case msgDrain:
		d.drains = append(d.drains, m.reply)
	case msgSync:
		d.syncs = append(d.syncs, m.reply)
	case msgCancel:
		d.cancelUnit(m.id, m.opts, m.errc)
	case msgHeartbeat:
		if r := d.runs[m.run.id]; r != nil && r == m.run {
			now := d.wall()
			d.submit(&store.Heartbeat{ID: r.u.id, Owner: d.owner, Run: r.no, At: now,
				LeaseExpires: now.Add(d.c.cfg.LeaseBuffer)})
		}
	case msgPruned:
		d.pruning = false
		next := d.c.cfg.pruneInterval()
		if m.more {
			next = 0 // a batch was full: more to do
		}
		d.schedulePrune(d.now().Add(next))
	case msgApplied:
		d.applyEnded(m.events)
	case msgServiceChanged:
		d.serviceChanged(m.service)
	case msgCall:
		m.f(d)
	case msgSettled:
		d.settled(m.id, m.state, m.applied)
		d.applyEnded(m.derived)
	case msgChecked:
		d.checked(m.id, m.ok)
	case msgScores:
		d.scoring = false
		d.storeScores(m.scores)
	case msgFed:
		d.fed(m.err)
	case msgStarted:
		d.settleReservations(m.run, m.start)
	case msgProgress:
		if m.due.After(d.now()) {
			d.dropTimer(m.run.progressTimer)
			m.run.progressTimer = &timerEntry{at: m.due, kind: tProgress, r: m.run}
			d.pushTimer(m.run.progressTimer)
		} else {
			d.emitProgress(m.run)
		}
	}
}

// external applies changes committed by other processes.
func (d *dispatcher) external(evs []store.Event) {
	var load []string
	for _, ev := range evs {
		switch ev.Type {
		case string(EventWorkQueued):
			if _, known := d.units[ev.WorkID]; !known {
				load = append(load, ev.WorkID)
			}
		case string(EventWorkCancelled), string(EventWorkFailed):
			d.applyEnded([]store.Event{ev})
		case store.EventWorkCancelRequested:
			if r := d.runs[ev.WorkID]; r != nil {
				var data struct {
					Cascade bool   `json:"cascade"`
					Reason  string `json:"reason"`
				}
				_ = json.Unmarshal(ev.Data, &data)
				d.cancelRun(r, CancelOptions{Cascade: data.Cascade, Reason: data.Reason})
			}
		case string(EventServiceChanged):
			var data struct {
				Service string `json:"service"`
			}
			if json.Unmarshal(ev.Data, &data) == nil {
				d.reloadService(data.Service)
			}
		}
	}
	if len(load) == 0 {
		return
	}
	units, err := d.c.st.ListUnits(context.Background(), store.ListFilter{IDs: load, States: []store.State{store.Queued}, Limit: len(load)})
	if err != nil {
		d.c.log.Error("runcue: load units submitted by another process", "units", len(load), "error", err)
		return
	}
	d.addUnits(units, true)
}

// applyEnded drops from memory the queued units that events report ended
// (cancelled, or failed by the store because a dependency died). Events
// about running units, or failures that will retry, are skipped.
func (d *dispatcher) applyEnded(evs []store.Event) {
	for _, ev := range evs {
		if ev.Type != string(EventWorkCancelled) && ev.Type != string(EventWorkFailed) {
			continue
		}
		if ev.Type == string(EventWorkFailed) && eventFrom(&ev).WillRetry {
			continue
		}
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

// fireTimers handles the timers that are due. Timer entries are on the
// monotonic timeline (d.now); what the handlers record is wall-clock time.
func (d *dispatcher) fireTimers() {
	now, wall := d.now(), d.wall()
	for d.timers.Len() > 0 && !d.timers.Peek().at.After(now) {
		e := d.timers.Pop()
		switch e.kind {
		case tUnitDue:
			if e.u.state == uWaiting && e.gen == e.u.timerGen {
				e.u.runAt = time.Time{}
				d.makeEligible(e.u)
			}
		case tDeadline:
			switch r := e.r; {
			case r.ended:
			case r.cancelled != nil:
				d.conclude(r, ending{err: ErrCancelled, cancelled: r.cancelled, at: wall})
			default:
				// It fails at its deadline whether or not its handler
				// ever returns.
				r.cause = ErrTimeout
				r.cancel(ErrTimeout)
				d.conclude(r, ending{err: timeoutError(r), at: wall})
			}
		case tGrace:
			if r := e.r; !r.ended {
				d.conclude(r, ending{err: ErrCancelled, cancelled: r.cancelled, at: wall})
			}
		case tPrune:
			d.prune(wall)
		case tResource:
			if e.at.Equal(e.res.timerAt) {
				e.res.timerAt = time.Time{}
				d.markStatus(e.res)
				d.wake(e.res)
			}
		case tStatus:
			e.res.statusTimer = false
			d.markStatus(e.res)
		case tEvict:
			d.maybeEvict(e.res)
		case tDepDeadline:
			d.dependencyTimeout(e.u, wall)
		case tRecheck:
			if d.units[e.u.id] == e.u && e.u.state == uChecking && !e.u.checking {
				d.requestCheck(e.u)
			}
		case tFeed:
			d.feedWait = false
		case tProgress:
			d.emitProgress(e.r)
		case tQueueStatus:
			d.queueStatus()
		}
	}
}

// dispatch starts as many units as the caps and services allow.
func (d *dispatcher) dispatch() {
	if d.stopping || d.failed != nil {
		return
	}
	if d.c.cfg.Priority != nil {
		d.dispatchByPriority()
		return
	}
	for d.inflight < d.c.cfg.MaxConcurrent && d.ready.Len() > 0 {
		l := d.ready.Pop()
		l.inReady = false
		now := d.now()
		blocker, until, probes := d.admit(l, now)
		if blocker != nil {
			d.park(l, blocker, until)
			continue
		}
		u := l.units.Pop()
		d.acquire(l, now, probes)
		if l.units.Len() > 0 {
			l.inReady = true
			d.ready.Push(l)
		}
		d.start(u, l, now, probes)
		for _, r := range l.resources {
			d.wake(r) // the next waiter, while room remains
		}
	}
}

func (d *dispatcher) start(u *unit, l *lane, now time.Time, probes []*resource) {
	t := l.task
	timeout := u.timeout
	if timeout <= 0 {
		timeout = t.def.Timeout
	}
	if timeout <= 0 {
		timeout = d.c.cfg.DefaultTimeout
	}
	u.runs++
	u.state = uRunning
	wall := d.wall()
	r := &run{u: u, id: u.id, task: u.task, lane: l, no: u.runs, start: wall, deadline: wall.Add(timeout), handler: t.def.Handler,
		target: u.target, params: u.params, load: !u.hasParams, probes: probes}
	r.ctx, r.cancel = context.WithCancelCause(context.Background())
	if clock.IsReal(d.clock) {
		// Let the handler see its deadline; the timer heap still decides.
		r.ctx, r.stopDL = context.WithDeadlineCause(r.ctx, r.deadline, ErrTimeout)
	}
	r.ctx, r.span = d.c.tel.startSpan(r.ctx, u.trace, u.task, u.id, r.no)
	tel := d.c.tel
	tel.queueWait.Record(bg, seconds(now.Sub(u.readyAt)), t.attrs)
	for _, res := range l.resources {
		if res.class != "" {
			tel.requests.Add(bg, 1, res.attrs())
		}
	}
	if d.c.log.Enabled(bg, slog.LevelDebug) {
		d.c.log.Debug("work_started", "work_unit_id", u.id, "task_type", u.task, "attempt", r.no)
	}
	r.decided = now
	for _, res := range l.resources {
		if res.window != nil {
			r.reserved = append(r.reserved, res.window) // reserved by acquire
		}
	}
	d.runs[u.id] = r
	if h := d.c.testHooks.started; h != nil {
		h(r)
	}
	d.inflight++
	d.c.stats.dispatches.Add(1)
	r.deadlineTimer = &timerEntry{at: now.Add(timeout), kind: tDeadline, r: r}
	d.pushTimer(r.deadlineTimer)
	claim := &store.Claim{ID: u.id, Owner: d.owner, Run: r.no, At: wall, LeaseExpires: r.deadline.Add(d.c.cfg.LeaseBuffer),
		ServiceLog: l.logged, Events: []store.Event{{Type: string(EventWorkStarted), Task: u.task, Attempt: r.no}}}
	// A dispatch counted in a rate window is logged before the handler
	// starts, so that a crash cannot forget a request the service saw.
	// Other claims are written behind the handler's start: a crash before
	// the commit leaves the unit queued, and it runs again.
	r.waitClaim = len(l.logged) > 0
	done := func(res []store.Result, err error) {
		if err != nil || !res[0].Applied {
			d.in.Push(msgClaimFailed{run: r})
		}
	}
	if r.waitClaim {
		d.claims++
		done = func(res []store.Result, err error) {
			d.in.Push(msgClaimed{run: r, applied: err == nil && res[0].Applied})
		}
	}
	if err := d.c.w.Submit(&writer.Request{Ops: []store.Op{claim}, Done: done}); err != nil {
		// The writer is closed or failed: the run cannot be recorded.
		d.failed = err
		r.claimFailed = true
		if r.waitClaim {
			d.claims--
			d.claimed(r, false)
			return
		}
	}
	if !r.waitClaim {
		d.launch(r)
	}
}

func (d *dispatcher) launch(r *run) {
	r.launched = true
	d.live++
	d.handlers.Go(func() { d.execute(r) })
}

// claimed continues a run whose write-ahead claim has committed.
func (d *dispatcher) claimed(r *run, applied bool) {
	switch {
	case !applied:
		r.claimFailed = true
		if !r.ended {
			d.end(r, true, verdictNone)
			d.forget(r.u)
			endSpan(r.span, "abandoned", nil)
		}
	case r.ended:
		// Its deadline passed first; nothing to run.
	case r.cause != nil:
		// Shutdown or cancellation came first: do not start the handler.
		d.finished(msgDone{run: r, err: context.Cause(r.ctx), end: d.wall()})
	default:
		d.launch(r)
	}
}

// execute runs on the handler goroutine.
func (d *dispatcher) execute(r *run) {
	w := &Work{ID: r.id, Task: r.task, Target: r.target, Params: r.params, Attempt: r.no,
		beat: func() { d.heartbeat(r) }, report: func(b []byte) { d.reportProgress(r, b) }}
	var res any
	var err error
	sent := false
	defer func() {
		// Only runtime.Goexit (t.FailNow in a shared helper, say) ends the
		// goroutine without the send below: record the run as failed now,
		// not at its deadline.
		if !sent {
			d.in.Push(msgDone{run: r, err: errGoexit, end: d.wall()})
		}
	}()
	if r.load {
		var su *store.Unit
		if su, err = d.c.st.GetUnit(context.Background(), r.id); err == nil {
			w.Target, w.Params = su.Target, su.Params
		} else {
			err = fmt.Errorf("runcue: load unit: %w", err)
		}
	}
	var out []byte
	notStarted := true
	if err == nil {
		if r.lane.keyErr != nil {
			err = Permanent(r.lane.keyErr)
		} else if err = d.begin(r, w); err == nil {
			notStarted = false
			res, err = callHandler(r.ctx, r.handler, w)
		}
		if err == nil {
			if out, err = json.Marshal(res); err != nil {
				err = Permanent(fmt.Errorf("runcue: encode result: %w", err))
			} else if len(out) > d.c.cfg.MaxPayload {
				out, err = nil, Permanent(fmt.Errorf("runcue: result of %d bytes exceeds Config.MaxPayload (%d)", len(out), d.c.cfg.MaxPayload))
			}
		}
	}
	sent = true
	d.in.Push(msgDone{run: r, result: out, err: err, end: d.wall(), notStarted: notStarted})
}

// errLateStart is why a rate-limited run whose handler would have started
// more than Config.MaxStartDelay after its dispatch was decided did not
// start.
var errLateStart = errors.New("runcue: the handler would have started more than MaxStartDelay after its dispatch was decided")

// begin runs on the handler goroutine just before it calls the handler: it
// reads the start instant (Work.Started) and reports it to the rate windows
// of the run's services. It refuses the start, with the reason, when the
// run was cancelled or shut down meanwhile, when the start would come more
// than MaxStartDelay after the decision (the run is requeued), or when the
// dispatcher has exited.
func (d *dispatcher) begin(r *run, w *Work) error {
	if r.ctx.Err() != nil {
		return context.Cause(r.ctx)
	}
	d.startMu.RLock()
	defer d.startMu.RUnlock()
	if d.noStarts {
		return ErrShutdown
	}
	now := d.now()
	w.Started = d.wall()
	if len(r.reserved) > 0 {
		if now.Sub(r.decided) > d.c.cfg.MaxStartDelay {
			return errLateStart
		}
		d.in.Push(msgStarted{run: r, start: now})
	}
	return nil
}

// settleReservations commits r's window reservations at its handler's
// start, or gives them back (start zero) if the handler never started.
func (d *dispatcher) settleReservations(r *run, start time.Time) {
	if len(r.reserved) == 0 {
		return
	}
	for _, w := range r.reserved {
		if start.IsZero() {
			w.Release()
		} else {
			w.Commit(start)
		}
	}
	r.reserved = nil
	for _, res := range r.lane.resources {
		if res.window != nil {
			d.markStatus(res)
			d.wake(res) // a place freed, or its time is known now
		}
	}
}

// errGoexit is the failure recorded for a handler that called
// runtime.Goexit. It counts as a panic: the handler did not return.
var errGoexit = &panicError{value: "handler called runtime.Goexit (t.FailNow, t.SkipNow or log.Fatal-like code in a handler?) instead of returning"}

// record reports a run's outcome to metrics, its span and the log.
func (d *dispatcher) record(r *run, fin *store.Finish, err error, end time.Time) {
	outcome := fin.Attempt.Outcome
	if outcome == "" {
		outcome = "abandoned" // the claim was refused: nothing ran for the record
	}
	tel, log := d.c.tel, d.c.log
	rt := r.lane.task
	tel.runDuration.Record(bg, seconds(end.Sub(r.start)), rt.outcomeAttrs(outcome))
	switch outcome {
	case "completed":
		tel.completed.Add(bg, 1, rt.attrs)
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_completed", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no, "duration", end.Sub(r.start))
		}
	case "failed", "timeout", "panic":
		tel.failed.Add(bg, 1, rt.outcomeAttrs(outcome))
		willRetry := fin.State == store.Queued
		level := slog.LevelWarn
		if willRetry {
			level = slog.LevelInfo
		}
		errText := fin.Error
		if outcome == "panic" {
			errText = firstLine(errText) // the stack is in the unit's history
		}
		log.Log(bg, level, "work_failed", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no,
			"error", errText, "error_kind", fin.ErrorKind, "will_retry", willRetry)
	case "cancelled", "interrupted", "deferred":
		log.Info("work_"+outcome, "work_unit_id", r.id, "task_type", r.task, "attempt", r.no)
	}
	endSpan(r.span, outcome, err)
}

func firstLine(s string) string {
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

// panicError records a handler panic.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	if len(e.stack) == 0 {
		return fmt.Sprintf("panic: %v", e.value)
	}
	return fmt.Sprintf("panic: %v\n%s", e.value, e.stack)
}

func (e *panicError) Is(target error) bool { return target == ErrPanic }

func callHandler(ctx context.Context, h Handler, w *Work) (res any, err error) {
	defer func() {
		if v := recover(); v != nil {
			stack := debug.Stack()
			if len(stack) > 8<<10 {
				stack = stack[:8<<10]
			}
			res, err = nil, &panicError{value: v, stack: stack}
		}
	}()
	return h(ctx, w)
}

// end decides that r is over and its unit leaves the running set. The
// verdict goes to the circuits of the run's services. Its resources are
// released now, unless its handler has not returned and its task holds
// slots until then.
func (d *dispatcher) end(r *run, returned bool, v verdict) {
	r.ended = true
	if !r.launched {
		d.settleReservations(r, time.Time{}) // it never starts
	}
	delete(d.runs, r.u.id)
	if r.stopDL != nil {
		r.stopDL()
	}
	d.dropTimer(r.deadlineTimer)
	d.dropTimer(r.graceTimer)
	r.deadlineTimer, r.graceTimer = nil, nil
	d.judge(r, v)
	if !returned && r.lane.task.def.HoldSlotsUntilReturn {
		r.holding = true
		d.held[r] = struct{}{}
		return
	}
	d.inflight--
	d.release(r.lane)
}

// finished handles a handler's return (or a run that never started its
// handler because shutdown or cancellation came first).
func (d *dispatcher) finished(m msgDone) {
	r := m.run
	if m.notStarted {
		d.settleReservations(r, time.Time{})
	}
	if r.ended {
		// Decided at its deadline or grace: a late result is discarded.
		if r.holding {
			r.holding = false
			delete(d.held, r)
			d.inflight--
			d.release(r.lane)
		}
		r.cancel(nil)
		return
	}
	d.conclude(r, ending{returned: true, err: m.err, result: m.result, cancelled: r.cancelled,
		shutdown: errors.Is(r.cause, ErrShutdown), at: m.end})
}

func (d *dispatcher) requeueLocal(u *unit, at time.Time) {
	u.runAt = at
	if d.stopping {
		d.forget(u) // it stays queued in the store for the next run
		return
	}
	d.makeEligible(u)
}

// cancelUnit handles Cancel for a unit this Cue owns.
func (d *dispatcher) cancelUnit(id string, opts CancelOptions, errc chan error) {
	if r := d.runs[id]; r != nil {
		d.cancelRun(r, opts)
		errc <- nil
		return
	}
	u := d.units[id]
	if u == nil {
		for _, o := range d.orphans {
			if u = o[id]; u != nil {
				break
			}
		}
	}
	op := &store.Cancel{ID: id, At: d.wall(), Reason: opts.Reason, Cascade: opts.Cascade, RequestIfRunning: true}
	if u != nil {
		// It cannot be dispatched while the cancel commits, and its
		// dependents wait for the commit, as for a Finish.
		d.removeQueued(u)
		d.finishing[id] = struct{}{}
		op.Events = []store.Event{{Type: string(EventWorkCancelled), Task: u.task, Data: eventData{Reason: opts.Reason}.encode()}}
	}
	err := d.c.w.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		var evs []store.Event
		if err == nil {
			evs = res[0].Events
		}
		if u != nil {
			d.in.Push(msgSettled{id: id, state: store.Cancelled, applied: err == nil && res[0].Applied, derived: evs})
		} else if len(evs) > 0 {
			d.in.Push(msgApplied{events: evs})
		}
		if err != nil {
			errc <- wrapStoreErr(err)
			return
		}
		errc <- cancelResult(id, res[0])
	}})
	if err != nil {
		errc <- wrapStoreErr(err)
	}
}

// cancelRun cancels a running handler's context and starts its grace.
func (d *dispatcher) cancelRun(r *run, opts CancelOptions) {
	if r.cancelled != nil || r.ended {
		return
	}
	r.cancelled = &opts
	r.cause = ErrCancelled
	r.cancel(ErrCancelled)
	r.graceTimer = &timerEntry{at: d.now().Add(d.c.cfg.CancelGrace), kind: tGrace, r: r}
	d.pushTimer(r.graceTimer)
}

// heartbeat records that r's handler is alive, at most once a second.
func (d *dispatcher) heartbeat(r *run) {
	now := d.now().UnixNano()
	last := r.lastBeat.Load()
	if now-last < int64(time.Second) || !r.lastBeat.CompareAndSwap(last, now) {
		return
	}
	d.in.Push(msgHeartbeat{run: r})
}

// pruneBatch caps the rows one retention pass deletes in a transaction.
const pruneBatch = 1000

func (d *dispatcher) schedulePrune(at time.Time) {
	d.pushTimer(&timerEntry{at: at, kind: tPrune})
}

// prune deletes, in one batch, finished units past Config.Retention, events
// past Config.EventRetention, and the service log entries that no rate
// window needs any more.
func (d *dispatcher) prune(now time.Time) {
	if d.pruning || d.stopping {
		return
	}
	op := &store.Prune{Limit: pruneBatch, LogBefore: d.logCutoffs(now), EventsBefore: now.Add(-d.c.cfg.EventRetention)}
	if d.c.cfg.Retention > 0 {
		op.Before = now.Add(-d.c.cfg.Retention)
	}
	d.pruning = true
	err := d.c.w.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		d.in.Push(msgPruned{more: err == nil && res[0].More})
	}})
	if err != nil {
		d.pruning = false
	}
}

// submit queues ops for the writer without waiting. An op that ends a unit
// (a terminal Finish, a FailQueued) reports its commit back (mSettled), so
// that the unit's dependents are released only once its end is durable;
// events the store derived for other units (dependents failed or cancelled
// with it) come back too, and the dispatcher drops those units from memory.
func (d *dispatcher) submit(ops ...store.Op) {
	for _, op := range ops {
		if id, _, _, ends := opEnds(op); ends {
			d.finishing[id] = struct{}{}
		}
	}
	err := d.c.w.Submit(&writer.Request{Ops: ops, Done: func(res []store.Result, err error) {
		for i, op := range ops {
			id, state, own, ends := opEnds(op)
			if id == "" {
				continue
			}
			var derived []store.Event
			applied := err == nil && res[i].Applied
			if applied && len(res[i].Events) > own {
				derived = res[i].Events[own:]
			}
			if ends {
				d.in.Push(msgSettled{id: id, state: state, applied: applied, derived: derived})
			} else if len(derived) > 0 {
				d.in.Push(msgApplied{events: derived})
			}
		}
	}})
	if err != nil && d.failed == nil {
		d.failed = err
	}
}

// opEnds describes an op that finishes or fails a unit: its ID, the state
// it leaves the unit in, how many of its result's events are its own (the
// rest the store derived for dependents), and whether the unit ends. id is
// "" for other ops.
func opEnds(op store.Op) (id string, state store.State, own int, ends bool) {
	switch op := op.(type) {
	case *store.Finish:
		return op.ID, op.State, len(op.Events), op.State.Terminal()
	case *store.FailQueued:
		return op.ID, store.Failed, len(op.Events), true
	}
	return "", "", 0, false
}

// drain waits until the dispatcher holds no work of registered task types.
func (d *dispatcher) drain(ctx context.Context) error {
	ch := make(chan drainReply, 1)
	d.in.Push(msgDrain{reply: ch})
	select {
	case rep := <-ch:
		if rep.stopped {
			return errors.New("runcue: Drain: the Cue stopped before its work was finished")
		}
		d.c.reportOrphans(rep.orphans)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type drainReply struct {
	orphans map[string]int
	stopped bool
}

// sync returns after the dispatcher has handled every message sent before
// the call and completed one loop iteration.
func (d *dispatcher) sync(ctx context.Context) error {
	ch := make(chan struct{})
	d.in.Push(msgSync{reply: ch})
	select {
	case <-ch:
		return nil
	case <-d.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
