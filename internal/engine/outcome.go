package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// The outcome of a run: decide is the one place that turns how a run ended
// into its unit's fate and the store.Finish that records it; conclude
// (below) is the one place that applies the decision and submits the
// Finish.

// ending is how a run ended.
type ending struct {
	// returned: the handler returned (its Runner reported the end).
	// Otherwise its deadline or its cancellation grace passed first, and
	// err says which.
	returned bool
	// err is the handler's error (nil: success) or, when it did not
	// return, why it was cut off (ErrTimeout after its timeout,
	// ErrCancelled); class, skipReason, delay and services are what its
	// Runner made of it (see Ending).
	err        error
	class      Class
	permanent  bool
	skipReason string
	delay      time.Duration
	services   []string
	result     []byte
	// overload: the Runner marked the error as the service's overload
	// (Ending.Overload).
	overload bool
	// cancelled: a Cancel reached the run (its options).
	cancelled *rt.CancelOptions
	// shutdown: StopAndCancel cut the run short.
	shutdown bool
	// at is the wall-clock end.
	at time.Time
	// used are the amounts the run reported it used (Ending.Used).
	used map[string]int64
}

// runFacts is what decide needs to know of a run and its unit.
type runFacts struct {
	id, task, owner string
	target          string
	run             int
	start           time.Time
	// failures and deferrals are the unit's counts before this run.
	failures, deferrals int
	// services are the names of the run's services (keyed instances
	// included), for a Retry-After to hold.
	services []string
	// policy says how many runs may fail and the wait after each (the
	// unit's own, else its task's); retryable whether an error may be
	// retried (its task's).
	policy       RetryPolicy
	retryable    func(error) bool
	maxDeferrals int
	// probe: the run was a half-open circuit's probe; probeFails is the
	// unit's failed probes in a row before this run.
	probe      bool
	probeFails int
	// lease is when the run's lease ends (its deadline plus LeaseBuffer).
	lease time.Time
}

// outcome is the decision about a run.
type outcome struct {
	// fin records the run; conclude submits it.
	fin store.Finish
	// verdict goes to the circuits of the run's services.
	verdict verdict
	// requeue: the unit comes back, eligible at runAt (zero: at once),
	// waiting for why ("backoff", "retry_after" or ""). Otherwise it leaves
	// the dispatcher.
	requeue bool
	runAt   time.Time
	why     string
	// hold, when positive, holds the services in holdServices (resource
	// names, keyed instances included) for that long: a Retry-After.
	// holdUnknown is a service the Retry-After named that the run does not
	// use (all of its services are then held).
	hold         time.Duration
	holdServices []string
	holdUnknown  string
	// failures and deferrals are the unit's counts after the run;
	// probeFails its failed probes in a row.
	failures, deferrals, probeFails int
	// toBack: the unit, requeued, goes behind the units queued with it (a
	// failed probe's, so that another unit probes next).
	toBack bool
	// leaseHeld: the run ended without its Runner reporting the end (its
	// deadline passed): the unit waits for the run's lease to end (runAt)
	// before it runs again, unless the Runner reports the end first; then
	// it may run at backoffAt (the lease rule).
	leaseHeld bool
	backoffAt time.Time
}

// decide returns the fate of a run that ended as e. jitter, in [0, 1),
// draws the retry delay. It is pure: no clock, no I/O, no dispatcher.
func decide(f runFacts, e ending, jitter float64) outcome {
	o := outcome{failures: f.failures, deferrals: f.deferrals}
	if f.probe {
		o.probeFails = f.probeFails // else a run that was no probe ends a run of failed probes
	}
	fin := &o.fin
	*fin = store.Finish{ID: f.id, Task: f.task, Owner: f.owner, Run: f.run, At: e.at,
		Attempt: store.Attempt{Run: f.run, Start: f.start, End: e.at, Used: e.used}}
	delay, services, isDeferral := e.delay, e.services, e.class == ClassRetryAfter
	var errText string
	if e.err != nil {
		errText = boundedText(e.err.Error(), maxErrorText)
	}
	skipReason, isSkip := e.skipReason, e.class == ClassSkip
	switch {
	case e.returned && e.err == nil:
		o.verdict = verdictSuccess
		fin.State, fin.Result = store.Completed, e.result
		fin.Attempt.Outcome = "completed"
		fin.Events = []store.Event{{Type: store.TypeWorkCompleted, Task: f.task, Attempt: f.run, Result: e.result}}
	case e.returned && isSkip:
		// The handler chose to skip: final like a success, whatever else
		// happened meanwhile; no budget, no circuit verdict.
		fin.State = store.Skipped
		fin.Error, fin.ErrorKind = skipReason, "skipped"
		fin.Attempt.Outcome, fin.Attempt.Error = "skipped", skipReason
		fin.Events = []store.Event{{Type: store.TypeWorkSkipped, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Reason: skipReason}}}
	case e.cancelled != nil:
		// Cancelled and not a success: no budget spent.
		reason := e.cancelled.Reason
		if reason == "" {
			reason = "cancelled"
		}
		fin.State = store.Cancelled
		fin.Error, fin.ErrorKind = reason, "cancelled"
		fin.Attempt.Outcome = "cancelled"
		if e.returned && e.err != nil {
			fin.Attempt.Error = errText
		}
		fin.Propagate, fin.CascadeCancel = true, e.cancelled.Cascade
		fin.Events = []store.Event{{Type: store.TypeWorkCancelled, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Reason: e.cancelled.Reason}}}
	case e.returned && e.shutdown:
		// Cut short by shutdown: back to the queue, no budget spent.
		o.requeue = true
		fin.State = store.Queued
		fin.Error, fin.ErrorKind = errText, "interrupted"
		fin.Attempt.Outcome, fin.Attempt.Error = "interrupted", errText
		fin.Events = []store.Event{{Type: store.TypeWorkRequeued, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Reason: "shutdown"}}}
	case e.returned && e.class == ClassLost:
		// Its Runner lost it (the executor running it stopped): back to
		// the queue, no budget spent, as a run its owner's death left.
		o.requeue = true
		fin.State = store.Queued
		fin.Error, fin.ErrorKind = errText, "interrupted"
		fin.Attempt.Outcome, fin.Attempt.Error = "abandoned", errText
		fin.Events = []store.Event{{Type: store.TypeWorkRequeued, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Reason: "executor_lost"}}}
	case e.returned && e.class == ClassLateStart:
		// Never started (see Config.MaxStartDelay): nothing ran.
		o.requeue = true
		fin.State = store.Queued
		fin.Error, fin.ErrorKind = errText, "late_start"
		fin.Attempt.Outcome, fin.Attempt.Error = "late_start", errText
		fin.Events = []store.Event{{Type: store.TypeWorkRequeued, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Reason: "late_start"}}}
	case e.returned && isDeferral && f.deferrals < f.maxDeferrals:
		// Retry-After: come back later, holding the services; no budget.
		next := e.at.Add(delay)
		o.requeue, o.runAt, o.why = true, next, "retry_after"
		o.hold = delay
		o.holdServices, o.holdUnknown = heldServices(f.services, services)
		o.deferrals++
		fin.State, fin.RunAt, fin.Deferral = store.Queued, next, true
		fin.Error, fin.ErrorKind = errText, "retry_after"
		fin.Attempt.Outcome, fin.Attempt.Error = "deferred", errText
		fin.Events = []store.Event{{Type: store.TypeWorkRetrying, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{NextAttempt: next.UnixNano(), Reason: "retry_after", Error: errText, Services: o.holdServices}}}
	default:
		// A failure: retried while the policy allows.
		kind := "error"
		switch {
		case !e.returned, e.class == ClassTimeout, errors.Is(e.err, ErrTimeout):
			// Cut off at the deadline, or returned its context's cause
			// (ErrTimeout) before the deadline was handled here.
			kind = "timeout"
		case e.class == ClassPanic:
			kind = "panic"
		}
		o.verdict = verdictFailure
		if e.returned && (e.permanent || isDeferral) {
			o.verdict = verdictNone // input errors and politeness never open a circuit
		}
		msg := errText
		fin.Error, fin.ErrorKind = msg, kind
		fin.Attempt.Outcome, fin.Attempt.Error = kind, msg
		if kind == "error" {
			fin.Attempt.Outcome = "failed"
		}
		if f.probe && o.verdict == verdictFailure && f.probeFails < rt.MaxFreeProbes {
			// The circuit's probe failed: the service is still down, not
			// the unit. Its circuit reopens; the unit comes back at once,
			// no retry budget spent, behind the units queued with it
			// (toBack), so that another one is the next probe.
			o.probeFails++
			o.requeue, o.toBack = true, true
			fin.State = store.Queued
			if !e.returned {
				o.leaseHeld, o.runAt, fin.RunAt = true, f.lease, f.lease
			}
			fin.Events = []store.Event{
				{Type: store.TypeWorkFailed, Task: f.task, Attempt: f.run,
					Detail: &store.EventData{Error: msg, ErrorKind: kind, WillRetry: true}},
				{Type: store.TypeWorkRetrying, Task: f.task, Attempt: f.run,
					Detail: &store.EventData{Reason: "probe_failed"}},
			}
			break
		}
		fin.SpendBudget = true
		o.failures++
		if o.failures < f.policy.Attempts() && !e.permanent && f.retryable(e.err) {
			next := e.at.Add(f.policy.Delay(o.failures, jitter))
			if !e.returned && next.Before(f.lease) {
				// The lease rule: the run may go on until its lease ends.
				o.leaseHeld, o.backoffAt, next = true, next, f.lease
			}
			o.requeue, o.runAt, o.why = true, next, "backoff"
			fin.State, fin.RunAt = store.Queued, next
			fin.Events = []store.Event{
				{Type: store.TypeWorkFailed, Task: f.task, Attempt: f.run,
					Detail: &store.EventData{Error: msg, ErrorKind: kind, WillRetry: true}},
				{Type: store.TypeWorkRetrying, Task: f.task, Attempt: f.run,
					Detail: &store.EventData{NextAttempt: next.UnixNano()}},
			}
			break
		}
		fin.State, fin.Propagate = store.Failed, true
		fin.Events = []store.Event{{Type: store.TypeWorkFailed, Task: f.task, Attempt: f.run,
			Detail: &store.EventData{Error: msg, ErrorKind: kind}}}
	}
	for i := range fin.Events {
		fin.Events[i].Target = f.target
	}
	return o
}

// maxErrorText bounds the error text recorded of a run (in its unit, its
// attempt and its events): a handler's error can be of any size.
const maxErrorText = 32 << 10

// boundedText returns s cut to at most limit bytes, at a character's
// start, with a note of how much was cut.
func boundedText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	note := fmt.Sprintf(" … (%d bytes cut)", len(s)-limit)
	cut := limit - len(note)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + note
}

// heldServices resolves the services a Retry-After names against those a
// run used (used: resource names, keyed instances "class:key" included): a
// service used is held if named by its name or its class, and every one
// is held when none is named, or when one named is not used (unknown: a
// typo, say; holding too much is safer than ignoring the request).
func heldServices(used, named []string) (held []string, unknown string) {
	for _, n := range named {
		if !slices.ContainsFunc(used, func(u string) bool { return u == n || classOf(u) == n }) {
			return used, n
		}
	}
	if len(named) == 0 {
		return used, ""
	}
	for _, u := range used {
		if slices.Contains(named, u) || slices.Contains(named, classOf(u)) {
			held = append(held, u)
		}
	}
	return held, ""
}

// classOf returns the service whose limits apply to resource name: name,
// or for a keyed instance ("host:example.org") its class.
func classOf(name string) string {
	if i := strings.IndexByte(name, ':'); i > 0 {
		return name[:i]
	}
	return name
}

// facts gathers what decide needs of r.
func (d *Engine) facts(r *run) runFacts {
	u := r.u
	spec := r.lane.task.spec
	policy := spec.Retry
	if u.more != nil && u.more.retry != nil {
		policy = u.more.retry // its RetryOn is not stored: the task's applies
	}
	return runFacts{lease: r.deadline.Add(d.cfg.LeaseBuffer), id: u.id, task: u.task, target: u.target, owner: r.pub.Owner, run: r.no, start: r.start,
		failures: int(u.failures), deferrals: int(u.deferrals), policy: policy, retryable: spec.Retryable,
		maxDeferrals: spec.MaxDeferrals, services: r.lane.serviceNames(), probe: len(r.probes) > 0, probeFails: int(u.probeFails)}
}
