package engine

import (
	"context"
	"errors"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// The Runner port: the engine starts a run through its task's Runner, and
// the Runner reports what happened to it through the Run (Begin or Started,
// Progress, Heartbeat, Done). runcue's in-process goroutines are one Runner; handlers
// on other hosts will be another. The engine's promises hold for any
// Runner: a start reported late, out of order or never counts at the latest
// instant it can affect (StartBy), and a run whose Runner never reports its
// end ends at its deadline.

// Runner starts runs and stops them when asked.
type Runner interface {
	// Launch starts r: it calls r's handler (after r.Begin agrees, or
	// reporting r.Started) no later than r.StartBy when that is set, and
	// reports its end with r.Done. It must not block.
	Launch(r *Run)
	// Cancel asks r's handler to stop, for cause (ErrShutdown, ErrTimeout,
	// ErrCancelled). Its end is still reported with Done.
	Cancel(r *Run, cause error)
}

// InProcess is implemented by a Runner whose handlers run in this process
// and start at once (runcue's local Runner): Settle waits for each of its
// runs to reach its handler or end. A Runner that starts runs elsewhere, on
// its own time, does not implement it.
type InProcess interface {
	Runner
	InProcess()
}

// Adopter is implemented by a Runner whose runs outlive the owner that
// launched them (executors: their heartbeats keep their runs' leases). A
// new owner adopts such a run an earlier owner left, with its lease
// still held (store.Recover's Held), instead of waiting for its lease to
// end: Adopt hands the Runner the Run, which then reports its start and
// end as for a run it launched (a start already counted by the earlier
// owner's log is counted again at most at StartBy's bound: it is not
// reported). Adopt must not block.
type Adopter interface {
	Runner
	Adopt(r *Run)
}

// EndWriter is implemented by a Runner that keeps its own record of a run
// in the store (an executor's assignment): the ops EndOps returns are
// written in the transaction of the run's Finish, so that the record
// ends with the run.
type EndWriter interface {
	Runner
	EndOps(r *Run) []store.Op
}

// Run is one dispatch of a unit, as its Runner sees it. The engine owns
// it; a Runner reads its fields, keeps its own state in Handle, and passes
// the Run back when it reports.
type Run struct {
	ID, Task, Target string
	// Attempt is the run number, from 1.
	Attempt int
	// Deadline is the run's timeout, on the wall clock.
	Deadline time.Time
	// StartBy, when set, bounds the start of a rate-limited or budgeted
	// run, on the engine's timeline (Run.Now): a handler that would
	// start later must not (Done with NotStarted, ClassLateStart).
	StartBy time.Time
	// Ctx carries the run's trace span (and the submitter's trace).
	Ctx context.Context
	// Handle is the Runner's own.
	Handle any
	// Owner is the lease name the run's claim wrote (the unit's
	// leased_by), Epoch the engine's owner epoch: a Runner that writes its
	// own ops for the run (store.Assign) makes them with both.
	Owner string
	Epoch int64
	// Adopted: the run was launched by an earlier owner (see Adopter).
	Adopted bool
	// Batch are the runs of the units that follow this one in its batch
	// (a batch task's): the Runner calls the handler once for all, as
	// this run's start, and reports each run's end with its Done.
	Batch []*Run

	r *run
}

// Params returns the unit's params, waiting for them if they were not in
// memory when the run was dispatched (they are read in batches).
func (p *Run) Params() ([]byte, error) {
	r := p.r
	if r.pbatch == nil {
		return r.params, nil
	}
	return paramsFrom(r.pbatch, p.ID)
}

// Begin is the start gate of an in-process Runner, called on the
// goroutine that is about to call the handler, after the Runner checked
// its own cancellation: it reads the start instant (the one rate windows
// and budgets count), reports it, and returns it on the wall clock. It
// refuses the start when the engine has exited (ErrShutdown: no handler
// starts after ownership is released), when its lease is not trusted
// (store.ErrNotOwner) and when a rate-limited run would start after
// StartBy (ErrLateStart); the Runner then reports Done with NotStarted,
// and the engine requeues the run as a late start (nothing ran, no retry
// budget spent) whatever class the Runner gave.
func (p *Run) Begin() (time.Time, error) { return p.r.d.gate(p) }

// Started reports that the handler started at at, on the engine's
// timeline (Now), for a Runner that does not call Begin: one whose
// handlers run elsewhere, or that reports late or out of order. A start
// reported outside [decision, StartBy] counts at StartBy, the latest
// instant it can affect; a start never reported counts there too.
func (p *Run) Started(at time.Time) { p.r.d.reportStart(p, at) }

// Now returns the current instant on the engine's timeline (monotonic,
// reading as the wall clock when the engine started).
func (p *Run) Now() time.Time { return p.r.d.now() }

// Done reports how the run ended. A Runner calls it once per run it
// launched, after the handler returned, or with NotStarted when it never
// called it; later calls are ignored.
func (p *Run) Done(e Ending) { p.r.d.reportEnd(p, e) }

// Progress reports a value the handler gave (JSON), published as a
// work_progress event at most once a second, the latest value winning.
func (p *Run) Progress(b []byte) { p.r.d.reportProgress(p, b) }

// Observe reports what a service the run uses said of its limits in a
// response (see Observation). Reports apply in the order they are made.
func (p *Run) Observe(o rt.Observation) {
	p.r.d.in.Push(msgObserved{run: p.r, obs: o, at: p.r.d.now()})
}

// ObserveAt is Observe for a report made at wall-clock instant at, on
// this host's clock (a remote run's, read from its executor's report):
// it is placed on the engine's timeline by its distance from now, and
// never after now.
func (p *Run) ObserveAt(o rt.Observation, at time.Time) {
	d := p.r.d
	now := d.now()
	t := now.Add(at.Sub(d.wall()))
	if t.After(now) {
		t = now
	}
	d.in.Push(msgObserved{run: p.r, obs: o, at: t})
}

// Heartbeat reports that the handler is alive: its lease is extended,
// with at most one write a second.
func (p *Run) Heartbeat() { p.r.d.reportHeartbeat(p) }

// Ending is how a run ended, as its Runner reports it.
type Ending struct {
	// Err is the handler's error, nil when it succeeded; Result its
	// result's JSON.
	Err    error
	Result []byte
	// Class is what Err means to the engine; Permanent marks an error
	// that is never retried and says nothing about the service's health
	// (bad input).
	Class     Class
	Permanent bool
	// SkipReason is ClassSkip's reason; Delay and Services a
	// ClassRetryAfter's wait and the services it names.
	SkipReason string
	Delay      time.Duration
	Services   []string
	// Overload marks Err as the service saying it is overloaded (a 503
	// without Retry-After): a signal to the services' adaptive limits.
	Overload bool
	// At is when it ended, on the wall clock.
	At time.Time
	// NotStarted: the handler was never called (its start was refused, or
	// the run failed before it).
	NotStarted bool
	// Used are the amounts the run reports it actually used, by amount
	// (tokens, bytes): each meter that counts one replaces the start's
	// charge per its charge policy (see broker.Charge). Nil: the
	// estimates stand.
	Used map[string]int64
}

// Class is what a run's error means to the engine.
type Class uint8

const (
	// ClassError is a failure (or, with Err nil, a success).
	ClassError Class = iota
	// ClassSkip ends the unit skipped.
	ClassSkip
	// ClassRetryAfter defers the unit and holds services.
	ClassRetryAfter
	// ClassPanic is a failure of kind panic.
	ClassPanic
	// ClassLateStart: the start was refused past StartBy; nothing ran.
	ClassLateStart
	// ClassTimeout is a failure of kind timeout: the handler returned its
	// context's cause (the deadline) before the engine ended the run.
	ClassTimeout
	// ClassLost: the Runner lost the run (the executor running it
	// stopped); it is requeued with no budget spent, as a run its owner's
	// death left, and its start still counts.
	ClassLost
)

// gate is the start gate of an in-process Runner, called on the goroutine
// that is about to call r's handler: it reads the start instant (the one
// rate windows and budgets count), reports it, and returns it on the wall
// clock. It refuses the start, with the reason, when the engine has exited
// (ErrShutdown: no handler starts after ownership is released), when the
// engine's lease is no longer trusted (store.ErrNotOwner, see
// store.Leased), and when a
// rate-limited run would start after its StartBy (ErrLateStart: the run is
// requeued, nothing ran); the Runner then reports Done with NotStarted.
// The Runner checks its own cancellation first.
func (d *Engine) gate(p *Run) (time.Time, error) {
	r := p.r
	d.startMu.RLock()
	defer d.startMu.RUnlock()
	if d.noStarts {
		return time.Time{}, ErrShutdown
	}
	if l, ok := d.own.(store.Leased); ok && !l.Trusted() {
		// A lease not renewed in time (a process frozen, a host cut off):
		// a standby may own the database by now, and count this run's
		// logged decision as started before it took over.
		return time.Time{}, store.ErrNotOwner
	}
	now := d.now()
	wall := d.wall()
	if !p.StartBy.IsZero() {
		if now.After(r.startBy) {
			return time.Time{}, ErrLateStart
		}
		d.in.Push(msgStarted{run: r, start: now, wall: wall})
	}
	d.entered(r)
	for _, q := range p.Batch {
		d.entered(q.r)
	}
	return wall, nil
}

// ErrLateStart is why a rate-limited run whose handler would have started
// after its StartBy (Config.MaxStartDelay after its dispatch was decided)
// did not start.
var ErrLateStart = errors.New("runcue: the handler would have started more than MaxStartDelay after its dispatch was decided")

// reportStart reports that r's handler started at at, on the engine's timeline
// (Now), for a Runner that does not ask Begin: one whose handlers run
// elsewhere, or that reports late or out of order. A start reported
// outside [decision, StartBy] counts at StartBy, the latest instant it can
// affect; a start never reported counts there too.
func (d *Engine) reportStart(p *Run, at time.Time) {
	r := p.r
	if !p.StartBy.IsZero() {
		d.in.Push(msgStarted{run: r, start: at, wall: d.toWall(at)})
	}
	d.entered(r)
	for _, q := range p.Batch {
		d.entered(q.r)
	}
}

// entered records that r's handler started, for Settle's counts.
func (d *Engine) entered(r *run) {
	if r.entered.Swap(true) {
		return
	}
	d.activity.Add(1)
	if r.local {
		d.inside.Add(1)
		d.launching.Add(-1)
	}
}

// reportEnd reports how r ended. A Runner calls it once per run it launched,
// after the handler returned, or with NotStarted when it never called it.
func (d *Engine) reportEnd(p *Run, e Ending) {
	r := p.r
	if r.endReported.Swap(true) {
		return // a Runner that reports twice: the first report stands
	}
	if e.NotStarted && (errors.Is(e.Err, ErrLateStart) || errors.Is(e.Err, store.ErrNotOwner)) {
		e.Class = ClassLateStart // refused by the gate (Begin): nothing ran
	}
	r.end = e
	d.in.Push(msgDone{run: r})
	// After the message is pushed (see settling).
	d.activity.Add(1)
	switch {
	case !r.local:
	case r.entered.Load():
		d.inside.Add(-1)
	default:
		d.launching.Add(-1)
	}
}
