package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// Explain says why a unit is not running right now: waiting on
// dependencies, a service at its cap, a rate window full until some time,
// an open circuit, a paused service, the global or task cap, retry backoff
// or RunAt, backpressure, or a task type not registered. In the owning Cue
// the answer comes from the dispatcher's live state; elsewhere, from the
// database.
//
// A unit a schedule submitted names the schedule and the period
// (Explanation.Schedule, Period); a debounced unit that a later
// submission of its key would replace says so in its notes.
func (c *Cue) Explain(ctx context.Context, id string) (Explanation, error) {
	ex, err := c.explain(ctx, id)
	if err == nil {
		if wi, gerr := c.Get(ctx, id); gerr == nil {
			ex.Schedule, ex.Period = wi.Schedule, wi.Period
			if wi.DebounceKey != "" {
				ex.Notes = append(ex.Notes, fmt.Sprintf("debounced: key %q, its burst began %s; it runs %s unless a later submission of the key replaces it",
					wi.DebounceKey, wi.DebounceSince.UTC().Format(time.RFC3339), wi.RunAt.UTC().Format(time.RFC3339)))
			}
		}
	}
	return ex, err
}

func (c *Cue) explain(ctx context.Context, id string) (Explanation, error) {
	if err := c.checkOpen(); err != nil {
		return Explanation{}, err
	}
	var owner []Reason // the owner's, for a unit it does not hold
	if d := c.disp.Load(); d != nil {
		ex, ok, err := d.explain(ctx, id)
		if err != nil {
			return Explanation{}, err
		}
		if ok && ex.ID != "" {
			ex.Live, ex.AsOf = true, c.clock.Now()
			return ex, nil
		}
		// Not in the dispatcher's memory (finished, or not loaded yet), or
		// the dispatcher ended.
		owner = ex.Reasons
	}
	if c.disp.Load() == nil {
		var ex Explanation
		if c.askOwner(ctx, store.OwnerQuestion{Kind: "explain", ID: id}, &ex) {
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
		ex.Reasons = append(ex.Reasons, owner...) // not_loaded
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
	line, _, _ := strings.Cut(u.Error, "\n")
	return fmt.Sprintf("the unit is %s (%s): %s", u.State, u.ErrorKind, line)
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
		if keys, err := serviceKeys(t, w); err == nil {
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
		storedCircuit(byName[name].Meters[store.MeterCircuit], now, &st)
		if !st.BlockedUntil.IsZero() {
			out = append(out, Reason{Kind: ReasonServiceRetryAfter, Service: name, Until: st.BlockedUntil, Detail: name + " asked to wait (Retry-After)"})
			continue
		}
		if st.Circuit == CircuitOpen && st.CircuitOpenUntil.After(now) {
			out = append(out, Reason{Kind: ReasonCircuitOpen, Service: name, Until: st.CircuitOpenUntil, Detail: name + "'s circuit is open"})
			continue
		}
		s := limitsOf(name, class)
		if s.RateLimit > 0 {
			log, err := c.requestLog(ctx, name, now.Add(-vocab.Hold(s)).Add(1))
			if err != nil {
				return nil, c.readErr(err)
			}
			if len(log) >= s.RateLimit {
				until := log[len(log)-s.RateLimit].Add(vocab.Hold(s))
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

// askOwner asks the owner, when it runs in another process, a question
// about its live state, outside the event log: a question stored for the
// owner (store.Ask), which it answers at its next poll, the answer read
// here until it comes, and the question then forgotten. It reports false
// (the caller reads the database instead) when no other process owns the
// database, the store carries no questions, the owner cannot answer (it
// does not hold the unit), or no answer comes within two of this Cue's
// poll intervals and a second.
func (c *Cue) askOwner(ctx context.Context, q store.OwnerQuestion, out any) bool {
	p, ok := c.st.(store.OwnerProber)
	qs, ok2 := c.st.(store.Questioner)
	if !ok || !ok2 {
		return false
	}
	h, owned, err := p.Owner(ctx)
	if err != nil || !owned || h.PID == os.Getpid() {
		return false // none, or in this process: its state is read from the database
	}
	q.Nonce = c.ids.New(c.clock.Now())
	if _, err := c.w.Do(ctx, &store.Ask{Question: q, At: c.clock.Now()}); err != nil {
		return false
	}
	defer func() {
		// Forgotten whether answered or not (an owner's answer to come
		// then changes nothing); the owner forgets what this misses.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = c.w.Do(fctx, &store.ForgetQuestion{ID: q.Nonce})
	}()
	// Real time: the answer comes from another process, within its poll.
	deadline := time.NewTimer(2*c.cfg.PollInterval + time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(min(max(c.cfg.PollInterval/4, 5*time.Millisecond), 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
		answer, answered, err := qs.Answered(ctx, q.Nonce)
		if err != nil || !answered {
			continue
		}
		return len(answer) > 0 && json.Unmarshal(answer, out) == nil
	}
}
