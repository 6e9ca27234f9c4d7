// Package remote is the owner's Runner of remote tasks (Task.Remote):
// their runs, handed to executors (runcue.Executor) through the store. The scheduler still decides every
// start; the Runner picks a live executor with room that runs the task,
// writes the assignment with its start deadline on the store's clock (the
// run's StartBy, or its deadline, less this host's offset uncertainty),
// and reads the executors' reports back: each start (on the store's clock,
// the latest it can have been, converted back with the same care) and each
// end. A run whose executor stops heartbeating ends as lost (requeued, no
// budget spent); its Finish deletes the assignment in its transaction, so
// that a late report from that executor is refused (store.ErrStaleRun).
package remote

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/runcue/runcue/clock"
	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/clocksync"
	"github.com/runcue/runcue/internal/engine"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Runner is one engine's Runner of its remote tasks. The engine calls
// Launch, Cancel, Adopt and EndOps on its goroutine; the loop (run) reads
// the store; mu guards the rest.
type Runner struct {
	d    Deps
	es   store.ExecutorStore
	e    *engine.Engine
	loop sync.Once

	mu      sync.Mutex
	remote  []string              // the remote tasks
	runs    map[string]*remoteRun // by unit ID, launched or adopted and not ended
	pending []*remoteRun          // launched, waiting for an executor with room
	execs   map[string]*execState // the live executors, as last read
	rooms   map[string]int        // the room last told the engine, by task
	refused map[string]bool       // executors whose poll is too slow, warned of
	clock   clocksync.Estimator   // this host's offset to the store's clock (engine timeline)
	synced  time.Time             // when the offset was last measured
	// finishing holds the runs ended and handed to the engine (EndOps),
	// whose assignments the reads leave out (store.Known) until their
	// Finish has surely committed: for keepFinishing reads.
	finishing map[string]finishingRun
	reads     int // the reads of the reports so far

	wake chan struct{}
}

// remoteRun is a run handed (or to be handed) to an executor.
type remoteRun struct {
	p        *engine.Run
	exec     string // "" until assigned (or, adopted, until its assignment is read)
	started  bool   // its start was reported to the engine
	ended    bool   // its end was reported to the engine
	unseen   int    // reads of the assignments that did not find it (adopted)
	assigned bool   // its Assign committed
	// slot is the executor state whose inflight counts it (nil: none).
	slot *execState
}

// finishingRun is an ended run's number, and the count of reads when its
// Finish was handed to the writer.
type finishingRun struct{ run, read int }

// keepFinishing is how many reads leave out an ended run's assignment
// after its Finish was handed to the writer: it is deleted when that
// commits, and a read that still finds it ignores it.
const keepFinishing = 4

// execState is a live executor and the runs this scheduler assigned it.
type execState struct {
	rec      store.ExecutorRecord
	inflight int
}

// errNotAssigned ends a run whose assignment the store did not apply (its
// claim was refused: the unit was cancelled meanwhile).
var errNotAssigned = errors.New("runcue: the run could not be assigned to an executor")

// errNoRoom ends a run that waited for an executor with room past the
// last instant its handler could start.
var errNoRoom = errors.New("runcue: no executor had room for the run before its start deadline")

// Deps are what a Runner works with, fixed for its life.
type Deps struct {
	// Store must implement store.ExecutorStore.
	Store  store.Store
	Writer *writer.Writer
	Clock  clock.Clock
	Log    *slog.Logger
	// PollInterval is how often the executors are read without a
	// notification; MaxStartDelay is the Cue's (an executor must poll
	// well inside it to be assigned runs).
	PollInterval, MaxStartDelay time.Duration
}

// New returns the Runner of one engine; Bind gives it the engine before
// the engine runs.
func New(d Deps) *Runner {
	es, _ := d.Store.(store.ExecutorStore)
	return &Runner{d: d, es: es, runs: map[string]*remoteRun{}, execs: map[string]*execState{},
		rooms: map[string]int{}, refused: map[string]bool{}, clock: clocksync.Estimator{}, finishing: map[string]finishingRun{},
		wake: make(chan struct{}, 1)}
}

// AddTask records a remote task (registration, under the Cue's mu).
func (rr *Runner) AddTask(name string) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if !slices.Contains(rr.remote, name) {
		rr.remote = append(rr.remote, name)
	}
}

// HasTasks reports whether a remote task is registered.
func (rr *Runner) HasTasks() bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return len(rr.remote) > 0
}

// Start starts the loop, once; it ends with the engine.
func (rr *Runner) Start() { rr.loop.Do(func() { go rr.run() }) }

// Launch implements engine.Runner.
func (rr *Runner) Launch(p *engine.Run) {
	x := &remoteRun{p: p}
	p.Handle = x
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.runs[p.ID] = x
	if !rr.place(x) {
		rr.pending = append(rr.pending, x)
	}
}

// Adopt implements engine.Adopter: x's executor is learnt from the next
// read of the assignments.
func (rr *Runner) Adopt(p *engine.Run) {
	x := &remoteRun{p: p, assigned: true}
	p.Handle = x
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.runs[p.ID] = x
	rr.poke()
}

// Cancel implements engine.Runner: a run not assigned yet ends now; an
// assigned one's executor is asked to stop its handler.
func (rr *Runner) Cancel(p *engine.Run, cause error) {
	x := p.Handle.(*remoteRun)
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if x.ended {
		return
	}
	if i := slices.Index(rr.pending, x); i >= 0 {
		rr.pending = slices.Delete(rr.pending, i, i+1)
		x.ended = true
		p.Done(engine.Ending{Err: cause, NotStarted: true, At: rr.d.Clock.Now()})
		return
	}
	why := "cancelled"
	switch cause {
	case engine.ErrTimeout:
		why = "timeout"
	case engine.ErrShutdown:
		why = "shutdown"
	}
	rr.submit(&store.CancelAssigned{Epoch: p.Epoch, ID: p.ID, Run: p.Attempt, Cause: why}, nil)
}

// Bind gives rr its engine, before the engine runs.
func (rr *Runner) Bind(e *engine.Engine) { rr.e = e }

// EndOps implements engine.EndWriter: the run's assignment is deleted with
// its Finish, and its executor's slot freed.
func (rr *Runner) EndOps(p *engine.Run) []store.Op {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if x := rr.runs[p.ID]; x != nil && x.p == p {
		delete(rr.runs, p.ID)
		rr.finishing[p.ID] = finishingRun{run: p.Attempt, read: rr.reads}
		x.ended = true
		if i := slices.Index(rr.pending, x); i >= 0 {
			rr.pending = slices.Delete(rr.pending, i, i+1)
		}
		if x.slot != nil {
			x.slot.inflight--
			x.slot = nil
		}
		rr.placePending()
	}
	return []store.Op{&store.Unassign{Epoch: p.Epoch, ID: p.ID, Run: p.Attempt}}
}

// place assigns x to the live executor with the most room that runs its
// task; false when none has room (or the offset is not measured yet).
// rr.mu is held.
func (rr *Runner) place(x *remoteRun) bool {
	p := x.p
	var best *execState
	for _, ex := range rr.execs {
		if ex.inflight < ex.rec.Capacity && slices.Contains(ex.rec.Tasks, p.Task) &&
			(best == nil || ex.rec.Capacity-ex.inflight > best.rec.Capacity-best.inflight) {
			best = ex
		}
	}
	now := rr.e.Now()
	offset, unc, ok := rr.clock.Estimate(now)
	if best == nil || !ok {
		return false
	}
	// The last instant the handler may start, on this engine's timeline:
	// StartBy for a run its windows count, else its deadline (wall).
	by := now.Add(p.Deadline.Sub(rr.d.Clock.Now()))
	if !p.StartBy.IsZero() && p.StartBy.Before(by) {
		by = p.StartBy
	}
	best.inflight++
	x.exec, x.slot = best.rec.ID, best
	op := &store.Assign{Epoch: p.Epoch, ID: p.ID, Task: p.Task, Owner: p.Owner, Run: p.Attempt, Executor: best.rec.ID,
		// The earliest store instant that can be by here.
		StartBy: by.Add(offset - unc), Timeout: p.Deadline.Sub(rr.d.Clock.Now())}
	rr.submit(op, func(r store.Result) {
		rr.mu.Lock()
		defer rr.mu.Unlock()
		if r.Applied {
			x.assigned = true
			return
		}
		if !x.ended {
			x.ended = true
			p.Done(engine.Ending{Err: errNotAssigned, NotStarted: true, Class: engine.ClassLateStart, At: rr.d.Clock.Now()})
		}
	})
	return true
}

// placePending assigns the pending runs that now have room, and ends as
// late starts (nothing ran, no budget spent) those that waited past the
// last instant their handlers could start. rr.mu is held.
func (rr *Runner) placePending() {
	kept := rr.pending[:0]
	now, wall := rr.e.Now(), rr.d.Clock.Now()
	for _, x := range rr.pending {
		p := x.p
		if !x.ended && ((!p.StartBy.IsZero() && now.After(p.StartBy)) || !wall.Before(p.Deadline)) {
			x.ended = true
			p.Done(engine.Ending{Err: errNoRoom, NotStarted: true, Class: engine.ClassLateStart, At: wall})
		}
		if x.ended || !rr.place(x) {
			if !x.ended {
				kept = append(kept, x)
			}
		}
	}
	clear(rr.pending[len(kept):])
	rr.pending = kept
}

// submit writes op; then, if set, calls done with its result (on the
// writer's goroutine).
func (rr *Runner) submit(op store.Op, done func(store.Result)) {
	err := rr.d.Writer.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		if done == nil {
			return
		}
		if err != nil {
			done(store.Result{Err: err})
			return
		}
		done(res[0])
	}})
	if err != nil && done != nil {
		go done(store.Result{Err: err}) // the writer is closed: the engine is stopping
	}
}

// poke wakes the loop.
func (rr *Runner) poke() {
	select {
	case rr.wake <- struct{}{}:
	default:
	}
}

// run is the loop: it reads the executors and the assignments every
// PollInterval (and at the store's notifications), until stop.
func (rr *Runner) run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var notes <-chan struct{}
	if w, ok := rr.d.Store.(store.ExecutorWatcher); ok {
		notes, _ = w.WatchReported(ctx)
	} else if w, ok := rr.d.Store.(store.Watcher); ok {
		notes, _ = w.Watch(ctx)
	}
	tick := time.NewTicker(rr.d.PollInterval)
	defer tick.Stop()
	full := true
	var failing time.Time // when the reads began to fail (logged once an outage)
	for {
		rctx, cancelRead := context.WithTimeout(ctx, readTimeout(rr.d.Store))
		err := rr.read(rctx, full)
		cancelRead()
		switch {
		case err != nil && ctx.Err() == nil && failing.IsZero():
			failing = time.Now()
			rr.d.Log.Warn("runcue: read the executors: retrying at every poll", "error", err)
		case err == nil && !failing.IsZero():
			rr.d.Log.Info("runcue: read the executors: the store answers again", "failed_for", time.Since(failing).Round(time.Millisecond))
			failing = time.Time{}
		}
		select {
		case <-rr.e.Done():
			return
		case <-tick.C:
			full = true
		case <-rr.wake:
			full = true
		case <-notes:
			// A report: the executors are read at the poll. The reports of
			// the next moment are read with it, in one read.
			full = false
			time.Sleep(coalesce)
		}
	}
}

// readTimeout bounds a read of the owner's loops: the store's
// transactions' bound (store.TxTimeouter), else a minute.
func readTimeout(st store.Store) time.Duration {
	if t, ok := st.(store.TxTimeouter); ok && t.TxTimeout() > 0 {
		return t.TxTimeout()
	}
	return time.Minute
}

// coalesce is how long a read waits after a notification, so that the
// commits of that moment are read at once (every read and every commit
// costs the database more than the rows it carries).
const coalesce = time.Millisecond

// syncEvery is how often the scheduler measures its offset to the store's
// clock.
const syncEvery = 10 * time.Second

// read measures the offset when due, reads the executors and the
// assignments, and applies them: starts and ends reported, runs of
// executors gone, the tasks' room, the pending runs placed.
func (rr *Runner) read(ctx context.Context, full bool) error {
	if now := rr.e.Now(); rr.synced.IsZero() || now.Sub(rr.synced) >= syncEvery {
		if err := rr.sync(ctx); err != nil {
			return err
		}
	}
	var execs []store.ExecutorRecord
	var storeNow time.Time
	if full {
		var err error
		if execs, storeNow, err = rr.es.Executors(ctx); err != nil {
			return err
		}
	}
	as, err := rr.es.Reported(ctx, rr.known())
	if err != nil {
		return err
	}
	if full && rr.adoptedUnknown() {
		// Reported holds no pending assignment: read the live executors'
		// for the adopted runs not started yet.
		for _, rec := range execs {
			mine, err := rr.es.Assigned(ctx, rec.ID)
			if err != nil {
				return err
			}
			as = append(as, mine...)
		}
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if full {
		rr.applyExecutors(execs, storeNow)
	}
	seen := rr.applyReports(as)
	if full {
		rr.endLost(seen)
	}
	rr.placePending()
	return nil
}

// known is what the next read of the reports need not return: the starts
// taken, the ends taken, and the runs finishing. It counts the read.
func (rr *Runner) known() []store.Known {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.reads++
	known := make([]store.Known, 0, len(rr.runs)+len(rr.finishing))
	for id, f := range rr.finishing {
		if rr.reads-f.read > keepFinishing {
			delete(rr.finishing, id)
			continue
		}
		known = append(known, store.Known{ID: id, Run: f.run, State: store.AssignEnded})
	}
	for id, x := range rr.runs {
		switch {
		case x.exec == "":
		case x.ended:
			known = append(known, store.Known{ID: id, Run: x.p.Attempt, State: store.AssignEnded})
		case x.started:
			known = append(known, store.Known{ID: id, Run: x.p.Attempt, State: store.AssignStarted})
		}
	}
	return known
}

// applyExecutors takes the executors read at storeNow (the store's clock):
// the live ones whose poll is well inside MaxStartDelay, and each remote
// task's room. rr.mu is held.
func (rr *Runner) applyExecutors(execs []store.ExecutorRecord, storeNow time.Time) {
	live := make(map[string]*execState, len(execs))
	for _, rec := range execs {
		if rec.Poll > rr.d.MaxStartDelay/4 {
			// It could read an assignment after its start deadline.
			if !rr.refused[rec.ID] {
				rr.refused[rec.ID] = true
				rr.d.Log.Warn("runcue: an executor's poll interval is not well inside MaxStartDelay (at most a quarter of it); no run is assigned to it",
					"executor", rec.ID, "poll", rec.Poll, "max_start_delay", rr.d.MaxStartDelay)
			}
			continue
		}
		if rec.Live(storeNow) {
			ex := rr.execs[rec.ID]
			if ex == nil {
				// New, or back after it was judged gone: it holds the runs
				// still assigned to it.
				ex = &execState{}
				for _, x := range rr.runs {
					if x.exec == rec.ID && !x.ended {
						x.slot = ex
						ex.inflight++
					}
				}
			}
			ex.rec = rec
			live[rec.ID] = ex
		}
	}
	rr.execs = live
	for _, task := range rr.remote {
		room := 0
		for _, ex := range live {
			if slices.Contains(ex.rec.Tasks, task) {
				room += ex.rec.Capacity
			}
		}
		if old, ok := rr.rooms[task]; !ok || old != room {
			rr.rooms[task] = room
			rr.e.SetRoom(task, room)
		}
	}
}

// applyReports tells the engine of the starts and ends reported, and
// returns the runs the assignments named. rr.mu is held.
func (rr *Runner) applyReports(as []store.Assignment) map[string]bool {
	offset, unc, _ := rr.clock.Estimate(rr.e.Now())
	seen := make(map[string]bool, len(as))
	for _, a := range as {
		x := rr.runs[a.ID]
		if x == nil || x.p.Attempt != a.Run || x.ended || (x.exec != "" && x.exec != a.Executor) {
			continue
		}
		seen[a.ID] = true
		x.unseen = 0
		if x.exec == "" {
			x.exec = a.Executor // adopted: it holds a place there
			if ex := rr.execs[a.Executor]; ex != nil {
				x.slot = ex
				ex.inflight++
			}
		}
		if a.State >= store.AssignStarted && !x.started && !a.Started.IsZero() {
			x.started = true
			// The latest local instant the reported start can have been.
			x.p.Started(a.Started.Add(-offset + unc))
		}
		// An end without a start (its handler never called, or its
		// start's report lost) is not a start: the engine releases a run
		// ended NotStarted, and counts any other at its StartBy when that
		// comes (a start dated outside [decision, StartBy] would count
		// there at once, ahead of the present).
		if a.State == store.AssignEnded {
			x.ended = true
			// What the handler observed of its services' limits, each at
			// its instant (the store's clock, made this host's), before
			// the end: the end's adaptive limits read it (as a local run's).
			for _, o := range observedOf(a.Ending) {
				x.p.ObserveAt(o.Observation, o.At.Add(-offset))
			}
			x.p.Done(endingOf(a.Ending, rr.d.Clock.Now()))
		}
	}
	return seen
}

// endLost ends, as lost, the runs of executors no longer live, and the
// adopted runs no assignment names (seen: those a full read found). rr.mu
// is held.
func (rr *Runner) endLost(seen map[string]bool) {
	for _, x := range rr.runs {
		switch {
		case x.ended || !x.assigned:
		case x.exec == "" && !seen[x.p.ID]:
			// Adopted, and no assignment names it: the earlier owner died
			// before its Assign committed, so no executor runs it.
			if x.unseen++; x.unseen >= 2 {
				x.ended = true
				x.p.Done(engine.Ending{Err: rt.ErrExecutorLost, Class: engine.ClassLost, At: rr.d.Clock.Now()})
			}
		case x.exec != "" && rr.execs[x.exec] == nil:
			x.ended = true
			x.p.Done(engine.Ending{Err: rt.ErrExecutorLost, Class: engine.ClassLost, At: rr.d.Clock.Now()})
		}
	}
}

// adoptedUnknown reports whether an adopted run's executor is not known
// yet.
func (rr *Runner) adoptedUnknown() bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, x := range rr.runs {
		if x.exec == "" && x.p.Adopted && !x.ended {
			return true
		}
	}
	return false
}

// sync measures the offset of the engine's timeline to the store's clock.
func (rr *Runner) sync(ctx context.Context) error {
	sent := rr.e.Now()
	remote, err := rr.es.Now(ctx)
	if err != nil {
		return err
	}
	received := rr.e.Now()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.clock.Add(clocksync.Sample{Sent: sent, Received: received, Remote: remote})
	rr.synced = received
	return nil
}
