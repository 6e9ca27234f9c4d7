package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
	"go.opentelemetry.io/otel/trace"
)

// The run table: a run from its dispatch (start) through its handler
// goroutine (execute, begin) to its end (end, finished; the outcome is
// decided in outcome.go). The dispatcher goroutine owns a run's fields but
// those its comments give to the handler goroutine.

// runTable holds the runs whose outcome is not decided (runs, by unit ID)
// and those that ended but hold their slots until their handlers return
// (held), with the counts the loop's exit and the caps read.
type runTable struct {
	runs map[string]*run
	held map[*run]struct{}
	// inflight counts the runs whose slots are taken (in runs or held),
	// live the handler goroutines not yet returned, claims the
	// write-ahead claims not yet committed, uncommitted the runs whose
	// Finish is queued for the writer and not yet reported committed
	// (Config.MaxUncommitted).
	inflight    int
	live        int
	claims      int
	uncommitted int
	handlers    sync.WaitGroup
	// startMu guards noStarts, set at exit: once it is set no handler may
	// start, so that none starts after ownership is released (an
	// abandoned handler goroutine that had not yet started, say). Handler
	// goroutines read it; the dispatcher goroutine sets it.
	startMu  sync.RWMutex
	noStarts bool
}

// closeStarts makes every later mayStart report false.
func (t *runTable) closeStarts() {
	t.startMu.Lock()
	t.noStarts = true
	t.startMu.Unlock()
}

// runState is where a run is in its life. A run starts claiming, or
// launched when its claim need not commit first; it ends (its outcome
// decided by its return, its deadline or its cancellation grace) from
// either, and an ended run whose task holds its slots until its handler
// returns holds them until then:
//
//	runClaiming ──claim committed──▶ runLaunched ──end──▶ runEnded
//	     │                                │                  ▲
//	     └──────────end─────────▶ runEnded└──end──▶ runHolding ─┘ handler returned
type runState uint8

const (
	// runClaiming: dispatched; its handler starts only once its claim (and
	// its service log entry) is committed.
	runClaiming runState = iota
	// runLaunched: its handler goroutine was started; that goroutine
	// reports whether the handler started (msgStarted, or msgDone with
	// notStarted).
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
	d        *dispatcher
	u        *unit
	lane     *lane
	no       int
	start    time.Time
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc
	handler  Handler
	// target and params are the unit's, copied at the start: the
	// handler goroutine must not read the unit, which the dispatcher keeps
	// changing. pbatch, when set, is the read that brings the params (they
	// were not in memory).
	target string
	params []byte
	pbatch *paramBatch
	// id and task are the unit's, for the handler goroutine.
	id, task string
	// probes are the resources whose half-open circuit this run probes.
	probes []*resource
	// cause is why runcue cancelled the run (ErrShutdown, ErrTimeout,
	// ErrCancelled), nil if it did not.
	cause error
	// state is where the run is in its life (see runState).
	state runState
	// claimFailed: the store refused the run's claim, or could not take it.
	claimFailed bool
	// decided is when the dispatch was decided, on the monotonic timeline
	// (d.now). A run of a rate-limited or budgeted lane holds a
	// reservation in each of its windows (reserved) and budgets (budgets)
	// from then until its handler's start is committed to them
	// (msgStarted) or it is known never to start.
	decided  time.Time
	reserved []*broker.Window
	budgets  []*broker.Budget
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
	// mem holds what start makes for every run, allocated with it: its
	// deadline's timer entry, its claim and the request that writes it.
	mem struct {
		ctx      runCtx
		work     Work
		deadline timerEntry
		claim    store.Claim
		started  [1]store.Event
		req      writer.Request
		ops      [1]store.Op
		// The run's Finish and its request (outcome.go, finishSink).
		fin    store.Finish
		finReq writer.Request
		finOps [1]store.Op
	}
}

// runCtx is a handler's context. runcue cancels it with the reason
// (context.Cause: ErrTimeout, ErrCancelled, ErrShutdown). It shows the run's
// deadline under the real clock, but no runtime timer enforces it: the
// dispatcher's timer heap does, and once it has, Err reports
// context.DeadlineExceeded, as a context with that deadline would. A
// context a handler derives from it is cancelled at the deadline too, and
// its Err reports context.Canceled (its Cause is ErrTimeout).
type runCtx struct {
	context.Context           // from context.WithCancelCause
	deadline        time.Time // zero: none shown (a fake clock)
	expired         atomic.Bool
}

// Deadline returns the run's deadline, if it is shown.
func (c *runCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

// Err is context.DeadlineExceeded once the run's deadline has passed.
func (c *runCtx) Err() error {
	err := c.Context.Err()
	if err != nil && c.expired.Load() {
		return context.DeadlineExceeded
	}
	return err
}

type progress struct {
	mu       sync.Mutex
	latest   []byte
	lastEmit time.Time
	pending  bool // an emission is scheduled
}

// start runs u on l, whose resources acquire took at now; spent are the
// budget_exhausted events of that dispatch, stored with its claim.
func (d *dispatcher) start(u *unit, l *lane, now time.Time, probes []*resource, spent []store.Event) {
	for i := range spent {
		spent[i].Task, spent[i].Target = u.task, u.target
	}
	t := l.task
	var timeout time.Duration
	if u.more != nil {
		timeout = u.more.timeout
	}
	if timeout <= 0 {
		timeout = t.def.Timeout
	}
	if timeout <= 0 {
		timeout = d.cfg.DefaultTimeout
	}
	u.runs++
	u.state = uRunning
	wall := d.wall()
	r := &run{d: d, u: u, id: u.id, task: u.task, lane: l, no: int(u.runs), start: wall, deadline: wall.Add(timeout), handler: t.def.Handler,
		target: u.target, params: u.params, probes: probes}
	if !u.hasParams {
		r.pbatch = d.paramsOf(u)
	}
	r.mem.ctx.Context, r.cancel = context.WithCancelCause(context.Background())
	if clock.IsReal(d.clock) {
		// Let the handler see its deadline; the timer heap enforces it.
		r.mem.ctx.deadline = r.deadline
	}
	r.ctx = &r.mem.ctx
	r.ctx, r.span = d.tel.startSpan(r.ctx, u.traceCtx(), u.task, u.id, r.no)
	tel := d.tel
	tel.queueWait.Record(bg, seconds(now.Sub(time.Unix(0, u.readyAt))), t.attrs.rec...)
	for _, res := range l.resources {
		if res.class != "" {
			tel.requests.Add(bg, 1, res.attrs())
		}
	}
	if d.log.Enabled(bg, slog.LevelDebug) {
		d.log.Debug("work_started", "work_unit_id", u.id, "task_type", u.task, "attempt", r.no)
	}
	r.decided = now
	for _, res := range l.resources {
		if res.Window != nil {
			r.reserved = append(r.reserved, res.Window) // reserved by acquire
		}
		r.budgets = append(r.budgets, res.Budgets...) // reserved by acquire
	}
	d.runs[u.id] = r
	if h := d.hooks.started; h != nil {
		h(r)
	}
	d.inflight++
	d.stats.dispatches.Add(1)
	r.mem.deadline = timerEntry{at: now.Add(timeout), kind: tDeadline, r: r}
	r.deadlineTimer = &r.mem.deadline
	d.pushTimer(r.deadlineTimer)
	r.mem.started[0] = store.Event{Type: string(EventWorkStarted), Task: u.task, Target: u.target, Attempt: r.no}
	events := r.mem.started[:]
	if len(spent) > 0 {
		events = append(events[:1:1], spent...)
	}
	logged := d.loggedOf(l)
	r.mem.claim = store.Claim{ID: u.id, Task: u.task, Owner: d.owner, Run: r.no, At: wall, LeaseExpires: r.deadline.Add(d.cfg.LeaseBuffer),
		ServiceLog: logged, Events: events, Wait: now.Sub(time.Unix(0, u.readyAt))}
	claim := &r.mem.claim
	// A dispatch counted in a rate window is logged before the handler
	// starts, so that a crash cannot forget a request the service saw.
	// Other claims are written behind the handler's start: a crash before
	// the commit leaves the unit queued, and it runs again.
	waitClaim := len(logged) > 0
	done := func(res []store.Result, err error) {
		if err != nil || !res[0].Applied {
			d.in.Push(msgClaimFailed{run: r})
		}
	}
	if waitClaim {
		d.claims++
		done = func(res []store.Result, err error) {
			d.in.Push(msgClaimed{run: r, applied: err == nil && res[0].Applied})
		}
	}
	r.mem.ops[0] = claim
	r.mem.req = writer.Request{Ops: r.mem.ops[:], Done: done}
	if err := d.w.Submit(&r.mem.req); err != nil {
		// The writer is closed or failed: the run cannot be recorded.
		d.failed = err
		r.claimFailed = true
		if waitClaim {
			d.claims--
			d.claimed(r, false)
			return
		}
	}
	if !waitClaim {
		d.launch(r)
	}
}

func (d *dispatcher) launch(r *run) {
	r.state = runLaunched
	d.live++
	d.handlers.Add(1)
	d.launching.Add(1)
	d.activity.Add(1)
	go d.execute(r)
}

// claimed continues a run whose write-ahead claim has committed.
func (d *dispatcher) claimed(r *run, applied bool) {
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
		d.finished(msgDone{run: r, err: context.Cause(r.ctx), end: d.wall()})
	default:
		d.launch(r)
	}
}

// execute runs on the handler goroutine.
func (d *dispatcher) execute(r *run) {
	defer d.handlers.Done()
	entered := false
	defer func() {
		// After the last message is pushed (see settling).
		d.activity.Add(1)
		if entered {
			d.inside.Add(-1)
		} else {
			d.launching.Add(-1)
		}
	}()
	w := &r.mem.work
	*w = Work{ID: r.id, Task: r.task, Target: r.target, Params: r.params, Attempt: r.no, run: r}
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
	if r.pbatch != nil {
		w.Params, err = paramsFrom(r.pbatch, r.id)
	}
	var out []byte
	notStarted := true
	if err == nil {
		if r.lane.keyErr != nil {
			err = Permanent(r.lane.keyErr)
		} else if err = d.begin(r, w); err == nil {
			notStarted = false
			d.activity.Add(1)
			d.inside.Add(1)
			d.launching.Add(-1)
			entered = true
			res, err = callHandler(r.ctx, r.handler, w)
		}
		if err == nil {
			if out, err = json.Marshal(res); err != nil {
				err = Permanent(fmt.Errorf("runcue: encode result: %w", err))
			} else if len(out) > d.cfg.MaxPayload {
				out, err = nil, Permanent(fmt.Errorf("runcue: result of %d bytes exceeds Config.MaxPayload (%d)", len(out), d.cfg.MaxPayload))
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
	if len(r.reserved) > 0 || len(r.budgets) > 0 {
		if now.Sub(r.decided) > d.cfg.MaxStartDelay {
			return errLateStart
		}
		d.in.Push(msgStarted{run: r, start: now, wall: w.Started})
	}
	return nil
}

// settleReservations commits r's window and budget reservations at its
// handler's start (start on the timeline, wall on the wall clock), or gives
// them back (start zero) if the handler never started.
func (d *dispatcher) settleReservations(r *run, start, wall time.Time) {
	if len(r.reserved) == 0 && len(r.budgets) == 0 {
		return
	}
	for _, w := range r.reserved {
		if start.IsZero() {
			w.Release()
		} else {
			w.Commit(start)
		}
	}
	for _, b := range r.budgets {
		if start.IsZero() {
			b.Release()
		} else {
			b.Commit(wall, start)
		}
	}
	r.reserved, r.budgets = nil, nil
	for _, res := range r.lane.resources {
		if res.Window != nil || len(res.Budgets) > 0 {
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
	tel, log := d.tel, d.log
	rt := r.lane.task
	tel.runDuration.Record(bg, seconds(end.Sub(r.start)), rt.outcomeAttrs(outcome).rec...)
	switch outcome {
	case "completed":
		tel.completed.Add(bg, 1, rt.attrs.add...)
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_completed", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no, "duration", end.Sub(r.start))
		}
	case "skipped":
		tel.skipped.Add(bg, 1, rt.attrs.add...)
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_skipped", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no, "reason", fin.Error)
		}
	case "failed", "timeout", "panic":
		// A failure that will be retried is routine (Debug); a unit that
		// fails for good is worth an operator's look (Warn).
		tel.failed.Add(bg, 1, rt.outcomeAttrs(outcome).add...)
		willRetry := fin.State == store.Queued
		level := slog.LevelWarn
		if willRetry {
			level = slog.LevelDebug
		}
		if !log.Enabled(bg, level) {
			break
		}
		errText := fin.Error
		if outcome == "panic" {
			errText = firstLine(errText) // the stack is in the unit's history
		}
		log.Log(bg, level, "work_failed", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no,
			"error", errText, "error_kind", fin.ErrorKind, "will_retry", willRetry)
	case "deferred":
		// A 429 or 503 with a Retry-After: the service asked, runcue waits.
		if log.Enabled(bg, slog.LevelDebug) {
			log.Debug("work_deferred", "work_unit_id", r.id, "task_type", r.task, "attempt", r.no, "error", fin.Error)
		}
	case "cancelled", "interrupted":
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
	if r.state == runClaiming {
		d.settleReservations(r, time.Time{}, time.Time{}) // it never starts
	}
	r.state = runEnded
	delete(d.runs, r.u.id)
	d.dropTimer(r.deadlineTimer)
	d.dropTimer(r.graceTimer)
	r.deadlineTimer, r.graceTimer = nil, nil
	d.judge(r, v)
	if !returned && r.lane.task.def.HoldSlotsUntilReturn {
		r.state = runHolding
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
		d.settleReservations(r, time.Time{}, time.Time{})
	}
	if r.over() {
		// Decided at its deadline or grace: a late result is discarded.
		if r.state == runHolding {
			r.state = runEnded
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

// heartbeat records that r's handler is alive, at most once a second.
func (d *dispatcher) heartbeat(r *run) {
	now := d.now().UnixNano()
	last := r.lastBeat.Load()
	if now-last < int64(time.Second) || !r.lastBeat.CompareAndSwap(last, now) {
		return
	}
	d.in.Push(msgHeartbeat{run: r})
}
