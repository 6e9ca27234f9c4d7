package runcue

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runcue/runcue/internal/writer"
	"github.com/runcue/runcue/store"
)

// The outcome of a run: decide is the one place that turns how a run ended
// into its unit's fate and the store.Finish that records it; conclude
// (below) is the one place that applies the decision and submits the
// Finish.

// ending is how a run ended.
type ending struct {
	// returned: the handler returned. Otherwise its deadline or its
	// cancellation grace passed first, and err says which.
	returned bool
	// err is the handler's error (nil: success) or, when it did not
	// return, why it was cut off (ErrTimeout after its timeout,
	// ErrCancelled).
	err    error
	result []byte
	// cancelled: a Cancel reached the run (its options).
	cancelled *CancelOptions
	// shutdown: StopAndCancel cut the run short.
	shutdown bool
	// at is the wall-clock end.
	at time.Time
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
	services     []string
	policy       RetryPolicy
	maxDeferrals int
	// probe: the run was a half-open circuit's probe; probeFails is the
	// unit's failed probes in a row before this run.
	probe      bool
	probeFails int
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
		Attempt: store.Attempt{Run: f.run, Start: f.start, End: e.at}}
	delay, services, isDeferral := retryAfterOf(e.err)
	var errText string
	if e.err != nil {
		errText = boundedText(e.err.Error(), maxErrorText)
	}
	skipReason, isSkip := skipOf(e.err)
	switch {
	case e.returned && e.err == nil:
		o.verdict = verdictSuccess
		fin.State, fin.Result = store.Completed, e.result
		fin.Attempt.Outcome = "completed"
		fin.Events = []store.Event{{Type: string(EventWorkCompleted), Task: f.task, Attempt: f.run, Result: e.result}}
	case e.returned && isSkip:
		// The handler chose to skip: final like a success, whatever else
		// happened meanwhile; no budget, no circuit verdict.
		fin.State = store.Skipped
		fin.Error, fin.ErrorKind = skipReason, "skipped"
		fin.Attempt.Outcome, fin.Attempt.Error = "skipped", skipReason
		fin.Events = []store.Event{{Type: string(EventWorkSkipped), Task: f.task, Attempt: f.run,
			Data: eventData{Reason: skipReason}.encode()}}
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
		fin.Events = []store.Event{{Type: string(EventWorkCancelled), Task: f.task, Attempt: f.run,
			Data: eventData{Reason: e.cancelled.Reason}.encode()}}
	case e.returned && e.shutdown:
		// Cut short by shutdown: back to the queue, no budget spent.
		o.requeue = true
		fin.State = store.Queued
		fin.Error, fin.ErrorKind = errText, "interrupted"
		fin.Attempt.Outcome, fin.Attempt.Error = "interrupted", errText
		fin.Events = []store.Event{{Type: string(EventWorkRequeued), Task: f.task, Attempt: f.run,
			Data: eventData{Reason: "shutdown"}.encode()}}
	case e.returned && errors.Is(e.err, errLateStart):
		// Never started (see Config.MaxStartDelay): nothing ran.
		o.requeue = true
		fin.State = store.Queued
		fin.Error, fin.ErrorKind = errText, "late_start"
		fin.Attempt.Outcome, fin.Attempt.Error = "late_start", errText
		fin.Events = []store.Event{{Type: string(EventWorkRequeued), Task: f.task, Attempt: f.run,
			Data: eventData{Reason: "late_start"}.encode()}}
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
		fin.Events = []store.Event{{Type: string(EventWorkRetrying), Task: f.task, Attempt: f.run,
			Data: eventData{NextAttempt: next.UnixNano(), Reason: "retry_after", Error: errText, Services: o.holdServices}.encode()}}
	default:
		// A failure: retried while the policy allows.
		kind := "error"
		switch {
		case !e.returned, errors.Is(e.err, ErrTimeout):
			// Cut off at the deadline, or returned its context's cause
			// (ErrTimeout) before the deadline was handled here.
			kind = "timeout"
		case errors.Is(e.err, ErrPanic):
			kind = "panic"
		}
		o.verdict = verdictFailure
		if e.returned && (errors.Is(e.err, ErrPermanent) || isDeferral) {
			o.verdict = verdictNone // input errors and politeness never open a circuit
		}
		msg := errText
		fin.Error, fin.ErrorKind = msg, kind
		fin.Attempt.Outcome, fin.Attempt.Error = kind, msg
		if kind == "error" {
			fin.Attempt.Outcome = "failed"
		}
		if f.probe && o.verdict == verdictFailure && f.probeFails < MaxFreeProbes {
			// The circuit's probe failed: the service is still down, not
			// the unit. Its circuit reopens; the unit comes back at once,
			// no retry budget spent, behind the units queued with it
			// (toBack), so that another one is the next probe.
			o.probeFails++
			o.requeue, o.toBack = true, true
			fin.State = store.Queued
			fin.Events = []store.Event{
				{Type: string(EventWorkFailed), Task: f.task, Attempt: f.run,
					Data: eventData{Error: msg, ErrorKind: kind, WillRetry: true}.encode()},
				{Type: string(EventWorkRetrying), Task: f.task, Attempt: f.run,
					Data: eventData{Reason: "probe_failed"}.encode()},
			}
			break
		}
		fin.SpendBudget = true
		o.failures++
		if o.failures < f.policy.MaxAttempts && f.policy.retryable(e.err) {
			next := e.at.Add(f.policy.Delay(o.failures, jitter))
			o.requeue, o.runAt, o.why = true, next, "backoff"
			fin.State, fin.RunAt = store.Queued, next
			fin.Events = []store.Event{
				{Type: string(EventWorkFailed), Task: f.task, Attempt: f.run,
					Data: eventData{Error: msg, ErrorKind: kind, WillRetry: true}.encode()},
				{Type: string(EventWorkRetrying), Task: f.task, Attempt: f.run,
					Data: eventData{NextAttempt: next.UnixNano()}.encode()},
			}
			break
		}
		fin.State, fin.Propagate = store.Failed, true
		fin.Events = []store.Event{{Type: string(EventWorkFailed), Task: f.task, Attempt: f.run,
			Data: eventData{Error: msg, ErrorKind: kind}.encode()}}
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
func (d *dispatcher) facts(r *run) runFacts {
	u := r.u
	policy := r.lane.task.retry
	if u.more != nil && u.more.retry != nil {
		p := *u.more.retry
		p.RetryOn = policy.RetryOn
		policy = p.withDefaults()
	}
	f := runFacts{id: u.id, task: u.task, target: u.target, owner: d.owner, run: r.no, start: r.start,
		failures: int(u.failures), deferrals: int(u.deferrals), policy: policy, maxDeferrals: r.lane.task.def.maxDeferrals(),
		services: r.lane.serviceNames(), probe: len(r.probes) > 0, probeFails: int(u.probeFails)}
	return f
}

// conclude ends r as e says: the run leaves the running set (its
// resources are released, unless it holds them until its handler
// returns), the decision is applied to its unit, and its Finish is
// submitted. It is the only place a run's Finish is submitted.
func (d *dispatcher) conclude(r *run, e ending) {
	u := r.u
	if r.claimFailed {
		// The store refused the claim (the unit was cancelled elsewhere,
		// or the store failed): there is nothing to record.
		d.end(r, e.returned, verdictNone)
		d.forget(u)
		endSpan(r.span, "abandoned", nil)
		if e.returned {
			r.cancel(nil)
		}
		return
	}
	o := decide(d.facts(r), e, d.rnd.Float64())
	d.end(r, e.returned, o.verdict)
	u.failures, u.deferrals, u.probeFails = int32(o.failures), int32(o.deferrals), uint8(o.probeFails)
	if o.hold > 0 {
		d.blockServices(r.lane, o.holdServices, o.holdUnknown, o.hold)
	}
	if o.requeue {
		u.why = whyNamed(o.why)
		if o.toBack {
			u.seq = d.backSeq()
		}
		d.requeueLocal(u, o.runAt)
	} else {
		d.forget(u)
	}
	if o.fin.Attempt.Outcome == "late_start" {
		d.log.Warn("runcue: a rate-limited run would have started too long after its dispatch was decided; requeued",
			"work_unit_id", r.id, "task_type", r.task, "max_start_delay", d.cfg.MaxStartDelay)
	}
	recorded := e.err
	if !e.returned && e.cancelled != nil {
		recorded = ErrCancelled
	}
	r.mem.fin = o.fin
	fin := &r.mem.fin
	d.record(r, fin, recorded, e.at)
	if e.returned {
		r.cancel(nil)
	}
	r.mem.finOps[0] = fin
	r.mem.finReq = writer.Request{Ops: r.mem.finOps[:], Sink: (*finishSink)(r)}
	d.uncommitted++
	d.enqueue(&r.mem.finReq)
	if h := d.hooks.concluded; h != nil {
		h(r)
	}
}

// timeoutError is the failure recorded for a run cut off at its deadline.
func timeoutError(r *run) error {
	return fmt.Errorf("%w after %v", ErrTimeout, r.deadline.Sub(r.start))
}
