package runcue

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

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/clocksync"
	"github.com/runcue/runcue/internal/ulid"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// An Executor runs the handlers of remote tasks (Task.Remote) for the Cue
// that owns the database, in another process or on another host. It
// registers the tasks it runs and its capacity, reads the runs the
// scheduler assigns it, starts each handler no later than its start
// deadline (on the store's clock, less this host's offset uncertainty,
// checked with the reading of the clock that is the handler's start
// instant; a run it cannot start in time it reports as a late start, and
// the scheduler requeues it, nothing run), reports each start and each end
// through the store, and keeps its runs' leases alive with its heartbeat.
// Its leases survive the scheduler: a standby that takes over adopts its
// runs. A report for a run the scheduler has since ended or requeued is
// refused (store.ErrStaleRun): an executor frozen past its lease stores
// nothing when it resumes, and it starts no handler while it cannot know
// its lease holds (no heartbeat written within TTL*2/3). A process that
// takes the name of one that died reports lost, unrun, the runs assigned
// to the name before it registered: the other may have started one before
// its start report committed; the scheduler requeues them, each counted
// as if it ran.
type Executor struct {
	cfg   ExecutorConfig
	st    store.Store
	es    store.ExecutorStore
	tasks map[string]Handler
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
	// startReading, set by tests, replaces the clock's reading that is a
	// handler's start instant (a clock that jumped, a goroutine delayed).
	startReading func(time.Time) time.Time
}

// ExecutorConfig configures an Executor. Zero fields take their defaults.
type ExecutorConfig struct {
	// ID names the executor in the store; default host:pid:unique.
	ID string
	// Capacity is how many handlers it runs at once. Default 4.
	Capacity int
	// PollInterval is how often it reads its assignments (also at the
	// store's notifications, PostgreSQL's). Default 100ms; it must be at
	// most a quarter of MaxStartDelay, or a run could wait for the poll
	// past its start deadline.
	PollInterval time.Duration
	// MaxStartDelay is the scheduler's Config.MaxStartDelay. Default the
	// same as Config's.
	MaxStartDelay time.Duration
	// Heartbeat is how often it records that it lives; TTL how long after
	// its last heartbeat the scheduler counts it gone and requeues its
	// runs. Defaults 1s and 10s; TTL at least three heartbeats.
	Heartbeat, TTL time.Duration
	// ClockSync is how often it measures its offset to the store's clock.
	// Default 10s.
	ClockSync time.Duration
	// MaxPayload bounds a result's JSON. Default Config's.
	MaxPayload int
	// Logger, default slog.Default().
	Logger *slog.Logger
	// Clock is the executor's wall clock (default the system's): its
	// offset to the store's clock is measured, whatever it reads.
	Clock clock.Clock
}

// execRun is a run this executor holds.
type execRun struct {
	a      store.Assignment
	cancel context.CancelCauseFunc
	ctx    runCtx
}

// remoteEnding is an executor's report of a run's end (store.ReportEnd's
// JSON), read by the scheduler (remote.go: endingOf).
type remoteEnding struct {
	Error      string           `json:"error,omitempty"`
	Result     json.RawMessage  `json:"result,omitempty"`
	NotStarted bool             `json:"not_started,omitempty"`
	Late       bool             `json:"late,omitempty"`
	Lost       bool             `json:"lost,omitempty"`
	Permanent  bool             `json:"permanent,omitempty"`
	Overload   bool             `json:"overload,omitempty"`
	Skip       *string          `json:"skip,omitempty"`
	RetryAfter *int64           `json:"retry_after_ms,omitempty"`
	Services   []string         `json:"services,omitempty"`
	Timeout    bool             `json:"timeout,omitempty"`
	Panic      bool             `json:"panic,omitempty"`
	Used       map[string]int64 `json:"used,omitempty"`
}

// errLateRemote is the error of a run its executor could not start by its
// start deadline.
var errLateRemote = errors.New("runcue: the executor could not start the handler by its start deadline")

// ErrLeaseLost is the cause an executor cancels a handler with when its
// run is no longer assigned to it (the scheduler requeued or ended it).
var ErrLeaseLost = errors.New("runcue: the run's lease was lost")

// NewExecutor returns an executor of the tasks named in tasks, working
// through st (which must implement store.ExecutorStore). Run runs it.
func NewExecutor(st store.Store, cfg ExecutorConfig, tasks map[string]Handler) (*Executor, error) {
	es, ok := st.(store.ExecutorStore)
	if !ok {
		return nil, fmt.Errorf("%w: the store has no executors (store.ExecutorStore)", ErrInvalid)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("%w: an executor needs at least one task", ErrInvalid)
	}
	for name, h := range tasks {
		if err := validName("task", name); err != nil {
			return nil, err
		}
		if h == nil {
			return nil, fmt.Errorf("%w: task %q has no handler", ErrInvalid, name)
		}
	}
	def := Config{}.withDefaults()
	orDefault(&cfg.Capacity, 4)
	orDefault(&cfg.PollInterval, 100*time.Millisecond)
	orDefault(&cfg.MaxStartDelay, def.MaxStartDelay)
	orDefault(&cfg.Heartbeat, time.Second)
	orDefault(&cfg.TTL, 10*time.Second)
	orDefault(&cfg.ClockSync, 10*time.Second)
	orDefault(&cfg.MaxPayload, def.MaxPayload)
	switch {
	case cfg.PollInterval > cfg.MaxStartDelay/4:
		return nil, fmt.Errorf("%w: PollInterval %v is not well inside MaxStartDelay %v (at most a quarter of it)", ErrInvalid, cfg.PollInterval, cfg.MaxStartDelay)
	case cfg.TTL < 3*cfg.Heartbeat:
		return nil, fmt.Errorf("%w: TTL %v is less than three heartbeats (%v)", ErrInvalid, cfg.TTL, cfg.Heartbeat)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		var g ulid.Generator
		cfg.ID = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), g.New(cfg.Clock.Now()))
	}
	return &Executor{cfg: cfg, st: st, es: es, tasks: tasks, log: cfg.Logger, runs: map[string]*execRun{}, ended: map[string]int{}}, nil
}

// ID returns the executor's name in the store.
func (x *Executor) ID() string { return x.cfg.ID }

// Run registers the executor and runs the handlers assigned to it until
// ctx ends; then it takes no more runs, cancels its handlers (cause
// ErrShutdown), waits for them and reports their ends, and removes its
// registration. It returns an error only if the store fails for good (a
// fatal error, see docs/resilience.md).
//
// Through an outage of the store (a restart, a failover, a lost
// connection) it goes on: its handlers run on, their reports wait in its
// writer and are stored once the store answers (a report of a run the
// scheduler requeued meanwhile is refused by its run number), and no run
// starts until a heartbeat is stored again. While another live process
// (another host or PID) is registered under its ID, it waits, running
// nothing: two processes never run one ID's runs.
func (x *Executor) Run(ctx context.Context) error {
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
			time.Sleep(coalesce) // the assignments of that moment, in one read
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
func (x *Executor) trust(sent time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.trusted = sent.Add(x.cfg.TTL * 2 / 3)
}

// sync measures this host's offset to the store's clock.
func (x *Executor) sync(ctx context.Context) error {
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
func (x *Executor) poll(ctx context.Context) error {
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
			r.cancel(ErrLeaseLost) // an earlier run, requeued and assigned again
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
			x.report(a, remoteEnding{Error: ErrExecutorLost.Error(), Lost: true})
		case a.State != store.AssignPending || len(x.runs) >= x.cfg.Capacity:
		case a.Cancel != "":
			x.report(a, remoteEnding{Error: cancelCause(a.Cancel).Error(), NotStarted: true})
		case x.tasks[a.Task] == nil:
			x.report(a, remoteEnding{Error: fmt.Sprintf("runcue: executor %s has no handler for task %q", x.cfg.ID, a.Task), NotStarted: true, Permanent: true})
		default:
			latest, ok := x.clock.LatestStart(a.StartBy, now)
			if !ok || now.After(x.trusted) {
				continue // not yet: no offset measured, or no lease trusted
			}
			if !a.StartBy.IsZero() && now.After(latest) {
				x.report(a, remoteEnding{Error: errLateRemote.Error(), NotStarted: true, Late: true})
				continue
			}
			x.launch(a)
		}
	}
	for id, r := range x.runs {
		if !current[id] {
			r.cancel(ErrLeaseLost)
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
		return ErrTimeout
	case "shutdown":
		return ErrShutdown
	}
	return ErrCancelled
}

// launch starts a's handler on a goroutine of its own. x.mu is held.
func (x *Executor) launch(a store.Assignment) {
	r := &execRun{a: a}
	r.ctx.Context, r.cancel = context.WithCancelCause(context.Background())
	if a.Timeout > 0 {
		r.ctx.deadline = x.cfg.Clock.Now().Add(a.Timeout)
	}
	x.runs[a.ID] = r
	x.wg.Add(1)
	go x.execute(r)
}

// execute runs r's handler and reports its start and its end.
func (x *Executor) execute(r *execRun) {
	defer x.wg.Done()
	a := r.a
	w := &Work{ID: a.ID, Task: a.Task, Target: a.Target, Params: a.Params, Attempt: a.Run}
	if a.Timeout > 0 {
		t := time.AfterFunc(a.Timeout, func() { r.ctx.expired.Store(true); r.cancel(ErrTimeout) })
		defer t.Stop()
	}
	x.mu.Lock()
	// The start gate, at the instant the handler starts: poll checked the
	// deadline when it launched the run, but the goroutine may start much
	// later on a loaded host, and a start past the deadline would count in
	// the scheduler's windows earlier than it happened (at StartBy).
	w.Started = x.cfg.Clock.Now()
	if x.startReading != nil {
		w.Started = x.startReading(w.Started)
	}
	offset, unc, ok := x.clock.Estimate(w.Started)
	latest, _ := x.clock.LatestStart(a.StartBy, w.Started)
	if err := context.Cause(&r.ctx); err != nil || !ok || w.Started.After(x.trusted) || (!a.StartBy.IsZero() && w.Started.After(latest)) {
		e := remoteEnding{Error: errLateRemote.Error(), NotStarted: true, Late: true}
		if err != nil {
			e = remoteEnding{Error: err.Error(), NotStarted: true}
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
	x.submit(&store.ReportStart{Executor: x.cfg.ID, ID: a.ID, Run: a.Run, At: w.Started.Add(offset + unc)})
	u := &usage{}
	w.run = u
	res, err := callHandler(&r.ctx, x.tasks[a.Task], w)
	var out []byte
	if err == nil {
		if out, err = json.Marshal(res); err != nil {
			err = Permanent(fmt.Errorf("runcue: encode result: %w", err))
		} else if len(out) > x.cfg.MaxPayload {
			out, err = nil, Permanent(fmt.Errorf("runcue: result of %d bytes exceeds MaxPayload (%d)", len(out), x.cfg.MaxPayload))
		}
	}
	e := endingFor(err)
	e.Result, e.Used = out, u.take()
	r.cancel(nil)
	x.mu.Lock()
	if x.runs[a.ID] == r {
		delete(x.runs, a.ID)
	}
	x.ended[a.ID] = a.Run
	x.report(a, e)
	x.mu.Unlock()
}

// endingFor describes a handler's error as the scheduler classifies it.
func endingFor(err error) remoteEnding {
	var e remoteEnding
	if err == nil {
		return e
	}
	e.Error = err.Error()
	e.Permanent, e.Overload = errors.Is(err, ErrPermanent), errors.Is(err, ErrOverloaded)
	if reason, ok := skipOf(err); ok {
		e.Skip = &reason
	} else if delay, services, ok := retryAfterOf(err); ok {
		ms := delay.Milliseconds()
		e.RetryAfter, e.Services = &ms, services
	} else if errors.Is(err, ErrTimeout) {
		e.Timeout = true
	} else if errors.Is(err, ErrPanic) {
		e.Panic = true
	}
	return e
}

// report writes a's end. A report for a run no longer assigned to this
// executor is refused by the store, and logged.
func (x *Executor) report(a store.Assignment, e remoteEnding) {
	b, err := json.Marshal(e)
	if err != nil {
		b, _ = json.Marshal(remoteEnding{Error: err.Error(), Permanent: true})
	}
	x.submit(&store.ReportEnd{Executor: x.cfg.ID, ID: a.ID, Run: a.Run, Ending: b})
}

// submit writes op, logging a refusal.
func (x *Executor) submit(op store.Op) {
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
func (x *Executor) shutdown() error {
	x.mu.Lock()
	for _, r := range x.runs {
		r.cancel(ErrShutdown)
	}
	x.mu.Unlock()
	x.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := x.w.Do(ctx, &store.RemoveExecutor{ID: x.cfg.ID, Host: x.rec.Host, PID: x.rec.PID})
	return err
}

// usage is a remote run's Work reporter: it keeps the amounts the handler
// reports for the end; progress, heartbeats and observations are not sent
// (the executor's own heartbeat keeps the lease).
type usage struct {
	mu   sync.Mutex
	used map[string]int64
}

func (u *usage) progress([]byte)     {}
func (u *usage) heartbeat()          {}
func (u *usage) observe(Observation) {}
func (u *usage) use(amounts Costs) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for name, n := range amounts {
		if u.used == nil {
			u.used = make(map[string]int64, len(amounts))
		}
		u.used[name] = boundUsed(n)
	}
}
func (u *usage) take() map[string]int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	used := u.used
	u.used = nil
	return used
}
