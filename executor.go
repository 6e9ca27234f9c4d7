package runcue

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/internal/execloop"
	"github.com/runcue/runcue/internal/ulid"
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
	l  *execloop.Loop
	id string
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

// NewExecutor returns an executor of the tasks named in tasks, working
// through st (which must implement store.ExecutorStore). Run runs it. Its
// handlers' Work has no Cue: an executor that submits follow-up work is
// made with Cue.Executor.
func NewExecutor(st store.Store, cfg ExecutorConfig, tasks map[string]Handler) (*Executor, error) {
	return newExecutor(st, cfg, tasks, nil)
}

// Executor returns an executor, working through c's store, of the tasks
// named in handlers, each registered in c as the scheduler registers it
// (Task with Remote set, and its Services, Estimate, ServiceKeys), and
// gives c to its handlers (Work.Cue): what they submit is costed by c's
// registered tasks (a follow-up's Estimate applies), and they read their
// dependencies' results with c.DependencyResults. c need not be started:
// in an executor's process it owns nothing and dispatches nothing. Run
// runs the executor; c must stay open while it runs.
func (c *Cue) Executor(cfg ExecutorConfig, handlers map[string]Handler) (*Executor, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	for name := range handlers {
		if t, ok := c.tasks[name]; !ok || !t.Remote {
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: task %q is not registered in this Cue as a remote task (Task.Remote), as the scheduler registers it", ErrInvalid, name)
		}
	}
	c.mu.Unlock()
	if cfg.Logger == nil {
		cfg.Logger = c.log
	}
	if cfg.Clock == nil {
		cfg.Clock = c.clock
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = c.cfg.MaxPayload
	}
	if cfg.MaxStartDelay == 0 {
		cfg.MaxStartDelay = c.cfg.MaxStartDelay
	}
	return newExecutor(c.st, cfg, handlers, c)
}

func newExecutor(st store.Store, cfg ExecutorConfig, tasks map[string]Handler, cue *Cue) (*Executor, error) {
	if _, ok := st.(store.ExecutorStore); !ok {
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
	names := make([]string, 0, len(tasks))
	for name := range tasks {
		names = append(names, name)
	}
	slices.Sort(names)
	call := func(ctx context.Context, a store.Assignment, started time.Time, rep call.Reporter) (any, error) {
		w := &Work{ID: a.ID, Task: a.Task, Target: a.Target, Params: a.Params, Attempt: a.Run, Started: started, run: rep, cue: cue}
		return tasks[a.Task](withWork(ctx, w), w)
	}
	set := execloop.Settings{ID: cfg.ID, Capacity: cfg.Capacity, PollInterval: cfg.PollInterval, MaxStartDelay: cfg.MaxStartDelay,
		Heartbeat: cfg.Heartbeat, TTL: cfg.TTL, ClockSync: cfg.ClockSync, MaxPayload: cfg.MaxPayload, Logger: cfg.Logger, Clock: cfg.Clock}
	return &Executor{l: execloop.New(st, set, names, call), id: cfg.ID}, nil
}

// ID returns the executor's name in the store.
func (x *Executor) ID() string { return x.id }

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
func (x *Executor) Run(ctx context.Context) error { return x.l.Run(ctx) }
