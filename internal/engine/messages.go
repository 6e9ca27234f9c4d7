package engine

import (
	"context"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Messages: everything that reaches the dispatcher goroutine arrives as one
// of these values on its inbox (d.in), from the Cue's methods, the writer's
// commit callbacks, handler goroutines and the helper goroutines. The types
// below are the only messages; handle (dispatcher.go) switches on them.
// Each field says what it carries; none is shared with another kind.
type message interface{ isMessage() }

// msgInserted: units this Cue committed, and the events of the same
// insert that ended other units (dropped for room, failed because a
// dependency was dead).
type msgInserted struct {
	units []*store.Unit
	ended []store.Event
}

// msgExternal: events committed by another process (or requeues by this
// one), to apply.
type msgExternal struct{ events []store.Event }

// msgQuestions: questions another process asked the owner
// (store.Questioner), to answer.
type msgQuestions struct{ questions []store.OwnerQuestion }

// msgDone: a run's Runner reported its end (Run.Done), in run.end. (One
// pointer: pushing it allocates nothing.)
type msgDone struct{ run *run }

// msgRunWritten: a run's claim (claim) or Finish committed (applied) or
// not; derived are the events the store added for other units with a
// Finish (dependents failed or cancelled with its unit).
type msgRunWritten struct {
	run   *run
	claim bool
	// logged: the run's start logged ahead of its claim (store.LogStart)
	// committed (applied) or not.
	logged  bool
	applied bool
	derived []store.Event
	// each says, for a batch's claims, which applied (the leader's
	// first).
	each []bool
}

// msgStop: stop dispatching; cancel also cancels running handlers.
type msgStop struct{ cancel bool }

// msgAbandon: exit now, leaving running handlers behind.
type msgAbandon struct{}

// msgRegistry: tasks or services were registered in the Cue; a snapshot of
// its registrations.
type msgRegistry struct{ reg Registry }

// msgRoom: what the executors of a task have room for (SetRoom).
type msgRoom struct {
	task string
	room int
}

// msgStoreFailed: the store failed; nothing more is dispatched.
type msgStoreFailed struct{ err error }

// msgDrain: reply once no work of registered task types is left.
type msgDrain struct{ reply chan drainReply }

// msgSync: reply after one full loop iteration (tests and Settle).
type msgSync struct{ reply chan struct{} }

// msgCancel: Cancel from this Cue; the outcome goes to reply.
type msgCancel struct {
	id    string
	opts  rt.CancelOptions
	reply chan CancelReply
}

// msgHeartbeat: a handler reported liveness.
type msgHeartbeat struct{ run *run }

// msgPruned: a retention pass committed; more reports a full batch.
type msgPruned struct{ more bool }

// msgApplied: events of this Cue's commits that end queued units.
type msgApplied struct{ events []store.Event }

// msgServiceChanged: this Cue changed a service's stored override or
// pause; applied is closed once the dispatcher applies the change.
type msgServiceChanged struct {
	service string
	applied chan struct{}
}

// msgPausesChanged: a task's or the queue's pause changed (in this
// process); applied is closed once the owner applied the stored pauses.
type msgPausesChanged struct {
	applied chan struct{}
}

// msgGhost: the store answered the Recover of ghost g (its lease ended).
type msgGhost struct {
	g   *ghost
	res store.Result
	err error
}

// msgFenced: a write of this owner failed with store.ErrNotOwner (another
// Cue took ownership), or its lease was lost (lease; see watchLease).
type msgFenced struct{ lease bool }

// msgCall runs f on the dispatcher goroutine: queries (service status,
// Explain) and test inspection. f must not block.
type msgCall struct{ f func(*Engine) }

// ask runs f on d's goroutine (a msgCall) and returns its answer. ok
// is false when d ended before answering; err is ctx's when it ended first.
func ask[T any](ctx context.Context, d *Engine, f func(*Engine) T) (v T, ok bool, err error) {
	ch := make(chan T, 1)
	d.in.Push(msgCall{f: func(d *Engine) { ch <- f(d) }})
	select {
	case v = <-ch:
		return v, true, nil
	case <-d.done:
		return v, false, nil
	case <-ctx.Done():
		return v, false, ctx.Err()
	}
}

// msgSettled: an op (not a run's Finish) that ends unit id committed
// (applied) or not, leaving it in state; derived are the events the store
// added for other units (dependents failed or cancelled with it).
type msgSettled struct {
	id      string
	state   store.State
	applied bool
	derived []store.Event
}

// msgRead: a read of the store the loop asked for finished; apply uses
// its answer (see reads.go).
type msgRead struct{ apply func(*Engine) }

// msgChecked: a DependencySatisfied check of unit id finished.
type msgChecked struct {
	id string
	ok bool
}

// msgScores: a scoring pass finished; scores are in the order of its units.
type msgScores struct {
	pass   uint64
	scores []float64
}

// msgParams: a read of params (params.go) finished.
type msgParams struct {
	batch *paramBatch
	units []*unit
}

// msgLoaded: a batch of the streamed load of queued units (recovery.go):
// the units read of those not ended, how many queued units the batch read,
// and whether it is the last (done; err says why it ended early).
type msgLoaded struct {
	units []*unit
	read  int
	done  bool
	err   error
}

// msgScoreOverrun: a scoring pass took longer than CallbackTimeout.
type msgScoreOverrun struct{ pass uint64 }

// msgFed: a Feed call finished.
type msgFed struct{ err error }

// msgObserved: a run's Runner reported what a service said of its limits.
type msgObserved struct {
	run *run
	obs rt.Observation
	at  time.Time // when it was reported, on the timeline
}

// msgProgress: a handler reported progress; emit it at due (on the
// scheduling timeline).
type msgProgress struct {
	run *run
	due time.Time
}

// msgStarted: a rate-limited or budgeted run's handler started at start (on the
// scheduling timeline).
type msgStarted struct {
	run   *run
	start time.Time
	wall  time.Time // the same instant on the wall clock (Work.Started)
}

func (msgInserted) isMessage()       {}
func (msgExternal) isMessage()       {}
func (msgQuestions) isMessage()      {}
func (msgDone) isMessage()           {}
func (msgGhost) isMessage()          {}
func (msgFenced) isMessage()         {}
func (msgRunWritten) isMessage()     {}
func (msgStop) isMessage()           {}
func (msgAbandon) isMessage()        {}
func (msgRegistry) isMessage()       {}
func (msgRoom) isMessage()           {}
func (msgStoreFailed) isMessage()    {}
func (msgDrain) isMessage()          {}
func (msgSync) isMessage()           {}
func (msgCancel) isMessage()         {}
func (msgHeartbeat) isMessage()      {}
func (msgObserved) isMessage()       {}
func (msgPruned) isMessage()         {}
func (msgApplied) isMessage()        {}
func (msgServiceChanged) isMessage() {}
func (msgCall) isMessage()           {}
func (msgSettled) isMessage()        {}
func (msgChecked) isMessage()        {}
func (msgRead) isMessage()           {}
func (msgScores) isMessage()         {}
func (msgScoreOverrun) isMessage()   {}
func (msgLoaded) isMessage()         {}
func (msgParams) isMessage()         {}
func (msgFed) isMessage()            {}
func (msgProgress) isMessage()       {}
func (msgStarted) isMessage()        {}
func (msgPausesChanged) isMessage()  {}
