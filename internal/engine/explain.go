package engine

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// explain runs on the dispatcher goroutine. It returns an empty Explanation
// for a unit it does not hold, with the reason not_loaded (and no ID) while
// a deep queue is loading: the unit may be one not loaded yet.
func (d *Engine) explain(id string) rt.Explanation {
	now := d.now()
	u := d.units[id]
	if u == nil {
		for task, o := range d.orphans {
			if ou := o[id]; ou != nil {
				return rt.Explanation{ID: id, Task: task, State: store.Queued, Reasons: []rt.Reason{{Kind: rt.ReasonTaskNotRegistered,
					Detail: fmt.Sprintf("no handler for task type %q in the owning Cue", task)}}}
			}
		}
		if d.loading {
			return rt.Explanation{Reasons: []rt.Reason{{Kind: rt.ReasonNotLoaded,
				Detail: fmt.Sprintf("the owning Cue has not loaded it yet: %d queued units are stored behind the %d it holds", d.unloaded, d.heldQueued())}}}
		}
		return rt.Explanation{}
	}
	ex := rt.Explanation{ID: id, Task: u.task, State: store.Queued, Notes: d.unmatchedNotes(u)}
	add := func(r rt.Reason) { ex.Reasons = append(ex.Reasons, r) }
	if d.stopping || d.failed != nil {
		add(rt.Reason{Kind: rt.ReasonStopping, Detail: "the owning Cue is stopping or its store failed: nothing is dispatched"})
	}
	if d.queuePaused && u.state != uRunning {
		add(QueuePausedReason())
	}
	switch u.state {
	case uRunning:
		ex.State = store.Running
		add(rt.Reason{Kind: rt.ReasonRunning, Detail: "running"})
		return ex
	case uBlocked:
		var waiting []string
		for _, dep := range u.deps() {
			if d.waiting(u, dep) {
				waiting = append(waiting, dep)
			}
		}
		add(rt.Reason{Kind: rt.ReasonDependencies, Dependencies: waiting, Until: u.depsBy(),
			Detail: fmt.Sprintf("waiting for %d of %d dependencies to complete", len(waiting), len(u.deps()))})
	case uChecking:
		r := rt.Reason{Kind: rt.ReasonDependencyCheck, Detail: "dependencies completed; DependencySatisfied has not said they are usable"}
		for _, e := range d.timers.Items() {
			if e.kind == tRecheck && e.u == u {
				r.Until = d.toWall(e.at)
			}
		}
		add(r)
	case uWaiting:
		add(TimeReason(u.why.String(), u.runAt))
	case uSequenced:
		add(d.sequenceReason(u))
	case uReady:
		if d.inflight >= d.cfg.MaxConcurrent {
			add(rt.Reason{Kind: rt.ReasonGlobalCap, Detail: fmt.Sprintf("%d units are running, the Cue's MaxConcurrent", d.inflight)})
		}
		if d.uncommitted >= d.cfg.MaxUncommitted {
			add(rt.Reason{Kind: rt.ReasonCommitBacklog, Detail: fmt.Sprintf("%d ended runs wait for their outcomes to be committed, the Cue's MaxUncommitted", d.uncommitted)})
		}
		for _, r := range u.lane.resources {
			if rs, ok := d.resourceReason(r, now, u.costs(), u.lane); ok {
				rs.Until = d.toWall(rs.Until)
				if b := r.SpentBudget(now); rs.Kind == rt.ReasonBudgetExhausted && b != nil {
					rs.Until = b.PeriodEnd() // exact: the period ends on the wall clock
				}
				add(rs)
			}
		}
		if e := u.lane.batchTimer; e != nil {
			add(rt.Reason{Kind: rt.ReasonBatch, Until: d.toWall(e.at), Detail: fmt.Sprintf("its batch holds %d units (at most %d): it waits for more to join it",
				u.lane.units.Len(), u.lane.task.spec.Batch.Max)})
		}
		if len(ex.Reasons) == 0 {
			add(rt.Reason{Kind: rt.ReasonEligible, Detail: "nothing holds it back; it runs when its turn comes"})
		}
	}
	if len(u.skipped()) > 0 {
		add(SkippedReason(u.skipped()))
	}
	if d.bpActive {
		add(rt.Reason{Kind: rt.ReasonBackpressure, Detail: fmt.Sprintf("the queue is over its high-water mark (%d queued, MaxQueued %d)",
			d.queuedCount(), d.cfg.MaxQueued)})
	}
	return ex
}

// resourceReason says why r refuses a dispatch of a unit of costs on lane
// l now, if it does: its refusal, in words.
func (d *Engine) resourceReason(r *resource, now time.Time, costs rt.Costs, l *lane) (rt.Reason, bool) {
	d.syncBudgets(r)
	rf, refused := r.RefusalFor(now, costs, l)
	if refused && r.class == "" && rf.Kind == broker.RefusePaused {
		return TaskPausedReason(r.name[len("task "):]), true
	}
	if !refused || (r.class == "" && rf.Kind != broker.RefuseTaskCap && rf.Kind != broker.RefuseNoRunner) {
		return rt.Reason{}, false
	}
	name := r.name
	reason := rt.Reason{Kind: reasons[rf.Kind], Service: name, Until: rf.Until}
	switch reason.Kind {
	case rt.ReasonTaskCap:
		reason.Service, reason.Detail = "", fmt.Sprintf("%d units of the task are running, its MaxConcurrent", r.Active)
		if r.roomed {
			reason.Detail = fmt.Sprintf("%d units of the task are running, all its live executors have room for", r.Active)
		}
	case rt.ReasonNoExecutor:
		reason.Service, reason.Detail = "", "no live executor runs the task"
	case rt.ReasonPaused:
		reason.Detail = name + " is paused"
	case rt.ReasonBudgetExhausted:
		b := r.SpentBudget(now)
		for i, rb := range r.Budgets {
			if rb == b {
				spec := r.budgetSpecs[i]
				reason.Detail = fmt.Sprintf("%s's budget of %d requests per %s (%s) is spent until %s", name, spec.Requests,
					spec.Per, location(spec), b.PeriodEnd().In(location(spec)).Format(time.RFC3339))
			}
		}
	case rt.ReasonServiceRetryAfter:
		reason.Detail = name + " asked to wait (Retry-After)"
	case rt.ReasonCircuitOpen:
		reason.Detail = fmt.Sprintf("%s's circuit is open after %d consecutive failures", name, r.Circuit.Threshold)
	case rt.ReasonCircuitProbe:
		reason.Detail = name + "'s circuit is half-open; its probe is running"
	case rt.ReasonServiceBusy:
		reason.Detail = fmt.Sprintf("%s has %d of %d slots in use", name, r.Active, r.Limit)
	case rt.ReasonMeterFull:
		reason.Meter = rf.Meter
		if a := r.Amount(rf.Meter); a != nil {
			reason.Detail = amountDetail(name, a, now, costs.Of(rf.Meter), d.toWall(rf.Until))
			if rf.Held {
				reason.Detail += fmt.Sprintf("; %s held for an older unit of cost %s until it starts, at the latest %s", rf.Meter,
					grouped(r.Held.Costs.Of(rf.Meter)), d.toWall(r.Held.Until).UTC().Format("15:04:05.000 UTC"))
			}
			break
		}
		reason.Detail = fmt.Sprintf("%s's %s meter is full", name, rf.Meter)
	case rt.ReasonRateLimited:
		if r.Window == nil {
			reason.Detail = fmt.Sprintf("%s's rate window is full", name)
			break
		}
		reason.Detail = fmt.Sprintf("%s's rate window is full (%d per %v)", name, r.Window.Limit(), r.Window.Length())
		if r.Window.Paced() && r.Window.Used(now) < r.Window.Limit() {
			reason.Detail = fmt.Sprintf("%s is paced: one start every %v (%d per %v)", name,
				r.Window.Length()/time.Duration(r.Window.Limit()), r.Window.Limit(), r.Window.Length())
		}
	}
	switch {
	case reason.Kind == rt.ReasonServiceBusy:
		reason.Detail += adaptNote(r, LimitConcurrency)
	case reason.Kind == rt.ReasonMeterFull:
		reason.Detail += adaptNote(r, rf.Meter)
	case reason.Kind == rt.ReasonRateLimited:
		reason.Detail += adaptNote(r, LimitRequests)
	}
	return reason, true
}

// adaptNote says, for a limit of r an adaptive controller lowered, what
// is in force: "; effective limit 42 (configured 60), lowered after 3
// 429s"; "" for any other limit.
func adaptNote(r *resource, limit string) string {
	if r.adapt == nil {
		return ""
	}
	for _, l := range r.adapt.limits {
		if l.name != limit || l.ctl.Effective() >= l.ctl.Ceiling {
			continue
		}
		s := fmt.Sprintf("; effective limit %d (configured %d)", l.ctl.Limit(), int64(l.ctl.Ceiling))
		c := r.adapt.counts
		if why := (&rt.AdaptiveStatus{Throttled: c.Throttled, Unavailable: c.Unavailable, Timeouts: c.Timeouts}).Signals(); why != "" {
			s += ", lowered after " + why
		}
		return s
	}
	return ""
}

// amountDetail says why amount window a of service name refuses a cost at
// now: "blocked on output_tokens: 7,900 of 8,000 in the last 1m0s (cost
// 400); frees at 12:01:07 UTC" (free is on the wall clock; zero when only
// a start or a run's end can make room).
func amountDetail(name string, a broker.AmountMeter, now time.Time, cost int64, free time.Time) string {
	s := fmt.Sprintf("%s: blocked on %s: %s of %s in the last %v (cost %s)", name, a.Name(), grouped(a.Used(now)),
		grouped(a.Limit()), a.Length(), grouped(cost))
	if _, ok := a.(*broker.Bucket); ok {
		s = fmt.Sprintf("%s: blocked on %s: %s of its bucket of %s taken, refilling %s per %v (cost %s)", name, a.Name(),
			grouped(a.Used(now)), grouped(a.Limit()), grouped(a.Limit()), a.Length(), grouped(cost))
	}
	if seen, share := a.FromElsewhere(now); seen > 0 || share > 0 {
		s += fmt.Sprintf("; %s: %s of %s used by others in the last %v, room kept (%s)", a.Name(), grouped(seen), grouped(a.Limit()),
			a.Length(), grouped(a.Elsewhere(now)))
		if share > 0 {
			s += fmt.Sprintf(", and %.0f%% of the refill left to them", 100*share)
		}
	}
	if free.IsZero() {
		return s + "; room frees as reserved starts are counted"
	}
	return s + "; frees at " + free.UTC().Format("15:04:05.000 UTC")
}

// grouped writes n with thousands separated by commas.
func grouped(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// answerQuestions answers questions another process asked, on the
// dispatcher goroutine, from the live state. An answer forgets the
// answered questions asked more than a minute before: their askers read
// them or gave up.
func (d *Engine) answerQuestions(qs []store.OwnerQuestion) {
	for _, q := range qs {
		var answer any
		switch q.Kind {
		case "explain":
			if ex := d.explain(q.ID); ex.ID != "" {
				ex.AsOf = d.wall()
				answer = ex
			}
		case "services":
			answer = d.serviceStats()
		case "service":
			if st := d.liveKeyStatus(q.Service); st != nil {
				answer = st
			}
		case "sequences":
			answer = d.patternStats()
		}
		var data []byte
		if answer != nil {
			data = d.encode(answer)
		}
		now := d.wall()
		d.submit(&store.AnswerQuestion{Epoch: d.epoch, ID: q.Nonce, Answer: data, Forget: now.Add(-time.Minute)})
	}
}

// unmatchedNotes words the amounts runs reported that no meter of u's
// services counts (checkReported).
func (d *Engine) unmatchedNotes(u *unit) []string {
	var notes []string
	note := func(who string, names []string) {
		for _, n := range names {
			notes = append(notes, fmt.Sprintf("%s: runs reported an amount of %q that no meter counts; it was ignored", who, n))
		}
	}
	note("task "+u.task, d.unmatched["task "+u.task])
	if u.lane == nil {
		return notes
	}
	seen := map[string]bool{}
	for _, r := range u.lane.resources {
		if r.class != "" && !seen[r.class] {
			seen[r.class] = true
			note("service "+r.class, d.unmatched[r.class])
		}
	}
	return notes
}
