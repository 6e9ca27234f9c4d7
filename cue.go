package runcue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/hub"
	"github.com/runcue/runcue/internal/ulid"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// Cue coordinates work units: it stores them, dispatches them to their
// handlers within the limits of their services, and reports every change as
// an event.
//
// Any number of Cues, in any number of processes, may open the same
// database to submit and inspect work; one at a time owns it (Start) and
// runs the work. A Cue is safe for simultaneous use by multiple goroutines.
type Cue struct {
	// Set by New and never changed: any goroutine reads them.
	cfg       Config
	st        store.Store
	ownsStore bool
	clock     clock.Clock
	log       *slog.Logger
	w         *writer.Writer // safe for concurrent use
	sw        *writer.Writer // the starts logged ahead (store.StartLogger), or nil
	hub       *hub.Hub       // safe for concurrent use
	acked     broadcast      // notified by Ack; Drain waits on it
	ids       ulid.Generator // safe for concurrent use

	// mu guards the registrations and the lifecycle below; the engine
	// never takes it (it gets registration snapshots).
	mu         sync.Mutex
	tasks      map[string]*Task
	services   map[string]Service
	knownTasks map[string]bool // registered here or in the database
	closed     bool
	running    *dispatcher // the current or last run
	stopAfter  func() bool // unregisters the Start ctx watcher
	// loop is set while a Start's ownership goroutine runs (it runs the
	// engine, waits for ownership when it has none, and competes again
	// when it loses it); Stop closes its stop channel and waits for it.
	loop *ownerLoop

	disp atomic.Pointer[dispatcher] // the running engine, nil when stopped (any goroutine)

	// mach is what the engines share: telemetry, counters, test hooks
	// (adapter.go).
	mach machinery
	bg   sync.WaitGroup // the OnBackpressure caller

	health health // Status (health.go)
}

// Open opens (creating if needed) the SQLite database at path, with
// package sqlite's default options, and migrates its schema. It does not
// take ownership: any number of Cues may open one database to submit and
// inspect work, and Start makes one of them run it. For other options
// (sqlite.Options: durability, file mode) open the store and pass it to
// New.
func Open(path string, cfg Config) (*Cue, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		return nil, err
	}
	c, err := New(st, cfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	c.ownsStore = true
	return c, nil
}

// New returns a Cue on an open store: a SQLite store opened with options of
// its own (sqlite.Open), or another backend. Close does not close st; close
// it after the Cue.
func New(st store.Store, cfg Config) (*Cue, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ctx := context.Background()
	last, err := st.LastSeq(ctx)
	if err != nil {
		return nil, fmt.Errorf("runcue: read event log: %w", err)
	}
	stored, err := st.Tasks(ctx)
	if err != nil {
		return nil, fmt.Errorf("runcue: read tasks: %w", err)
	}
	c := &Cue{
		cfg: cfg, st: st, clock: cfg.Clock, log: cfg.Logger,
		tasks: make(map[string]*Task), services: make(map[string]Service), knownTasks: make(map[string]bool),
	}
	for name := range stored {
		c.knownTasks[name] = true
	}
	c.health.role, c.health.since = RoleClient, cfg.Clock.Now()
	c.hub = hub.New(st, cfg.EventBuffer, last)
	var txTimeout time.Duration
	if t, ok := st.(store.TxTimeouter); ok {
		txTimeout = t.TxTimeout()
	}
	c.w = writer.New(writer.Settings{
		Store: st, Clock: cfg.Clock, Poll: cfg.PollInterval, LastSeq: last, TxTimeout: txTimeout,
		Hooks: writer.Hooks{Publish: c.publish, Failed: c.storeFailed, Outage: c.storeOutage, Recovered: c.storeRecovered},
	})
	if _, ok := st.(store.StartLogger); ok {
		// Starts logged ahead of their claims, beside the writer's turns
		// (engine.Deps.Starts).
		c.sw = writer.New(writer.Settings{Store: st, Clock: cfg.Clock, TxTimeout: txTimeout})
	}
	// After the writer: the metrics' callback reads its stats.
	if err := c.newMachinery(); err != nil {
		c.w.Close()
		if c.sw != nil {
			c.sw.Close()
		}
		c.hub.Close()
		return nil, fmt.Errorf("runcue: telemetry: %w", err)
	}
	if f := cfg.OnBackpressure; f != nil {
		evs := hub.Subscribe(context.Background(), c.hub, hub.Options{After: -1, Buffer: 4, Accept: func(e *store.Event) bool {
			return e.Type == string(EventBackpressureActive) || e.Type == string(EventBackpressureCleared)
		}}, eventFrom)
		c.bg.Go(func() {
			for ev := range evs { // ends when the hub closes
				f(ev.Type == EventBackpressureActive, ev.Queued)
			}
		})
	}
	return c, nil
}

// publish runs on the writer goroutine after each commit.
func (c *Cue) publish(evs []store.Event, external bool) {
	c.hub.Publish(evs)
	if external {
		if d := c.disp.Load(); d != nil {
			d.external(evs)
		}
	}
}

func (c *Cue) storeFailed(err error) {
	now := c.clock.Now()
	c.health.setErr(err, now)
	c.health.setRole(RoleFailed, "", now)
	c.log.Error("runcue: store failed; dispatching stopped", "error", err, "fault", store.FaultOf(c.st, err).String())
	c.hub.Publish([]store.Event{{Type: store.TypeStoreFailed, Time: c.clock.Now(),
		Data: store.EventData{Error: err.Error(), ErrorKind: "store"}.Encode()}})
	if d := c.disp.Load(); d != nil {
		d.storeFailed(err)
	}
}

// inserted tells the running dispatcher about units this Cue committed,
// and about the units the insert ended (dropped for room, or failed because
// a dependency was dead).
func (c *Cue) inserted(units []*store.Unit, r store.Result) {
	d := c.disp.Load()
	if d == nil {
		return
	}
	var fresh []*store.Unit
	for i, iu := range r.Units {
		if !iu.Duplicate && iu.Refused == nil && iu.State == store.Queued {
			fresh = append(fresh, units[i])
		}
	}
	var ended []store.Event
	for _, ev := range r.Events {
		if ev.Type != store.TypeWorkQueued {
			ended = append(ended, ev)
		}
	}
	if len(fresh) > 0 || len(ended) > 0 {
		d.inserted(fresh, ended)
	}
}

// readErr maps the failure of a store read made while the Cue was closing
// to ErrClosed; other failures pass unchanged.
func (c *Cue) readErr(err error) error {
	if err != nil && c.checkOpen() != nil {
		return ErrClosed
	}
	return err
}

func (c *Cue) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// Start takes ownership of the database and begins dispatching; it returns
// at once. If another Cue owns the database, in this process or another,
// Start returns a *LockedError (ErrLocked). With Config.Standby, Start
// returns at once and a goroutine of the Cue's takes ownership, at once
// or as soon as it can. Units the previous owner left running are
// requeued first (work_recovered).
//
// A Cue that loses ownership once started (its lease not renewed in time
// through a database outage, another Cue took over) stops dispatching and
// cancels its handlers, then waits for the database and competes for
// ownership again, as a standby does; the runs it saw end meanwhile are
// requeued at once when it takes over again. Only a fatal store error
// (see docs/resilience.md) or Stop ends that. Status tells which it is
// doing.
//
// Cancelling ctx is the same as calling StopAndCancel. Calling Start on a
// running (or waiting) Cue does nothing.
func (c *Cue) Start(ctx context.Context) error {
	// c.mu is not held across the store's I/O (taking ownership, reading
	// services, recovery): other methods go on meanwhile. Ownership itself
	// keeps two Starts apart: the second gets ErrLocked.
	if err := c.startable(); err != nil || c.isRunning() {
		return err
	}
	var d *dispatcher
	if !c.cfg.Standby {
		holder := c.holder()
		own, err := c.st.Acquire(ctx, holder)
		if err != nil {
			return err
		}
		if d, err = c.begin(ctx, holder.Owner, own, nil); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loop != nil {
		// A concurrent Start won. Ownership keeps two engines apart, so d
		// is nil here; were it not, it would run unwatched: stop it.
		if d != nil {
			d.stop(true)
		}
		return nil
	}
	l := &ownerLoop{stop: make(chan struct{}), done: make(chan struct{})}
	c.loop = l
	c.stopAfter = context.AfterFunc(ctx, func() {
		_ = c.StopAndCancel(context.Background())
	})
	if d == nil {
		c.health.setRole(RoleStandby, "", c.clock.Now())
	}
	go c.own(l, d)
	return nil
}

// holder names a new owner: this host and process, and a unique lease name.
func (c *Cue) holder() store.Holder {
	now := c.clock.Now()
	host, _ := os.Hostname()
	return store.Holder{Owner: fmt.Sprintf("%s:%d:%s", host, os.Getpid(), c.ids.New(now)), PID: os.Getpid(), Host: host, Since: now}
}

// begin starts the engine of an owner that took ownership (own): it reads
// the stored services and pauses, recovers (requeueing ended, the runs an
// earlier engine of this Cue saw end) and starts the dispatcher. On an
// error it releases own.
func (c *Cue) begin(ctx context.Context, owner string, own store.Ownership, ended []store.RunRef) (*dispatcher, error) {
	stored, err := c.st.Services(ctx)
	if err != nil {
		own.Release()
		return nil, err
	}
	pauses, err := c.st.Pauses(ctx)
	if err != nil {
		own.Release()
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		own.Release()
		return nil, ErrClosed
	}
	// The snapshot and the dispatcher's publication happen under one lock
	// hold, so a registration is in the snapshot or reaches d as a message.
	d := c.newEngine(owner, own, stored, pauses, ended)
	c.disp.Store(d) // from here on, commits and registrations reach d's inbox
	c.mu.Unlock()
	err = d.recover(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.closed {
		err = ErrClosed
	}
	if err != nil {
		c.disp.Store(nil)
		own.Release()
		return nil, err
	}
	c.running = d
	d.run()
	c.log.Info("runcue: started", "owner", owner)
	c.health.setRole(RoleOwner, owner, c.clock.Now())
	return d, nil
}

// acquireTimeout bounds an attempt of the ownership goroutine to take
// ownership (a database cut off without a word would hold it until TCP
// gave up).
const acquireTimeout = 10 * time.Second

// ownerLoop is a started Cue's ownership goroutine (see Start).
type ownerLoop struct {
	stop chan struct{} // closed by Stop
	done chan struct{} // closed when the goroutine returns
}

// own is the ownership goroutine of a started Cue: it waits for d, the
// engine Start began (nil for a standby, which has none yet), to end; then,
// unless Stop ended it or the store failed for good, it tries to take
// ownership at once and then every PollInterval, runs the engine when it
// has, and waits again when the engine ends (deposed: its lease lost or
// another Cue took over), until Stop.
func (c *Cue) own(l *ownerLoop, d *dispatcher) {
	defer close(l.done)
	waiting, said := c.clock.Now(), false
	var ended []store.RunRef
	for {
		if d != nil {
			select {
			case <-l.stop:
				return // Stop stops d
			case <-d.done():
			}
			werr := c.w.Err()
			why := d.lostWhy(werr)
			ended = append(ended[:0], d.endedRuns()...)
			c.ownershipChanged(d.owner(), true, why)
			if werr != nil {
				// The store failed for good: this Cue cannot own the
				// database any more (Close, and open a new Cue).
				c.log.Error("runcue: the store failed; this Cue no longer takes ownership", "error", werr)
				return
			}
			waiting, said, d = c.clock.Now(), false, nil
			c.log.Info("runcue: ownership lost: this Cue competes for it again", "owner", c.health.status().Owner, "ended_runs", len(ended))
		}
		// On the Cue's clock, as its writer polls.
		t := c.clock.NewTimer(c.cfg.PollInterval)
		select {
		case <-l.stop:
			t.Stop()
			return
		case <-t.C():
		}
		if err := c.w.Err(); err != nil {
			c.log.Error("runcue: the store failed; this Cue no longer takes ownership", "error", err)
			return
		}
		holder := c.holder()
		actx, cancel := context.WithTimeout(context.Background(), acquireTimeout)
		own, err := c.st.Acquire(actx, holder)
		cancel()
		if err != nil {
			now := c.clock.Now()
			if errors.Is(err, store.ErrLocked) {
				c.health.setRole(RoleStandby, "", now)
				if !said {
					c.log.Info("runcue: another Cue owns the database: this one waits as a standby")
					said = true
				}
			} else {
				c.health.setRole(RoleWaiting, "", now)
				c.health.setErr(err, now)
				if !said {
					c.log.Warn("runcue: cannot take ownership: waiting for the database", "error", err)
					said = true
				}
			}
			continue
		}
		if d, err = c.begin(context.Background(), holder.Owner, own, ended); err != nil {
			c.log.Warn("runcue: start after taking ownership", "error", err)
			d = nil
			continue
		}
		ended = nil
		c.ownershipChanged(holder.Owner, false, nil)
		c.log.Info("runcue: took ownership", "owner", holder.Owner, "waited", c.clock.Now().Sub(waiting))
	}
}

// startable reports why Start may not start now (closed, a run still
// stopping, a failed store), or nil.
func (c *Cue) startable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.running != nil {
		select {
		case <-c.running.done():
		default:
			if c.running.stopping() {
				return ErrStopping
			}
		}
	}
	return wrapStoreErr(c.w.Err())
}

// isRunning reports whether a dispatcher runs (Start then does nothing).
func (c *Cue) isRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loop != nil {
		return true // owning, or waiting for ownership
	}
	if c.running == nil {
		return false
	}
	select {
	case <-c.running.done():
		return false
	default:
		return true
	}
}

// Stop stops dispatching and waits for running handlers to return and their
// outcomes to be stored; then it releases ownership. If ctx ends first,
// Stop returns ctx's error and the Cue goes on stopping in the background.
// Stop on a Cue that is not running returns nil.
func (c *Cue) Stop(ctx context.Context) error {
	return c.stop(ctx, false)
}

// StopAndCancel is Stop that also cancels running handlers' contexts (cause
// ErrShutdown). Runs that end with an error because of it return their
// units to the queue without spending retry budget.
func (c *Cue) StopAndCancel(ctx context.Context) error {
	return c.stop(ctx, true)
}

func (c *Cue) stop(ctx context.Context, cancel bool) error {
	c.mu.Lock()
	if c.stopAfter != nil {
		c.stopAfter()
		c.stopAfter = nil
	}
	l := c.loop
	c.loop = nil
	c.mu.Unlock()
	if l != nil {
		// No more takeovers; a Start in progress in the loop ends first,
		// so that its engine (c.running) is the one stopped below.
		close(l.stop)
		select {
		case <-l.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.mu.Lock()
	d := c.running
	c.mu.Unlock()
	if d == nil {
		if l != nil {
			c.health.setRole(RoleClient, "", c.clock.Now())
		}
		return nil
	}
	d.stop(cancel)
	select {
	case <-d.done():
		c.health.setRole(RoleClient, "", c.clock.Now())
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the Cue if it is running (cancelling handlers and waiting up
// to Config.ShutdownTimeout for them), commits what is pending and releases
// the database. Handlers still running after that are abandoned: their
// units stay running in the database and the next owner requeues them.
// Close is idempotent.
func (c *Cue) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	err := c.StopAndCancel(ctx)
	cancel()
	c.mu.Lock()
	c.closed = true
	d := c.running
	c.mu.Unlock()
	if err != nil && d != nil {
		// Handlers ignore their contexts: abandon them.
		d.abandon()
		<-d.done()
	}
	c.w.Close()
	if c.sw != nil {
		c.sw.Close()
	}
	c.hub.Close()
	c.bg.Wait()
	c.mach.tel.Close()
	var errs []error
	if c.ownsStore {
		errs = append(errs, c.st.Close())
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("runcue: close: handlers did not stop within %v: %w", c.cfg.ShutdownTimeout, err))
	}
	return errors.Join(errs...)
}
