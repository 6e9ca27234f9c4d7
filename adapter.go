package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/internal/engine"
	"github.com/runcue/runcue/internal/local"
	"github.com/runcue/runcue/internal/recur"
	"github.com/runcue/runcue/internal/remote"
	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// The adapter: with runner.go, the only files of this package that know
// internal/engine. They turn the user's vocabulary (Config, Task, Service,
// the callbacks) into the engine's, start the engine, and turn what it
// reports back into this package's types.

// machinery is the part of a Cue that serves its engines: telemetry, the
// counters and the test hooks. Set by New (hooks: by tests, before Start)
// and read-only after; the counters and instruments are safe for
// concurrent use.
type machinery struct {
	tel   *engine.Telemetry
	stats engine.Counters
	hooks engine.Hooks
	// ready is tel once made: the writer's hooks may run before.
	ready atomic.Pointer[engine.Telemetry]
}

// countOutage counts an outage of the store (a metric).
func (c *Cue) countOutage() {
	if t := c.mach.ready.Load(); t != nil {
		t.Outage()
	}
}

// countOwnership counts a change of ownership, "taken" or "lost".
func (c *Cue) countOwnership(change string) {
	if t := c.mach.ready.Load(); t != nil {
		t.OwnershipChanged(change)
	}
}

// lostWhy is why d, an engine that ended without Stop, lost ownership;
// werr is the writer's fatal failure, if any.
func (d *dispatcher) lostWhy(werr error) error {
	if werr != nil {
		return werr
	}
	if d.e.Deposed() {
		return store.ErrNotOwner
	}
	return errors.New("runcue: the engine stopped")
}

// endedRuns: see engine.Engine.EndedRuns.
func (d *dispatcher) endedRuns() []store.RunRef { return d.e.EndedRuns() }

// newMachinery makes c's telemetry; only the owner reports the queue.
func (c *Cue) newMachinery() error {
	var err error
	c.mach.tel, err = engine.NewTelemetry(c.cfg.MeterProvider, c.cfg.TracerProvider, func() (int64, int64, bool) {
		if d := c.disp.Load(); d != nil {
			q, unloaded := d.e.Queued()
			return q, unloaded, true
		}
		return 0, 0, false
	}, func() (int64, time.Duration) {
		n, _, busy := c.w.Stats()
		return n, busy
	})
	if err == nil {
		c.mach.tel.Unavailable = func() bool { _, _, out := c.w.Outage(); return out }
		c.mach.ready.Store(c.mach.tel)
	}
	return err
}

// dispatcher is a running engine, as the Cue's methods see it. Every
// method is safe for concurrent use; a question's ok is false when the
// engine exited before answering.
type dispatcher struct {
	e *engine.Engine
	// remote runs the remote tasks' runs (nil: the store has no executors).
	remote *remote.Runner
	// sched runs the stored schedules while the engine runs; finished
	// closes once both have ended.
	sched    *recur.Loop
	finished chan struct{}
	// questions holds the questions other processes ask (nil: the store
	// carries none); they are read every poll.
	questions store.Questioner
	poll      time.Duration
}

// startEngine makes the engine of an owner that took ownership (own):
// stored are the services' stored records, pauses the stored pauses. The
// caller holds c.mu (the registration snapshot and the publication of the
// engine are one step) and then calls recover.
func (c *Cue) newEngine(owner string, own store.Ownership, stored []store.ServiceRecord, pauses store.Pauses, ended []store.RunRef) *dispatcher {
	cfg := c.cfg
	ecfg := engine.Settings{
		MaxConcurrent: cfg.MaxConcurrent, MaxUncommitted: cfg.MaxUncommitted, MaxPayload: cfg.MaxPayload,
		MaxQueued: cfg.MaxQueued, FeedLowWater: cfg.FeedLowWater, LoadAhead: cfg.LoadAhead,
		DefaultTimeout: cfg.DefaultTimeout, LeaseBuffer: cfg.LeaseBuffer, MaxStartDelay: cfg.MaxStartDelay,
		EventRetention: cfg.EventRetention, SubscriptionRetention: cfg.SubscriptionRetention,
		QueueStatusInterval: cfg.QueueStatusInterval, CancelGrace: cfg.CancelGrace, Retention: cfg.Retention,
		DependencyRecheck: cfg.DependencyRecheck, PriorityTTL: cfg.PriorityTTL, CallbackTimeout: cfg.CallbackTimeout,
		FeedInterval: cfg.FeedInterval, StatsKeys: StatsKeys, DrainOnSpentBudget: cfg.DrainOnSpentBudget,
		Rand: cfg.Rand, Clock: cfg.Clock, Log: cfg.Logger, Ended: ended,
	}
	if f := cfg.Priority; f != nil {
		ecfg.Priority = func(in engine.PriorityInput) float64 {
			return f(PriorityContext{Work: workOf(in.Unit), QueueDepth: in.QueueDepth, ServicePressure: in.ServicePressure, WaitTime: in.WaitTime})
		}
	}
	if f := cfg.DependencySatisfied; f != nil {
		ecfg.DependencySatisfied = f
	}
	if f := cfg.Feed; f != nil {
		ecfg.Feed = func(ctx context.Context, want int) error {
			subs, err := f(ctx, want)
			switch {
			case errors.Is(err, ErrFeedExhausted):
				return engine.ErrFeedExhausted
			case err != nil:
				return err
			case len(subs) == 0:
				return engine.ErrFeedEmpty
			}
			_, err = c.SubmitBatch(ctx, subs)
			return err
		}
	}
	d := &dispatcher{finished: make(chan struct{}), poll: c.cfg.PollInterval}
	d.questions, _ = c.st.(store.Questioner)
	epoch := own.Epoch()
	d.sched = recur.NewLoop(recur.Deps{Clock: c.clock, Load: c.st.Schedules, Log: c.log,
		Fire: func(ctx context.Context, f recur.Firing) (store.Result, error) { return c.fire(ctx, epoch, f) }})
	if _, ok := c.st.(store.ExecutorStore); ok {
		d.remote = remote.New(remote.Deps{Store: c.st, Writer: c.w, Clock: c.clock, Log: c.log,
			PollInterval: c.cfg.PollInterval, MaxStartDelay: c.cfg.MaxStartDelay})
	}
	d.e = engine.New(ecfg, engine.Deps{
		Store: c.st, Writer: c.w, Starts: c.sw, Hub: c.hub, Tel: c.mach.tel, Stats: &c.mach.stats, Hooks: c.mach.hooks,
		UnitRetry: func(raw []byte) (engine.RetryPolicy, error) {
			p, err := decodeRetry(raw)
			return retryOf(p), err
		},
		Encode:        encodeReport,
		ReportOrphans: c.reportOrphans,
		Detach:        func(*engine.Engine) { c.disp.CompareAndSwap(d, nil) },
	}, owner, own, stored, pauses, c.registry(d.remote))
	if d.remote != nil {
		d.remote.Bind(d.e)
	}
	return d
}

// registry copies the registrations for the engine; the caller holds c.mu.
func (c *Cue) registry(rr *remote.Runner) engine.Registry {
	reg := engine.Registry{Services: make(map[string]store.ServiceDef, len(c.services)), Tasks: make(map[string]*engine.TaskSpec, len(c.tasks))}
	for name, s := range c.services {
		reg.Services[name] = vocab.ServiceDef(s)
	}
	for name, t := range c.tasks {
		reg.Tasks[name] = c.taskSpec(name, t, rr)
	}
	return reg
}

// notifyRegistry sends the running engine a snapshot of the
// registrations, so that it never takes c.mu itself. Snapshots only add,
// so their order does not matter.
func (c *Cue) notifyRegistry() {
	c.mu.Lock()
	d := c.disp.Load()
	var reg engine.Registry
	if d != nil {
		reg = c.registry(d.remote)
	}
	c.mu.Unlock()
	if d != nil {
		d.e.SetRegistry(reg)
		if d.remote != nil && d.remote.HasTasks() {
			d.remote.Start()
		}
	}
}

// taskSpec is task t as the engine runs it.
func (c *Cue) taskSpec(name string, t *Task, rr *remote.Runner) *engine.TaskSpec {
	policy := t.Retry.WithDefaults()
	spec := &engine.TaskSpec{
		Name: name, Services: t.Services, Timeout: t.Timeout, MaxConcurrent: t.MaxConcurrent,
		Retry: retryOf(policy), Retryable: func(err error) bool { return retryable(policy, err) }, MaxDeferrals: t.maxDeferrals(),
		HoldSlotsUntilReturn: t.HoldSlotsUntilReturn, FailOnSkippedDependency: t.FailOnSkippedDependency,
		ClaimAhead: t.Debounce != nil,
	}
	lr := &local.Runner{MaxPayload: c.cfg.MaxPayload, Clock: c.clock, ShowDeadline: clock.IsReal(c.clock)}
	if t.Batch != nil {
		spec.Batch, lr.Batch = c.batchSpec(name, t), c.batchCall(t.Batch.Handler)
	} else {
		lr.Call = c.localCall(t.Handler)
	}
	spec.Runner = lr
	if sq := t.Sequence; sq != nil {
		spec.HoldOnFailure = sq.HoldOnFailure
		spec.Sequence = func(target string) (key string) {
			if sq.Key == nil {
				return target
			}
			defer func() {
				if p := recover(); p != nil {
					c.log.Error("runcue: a Sequence Key panicked; the unit is in the sequence of its target", "task", name, "panic", p)
					key = target
				}
			}()
			return sq.Key(target)
		}
	}
	if t.Remote && rr != nil {
		spec.Runner, spec.Remote = rr, true
		rr.AddTask(name)
	}
	if f := t.ServiceKeys; f != nil {
		spec.Keys = func(v engine.UnitView) ([]string, error) {
			keys := f(workOf(v))
			for _, k := range keys {
				if i := strings.IndexByte(k, ':'); i > 0 {
					if err := validKey(k, k[i+1:]); err != nil {
						return nil, err
					}
				}
			}
			return keys, nil
		}
	}
	return spec
}

// localCall calls h with run p's Work.
func (c *Cue) localCall(h Handler) local.Call {
	return func(ctx context.Context, p *engine.Run, params json.RawMessage, started time.Time, rep call.Reporter) (any, error) {
		w := &Work{ID: p.ID, Task: p.Task, Target: p.Target, Params: params, Attempt: p.Attempt, Started: started, run: rep, cue: c}
		return h(withWork(ctx, w), w)
	}
}

// serviceKeys derives a unit's keyed services with t's ServiceKeys (nil
// when it has none), reporting a panic as an error.
func serviceKeys(t *Task, w *Work) ([]string, error) {
	if t.ServiceKeys == nil {
		return nil, nil
	}
	return engine.CallKeys(func(engine.UnitView) ([]string, error) { return t.ServiceKeys(w), nil }, engine.UnitView{})
}

// traceCarrier is the trace context of ctx's span, stored with a unit so
// that its runs' spans join the submitter's trace.
func traceCarrier(ctx context.Context) []byte { return engine.TraceCarrier(ctx) }

// workOf is a unit as a callback sees it.
func workOf(v engine.UnitView) *Work {
	return &Work{ID: v.ID, Task: v.Task, Target: v.Target, Params: v.Params, Attempt: v.Attempt}
}

// retryPolicy is a RetryPolicy as the engine uses it.
type retryPolicy struct{ p RetryPolicy }

func retryOf(p RetryPolicy) engine.RetryPolicy { return retryPolicy{p.WithDefaults()} }

func (r retryPolicy) Attempts() int                               { return r.p.MaxAttempts }
func (r retryPolicy) Delay(failures int, x float64) time.Duration { return r.p.Delay(failures, x) }

// recover requeues what the previous owner left and loads the queue.
func (d *dispatcher) recover(ctx context.Context) error {
	if err := d.e.Recover(ctx); err != nil {
		d.e.Discard()
		return wrapStoreErr(err)
	}
	return nil
}

func (d *dispatcher) run() {
	go d.e.Run()
	if d.remote != nil && d.remote.HasTasks() {
		d.remote.Start()
	}
	// The schedules, and the answers to other processes' questions, run
	// as long as the engine: its end stops them.
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { d.sched.Run(ctx) })
	if d.questions != nil {
		loops.Go(func() { d.answer(ctx) })
	}
	go func() {
		<-d.e.Done()
		cancel()
		loops.Wait()
		close(d.finished)
	}()
}

// answer reads the questions other processes ask the owner every poll
// interval (real time: they come from other processes) and hands the
// engine each new one, until ctx ends. The engine's answer is stored with
// the question; its asker reads it there (Cue.askOwner).
func (d *dispatcher) answer(ctx context.Context) {
	tick := time.NewTicker(d.poll)
	defer tick.Stop()
	handed := map[string]bool{} // given to the engine, not yet answered in the store
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		open, err := d.questions.Questions(ctx)
		if err != nil {
			continue // the next poll asks again
		}
		var fresh []store.OwnerQuestion
		listed := make(map[string]bool, len(open))
		for _, q := range open {
			listed[q.Nonce] = true
			if !handed[q.Nonce] {
				handed[q.Nonce] = true
				fresh = append(fresh, q)
			}
		}
		for n := range handed {
			if !listed[n] {
				delete(handed, n)
			}
		}
		if len(fresh) > 0 {
			d.e.Answer(fresh)
		}
	}
}

// done closes once the engine and its schedules have ended.
func (d *dispatcher) done() <-chan struct{} { return d.finished }
func (d *dispatcher) owner() string         { return d.e.Owner() }
func (d *dispatcher) stopping() bool        { return d.e.Stopping() }
func (d *dispatcher) stop(cancel bool)      { d.e.Stop(cancel) }
func (d *dispatcher) abandon()              { d.e.Abandon() }
func (d *dispatcher) storeFailed(err error) { d.e.StoreFailed(err) }

// inserted tells the engine of units this Cue committed and of the units
// the insert ended.
func (d *dispatcher) inserted(units []*store.Unit, ended []store.Event) { d.e.Inserted(units, ended) }

// external hands the engine events committed elsewhere (or requeues).
func (d *dispatcher) external(evs []store.Event) {
	d.e.External(evs)
	for _, ev := range evs {
		if ev.Type == store.TypeScheduleChanged {
			d.sched.Reload()
			break
		}
	}
}

// serviceChanged and pausesChanged return once the engine applied a
// stored change (or exited, or ctx ended).
func (d *dispatcher) serviceChanged(ctx context.Context, name string) { d.e.ServiceChanged(ctx, name) }
func (d *dispatcher) pausesChanged(ctx context.Context)               { d.e.PausesChanged(ctx) }

func (d *dispatcher) drain(ctx context.Context) error { return d.e.Drain(ctx) }

// settle records the periods due now, then settles the engine.
func (d *dispatcher) settle(ctx context.Context) (int, error) {
	if err := d.sched.Sync(ctx, d.finished); err != nil {
		return 0, err
	}
	return d.e.Settle(ctx)
}

// cancel cancels unit id as the owner; ok is false when the engine exited
// first.
func (d *dispatcher) cancel(ctx context.Context, id string, opts CancelOptions) (ok bool, err error) {
	rep, ok, err := d.e.Cancel(ctx, id, opts)
	switch {
	case err != nil || !ok:
		return ok, err
	case rep.Running:
		return true, nil
	case rep.Err != nil:
		return true, wrapStoreErr(rep.Err)
	}
	return true, cancelResult(id, rep.Result)
}

func (d *dispatcher) explain(ctx context.Context, id string) (Explanation, bool, error) {
	return d.e.Explain(ctx, id)
}

func (d *dispatcher) services(ctx context.Context) ([]ServiceStatus, bool, error) {
	return d.e.Services(ctx)
}

func (d *dispatcher) keyStatus(ctx context.Context, name string) (*ServiceStatus, bool, error) {
	return d.e.KeyStatus(ctx, name)
}

func (d *dispatcher) serviceStats(ctx context.Context) ([]ServiceStats, bool, error) {
	return d.e.ServiceStats(ctx)
}

func (d *dispatcher) sequences(ctx context.Context) (PatternStats, bool, error) {
	return d.e.Patterns(ctx)
}

func (d *dispatcher) backpressure(ctx context.Context) (BackpressureStats, bool, error) {
	return d.e.Backpressure(ctx)
}

// encodeReport is the JSON of what the engine reports, in this package's
// types: service_status, queue_status and budget_exhausted events, and
// the answers to another process's questions.
func encodeReport(v any) []byte {
	var out any = v
	switch v := v.(type) {
	case engine.BudgetEvent:
		out = budgetEventData{Service: v.Service, Class: v.Class, Budget: v.Budget}
	case engine.AdaptEvent:
		change := "raised"
		if v.Lowered {
			change = "lowered"
		}
		out = adaptEventData{Service: v.Service, Class: v.Class, Adaptive: v.Adaptive, Change: change}
	case engine.StatedEvent:
		out = statedEventData{Service: v.Service, Class: v.Class, Meter: v.Meter, Limit: v.Limit, Said: v.Said}
	case Explanation:
		v.Live = true
		out = v
	}
	b, _ := json.Marshal(out)
	return b
}

// The reasons Explain gives from the database, worded as the engine words
// them from its live state.
func queuePausedReason() Reason                  { return engine.QueuePausedReason() }
func taskPausedReason(task string) Reason        { return engine.TaskPausedReason(task) }
func skippedReason(deps []string) Reason         { return engine.SkippedReason(deps) }
func timeReason(why string, at time.Time) Reason { return engine.TimeReason(why, at) }

// batchSpec is t's Batch (set) as the engine runs it.
func (c *Cue) batchSpec(name string, t *Task) *engine.BatchSpec {
	b := t.Batch
	spec := &engine.BatchSpec{Max: b.Max, MaxCost: b.MaxCost, Wait: b.Wait}
	if b.Key != nil {
		spec.Key = func(target string) (key string) {
			defer func() {
				if p := recover(); p != nil {
					c.log.Error("runcue: a Batch Key panicked; the unit is in no key's batch", "task", name, "panic", p)
					key = ""
				}
			}()
			return b.Key(target)
		}
	}
	return spec
}

// batchCall calls h with the Works of a batch's runs.
func (c *Cue) batchCall(h BatchHandler) local.BatchCall {
	return func(ctx context.Context, ps []*engine.Run, params []json.RawMessage, started time.Time, rep call.Reporter) ([]any, []error, error) {
		works := make([]*Work, len(ps))
		for i, p := range ps {
			works[i] = &Work{ID: p.ID, Task: p.Task, Target: p.Target, Params: params[i], Attempt: p.Attempt, Started: started, run: rep, cue: c}
		}
		outs, err := h(withWork(ctx, works[0]), works)
		if err != nil {
			return nil, nil, err
		}
		results, errs := make([]any, len(outs)), make([]error, len(outs))
		for i, o := range outs {
			results[i], errs[i] = o.Result, o.Err
		}
		return results, errs, nil
	}
}
