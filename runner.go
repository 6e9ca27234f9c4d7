package runcue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/engine"
)

// The local Runner: each run's handler on a goroutine of this process. The
// engine starts a run through it (Launch) and asks it to stop one
// (Cancel); it reports the handler's start (Begin, read on the handler's
// goroutine just before the call), its progress and heartbeats (through
// Work), and how it ended (Done, with the error classified).

// localRunner runs the handler of one task.
type localRunner struct {
	h          Handler
	maxPayload int
	clock      clock.Clock
	// showDeadline: the handler's context shows its deadline (the real
	// clock; a fake clock's deadline means nothing to the runtime).
	showDeadline bool
}

// localRun is a run on its goroutine: what its handler gets. The
// dispatcher goroutine writes it in Launch and cancels it in Cancel; the
// handler's goroutine owns it in between.
type localRun struct {
	p      *engine.Run
	work   Work
	ctx    runCtx
	cancel context.CancelCauseFunc
	// used are the amounts the handler reported (Work.Used), under mu;
	// ended is set once they were read for the run's end.
	mu    sync.Mutex
	used  map[string]int64
	ended bool
}

// progress and heartbeat implement runHandle.
func (l *localRun) progress(b []byte) { l.p.Progress(b) }
func (l *localRun) heartbeat()        { l.p.Heartbeat() }

// use implements runHandle: it keeps the amounts for the run's end.
func (l *localRun) use(amounts Costs) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	for name, n := range amounts {
		if l.used == nil {
			l.used = make(map[string]int64, len(amounts))
		}
		l.used[name] = boundUsed(n)
	}
}

// observe implements runHandle.
func (l *localRun) observe(o Observation) { l.p.Observe(engineObservation(o)) }

// engineObservation is o with its values bounded.
func engineObservation(o Observation) Observation {
	out := Observation{Services: o.Services, Limits: make([]ObservedLimit, 0, len(o.Limits))}
	for _, l := range o.Limits {
		out.Limits = append(out.Limits, ObservedLimit{Name: l.Name, Remaining: min(l.Remaining, MaxCost),
			Reset: min(max(l.Reset, 0), MaxTimeout)})
	}
	return out
}

// takeUsed returns the amounts reported; later reports are ignored.
func (l *localRun) takeUsed() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	return l.used
}

// InProcess implements engine.InProcess: Settle waits for its goroutines.
func (lr *localRunner) InProcess() {}

// Launch implements engine.Runner: it starts the run's goroutine.
func (lr *localRunner) Launch(p *engine.Run) {
	l := &localRun{p: p}
	l.ctx.Context, l.cancel = context.WithCancelCause(p.Ctx)
	if lr.showDeadline {
		// Let the handler see its deadline; the engine enforces it.
		l.ctx.deadline = p.Deadline
	}
	p.Handle = l
	go lr.execute(l)
}

// Cancel implements engine.Runner: the handler's context is cancelled
// with the cause, as runcue names it.
func (lr *localRunner) Cancel(p *engine.Run, cause error) {
	l := p.Handle.(*localRun)
	switch cause {
	case engine.ErrTimeout:
		l.ctx.expired.Store(true)
		cause = ErrTimeout
	case engine.ErrCancelled:
		cause = ErrCancelled
	case engine.ErrShutdown:
		cause = ErrShutdown
	}
	l.cancel(cause)
}

// execute runs on the run's goroutine.
func (lr *localRunner) execute(l *localRun) {
	p := l.p
	sent := false
	defer func() {
		// Only runtime.Goexit (t.FailNow in a shared helper, say) ends the
		// goroutine without the report below: record the run as failed
		// now, not at its deadline.
		if !sent {
			l.cancel(nil)
			p.Done(engine.Ending{Err: errGoexit, Class: engine.ClassPanic, At: lr.clock.Now()})
		}
	}()
	w := &l.work
	*w = Work{ID: p.ID, Task: p.Task, Target: p.Target, Attempt: p.Attempt, run: l}
	params, err := p.Params()
	w.Params = params
	var res any
	var out []byte
	notStarted := true
	if err == nil {
		err = context.Cause(&l.ctx)
	}
	if err == nil {
		if w.Started, err = p.Begin(); err == nil {
			notStarted = false
			res, err = callHandler(&l.ctx, lr.h, w)
		}
	}
	if err == nil {
		if out, err = json.Marshal(res); err != nil {
			err = Permanent(fmt.Errorf("runcue: encode result: %w", err))
		} else if len(out) > lr.maxPayload {
			out, err = nil, Permanent(fmt.Errorf("runcue: result of %d bytes exceeds Config.MaxPayload (%d)", len(out), lr.maxPayload))
		}
	}
	end := engine.Ending{Err: err, Result: out, At: lr.clock.Now(), NotStarted: notStarted, Used: l.takeUsed()}
	classify(&end)
	l.cancel(nil)
	sent = true
	p.Done(end)
}

// classify says what a run's error means to the engine: a skip, a
// Retry-After, a timeout or a panic (in that order), and whether it is
// permanent.
func classify(e *engine.Ending) {
	err := e.Err
	if err == nil {
		return
	}
	e.Permanent = errors.Is(err, ErrPermanent)
	e.Overload = errors.Is(err, ErrOverloaded)
	if errors.Is(err, engine.ErrLateStart) {
		e.Class = engine.ClassLateStart
		return
	}
	if reason, ok := skipOf(err); ok {
		e.Class, e.SkipReason = engine.ClassSkip, reason
	} else if delay, services, ok := retryAfterOf(err); ok {
		e.Class, e.Delay, e.Services = engine.ClassRetryAfter, delay, services
	} else if errors.Is(err, ErrTimeout) {
		e.Class = engine.ClassTimeout
	} else if errors.Is(err, ErrPanic) {
		e.Class = engine.ClassPanic
	}
}

// runCtx is a handler's context. runcue cancels it with the reason
// (context.Cause: ErrTimeout, ErrCancelled, ErrShutdown). It shows the
// run's deadline under the real clock, but no runtime timer enforces it:
// the engine's timer heap does, and once it has, Err reports
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

// errGoexit is the failure recorded for a handler that called
// runtime.Goexit. It counts as a panic: the handler did not return.
var errGoexit = &panicError{value: "handler called runtime.Goexit (t.FailNow, t.SkipNow or log.Fatal-like code in a handler?) instead of returning"}

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
