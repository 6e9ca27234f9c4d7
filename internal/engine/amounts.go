package engine

import (
	"iter"
	"log/slog"
	"maps"
	"slices"
	"time"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Amount meters (token meters) beyond what every meter does: room held
// for a large unit that smaller ones would keep waiting, and what a run
// used, which its Runner reports (Ending.Used) and which replaces the
// charges its start made, in memory and in the service log, per each
// meter's charge policy.

// hold keeps room in r's amount windows for l's next unit (of costs),
// refused at now by one of them, so that smaller units of other lanes do
// not take it first: for at most the window's hold plus MaxStartDelay,
// by when everything that counted at now has left it (broker.Held).
func (t *resourceTable) hold(l *lane, r *resource, now time.Time, costs rt.Costs) {
	if h, ok := r.Held.For.(*lane); ok && h != l && now.Before(r.Held.Until) {
		if before, fair := t.fairOrder(l, h); fair {
			if !before {
				return // the holder's turn in the fair shares comes first
			}
			r.Held = broker.Held{} // l's turn comes first: it takes the hold over
		}
	}
	rf, refused := r.RefusalFor(now, costs, l)
	if !refused || rf.Kind != broker.RefuseMeter || rf.Held {
		return
	}
	a := r.Amount(rf.Meter)
	if a == nil {
		return
	}
	until := now.Add(a.Hold() + t.cfg.MaxStartDelay)
	r.Hold(l, costs, rf.Meter, now, until)
	if r.Held.For == l {
		t.resourceTimer(r, until) // the others may go when it lapses
	}
}

// noteUsed applies the amounts r's Runner reports it used: at once if its
// start is counted (the ops go with its Finish, or alone if that is
// written already), else when it is.
func (d *Engine) noteUsed(r *run, used map[string]int64) {
	if len(used) > 0 {
		d.checkReported(r, maps.Keys(used), nil, "Work.Used")
	}
	switch {
	case len(used) == 0:
	case r.counted:
		r.used = used
	case r.over():
		if ops := d.reconcile(r, used); len(ops) > 0 {
			d.submit(ops...)
		}
	default:
		r.reconciles = d.reconcile(r, used)
	}
}

// reconcile replaces the charges of r's counted start, in every meter of
// its resources that reconciles (broker.Reconciler), by what its charge
// policy makes of the amount used; it returns the ops that replace them in
// the service log. A meter whose charge does not change, or whose entry has
// left its window, needs no op.
func (d *Engine) reconcile(r *run, used map[string]int64) []store.Op {
	if r.countedAt.IsZero() {
		return nil
	}
	costs := r.costs()
	var ops []store.Op
	for _, res := range r.lane.resources {
		for _, m := range res.Meters() {
			rc, ok := m.(broker.Reconciler)
			if !ok {
				continue
			}
			amount := rc.Counts()
			actual, ok := res.usedOf(used, amount)
			if !ok {
				continue
			}
			est := costs.Of(amount)
			to := rc.ChargePolicy().Charged(est, actual)
			if to == est {
				continue
			}
			rc.Reconcile(r.countedAt, est, to)
			ops = append(ops, &store.Reconcile{Epoch: d.epoch, Service: res.name, Meter: amount, WorkID: r.u.id, At: r.start, Amount: to})
			d.markStatus(res)
			d.wake(res)
		}
	}
	return ops
}

// observe applies what run r's service said of its limits at at (on the
// timeline) to the meters of its resources that count the amounts named.
// An amount meter takes each reading as of the request's arrival (its
// Observe): what its own count then does not explain of the use the
// reading implies was used from elsewhere (another process or key sharing
// the quota, or a limit lower than the meter's), and the meter keeps room
// for it ahead (broker.elsewhere). The rate window of requests counts such
// use as entries instead, leaving the window when the service said the
// limit is whole again, at most a whole window later; a limit with nothing
// left holds it until its reset, again at most a window. The window takes
// reports in the order they were made: an older one than it already took
// is stale and ignored.
func (d *Engine) observe(r *run, o rt.Observation, at time.Time) {
	d.checkReported(r, func(yield func(string) bool) {
		for _, l := range o.Limits {
			if !yield(l.Name) {
				return
			}
		}
	}, o.Services, "Work.Observe")
	// The service computed what remains when the run's request arrived:
	// runcue's own count is compared as it stood then (the run's counted
	// start), not at the answer, by which time later starts of runcue's
	// would be counted twice, and others' use underestimated.
	arrival := at
	if !r.countedAt.IsZero() && r.countedAt.Before(at) {
		arrival = r.countedAt
	}
	for _, res := range r.lane.resources {
		if res.class == "" || (len(o.Services) > 0 && !slices.Contains(o.Services, res.name) && !slices.Contains(o.Services, res.class)) {
			continue
		}
		for _, l := range o.Limits {
			if l.Limit > 0 {
				d.stateLimit(res, res.meterOf(l.Name), l.Limit)
			}
			if l.Remaining < 0 {
				continue
			}
			name := res.meterOf(l.Name)
			a := res.Amount(name)
			if a == nil && (l.Name != store.MeterRequests || res.Window == nil) {
				// No meter counts it: it is not this service's business,
				// but a response that ran out of it points at no limit the
				// service adapts.
				if res.adapt != nil && l.Remaining == 0 {
					r.tell(res, name, true)
				}
				continue
			}
			if res.adapt != nil {
				r.tell(res, name, l.Remaining < max(r.costs().Of(name), 1))
			}
			if a != nil {
				before := a.Elsewhere(at)
				charged := r.costs().Of(name)
				if n, ok := res.usedOf(r.used, name); ok { // what it used, if it said so first
					charged = n
				}
				a.Observe(arrival, l.Remaining, charged)
				if after := a.Elsewhere(at); after != before {
					d.markStatus(res)
					if after < before {
						d.wake(res)
					}
					if d.log.Enabled(bg, slog.LevelDebug) {
						d.log.Debug("service_room_kept", "service", res.name, "meter", name, "remaining", l.Remaining,
							"for_elsewhere", after)
					}
				}
				continue
			}
			d.observeRequests(res, l, at, arrival)
		}
	}
}

// observeRequests applies a reading of res's requests limit (l, reported
// at at of a request that arrived at arrival) to its rate window: what its
// count then does not explain was used from elsewhere, and is counted
// until the reading's reset, at most a window.
func (d *Engine) observeRequests(res *resource, l rt.ObservedLimit, at, arrival time.Time) {
	w := res.Window
	if !res.observedAfter(store.MeterRequests, at) {
		return
	}
	limit := int64(w.Limit())
	ext := limit - int64(w.CountAt(arrival.Add(w.Margin()))) - l.Remaining
	if l.Remaining == 0 && l.Reset > 0 {
		ext = limit // nothing left until the reset: the window is held till then
	}
	if ext <= 0 {
		return
	}
	hold := w.Hold()
	leaves := hold
	if l.Reset > 0 {
		leaves = min(l.Reset, hold)
	}
	place := at.Add(leaves - hold) // an entry there leaves the window at at+leaves
	for range min(ext, limit) {
		w.Add(place)
	}
	d.submit(&store.LogUsage{Epoch: d.epoch, Service: res.name, Meter: store.MeterRequests, At: d.toWall(place), Amount: ext})
	d.markStatus(res)
	if d.log.Enabled(bg, slog.LevelDebug) {
		d.log.Debug("service_usage_observed", "service", res.name, "meter", store.MeterRequests, "remaining", l.Remaining,
			"from_elsewhere", ext, "reset", l.Reset)
	}
}

// observedAfter records a report of amount's limit made at at, and says
// whether it is the latest the resource has taken.
func (r *resource) observedAfter(amount string, at time.Time) bool {
	if last, ok := r.observed[amount]; ok && at.Before(last) {
		return false
	}
	if r.observed == nil {
		r.observed = make(map[string]time.Time, 1)
	}
	r.observed[amount] = at
	return true
}

// checkReported notes the amounts a report of run r names (from: what
// reported them) that no meter of its services counts, by name or alias:
// each is logged once per service and listed in the service's status
// (Unmatched) and in Explain. only, when set, limits the services to
// those a report names (Observation.Services).
func (d *Engine) checkReported(r *run, names iter.Seq[string], only []string, from string) {
	var classes []*resource
	for _, res := range r.lane.resources {
		if res.class != "" && (len(only) == 0 || slices.Contains(only, res.name) || slices.Contains(only, res.class)) {
			classes = append(classes, res)
		}
	}
	for name := range names {
		if slices.ContainsFunc(classes, func(res *resource) bool { return res.counts(name) }) {
			continue
		}
		if len(classes) == 0 {
			if d.unmatched == nil {
				d.unmatched = make(map[string][]string)
			}
			key := "task " + r.u.task
			if !slices.Contains(d.unmatched[key], name) {
				d.unmatched[key] = append(d.unmatched[key], name)
				d.log.Warn("runcue: a reported amount was ignored: the unit's task uses no service that meters it",
					"task", r.u.task, "amount", name, "reported_by", from)
			}
			continue
		}
		for _, res := range classes {
			if slices.Contains(d.unmatched[res.class], name) {
				continue
			}
			if d.unmatched == nil {
				d.unmatched = make(map[string][]string)
			}
			d.unmatched[res.class] = append(d.unmatched[res.class], name)
			slices.Sort(d.unmatched[res.class])
			d.log.Warn("runcue: a reported amount was ignored: no meter of the service counts it (name a meter so, or list the name in a meter's Aliases)",
				"service", res.class, "amount", name, "reported_by", from)
			d.markStatus(res)
		}
	}
}

// toldLimits is what a run's reports said of one adaptive resource's
// limits: each limit they named, and whether it had less left than the
// unit costs (exhausted).
type toldLimits struct {
	res       *resource
	named     []string
	exhausted []string
}

// tell records that a report of r named limit of res, exhausted or not.
func (r *run) tell(res *resource, limit string, exhausted bool) {
	i := slices.IndexFunc(r.told, func(t toldLimits) bool { return t.res == res })
	if i < 0 {
		r.told = append(r.told, toldLimits{res: res})
		i = len(r.told) - 1
	}
	t := &r.told[i]
	if !slices.Contains(t.named, limit) {
		t.named = append(t.named, limit)
	}
	if exhausted && !slices.Contains(t.exhausted, limit) {
		t.exhausted = append(t.exhausted, limit)
	}
}

// pointedAt returns the limits of res that r's reports said were
// exhausted, or nil when they named none of res's limits, or none as
// exhausted: the overload of r's end then points at no limit in
// particular.
func (r *run) pointedAt(res *resource) []string {
	for _, t := range r.told {
		if t.res == res {
			return t.exhausted
		}
	}
	return nil
}

// meterOf is the amount a meter of r counts under the reported name: the
// name, or the meter's whose alias it is.
func (r *resource) meterOf(reported string) string {
	if m, ok := r.aliases[reported]; ok {
		return m
	}
	return reported
}

// usedOf returns what a run reported it used of the amount a meter of r
// counts: under the meter's name, or else under one of its aliases (names
// of the same amount, not parts of it; the alias first in order when a
// run gave more than one).
func (r *resource) usedOf(used map[string]int64, meter string) (int64, bool) {
	if n, ok := used[meter]; ok {
		return n, true
	}
	best, n, ok := "", int64(0), false
	for name, v := range used {
		if r.meterOf(name) == meter && name != meter && (!ok || name < best) {
			best, n, ok = name, v, true
		}
	}
	return n, ok
}

// counts reports whether a meter of r takes a report of the amount named
// reported (by name or alias): an amount meter, or the rate window for
// requests.
func (r *resource) counts(reported string) bool {
	if reported == store.MeterRequests {
		return r.Window != nil
	}
	return r.Amount(r.meterOf(reported)) != nil
}
