package runcue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Calendar budgets: a service's quota per day or month of a time zone,
// the one limit that follows the wall clock.

// Period is the calendar period of a Budget.
type Period = broker.Period

// The periods.
const (
	// PerDay: from one local midnight to the next (23 or 25 hours across a
	// daylight-saving change; where the change skips midnight, the day
	// begins at the change).
	PerDay Period = broker.Day
	// PerMonth: from the first instant of the 1st to that of the next 1st.
	PerMonth Period = broker.Month
)

// Budget caps the requests to a service per calendar period of a time
// zone: "10,000 requests per day, Pacific time". A request is a handler
// start, counted at its wall-clock instant (Work.Started). The count
// starts again when the wall clock enters the next period in Location:
// this is the one place where runcue lets the wall clock, not the
// monotonic clock, decide, because a provider resets its quota at midnight
// on its own clock. If the system's clock is set back into a period
// already over, that period is not reopened: the budget waits for the
// next.
//
// A spent budget refuses the service (Explain: budget_exhausted, until the
// period ends) and emits a budget_exhausted event once per period. A
// service may have several budgets (a day and a month); a rolling window
// (RateLimit, RateWindow) may sit beside them. Budgets of a service with
// ServiceKeys instances apply to each instance. Counted starts are logged
// in the database, so that a restart in the middle of a period counts the
// starts before it (the ones logged since the budget was set).
type Budget struct {
	// Requests is the number of handler starts allowed per period.
	Requests int
	// Per is the period: PerDay or PerMonth.
	Per Period
	// Location is the time zone whose calendar delimits the periods, as
	// time.LoadLocation returns it (it is stored by name). Default UTC.
	Location *time.Location
}

func (b Budget) loc() *time.Location {
	if b.Location == nil {
		return time.UTC
	}
	return b.Location
}

func (b Budget) validate() error {
	switch {
	case b.Requests <= 0:
		return fmt.Errorf("%w: a budget needs a positive number of Requests", ErrInvalid)
	case b.Per != PerDay && b.Per != PerMonth:
		return fmt.Errorf("%w: a budget's period must be PerDay or PerMonth", ErrInvalid)
	}
	if b.Location != nil {
		if _, err := time.LoadLocation(b.Location.String()); err != nil {
			return fmt.Errorf("%w: budget location %q cannot be loaded by name (use time.LoadLocation): %v", ErrInvalid, b.Location, err)
		}
	}
	return nil
}

// budgetJSON is the stored and reported form of a Budget.
type budgetJSON struct {
	Requests int    `json:"requests"`
	Per      string `json:"per"`
	Location string `json:"location"`
}

// MarshalJSON encodes b as {"requests", "per" ("day" or "month"),
// "location" (a time zone name)}.
func (b Budget) MarshalJSON() ([]byte, error) {
	return json.Marshal(budgetJSON{Requests: b.Requests, Per: b.Per.String(), Location: b.loc().String()})
}

// UnmarshalJSON decodes the form MarshalJSON writes.
func (b *Budget) UnmarshalJSON(data []byte) error {
	var j budgetJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*b = Budget{Requests: j.Requests}
	switch j.Per {
	case "day":
		b.Per = PerDay
	case "month":
		b.Per = PerMonth
	default:
		return fmt.Errorf("runcue: budget period %q", j.Per)
	}
	if j.Location != "" && j.Location != "UTC" {
		loc, err := time.LoadLocation(j.Location)
		if err != nil {
			return fmt.Errorf("runcue: budget location: %w", err)
		}
		b.Location = loc
	}
	return nil
}

// BudgetStatus reports a budget in its current period.
type BudgetStatus struct {
	Budget Budget `json:"budget"`
	// Used counts the requests of the current period, including those
	// decided whose handlers have not started yet.
	Used int `json:"used"`
	// PeriodStart and Resets delimit the current period.
	PeriodStart time.Time `json:"period_start"`
	Resets      time.Time `json:"resets"`
	// Exhausted reports that no request is left until Resets.
	Exhausted bool `json:"exhausted,omitempty"`
}

// budgetStatus reports b at now (timeline).
func budgetStatus(spec Budget, b *broker.Budget, now time.Time) BudgetStatus {
	return BudgetStatus{Budget: spec, Used: b.Used(now), PeriodStart: b.Start(), Resets: b.End(), Exhausted: !b.Allow(now)}
}

// syncBudgets brings r's budgets to the wall clock's period.
func (t *resourceTable) syncBudgets(r *resource) {
	if len(r.Budgets) == 0 {
		return
	}
	wall, mono := t.wall(), t.now()
	for _, b := range r.Budgets {
		b.Sync(wall, mono)
	}
}

// budgetRecheckEvery is how often a resource held by a spent budget is
// checked against the wall clock before its period ends on the timeline:
// the wall clock may have been set forward past the end (or a suspended
// machine resumed, whose monotonic clock stood still meanwhile).
const budgetRecheckEvery = time.Minute

// budgetRecheck returns when to look at r again, refused until until: no
// later than budgetRecheckEvery from now while a budget of r is spent.
func (t *resourceTable) budgetRecheck(r *resource, until time.Time) time.Time {
	if len(r.Budgets) == 0 {
		return until
	}
	now := t.now()
	if r.SpentBudget(now) == nil {
		return until
	}
	if at := now.Add(budgetRecheckEvery); until.IsZero() || at.Before(until) {
		return at
	}
	return until
}

// applyBudgets makes r's budgets those of s: a budget already there (same
// period and zone) keeps its count.
func (t *resourceTable) applyBudgets(r *resource, s Service) {
	if len(s.Budgets) == 0 && len(r.Budgets) == 0 {
		return
	}
	wall, mono := t.wall(), t.now()
	old := r.Budgets
	r.Budgets, r.budgetSpecs = nil, nil
	for _, spec := range s.Budgets {
		var b *broker.Budget
		for _, o := range old {
			if o.Period == spec.Per && o.Loc.String() == spec.loc().String() && b == nil {
				b = o
				b.SetLimit(spec.Requests)
			}
		}
		if b == nil {
			b = broker.NewBudget(spec.Requests, spec.Per, spec.loc(), wall, mono)
		}
		b.Margin = s.margin()
		r.Budgets = append(r.Budgets, b)
		r.budgetSpecs = append(r.budgetSpecs, spec)
	}
}

// restoreBudgets counts in r's budgets the starts previous owners logged
// (prior: their latest possible wall instants) that can reach the current
// periods: started in them, or within the margin before them.
func (t *resourceTable) restoreBudgets(r *resource, prior []time.Time) {
	wall, mono := t.wall(), t.now()
	for _, b := range r.Budgets {
		b.Sync(wall, mono)
		for _, at := range prior {
			if at.Before(b.End()) {
				b.Add(at, mono.Add(at.Sub(wall))) // counted if at+Margin reaches the period
			}
		}
	}
}

// budgetsSince returns the earliest wall instant whose logged starts may
// count in s's budgets now: the start of the earliest current period,
// less lag (MaxStartDelay, as a start counts as late as it can have been,
// and the margin its arrival may take). Zero if s has no budget.
func budgetsSince(s Service, wall time.Time, lag time.Duration) time.Time {
	var since time.Time
	for _, spec := range s.Budgets {
		start, _ := spec.Per.Bounds(spec.loc(), wall)
		if at := start.Add(-lag); since.IsZero() || at.Before(since) {
			since = at
		}
	}
	return since
}

// announceBudgets returns the budget_exhausted events of r's budgets
// spent by a dispatch just decided, once per period, and logs and counts
// them.
func (t *resourceTable) announceBudgets(r *resource, now time.Time) []store.Event {
	var evs []store.Event
	for i, b := range r.Budgets {
		start, end, ok := b.Exhaustion(now)
		if !ok {
			continue
		}
		spec := r.budgetSpecs[i]
		t.log.Info("runcue: budget_exhausted", "service", r.name, "period", spec.Per.String(), "requests", spec.Requests,
			"location", spec.loc().String(), "resets", end)
		t.tel.budgetExhausted.Add(bg, 1, r.periodAttrs(spec.Per))
		st := BudgetStatus{Budget: spec, Used: b.Used(now), PeriodStart: start, Resets: end, Exhausted: true}
		data, _ := json.Marshal(budgetEventData{Service: r.name, Class: r.class, Budget: st})
		evs = append(evs, store.Event{Type: string(EventBudgetExhausted), Data: data})
	}
	return evs
}

// budgetEventData is the data of a budget_exhausted event.
type budgetEventData struct {
	Service string       `json:"service"`
	Class   string       `json:"class"`
	Budget  BudgetStatus `json:"budget"`
}

// budgetHeld reports whether a spent calendar budget keeps u from running
// this period: one of its lane's services has one, or (waiting for its
// dependencies) every dependency it waits for is so held. memo caches the
// answers of one pass.
func (d *dispatcher) budgetHeld(u *unit, now time.Time, memo map[*unit]bool) bool {
	if v, ok := memo[u]; ok {
		return v
	}
	memo[u] = false // a cycle is not possible, but never loop
	held := false
	switch u.state {
	case uRunning:
	case uBlocked:
		waiting := 0
		held = true
		for _, dep := range u.deps() {
			if !d.waiting(u, dep) {
				continue
			}
			waiting++
			du := d.units[dep]
			if du == nil || !d.budgetHeld(du, now, memo) {
				held = false
				break
			}
		}
		held = held && waiting > 0
	default:
		if u.lane != nil {
			for _, r := range u.lane.resources {
				if r.SpentBudget(now) != nil {
					held = true
					break
				}
			}
		}
	}
	memo[u] = held
	return held
}

// onlyBudgetHeld reports that nothing runs or is about to, and every unit
// left is held by a spent calendar budget (Config.DrainOnSpentBudget).
func (d *dispatcher) onlyBudgetHeld() bool {
	if !d.cfg.DrainOnSpentBudget || d.inflight > 0 || len(d.finishing) > 0 || d.pending > 0 || len(d.units) == 0 ||
		(d.cfg.Feed != nil && (!d.exhausted || d.feeding)) {
		return false
	}
	// A period the wall clock has left is over, whatever the timeline says:
	// its waiters may run now.
	now := d.now()
	reopened := false
	for _, rs := range []map[string]*resource{d.services, d.keyed} {
		for _, r := range rs {
			if len(r.Budgets) == 0 {
				continue
			}
			was := r.SpentBudget(now) != nil
			d.syncBudgets(r)
			if was && r.SpentBudget(now) == nil {
				d.wakeAll(r)
				reopened = true
			}
		}
	}
	if reopened {
		d.dispatch() // this loop iteration has dispatched already
		return false
	}
	memo := make(map[*unit]bool, len(d.units))
	for _, u := range d.units {
		if !d.budgetHeld(u, now, memo) {
			return false
		}
	}
	return true
}

// budgetUsage is what the budget gauges observe: per class and period,
// the requests used and the instances whose budget is spent.
type budgetUsage struct {
	class  string
	period string
	used   int64
	spent  int64
}

// snapshotBudgets refreshes the budget gauges' view.
func (t *resourceTable) snapshotBudgets() {
	t.budgetsDirty = false
	now := t.now()
	agg := map[[2]string]*budgetUsage{}
	add := func(r *resource) {
		for i, b := range r.Budgets {
			p := r.budgetSpecs[i].Per.String()
			k := [2]string{r.class, p}
			a := agg[k]
			if a == nil {
				a = &budgetUsage{class: r.class, period: p}
				agg[k] = a
			}
			a.used += int64(b.Used(now))
			if !b.Allow(now) {
				a.spent++
			}
		}
	}
	for _, r := range t.services {
		add(r)
	}
	for _, r := range t.keyed {
		add(r)
	}
	out := make([]budgetUsage, 0, len(agg))
	for _, a := range agg {
		out = append(out, *a)
	}
	t.tel.budgets.Store(&out)
}

// storedBudgets reports a service's budgets from the database, for a Cue
// that does not own it: the logged starts of each current period.
func (c *Cue) storedBudgets(ctx context.Context, name string, s Service) ([]BudgetStatus, error) {
	if len(s.Budgets) == 0 {
		return nil, nil
	}
	wall := c.clock.Now()
	margin := s.margin()
	since := budgetsSince(s, wall, margin)
	log, err := c.st.ServiceLog(ctx, name, since)
	if err != nil {
		return nil, err
	}
	out := make([]BudgetStatus, 0, len(s.Budgets))
	for _, spec := range s.Budgets {
		start, end := spec.Per.Bounds(spec.loc(), wall)
		st := BudgetStatus{Budget: spec, PeriodStart: start, Resets: end}
		for _, at := range log {
			if !at.Add(margin).Before(start) && at.Before(end) {
				st.Used++
			}
		}
		st.Exhausted = st.Used >= spec.Requests
		out = append(out, st)
	}
	return out, nil
}
