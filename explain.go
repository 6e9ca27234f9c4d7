package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// ReasonKind names why a unit is not running. The strings are stable.
type ReasonKind string

// Reasons a unit is not running now.
const (
	// ReasonRunning: it is running.
	ReasonRunning ReasonKind = "running"
	// ReasonFinished: it is completed, skipped, failed or cancelled.
	ReasonFinished ReasonKind = "finished"
	// ReasonDependencies: it waits for Dependencies to complete.
	ReasonDependencies ReasonKind = "waiting_dependencies"
	// ReasonDependencyCheck: its dependencies completed, but
	// Config.DependencySatisfied does not (yet) say they are usable; Until
	// is the next check.
	ReasonDependencyCheck ReasonKind = "dependency_not_satisfied"
	// ReasonServiceBusy: Service is at its concurrency limit.
	ReasonServiceBusy ReasonKind = "service_at_capacity"
	// ReasonRateLimited: Service's rate window is full until Until.
	ReasonRateLimited ReasonKind = "rate_window_full"
	// ReasonCircuitOpen: Service's circuit is open until Until.
	ReasonCircuitOpen ReasonKind = "circuit_open"
	// ReasonCircuitProbe: Service's circuit is half-open and its one probe
	// is running.
	ReasonCircuitProbe ReasonKind = "circuit_probing"
	// ReasonBudgetExhausted: a calendar budget of Service (Service.Budgets)
	// is spent until Until, the start of its next period.
	ReasonBudgetExhausted ReasonKind = "budget_exhausted"
	// ReasonQueuePaused: the queue is paused (PauseQueue).
	ReasonQueuePaused ReasonKind = "queue_paused"
	// ReasonTaskPaused: the unit's task type is paused (PauseTask).
	ReasonTaskPaused ReasonKind = "task_paused"
	// ReasonPaused: Service is paused.
	ReasonPaused ReasonKind = "service_paused"
	// ReasonServiceRetryAfter: Service asked for a pause (Retry-After)
	// until Until.
	ReasonServiceRetryAfter ReasonKind = "service_retry_after"
	// ReasonGlobalCap: Config.MaxConcurrent units are running.
	ReasonGlobalCap ReasonKind = "global_cap"
	// ReasonCommitBacklog: Config.MaxUncommitted ended runs wait for the
	// database to record their outcomes.
	ReasonCommitBacklog ReasonKind = "commit_backlog"
	// ReasonTaskCap: the task's MaxConcurrent units are running.
	ReasonTaskCap ReasonKind = "task_cap"
	// ReasonBackoff: it failed and retries at Until.
	ReasonBackoff ReasonKind = "retry_backoff"
	// ReasonRetryAfter: its last run was deferred by a Retry-After; it runs
	// again at Until.
	ReasonRetryAfter ReasonKind = "retry_after"
	// ReasonRunAt: it was submitted to run at Until.
	ReasonRunAt ReasonKind = "run_at"
	// ReasonDependenciesSkipped (informational): Dependencies were skipped
	// (Skip) and count as satisfied, since the unit's task does not set
	// FailOnSkippedDependency.
	ReasonDependenciesSkipped ReasonKind = "dependencies_skipped"
	// ReasonBackpressure: the queue is over its high-water mark; new
	// submissions are refused or wait (informational).
	ReasonBackpressure ReasonKind = "backpressure"
	// ReasonTaskNotRegistered: its task type has no handler in the owning
	// Cue.
	ReasonTaskNotRegistered ReasonKind = "task_not_registered"
	// ReasonNotOwned: no Cue in this process owns the database (Start), so
	// nothing here dispatches it; the reasons given are those the database
	// shows.
	ReasonNotOwned ReasonKind = "not_owned"
	// ReasonStopping: the owning Cue is stopping, or its store failed.
	ReasonStopping ReasonKind = "stopping"
	// ReasonEligible: nothing holds it back; it runs when its turn comes
	// (submission order, or priority when Config.Priority is set).
	ReasonEligible ReasonKind = "eligible"
)

// Reason is one reason a unit is not running.
type Reason struct {
	Kind ReasonKind `json:"kind"`
	// Service is the service concerned, if any.
	Service string `json:"service,omitempty"`
	// Until is when the reason may end, if known.
	Until time.Time `json:"until,omitzero"`
	// Dependencies are the units still awaited (ReasonDependencies) or
	// skipped (ReasonDependenciesSkipped).
	Dependencies []string `json:"dependencies,omitempty"`
	// Detail is a human-readable sentence.
	Detail string `json:"detail"`
}

// Explanation says why a unit is not running now.
type Explanation struct {
	ID    string `json:"id"`
	Task  string `json:"task"`
	State State  `json:"state"`
	// Reasons are every reason that holds now, most fundamental first.
	Reasons []Reason `json:"reasons"`
	// Live reports that the owning dispatcher answered from its live state
	// (this Cue owns the database and holds the unit). Otherwise the
	// answer was read from the database at AsOf: stored pauses, holds,
	// circuits, logged rate windows and budgets, dependencies and delays,
	// as they were committed then. A keyed instance's reasons are given
	// only where the unit's task is registered with its ServiceKeys.
	Live bool      `json:"live"`
	AsOf time.Time `json:"as_of"`
}

// Explain says why a unit is not running right now: waiting on
// dependencies, a service at its cap, a rate window full until some time,
// an open circuit, a paused service, the global or task cap, retry backoff
// or RunAt, backpressure, or a task type not registered. In the owning Cue
// the answer comes from the dispatcher's live state; elsewhere, from the
// database.
func (c *Cue) Explain(ctx context.Context, id string) (Explanation, error) {
	if err := c.checkOpen(); err != nil {
		return Explanation{}, err
	}
	if d := c.disp.Load(); d != nil {
		ex, ok, err := askLoop(ctx, d, func(d *dispatcher) Explanation { return d.explain(id) })
		if err != nil {
			return Explanation{}, err
		}
		if ok && ex.ID != "" {
			ex.Live, ex.AsOf = true, c.clock.Now()
			return ex, nil
		}
		// Not in the dispatcher's memory (finished, or not loaded yet), or
		// the dispatcher ended.
	}
	if c.disp.Load() == nil {
		var ex Explanation
		if c.askOwner(ctx, ownerQuestion{Kind: "explain", ID: id}, &ex) {
			return ex, nil
		}
	}
	u, err := c.st.GetUnit(ctx, id)
	if err != nil {
		return Explanation{}, c.readErr(err)
	}
	now := c.clock.Now()
	ex := Explanation{ID: u.ID, Task: u.Task, State: u.State, AsOf: now}
	switch {
	case u.State.Terminal():
		ex.Reasons = []Reason{{Kind: ReasonFinished, Detail: finishedDetail(u)}}
	case u.State == store.Running:
		ex.Reasons = []Reason{{Kind: ReasonRunning, Detail: "running on " + u.LeasedBy}}
	default:
		if c.disp.Load() == nil {
			ex.Reasons = append(ex.Reasons, Reason{Kind: ReasonNotOwned, Detail: "this Cue does not own the database; another process (or none) dispatches"})
		}
		paused, err := c.storedPauseReasons(ctx, u.Task)
		if err != nil {
			return Explanation{}, c.readErr(err)
		}
		ex.Reasons = append(ex.Reasons, paused...)
		services, err := c.storedServiceReasons(ctx, u, now)
		if err != nil {
			return Explanation{}, err
		}
		ex.Reasons = append(ex.Reasons, services...)
		var skipped []string
		for _, dep := range u.DependsOn {
			du, err := c.st.GetUnit(ctx, dep)
			switch {
			case err != nil:
			case !du.State.Terminal():
				ex.Reasons = append(ex.Reasons, Reason{Kind: ReasonDependencies, Dependencies: []string{dep},
					Detail: fmt.Sprintf("waiting for %s (%s)", dep, du.State)})
			case du.State == store.Skipped:
				skipped = append(skipped, dep)
			}
		}
		if u.RunAt.After(c.clock.Now()) {
			ex.Reasons = append(ex.Reasons, timeReason(whyOf(u), u.RunAt))
		}
		if len(skipped) > 0 {
			ex.Reasons = append(ex.Reasons, skippedReason(skipped))
		}
	}
	return ex, nil
}

// finishedDetail says how finished unit u ended.
func finishedDetail(u *store.Unit) string {
	switch {
	case u.State == store.Skipped:
		return "the unit is skipped: " + u.Error
	case u.State == store.Completed || u.ErrorKind == "":
		return fmt.Sprintf("the unit is %s", u.State)
	}
	return fmt.Sprintf("the unit is %s (%s): %s", u.State, u.ErrorKind, firstLine(u.Error))
}

// skippedReason notes that the skipped dependencies deps count as
// satisfied.
func skippedReason(deps []string) Reason {
	return Reason{Kind: ReasonDependenciesSkipped, Dependencies: deps,
		Detail: "skipped, and counted as satisfied: " + strings.Join(deps, ", ")}
}

func whyOf(u *store.Unit) string {
	switch {
	case u.ErrorKind == "retry_after":
		return "retry_after"
	case u.Failures > 0:
		return "backoff"
	}
	return "run_at"
}

func timeReason(why string, at time.Time) Reason {
	switch why {
	case "retry_after":
		return Reason{Kind: ReasonRetryAfter, Until: at, Detail: "deferred by a Retry-After until " + at.Format(time.RFC3339)}
	case "backoff":
		return Reason{Kind: ReasonBackoff, Until: at, Detail: "retrying after a failure at " + at.Format(time.RFC3339)}
	}
	return Reason{Kind: ReasonRunAt, Until: at, Detail: "submitted to run at " + at.Format(time.RFC3339)}
}

// explain runs on the dispatcher goroutine. It returns an empty Explanation
// for a unit it does not hold.
func (d *dispatcher) explain(id string) Explanation {
	now := d.now()
	u := d.units[id]
	if u == nil {
		for task, o := range d.orphans {
			if ou := o[id]; ou != nil {
				return Explanation{ID: id, Task: task, State: StateQueued, Reasons: []Reason{{Kind: ReasonTaskNotRegistered,
					Detail: fmt.Sprintf("no handler for task type %q in the owning Cue", task)}}}
			}
		}
		return Explanation{}
	}
	ex := Explanation{ID: id, Task: u.task, State: StateQueued}
	add := func(r Reason) { ex.Reasons = append(ex.Reasons, r) }
	if d.stopping || d.failed != nil {
		add(Reason{Kind: ReasonStopping, Detail: "the owning Cue is stopping or its store failed: nothing is dispatched"})
	}
	if d.queuePaused && u.state != uRunning {
		add(queuePausedReason())
	}
	switch u.state {
	case uRunning:
		ex.State = StateRunning
		add(Reason{Kind: ReasonRunning, Detail: "running"})
		return ex
	case uBlocked:
		var waiting []string
		for _, dep := range u.deps() {
			if d.waiting(u, dep) {
				waiting = append(waiting, dep)
			}
		}
		add(Reason{Kind: ReasonDependencies, Dependencies: waiting, Until: u.depsBy(),
			Detail: fmt.Sprintf("waiting for %d of %d dependencies to complete", len(waiting), len(u.deps()))})
	case uChecking:
		r := Reason{Kind: ReasonDependencyCheck, Detail: "dependencies completed; DependencySatisfied has not said they are usable"}
		for _, e := range d.timers.Items() {
			if e.kind == tRecheck && e.u == u {
				r.Until = d.toWall(e.at)
			}
		}
		add(r)
	case uWaiting:
		add(timeReason(u.why.String(), u.runAt))
	case uReady:
		if d.inflight >= d.cfg.MaxConcurrent {
			add(Reason{Kind: ReasonGlobalCap, Detail: fmt.Sprintf("%d units are running, the Cue's MaxConcurrent", d.inflight)})
		}
		if d.uncommitted >= d.cfg.MaxUncommitted {
			add(Reason{Kind: ReasonCommitBacklog, Detail: fmt.Sprintf("%d ended runs wait for their outcomes to be committed, the Cue's MaxUncommitted", d.uncommitted)})
		}
		for _, r := range u.lane.resources {
			if rs, ok := d.resourceReason(r, now); ok {
				rs.Until = d.toWall(rs.Until)
				if b := r.SpentBudget(now); rs.Kind == ReasonBudgetExhausted && b != nil {
					rs.Until = b.End() // exact: the period ends on the wall clock
				}
				add(rs)
			}
		}
		if len(ex.Reasons) == 0 {
			add(Reason{Kind: ReasonEligible, Detail: "nothing holds it back; it runs when its turn comes"})
		}
	}
	if len(u.skipped()) > 0 {
		add(skippedReason(u.skipped()))
	}
	if d.bpActive {
		add(Reason{Kind: ReasonBackpressure, Detail: fmt.Sprintf("the queue is over its high-water mark (%d queued, MaxQueued %d)",
			d.queuedCount(), d.cfg.MaxQueued)})
	}
	return ex
}

// resourceReason says why r refuses a dispatch now, if it does: its
// refusal, in words.
func (d *dispatcher) resourceReason(r *resource, now time.Time) (Reason, bool) {
	d.syncBudgets(r)
	rf, refused := r.Refusal(now)
	if refused && r.class == "" && rf.Kind == broker.RefusePaused {
		return taskPausedReason(r.name[len("task "):]), true
	}
	if !refused || (r.class == "" && rf.Kind != broker.RefuseTaskCap) {
		return Reason{}, false
	}
	name := r.name
	reason := Reason{Kind: reasons[rf.Kind], Service: name, Until: rf.Until}
	switch reason.Kind {
	case ReasonTaskCap:
		reason.Service, reason.Detail = "", fmt.Sprintf("%d units of the task are running, its MaxConcurrent", r.Active)
	case ReasonPaused:
		reason.Detail = name + " is paused"
	case ReasonBudgetExhausted:
		b := r.SpentBudget(now)
		for i, rb := range r.Budgets {
			if rb == b {
				spec := r.budgetSpecs[i]
				reason.Detail = fmt.Sprintf("%s's budget of %d requests per %s (%s) is spent until %s", name, spec.Requests,
					spec.Per, spec.loc(), b.End().In(spec.loc()).Format(time.RFC3339))
			}
		}
	case ReasonServiceRetryAfter:
		reason.Detail = name + " asked to wait (Retry-After)"
	case ReasonCircuitOpen:
		reason.Detail = fmt.Sprintf("%s's circuit is open after %d consecutive failures", name, r.Circuit.Threshold)
	case ReasonCircuitProbe:
		reason.Detail = name + "'s circuit is half-open; its probe is running"
	case ReasonServiceBusy:
		reason.Detail = fmt.Sprintf("%s has %d of %d slots in use", name, r.Active, r.Limit)
	case ReasonRateLimited:
		reason.Detail = fmt.Sprintf("%s's rate window is full (%d per %v)", name, r.Window.Limit(), r.Window.Length())
		if r.Window.Paced() && r.Window.Used(now) < r.Window.Limit() {
			reason.Detail = fmt.Sprintf("%s is paced: one start every %v (%d per %v)", name,
				r.Window.Length()/time.Duration(r.Window.Limit()), r.Window.Limit(), r.Window.Length())
		}
	}
	return reason, true
}

// storedServiceReasons says, from the database, which of u's services
// refuse it now: a stored pause (of the class or the instance), a
// Retry-After hold, an open circuit, a rate window full by the logged
// dispatches, a spent budget. Keyed instances are known only if u's task
// is registered here with ServiceKeys.
func (c *Cue) storedServiceReasons(ctx context.Context, u *store.Unit, now time.Time) ([]Reason, error) {
	tasks, err := c.st.Tasks(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	var td taskDef
	_ = json.Unmarshal(tasks[u.Task], &td)
	names := slices.Clone(td.Services)
	c.mu.Lock()
	t := c.tasks[u.Task]
	c.mu.Unlock()
	if t != nil && t.ServiceKeys != nil {
		w := &Work{ID: u.ID, Task: u.Task, Target: u.Target, Params: u.Params, Attempt: u.Runs + 1}
		if keys, err := callKeys(t.ServiceKeys, w); err == nil {
			names = append(names, keys...)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	recs, err := c.st.Services(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	byName := make(map[string]store.ServiceRecord, len(recs))
	for _, r := range recs {
		byName[r.Name] = r
	}
	// The limits in force: the instance's override, else the class's,
	// else its definition.
	limitsOf := func(name, class string) Service {
		if s, ok := decodeService(byName[name].Override); ok && name != class {
			return s
		}
		if s, ok := decodeService(byName[class].Override); ok {
			return s
		}
		s, _ := decodeService(byName[class].Def)
		return s
	}
	var out []Reason
	for _, name := range names {
		class := name
		if i := strings.IndexByte(name, ':'); i > 0 {
			class = name[:i]
		}
		if byName[class].Paused || byName[name].Paused {
			out = append(out, Reason{Kind: ReasonPaused, Service: name, Detail: name + " is paused"})
			continue
		}
		var st ServiceStatus
		storedCircuit(byName[name].Circuit, now, &st)
		if !st.BlockedUntil.IsZero() {
			out = append(out, Reason{Kind: ReasonServiceRetryAfter, Service: name, Until: st.BlockedUntil, Detail: name + " asked to wait (Retry-After)"})
			continue
		}
		if st.Circuit == broker.Open && st.CircuitOpenUntil.After(now) {
			out = append(out, Reason{Kind: ReasonCircuitOpen, Service: name, Until: st.CircuitOpenUntil, Detail: name + "'s circuit is open"})
			continue
		}
		s := limitsOf(name, class)
		if s.RateLimit > 0 {
			log, err := c.st.ServiceLog(ctx, name, now.Add(-s.hold()).Add(1))
			if err != nil {
				return nil, c.readErr(err)
			}
			if len(log) >= s.RateLimit {
				until := log[len(log)-s.RateLimit].Add(s.hold())
				out = append(out, Reason{Kind: ReasonRateLimited, Service: name, Until: until,
					Detail: fmt.Sprintf("%s's rate window is full (%d per %v)", name, s.RateLimit, s.RateWindow)})
				continue
			}
		}
		budgets, err := c.storedBudgets(ctx, name, s)
		if err != nil {
			return nil, c.readErr(err)
		}
		for _, b := range budgets {
			if b.Exhausted {
				out = append(out, Reason{Kind: ReasonBudgetExhausted, Service: name, Until: b.Resets,
					Detail: fmt.Sprintf("%s's budget of %d requests per %s is spent until %s", name, b.Budget.Requests,
						b.Budget.Per, b.Resets.Format(time.RFC3339))})
				break
			}
		}
	}
	return out, nil
}

// ownerQuestion is the data of owner_asked and owner_answered: what is
// asked (Kind "explain" with ID, "services", or "service" with Service) and,
// in the answer, the
// answer (absent when the owner cannot answer it).
type ownerQuestion struct {
	Nonce string `json:"nonce"`
	Kind  string `json:"kind"`
	ID    string `json:"id,omitempty"`
	// Service is the keyed instance of Kind "service".
	Service string          `json:"service,omitempty"`
	Answer  json.RawMessage `json:"answer,omitempty"`
}

// askOwner asks the owner, when it runs in another process, a question
// about its live state, through the event log: an owner_asked event the
// owner sees at its next poll, answered by an owner_answered event, whose
// answer is decoded into out. It reports false (the caller reads the
// database instead) when no other process owns the database, the owner
// cannot answer (it does not hold the unit), or no answer comes within two
// of this Cue's poll intervals and a second.
func (c *Cue) askOwner(ctx context.Context, q ownerQuestion, out any) bool {
	p, ok := c.st.(store.OwnerProber)
	if !ok {
		return false
	}
	h, owned, err := p.Owner(ctx)
	if err != nil || !owned || h.PID == os.Getpid() {
		return false // none, or in this process: its state is read from the database
	}
	answers, stop, err := c.Subscribe(ctx, SubscribeOptions{After: SeqNow, Types: []EventType{EventOwnerAnswered}})
	if err != nil {
		return false
	}
	defer stop()
	q.Nonce = c.ids.New(c.clock.Now())
	data, _ := json.Marshal(q)
	if _, err := c.w.Do(ctx, &store.AppendEvent{Event: store.Event{Type: string(EventOwnerAsked),
		Time: c.clock.Now(), Data: data}}); err != nil {
		return false
	}
	timeout := time.NewTimer(2*c.cfg.PollInterval + time.Second) // real time: an answer from another process
	defer timeout.Stop()
	for {
		select {
		case ev, open := <-answers:
			if !open {
				return false
			}
			var a ownerQuestion
			if json.Unmarshal([]byte(ev.Reason), &a) != nil || a.Nonce != q.Nonce {
				continue
			}
			return len(a.Answer) > 0 && json.Unmarshal(a.Answer, out) == nil
		case <-timeout.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// answerOwnerQuestion answers another process's owner_asked, on the
// dispatcher goroutine, from the live state.
func (d *dispatcher) answerOwnerQuestion(ev store.Event) {
	var q ownerQuestion
	if json.Unmarshal(ev.Data, &q) != nil || q.Nonce == "" {
		return
	}
	var answer any
	switch q.Kind {
	case "explain":
		if ex := d.explain(q.ID); ex.ID != "" {
			ex.Live, ex.AsOf = true, d.wall()
			answer = ex
		}
	case "services":
		answer = d.serviceStats()
	case "service":
		if st := d.liveKeyStatus(q.Service); st != nil {
			answer = st
		}
	}
	if answer != nil {
		q.Answer, _ = json.Marshal(answer)
	}
	data, _ := json.Marshal(q)
	d.submit(&store.AppendEvent{Event: store.Event{Type: string(EventOwnerAnswered), Time: d.wall(), Data: data}})
}
