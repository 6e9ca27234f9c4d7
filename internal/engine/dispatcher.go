package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/internal/hub"
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

// env is what the dispatcher needs of its Cue, fixed for its life: the
// configuration, the collaborators (store, writer, hub, telemetry, log),
// the counters it reports to, and the few Cue operations it calls. It
// holds none of the Cue's mutable state.
type env struct {
	cfg Settings
	// epoch is the owner epoch this engine took ownership at: every owner
	// op it makes carries it.
	epoch  int64
	log    *slog.Logger
	st     store.Store
	w      *writer.Writer
	sw     *writer.Writer // Deps.Starts
	hub    *hub.Hub
	tel    *Telemetry
	stats  *Counters
	cbErrs *callbackErrors
	hooks  Hooks
	// unitRetry reads a unit's stored retry policy; encode turns what the
	// engine reports into runcue's JSON; reportOrphans logs the units no
	// registered task can run; detach tells the Cue this engine has
	// exited.
	unitRetry     func([]byte) (RetryPolicy, error)
	encode        func(any) []byte
	reportOrphans func(map[string]int)
	detach        func(*Engine)
}

// dispatcher is the loop and the flows that cross its parts. Each part
// is a struct in the file named for it, owning its fields. The parts are
// layered: a part's methods reach its own fields and the parts it embeds,
// nothing above them:
//
//	timeline, taskTable, statusBoard, env   the base
//	resourceTable                           lanes, admission, circuits, status (embeds the base)
//	unitIndex                               units and orphans (embeds resourceTable, scorer)
//	depGraph                                who waits for whom (embeds unitIndex)
//
// The dispatcher embeds every part, so a flow (a method on *Engine)
// reads d.units or d.runs directly: its receiver is what marks it as
// crossing parts. Flows are in dispatcher.go (the loop, handle, dispatch)
// and in the file of the part they start from. Everything here, parts
// included, is owned by the dispatcher goroutine unless its comment says
// otherwise.
type Engine struct {
	env
	owner string
	own   store.Ownership
	in    *inbox.Inbox[message] // any goroutine pushes; the dispatcher takes
	// done is closed when the dispatcher has exited.
	done chan struct{}
	// stopReq is set once Stop or StopAndCancel has been called; deposed
	// once a write failed with store.ErrNotOwner (fence.go). Any goroutine.
	stopReq atomic.Bool
	deposed atomic.Bool
	// unwritten: see noteUnwritten (dispatcher goroutine; read by
	// EndedRuns once done is closed).
	unwritten []store.RunRef
	// finPending holds the local runs whose Finish the writer has not
	// answered yet (dispatcher goroutine).
	finPending map[*run]struct{}
	// abandonCh is closed by Abandon (once): it also ends exit's wait for
	// the writer, which an outage may prolong.
	abandonCh   chan struct{}
	abandonOnce sync.Once

	timeline      // timers.go: the scheduling clock and the timer heap
	taskTable     // tasks.go: registered tasks and service limits
	unitIndex     // units.go: queued, waiting and running units
	runTable      // run.go: runs from dispatch to their handlers' return
	resourceTable // resources.go: services, keyed instances and lanes
	depGraph      // deps.go: who waits for whom, and the checker
	scorer        // priority.go: the priority scores
	intake        // intake.go: backpressure and the feed
	statusBoard   // status.go: service status to publish
	maintenance   // maintenance.go: retention passes
	storeReader   // reads.go: store reads on the reader goroutine
	loader        // recovery.go: the streamed load of the queued units
	settling      // settle.go: what Settle waits for
	ghostTable    // ghosts.go: runs an earlier owner left, held until their leases end

	// aux counts the helper goroutines (the dependency checker, Feed
	// calls, the streamed load); auxStop and auxCtx stop them at exit.
	aux       sync.WaitGroup
	auxStop   chan struct{}
	auxCtx    context.Context
	auxCancel context.CancelFunc

	// stopping: Stop was handled; no more dispatches, exit when the runs
	// are over. abandon: exit now (StopAndCancel's grace ran out). failed:
	// the store failed; no more dispatches.
	stopping bool
	abandon  bool
	failed   error
	// drains and syncs are the replies owed to Drain and sync.
	drains []chan drainReply
	syncs  []chan struct{}
	rnd    *rand.Rand // retry jitter
}

// Registry is a snapshot of the Cue's registrations: limits by service
// name, tasks by name. Snapshots only add.
type Registry struct {
	Services map[string]store.ServiceDef
	Tasks    map[string]*TaskSpec
}

// New returns the engine of an owner that took ownership (own) of the
// store: stored are the services' stored records, pauses the stored
// pauses, reg the registrations so far. Recover, then Run.
func New(cfg Settings, deps Deps, owner string, own store.Ownership, stored []store.ServiceRecord, pauses store.Pauses, reg Registry) *Engine {
	d := &Engine{
		env: env{cfg: cfg, log: cfg.Log, st: deps.Store, w: deps.Writer, sw: deps.Starts, hub: deps.Hub, tel: deps.Tel, stats: deps.Stats,
			cbErrs: &callbackErrors{log: cfg.Log, stats: deps.Stats, tel: deps.Tel}, hooks: deps.Hooks, unitRetry: deps.UnitRetry,
			encode: deps.Encode, reportOrphans: deps.ReportOrphans, detach: deps.Detach, epoch: own.Epoch()},
		owner: owner, own: own, in: inbox.New[message](), done: make(chan struct{}),
		timeline:    newTimeline(cfg.Clock),
		taskTable:   taskTable{tasks: make(map[string]*taskRT), regs: make(map[string]store.ServiceDef)},
		unitIndex:   unitIndex{units: make(map[string]*unit), orphans: make(map[string]map[string]*unit)},
		runTable:    runTable{runs: make(map[string]*run), held: make(map[*run]struct{})},
		depGraph:    depGraph{dependents: make(map[string][]*unit), finishing: make(map[string]struct{})},
		statusBoard: statusBoard{dirty: make(map[*resource]struct{})},
		auxStop:     make(chan struct{}),
		finPending:  make(map[*run]struct{}),
		abandonCh:   make(chan struct{}),
		rnd:         newRand(cfg.Rand),
	}
	d.resourceTable = newResourceTable(&d.env, &d.timeline, &d.statusBoard, &d.taskTable, d.submit, stored)
	d.unitIndex = unitIndex{resourceTable: &d.resourceTable, scorer: &d.scorer,
		units: make(map[string]*unit), orphans: make(map[string]map[string]*unit)}
	d.depGraph = depGraph{unitIndex: &d.unitIndex, dependents: make(map[string][]*unit), finishing: make(map[string]struct{})}
	d.auxCtx, d.auxCancel = context.WithCancel(context.Background())
	d.queuePaused, d.pausedTasks = pauses.Queue, make(map[string]bool)
	for _, name := range pauses.Tasks {
		d.pausedTasks[name] = true
	}
	d.refreshRegistry(reg.Services, reg.Tasks)
	return d
}

// Run is the dispatcher goroutine: it returns when the engine exits.
func (d *Engine) Run() {
	d.watchLease()
	for {
		for _, m := range d.in.Take() {
			d.handle(m)
		}
		d.fireTimers()
		d.queued.Store(int64(d.queuedCount()))
		d.unloadedNow.Store(int64(d.unloaded))
		d.backpressure() // the queue as the messages left it, then as dispatch leaves it
		d.dispatch()
		d.backpressure()
		d.maybeFeed()
		if d.loadWaits {
			d.loadMore()
		}
		d.flushStatus()
		if h := d.hooks.CheckInvariants; h != nil {
			if err := d.verify(); err != nil {
				h(err)
			}
		}
		if len(d.drains) > 0 && (d.idle() || d.onlyBudgetHeld()) {
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
		if d.pending == 0 {
			for _, ch := range d.syncs {
				close(ch)
			}
			d.syncs = d.syncs[:0]
		}
		if ch := d.hooks.Iterated; ch != nil {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		if d.abandon || (d.stopping && d.liveLocal == 0 && len(d.runs) == 0 && len(d.held) == 0 && d.claims == 0) {
			d.exit()
			return
		}
		select {
		case <-d.in.Wake():
		case <-d.arm():
			d.fired()
		}
	}
}

// idle reports that no work of registered task types is queued, waiting or
// running, and the feed (if any) has no more.
func (d *Engine) idle() bool {
	return len(d.units) == 0 && len(d.finishing) == 0 && d.pending == 0 && !d.loading && len(d.ghosts) == 0 &&
		(d.cfg.Feed == nil || (d.exhausted && !d.feeding))
}

func (d *Engine) exit() {
	// No handler starts from here on: ownership is about to be released,
	// and a new owner counts only the starts it can bound.
	d.closeStarts()
	d.stopTimer()
	if d.passTimer != nil {
		d.passTimer.Stop()
	}
	close(d.auxStop)
	d.auxCancel()
	d.aux.Wait()
	d.keys.stop()
	for _, ch := range d.drains {
		ch <- drainReply{stopped: true, err: d.failed}
	}
	d.drains = nil
	if d.failed == nil {
		// Wait for this owner's writes before giving ownership up. A
		// deposed owner's are fenced (they fail at once), and a failed
		// store stores nothing: neither waits. The wait ends at Abandon
		// too: through an outage the writer retries for as long as it
		// lasts, and Close abandons after its ShutdownTimeout.
		ctx, cancel := context.WithCancel(context.Background())
		go func() { // ends with the wait: cancel below, or Abandon
			select {
			case <-d.abandonCh:
				cancel()
			case <-ctx.Done():
			}
		}()
		_ = d.w.Sync(ctx)
		cancel()
	}
	d.unwrittenAtExit()
	if d.abandon {
		d.unwritten = nil // a handler may still run
	}
	_ = d.own.Release()
	d.detach(d)
	if d.abandon && d.liveLocal > 0 {
		d.log.Warn("runcue: abandoned handlers that ignored cancellation", "handlers", d.liveLocal)
	}
	d.log.Info("runcue: stopped", "owner", d.owner)
	close(d.done)
}

// handle applies one message. The message types are in messages.go.
func (d *Engine) handle(m message) {
	if _, ok := m.(msgSync); !ok {
		d.activity.Add(1)
	}
	switch m := m.(type) {
	case msgInserted:
		d.applyEnded(m.ended)
		d.addUnits(m.units)
	case msgExternal:
		d.external(m.events)
	case msgQuestions:
		d.answerQuestions(m.questions)
	case msgDone:
		d.live--
		if m.run.local {
			d.liveLocal--
		}
		d.finished(m.run, m.run.end)
	case msgRunWritten:
		d.runWritten(m)
	case msgStop:
		if !d.stopping {
			d.stopping = true
			d.log.Info("runcue: stopping", "owner", d.owner, "running", d.inflight, "cancel", m.cancel)
		}
		if m.cancel {
			for _, r := range d.runs {
				d.stopRun(r, ErrShutdown)
			}
		}
	case msgAbandon:
		d.abandon = true
	case msgRegistry:
		d.refreshRegistry(m.reg.Services, m.reg.Tasks)
	case msgRoom:
		d.setRoom(m.task, m.room)
	case msgStoreFailed:
		d.storeFailed(m.err)
	case msgDrain:
		d.drains = append(d.drains, m.reply)
	case msgSync:
		d.syncs = append(d.syncs, m.reply)
	case msgCancel:
		d.cancelUnit(m.id, m.opts, m.reply)
	case msgHeartbeat:
		d.heartbeat(m.run)
	case msgObserved:
		d.observe(m.run, m.obs, m.at)
	case msgPruned:
		d.pruning = false
		next := d.cfg.pruneInterval()
		if m.more {
			next = 0 // a batch was full: more to do
		}
		d.schedulePrune(d.now().Add(next))
	case msgApplied:
		d.applyEnded(m.events)
	case msgServiceChanged:
		d.reloadService(m.service, m.applied)
	case msgPausesChanged:
		d.reloadPauses(m.applied)
	case msgCall:
		m.f(d)
	case msgSettled:
		d.settled(m.id, m.state, m.applied)
		d.applyEnded(m.derived)
	case msgChecked:
		d.checked(m.id, m.ok)
		if ch := d.hooks.Checked; ch != nil {
			select {
			case ch <- m.id:
			default:
			}
		}
	case msgRead:
		d.pending--
		m.apply(d)
		if d.pending == 0 {
			clear(d.ended)
		}
	case msgScores:
		d.scored(m)
	case msgScoreOverrun:
		d.scoreOverrun(m)
	case msgLoaded:
		d.loaded(m)
	case msgParams:
		d.paramsRead(m)
	case msgFed:
		d.fed(m.err)
	case msgGhost:
		d.exorcised(m)
	case msgFenced:
		d.lostOwnership(m.lease)
	case msgStarted:
		d.settleReservations(m.run, m.start, m.wall)
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

// dispatch starts as many units as the caps and services allow.
func (d *Engine) dispatch() {
	if d.stopping || d.failed != nil || d.queuePaused {
		return
	}
	prio := d.cfg.Priority != nil
	var awaiting []*lane
	if prio {
		d.scorePasses(d.now())
		defer func() {
			for _, l := range awaiting { // back in the ready heap
				l.inReady = true
				d.tagLane(l)
				d.ready.Push(l)
			}
		}()
	}
	for d.inflight < d.cfg.MaxConcurrent && d.uncommitted < d.cfg.MaxUncommitted && d.ready.Len() > 0 {
		if prio && !d.ready.Peek().units.Peek().scored {
			return // no unit of a ready lane holds a score yet (priority.go)
		}
		l := d.ready.Pop()
		l.inReady = false
		if l.awaiting {
			awaiting = append(awaiting, l) // its units that waited are being scored (priority.go)
			continue
		}
		now := d.now()
		costs := l.units.Peek().costs()
		var batch []*unit
		var blocker *resource
		var until time.Time
		var probes []*resource
		if b := l.task.spec.Batch; b != nil {
			if due := d.batchDue(l, b, now); !due.IsZero() {
				d.waitBatch(l, due) // ready again then, or when a unit joins
				continue
			}
			d.dropTimer(l.batchTimer)
			l.batchTimer = nil
			batch, costs, blocker, until, probes = d.admitBatch(l, d.gather(l, b, b.Max), now)
			if blocker != nil {
				d.unpop(l, batch)
				costs = l.units.Peek().costs()
			}
		} else {
			blocker, until, probes = d.admit(l, now, costs)
		}
		if blocker != nil {
			if why := blocker.Unfit(costs); why != "" {
				// It would wait forever and hold its lane back: a keyed
				// instance's limit (unknown at submit) or one lowered
				// since is below its cost.
				d.failUnfit(l.units.Peek(), blocker, why)
				continue
			}
			d.hold(l, blocker, now, costs)
			d.park(l, blocker, until)
			continue
		}
		var u *unit
		if batch == nil {
			u = l.units.Pop()
		}
		spent := d.acquire(l, now, probes, costs)
		if l.units.Len() > 0 {
			l.inReady = true
			d.tagLane(l)
			d.ready.Push(l)
			d.noteFresh(l)
		} else {
			l.dropScoring()
		}
		if batch != nil {
			d.startBatch(batch, l, now, probes, spent, costs)
		} else {
			d.start(u, l, now, probes, spent)
		}
		for _, r := range l.resources {
			d.wake(r) // the next waiter, while room remains
		}
	}
}

// drain waits until the dispatcher holds no work of registered task types.
func (d *Engine) drain(ctx context.Context) error {
	ch := make(chan drainReply, 1)
	d.in.Push(msgDrain{reply: ch})
	select {
	case rep := <-ch:
		if rep.stopped {
			if rep.err != nil {
				return fmt.Errorf("runcue: Drain: the Cue stopped before its work was finished: %w", rep.err)
			}
			return errors.New("runcue: Drain: the Cue stopped before its work was finished")
		}
		d.reportOrphans(rep.orphans)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type drainReply struct {
	orphans map[string]int
	stopped bool
	err     error // why it stopped, if it failed (ErrNotOwner, a store failure)
}

// sync returns after the dispatcher has handled every message sent before
// the call, the store reads they caused are answered, and it completed one
// loop iteration. Tests use it.
func (d *Engine) sync(ctx context.Context) error {
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

// newRand returns the dispatcher's source of random choices: src, or a PCG
// seeded from the time.
func newRand(src rand.Source) *rand.Rand {
	if src == nil {
		src = rand.NewPCG(uint64(time.Now().UnixNano()), 0x9e3779b97f4a7c15)
	}
	return rand.New(src)
}
