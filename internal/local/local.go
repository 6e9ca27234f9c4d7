// Package local runs handlers in the owner's process: each run on a
// goroutine of its own. The engine starts a run through a Runner (Launch)
// and asks it to stop one (Cancel); the Runner reports the handler's start
// (Begin, read on the handler's goroutine just before the call), its
// progress and heartbeats (through the run's Reporter), and how it ended
// (Done, with the error classified by package call).
package local

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/call"
	"github.com/runcue/runcue/internal/engine"
	rt "github.com/runcue/runcue/runcuetype"
)

// Call calls a task's handler for run p with its params, started at
// the instant the rate windows count; the handler reports through rep.
type Call func(ctx context.Context, p *engine.Run, params json.RawMessage, started time.Time, rep call.Reporter) (any, error)

// BatchCall calls a batch task's handler for the runs of a batch, ps
// (ps[0] leads it), with their params, started at the instant the rate
// windows count; the handler reports through rep. It returns each run's
// result and error, in order, or an error that is every run's.
type BatchCall func(ctx context.Context, ps []*engine.Run, params []json.RawMessage, started time.Time, rep call.Reporter) ([]any, []error, error)

// Runner runs the handler of one task. It implements engine.Runner and
// engine.InProcess. Its fields are set before its first Launch.
type Runner struct {
	// Call calls the handler of a run; Batch, when set, instead calls a
	// batch task's handler for a batch (batch.go).
	Call       Call
	Batch      BatchCall
	MaxPayload int
	Clock      clock.Clock
	// ShowDeadline: the handler's context shows its deadline (the real
	// clock; a fake clock's deadline means nothing to the runtime).
	ShowDeadline bool
}

// run is a run on its goroutine. The dispatcher goroutine writes it in
// Launch and cancels it in Cancel; the handler's goroutine owns it in
// between.
type run struct {
	p      *engine.Run
	ctx    call.Ctx
	cancel context.CancelCauseFunc
	// used are the amounts the handler reported (Work.Used), under mu;
	// ended is set once they were read for the run's end.
	mu    sync.Mutex
	used  map[string]int64
	ended bool
	// batch: the run leads a batch; its units' reports add up.
	batch bool
}

// Progress and Heartbeat implement call.Reporter.
func (l *run) Progress(b []byte) { l.p.Progress(b) }
func (l *run) Heartbeat() {
	l.p.Heartbeat()
	for _, q := range l.p.Batch {
		q.Heartbeat()
	}
}

// Use implements call.Reporter: it keeps the amounts, bounded, for the
// run's end; a report after the end is ignored.
func (l *run) Use(amounts rt.Costs) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	for name, n := range amounts {
		if l.used == nil {
			l.used = make(map[string]int64, len(amounts))
		}
		if l.batch {
			n += l.used[name]
		}
		l.used[name] = call.BoundUsed(n)
	}
}

// Observe implements call.Reporter, with the values bounded.
func (l *run) Observe(o rt.Observation) {
	out := rt.Observation{Services: o.Services, Limits: make([]rt.ObservedLimit, 0, len(o.Limits))}
	for _, lim := range o.Limits {
		out.Limits = append(out.Limits, rt.ObservedLimit{Name: lim.Name, Remaining: min(lim.Remaining, rt.MaxCost),
			Reset: min(max(lim.Reset, 0), rt.MaxTimeout), Limit: min(max(lim.Limit, 0), rt.MaxCost)})
	}
	l.p.Observe(out)
}

// takeUsed returns the amounts reported; later reports are ignored.
func (l *run) takeUsed() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	return l.used
}

// InProcess implements engine.InProcess: Settle waits for its goroutines.
func (lr *Runner) InProcess() {}

// Launch implements engine.Runner: it starts the run's goroutine.
func (lr *Runner) Launch(p *engine.Run) {
	l := &run{p: p}
	l.ctx.Context, l.cancel = context.WithCancelCause(p.Ctx)
	if lr.ShowDeadline {
		// Let the handler see its deadline; the engine enforces it.
		l.ctx.Shown = p.Deadline
	}
	p.Handle = l
	if lr.Batch != nil {
		l.batch = true
		go lr.executeBatch(l)
		return
	}
	go lr.execute(l)
}

// Cancel implements engine.Runner: the handler's context is cancelled
// with the cause (runcue's errors: the engine's are the same values).
func (lr *Runner) Cancel(p *engine.Run, cause error) {
	l, ok := p.Handle.(*run)
	if !ok {
		return // a unit that follows another in its batch: the call is the leader's
	}
	if cause == engine.ErrTimeout {
		l.ctx.Expire()
	}
	l.cancel(cause)
}

// execute runs on the run's goroutine.
func (lr *Runner) execute(l *run) {
	p := l.p
	sent := false
	defer func() {
		// Only runtime.Goexit (t.FailNow in a shared helper, say) ends the
		// goroutine without the report below: record the run as failed
		// now, not at its deadline.
		if !sent {
			l.cancel(nil)
			p.Done(engine.Ending{Err: call.ErrGoexit, Class: engine.ClassPanic, At: lr.Clock.Now()})
		}
	}()
	params, err := p.Params()
	var out []byte
	notStarted := true
	if err == nil {
		err = context.Cause(&l.ctx)
	}
	if err == nil {
		var started time.Time
		if started, err = p.Begin(); err == nil {
			notStarted = false
			out, err = call.Invoke(&l.ctx, func(ctx context.Context) (any, error) {
				return lr.Call(ctx, p, params, started, l)
			}, lr.MaxPayload)
		}
	}
	end := engine.Ending{Err: err, Result: out, At: lr.Clock.Now(), NotStarted: notStarted, Used: l.takeUsed()}
	Classify(&end)
	l.cancel(nil)
	sent = true
	p.Done(end)
}

// Classify says what a run's error means to the engine (see
// call.Classify); a start past its deadline (engine.ErrLateStart) comes
// first.
func Classify(e *engine.Ending) {
	if e.Err == nil {
		return
	}
	v := call.Classify(e.Err)
	e.Permanent, e.Overload = v.Permanent, v.Overload
	switch {
	case errors.Is(e.Err, engine.ErrLateStart):
		e.Class = engine.ClassLateStart
	case v.Skip:
		e.Class, e.SkipReason = engine.ClassSkip, v.SkipReason
	case v.RetryAfter:
		e.Class, e.Delay, e.Services = engine.ClassRetryAfter, v.Delay, v.Services
	case v.Timeout:
		e.Class = engine.ClassTimeout
	case v.Panic:
		e.Class = engine.ClassPanic
	}
}
