package execloop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/runcue/runcue/internal/call"
	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/clocksync"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// Loop is an executor's work: it registers, reads the runs assigned to
// it, starts and cancels their handlers and reports their starts and
// ends (see runcue.Executor, whose Run runs it).
type Loop struct {
	cfg   Settings
	st    store.Store
	es    store.ExecutorStore
	tasks map[string]bool
	call  Call
	log   *slog.Logger
	w     *writer.Writer

	mu   sync.Mutex
	runs map[string]*execRun // by unit ID
	// ended are the runs (unit ID to run number) whose handlers returned
	// here, until their assignments leave the reads: a read made before
	// their reports committed must not start them again.
	ended map[string]int
	// found are the runs (unit ID to run number) assigned to this name
	// before this process registered it: an earlier process of the name
	// may have started one before its start report committed, so they
	// are reported lost, not run.
	found   map[string]int
	clock   clocksync.Estimator
	synced  time.Time
	trusted time.Time // a handler may start before this local instant
	// rec is the registration; outage when the store began to fail (zero
	// when it answers), saidTaken that the ID's being held was logged: Run's
	// goroutine only.
	rec       store.ExecutorRecord
	outage    time.Time
	saidTaken bool
	wg        sync.WaitGroup
	// StartReading, set by tests before Run, replaces the clock's reading
	// that is a handler's start instant (a clock that jumped, a goroutine
	// delayed).
	StartReading func(time.Time) time.Time
}

// Settings configure a Loop: runcue.ExecutorConfig with its defaults set
// and checked.
type Settings struct {
	ID                          string
	Capacity                    int
	PollInterval, MaxStartDelay time.Duration
	Heartbeat, TTL, ClockSync   time.Duration
	MaxPayload                  int
	Logger                      *slog.Logger
	Clock                       clock.Clock
}

// Call calls the handler of assignment a's task, started at the instant
// the rate windows count; the handler reports through rep.
type Call func(ctx context.Context, a store.Assignment, started time.Time, rep call.Reporter) (any, error)

// execRun is a run this executor holds.
type execRun struct {
	a      store.Assignment
	cancel context.CancelCauseFunc
	ctx    call.Ctx
}

// errLateRemote is the error of a run its executor could not start by its
// start deadline.
var errLateRemote = errors.New("runcue: the executor could not start the handler by its start deadline")

// New returns the Loop of an executor of tasks (their names), working
// through st (a store.ExecutorStore), calling c for each run.
func New(st store.Store, cfg Settings, tasks []string, c Call) *Loop {
	es, _ := st.(store.ExecutorStore)
	names := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		names[t] = true
	}
	return &Loop{cfg: cfg, st: st, es: es, tasks: names, call: c, log: cfg.Logger, runs: map[string]*execRun{}, ended: map[string]int{}}
}

// ID returns the executor's name in the store.
func (x *Loop) ID() string { return x.cfg.ID }

// Run runs the executor until ctx ends (see runcue.Executor.Run).
func (x *Loop) Run(ctx context.Context) error {
	var txTimeout time.Duration
	if t, ok := x.st.(store.TxTimeouter); ok {
		txTimeout = t.TxTimeout()
	}
	x.w = writer.New(writer.Settings{Store: x.st, Clock: clock.Real(), TxTimeout: txTimeout})
	defer x.w.Close()
	host, _ := os.Hostname()
	names := make([]string, 0, len(x.tasks))
	for name := range x.tasks {
		names = append(names, name)
	}
	slices.Sort(names)
	x.rec = store.ExecutorRecord{ID: x.cfg.ID, Host: host, PID: os.Getpid(), Tasks: names, Capacity: x.cfg.Capacity,
		Poll: x.cfg.PollInterval, TTL: x.cfg.TTL}
	var notes <-chan struct{}
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	if w, ok := x.st.(store.ExecutorWatcher); ok {
		notes, _ = w.WatchAssigned(wctx, x.cfg.ID)
	} else if w, ok := x.st.(store.Watcher); ok {
		notes, _ = w.Watch(wctx)
	}
	poll := time.NewTicker(x.cfg.PollInterval)
	defer poll.Stop()
	beat := time.NewTicker(x.cfg.Heartbeat)
	defer beat.Stop()
	registered := false
	for {
		var err error
		switch {
		case !registered:
			registered, err = x.register(ctx)
		case x.cfg.Clock.Now().Sub(x.synced) >= x.cfg.ClockSync || x.synced.IsZero():
			err = x.sync(ctx)
		}
		if err == nil && registered {
			err = x.poll(ctx)
		}
		if err != nil && ctx.Err() == nil {
			if store.FaultOf(x.st, err) == store.Fatal {
				x.shutdown()
				return err
			}
			x.unavailable(err)
		} else if err == nil {
			x.available()
		}
		select {
		case <-ctx.Done():
			return x.shutdown()
		case <-poll.C:
		case <-notes:
			time.Sleep(time.Millisecond) // the assignments of that moment, in one read
		case <-beat.C:
			if registered {
				registered, err = x.beat(ctx)
				if err != nil && ctx.Err() == nil && store.FaultOf(x.st, err) == store.Fatal {
					x.shutdown()
					return err
				}
			}
		}
		if ctx.Err() != nil {
			return x.shutdown()
		}
	}
}

// trust records a heartbeat sent at local instant sent: its lease holds at
// least until sent + TTL on the store's clock; handlers may start until
// two thirds of that, the rest being the margin for this host's clock.
func (x *Loop) trust(sent time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.trusted = sent.Add(x.cfg.TTL * 2 / 3)
}

// sync measures this host's offset to the store's clock.
func (x *Loop) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.TTL/2)
	defer cancel()
	sent := x.cfg.Clock.Now()
	remote, err := x.es.Now(ctx)
	if err != nil {
		return err
	}
	received := x.cfg.Clock.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.clock.Add(clocksync.Sample{Sent: sent, Received: received, Remote: remote})
	x.synced = received
	return nil
}

// poll reads the assignments and acts on them: it starts the new ones it
// has room for (or reports them late), cancels the handlers the scheduler
// asked to stop, and those whose runs are no longer assigned to it.
func (x *Loop) poll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.TTL/2)
	defer cancel()
	as, err := x.es.Assigned(ctx, x.cfg.ID)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	now := x.cfg.Clock.Now()
	current := make(map[string]bool, len(as))
	for _, a := range as {
		current[a.ID] = true
		if x.ended[a.ID] == a.Run {
			continue // its end is reported, or about to be
		}
		r := x.runs[a.ID]
		if r != nil && r.a.Run != a.Run {
			r.cancel(rt.ErrLeaseLost) // an earlier run, requeued and assigned again
			r = nil
		}
		switch {
		case r != nil:
			if a.Cancel != "" {
				r.cancel(cancelCause(a.Cancel))
			}
		case a.State == store.AssignStarted || x.found[a.ID] == a.Run:
			// Started by an earlier process of this executor's name, which
			// died with its handler; or assigned to that process, which may
			// have started it before its start report committed (a handler
			// starts without waiting for it). The scheduler requeues it, its
			// start counted as if it ran.
			delete(x.found, a.ID)
			x.ended[a.ID] = a.Run
			x.report(a, call.Report{Error: rt.ErrExecutorLost.Error(), Lost: true})
		case a.State != store.AssignPending || len(x.runs) >= x.cfg.Capacity:
		case a.Cancel != "":
			x.report(a, call.Report{Error: cancelCause(a.Cancel).Error(), NotStarted: true})
		case !x.tasks[a.Task]:
			x.report(a, call.Report{Error: fmt.Sprintf("runcue: executor %s has no handler for task %q", x.cfg.ID, a.Task), NotStarted: true, Permanent: true})
		default:
			latest, ok := x.clock.LatestStart(a.StartBy, now)
			if !ok || now.After(x.trusted) {
				continue // not yet: no offset measured, or no lease trusted
			}
			if !a.StartBy.IsZero() && now.After(latest) {
				x.report(a, call.Report{Error: errLateRemote.Error(), NotStarted: true, Late: true})
				continue
			}
			x.launch(a)
		}
	}
	for id, r := range x.runs {
		if !current[id] {
			r.cancel(rt.ErrLeaseLost)
		}
	}
	for id := range x.ended {
		if !current[id] {
			delete(x.ended, id)
		}
	}
	return nil
}

// cancelCause is the cause a scheduler's CancelAssigned names.
func cancelCause(why string) error {
	switch why {
	case "timeout":
		return rt.ErrTimeout
	case "shutdown":
		return rt.ErrShutdown
	}
	return rt.ErrCancelled
}

// launch starts a's handler on a goroutine of its own. x.mu is held.
func (x *Loop) launch(a store.Assignment) {
	r := &execRun{a: a}
	r.ctx.Context, r.cancel = context.WithCancelCause(context.Background())
	if a.Timeout > 0 {
		r.ctx.Shown = x.cfg.Clock.Now().Add(a.Timeout)
	}
	x.runs[a.ID] = r
	x.wg.Add(1)
	go x.execute(r)
}

// execute runs r's handler and reports its start and its end.
func (x *Loop) execute(r *execRun) {
	defer x.wg.Done()
	a := r.a
	if a.Timeout > 0 {
		t := time.AfterFunc(a.Timeout, func() { r.ctx.Expire(); r.cancel(rt.ErrTimeout) })
		defer t.Stop()
	}
	x.mu.Lock()
	// The start gate, at the instant the handler starts: poll checked the
	// deadline when it launched the run, but the goroutine may start much
	// later on a loaded host, and a start past the deadline would count in
	// the scheduler's windows earlier than it happened (at StartBy).
	started := x.cfg.Clock.Now()
	if x.StartReading != nil {
		started = x.StartReading(started)
	}
	offset, unc, ok := x.clock.Estimate(started)
	latest, _ := x.clock.LatestStart(a.StartBy, started)
	if err := context.Cause(&r.ctx); err != nil || !ok || started.After(x.trusted) || (!a.StartBy.IsZero() && started.After(latest)) {
		e := call.Report{Error: errLateRemote.Error(), NotStarted: true, Late: true}
		if err != nil {
			e = call.Report{Error: err.Error(), NotStarted: true}
		}
		if x.runs[a.ID] == r {
			delete(x.runs, a.ID)
		}
		x.ended[a.ID] = a.Run
		x.report(a, e)
		x.mu.Unlock()
		r.cancel(nil)
		return
	}
	x.mu.Unlock()
	// The latest instant on the store's clock the start can have been.
	x.submit(&store.ReportStart{Executor: x.cfg.ID, ID: a.ID, Run: a.Run, At: started.Add(offset + unc)})
	u := &usage{now: func() time.Time {
		// On the handler's goroutine: the estimator is the loop's, which
		// sync updates under x.mu.
		t := x.cfg.Clock.Now()
		x.mu.Lock()
		off, _, _ := x.clock.Estimate(t)
		x.mu.Unlock()
		return t.Add(off) // on the store's clock
	}}
	out, err := call.Invoke(&r.ctx, func(ctx context.Context) (any, error) { return x.call(ctx, a, started, u) }, x.cfg.MaxPayload)
	e := call.ReportOf(err)
	e.Result, e.Used = out, u.take()
	e.Observations = u.takeObserved()
	r.cancel(nil)
	x.mu.Lock()
	if x.runs[a.ID] == r {
		delete(x.runs, a.ID)
	}
	x.ended[a.ID] = a.Run
	x.report(a, e)
	x.mu.Unlock()
}

// report writes a's end. A report for a run no longer assigned to this
// executor is refused by the store, and logged.
func (x *Loop) report(a store.Assignment, e call.Report) {
	b, err := json.Marshal(e)
	if err != nil {
		b, _ = json.Marshal(call.Report{Error: err.Error(), Permanent: true})
	}
	x.submit(&store.ReportEnd{Executor: x.cfg.ID, ID: a.ID, Run: a.Run, Ending: b})
}

// submit writes op, logging a refusal.
func (x *Loop) submit(op store.Op) {
	err := x.w.Submit(&writer.Request{Ops: []store.Op{op}, Done: func(res []store.Result, err error) {
		if err == nil {
			err = res[0].Err
		}
		if err != nil {
			x.log.Warn("runcue: executor report not stored", "executor", x.cfg.ID, "op", fmt.Sprintf("%T", op), "error", err)
		}
	}})
	if err != nil {
		x.log.Warn("runcue: executor report not stored", "executor", x.cfg.ID, "error", err)
	}
}

// shutdown cancels the handlers, waits for them, and removes the
// registration (its own: another process's of the ID is left alone).
func (x *Loop) shutdown() error {
	x.mu.Lock()
	for _, r := range x.runs {
		r.cancel(rt.ErrShutdown)
	}
	x.mu.Unlock()
	x.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := x.w.Do(ctx, &store.RemoveExecutor{ID: x.cfg.ID, Host: x.rec.Host, PID: x.rec.PID})
	return err
}

// usage is a remote run's Work reporter: it keeps the amounts the handler
// reports and what it observed of its services' limits, each with its
// instant on the store's clock (now), for the end's report; progress and
// heartbeats are not sent (the executor's own heartbeat keeps the lease).
type usage struct {
	mu       sync.Mutex
	now      func() time.Time
	used     map[string]int64
	observed []call.Observed
}

func (u *usage) Progress([]byte) {}
func (u *usage) Heartbeat()      {}
func (u *usage) Observe(o rt.Observation) {
	at := u.now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.observed) == call.MaxObservations {
		u.observed = append(u.observed[:0], u.observed[1:]...)
	}
	u.observed = append(u.observed, call.Observed{At: at, Observation: o})
}
func (u *usage) takeObserved() []call.Observed {
	u.mu.Lock()
	defer u.mu.Unlock()
	o := u.observed
	u.observed = nil
	return o
}
func (u *usage) Use(amounts rt.Costs) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for name, n := range amounts {
		if u.used == nil {
			u.used = make(map[string]int64, len(amounts))
		}
		u.used[name] = call.BoundUsed(n)
	}
}
func (u *usage) take() map[string]int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	used := u.used
	u.used = nil
	return used
}
