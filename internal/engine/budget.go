package engine

import (
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// budgetStatus reports b at now (timeline).
func budgetStatus(spec store.BudgetDef, b *broker.Quota, now time.Time) rt.BudgetStatus {
	return rt.BudgetStatus{Budget: vocab.BudgetOf(spec), Used: b.Used(now), PeriodStart: b.PeriodStart(), Resets: b.PeriodEnd(), Exhausted: !b.Allow(now)}
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

// BudgetRecheckEvery is how often a resource held by a spent budget is
// checked against the wall clock before its period ends on the timeline:
// the wall clock may have been set forward past the end (or a suspended
// machine resumed, whose monotonic clock stood still meanwhile).
const BudgetRecheckEvery = time.Minute

// budgetRecheck returns when to look at r again, refused until until: no
// later than BudgetRecheckEvery from now while a budget of r is spent.
func (t *resourceTable) budgetRecheck(r *resource, until time.Time) time.Time {
	if len(r.Budgets) == 0 {
		return until
	}
	now := t.now()
	if r.SpentBudget(now) == nil {
		return until
	}
	if at := now.Add(BudgetRecheckEvery); until.IsZero() || at.Before(until) {
		return at
	}
	return until
}

// applyBudgets makes r's budgets those of s: a budget already there (same
// period and zone) keeps its count.
func (t *resourceTable) applyBudgets(r *resource, s store.ServiceDef) {
	if len(s.Budgets) == 0 && len(r.Budgets) == 0 {
		return
	}
	wall, mono := t.wall(), t.now()
	old := r.Budgets
	r.Budgets, r.budgetSpecs = nil, nil
	for _, spec := range s.Budgets {
		var b *broker.Quota
		for _, o := range old {
			if o.Period == period(spec) && o.Loc.String() == location(spec).String() && b == nil {
				b = o
				b.SetLimit(spec.Requests)
			}
		}
		if b == nil {
			b = broker.NewQuota(spec.Requests, period(spec), location(spec), wall, mono)
		}
		b.Margin = margin(s)
		r.Budgets = append(r.Budgets, b)
		r.budgetSpecs = append(r.budgetSpecs, spec)
	}
}

// budgetsSince returns the earliest wall instant whose logged starts may
// count in s's budgets now: the start of the earliest current period,
// less lag (MaxStartDelay, as a start counts as late as it can have been,
// and the margin its arrival may take). Zero if s has no budget.
func budgetsSince(s store.ServiceDef, wall time.Time, lag time.Duration) time.Time {
	var since time.Time
	for _, spec := range s.Budgets {
		start, _ := period(spec).Bounds(location(spec), wall)
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
		t.log.Info("runcue: budget_exhausted", "service", r.name, "period", period(spec).String(), "requests", spec.Requests,
			"location", location(spec).String(), "resets", end)
		t.tel.budgetExhausted.Add(bg, 1, r.periodAttrs(period(spec)))
		st := rt.BudgetStatus{Budget: vocab.BudgetOf(spec), Used: b.Used(now), PeriodStart: start, Resets: end, Exhausted: true}
		evs = append(evs, store.Event{Type: store.TypeBudgetExhausted, Data: t.encode(BudgetEvent{Service: r.name, Class: r.class, Budget: st})})
	}
	return evs
}

// budgetHeld reports whether a spent calendar budget keeps u from running
// this period: one of its lane's services has one, or (waiting for its
// dependencies) every dependency it waits for is so held. memo caches the
// answers of one pass.
func (d *Engine) budgetHeld(u *unit, now time.Time, memo map[*unit]bool) bool {
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
func (d *Engine) onlyBudgetHeld() bool {
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
			p := period(r.budgetSpecs[i]).String()
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
