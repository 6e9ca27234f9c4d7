package engine

import (
	"encoding/json"
	"math"
	"slices"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Adaptive limits, as the dispatcher runs them: a service with
// ServiceDef.Adaptive has one controller (broker.AIMD) per limit it
// configures (its concurrency, its rate window, each meter), all fed the
// same signals by the runs that end: an overload (a Retry-After, an
// Overloaded error, a timeout) cuts each, a success raises each. The
// broker's resource is given the effective limits, below the configured
// ones; its Ceilings let a unit costing more than a lowered meter's limit
// start alone. Owned by the dispatcher goroutine.

// Overload is the kind of overload signal a run's end gives.
type Overload uint8

const (
	OverloadNone        Overload = iota
	OverloadThrottled            // a Retry-After: 429, or 503 with Retry-After
	OverloadUnavailable          // an error the Runner marks as overload (Ending.Overload): 503
	OverloadTimeout              // cut off at its deadline, or it returned ErrTimeout
)

// The limits an adaptive service's controllers are named by, besides its
// meters' amounts.
const (
	LimitConcurrency = "concurrency"
	LimitRequests    = store.MeterRequests
)

// adaptive is a service resource's adaptive limits.
type adaptive struct {
	def    store.AdaptDef // in force (defaults applied)
	limits []adaptLimit
	// counts are the overload signals by kind since every limit was last
	// at its ceiling.
	counts adaptCounts
	// announced are the effective limits last announced and persisted,
	// by limit name.
	announced map[string]int64
}

// adaptLimit is one limit's controller.
type adaptLimit struct {
	name string
	ctl  *broker.AIMD
}

// adaptCounts are the overload signals behind a service's lowered limits,
// by kind.
type adaptCounts struct {
	Throttled, Unavailable, Timeouts int
}

// adaptive reports whether a service of l has adaptive limits.
func (l *lane) adaptive() bool {
	for _, r := range l.resources {
		if r.adapt != nil {
			return true
		}
	}
	return false
}

// lowered reports whether a limit of a is below its ceiling.
func (a *adaptive) lowered() bool {
	if a == nil {
		return false
	}
	for _, l := range a.limits {
		if l.ctl.Effective() < l.ctl.Ceiling {
			return true
		}
	}
	return false
}

// adaptLimits makes r's adaptive controllers match s (creating them, from
// the stored state the first time, or moving their ceilings), and returns
// s with its limits replaced by the effective ones.
func (t *resourceTable) adaptLimits(r *resource, s store.ServiceDef) store.ServiceDef {
	if s.Adaptive == nil {
		r.adapt, r.Ceilings = nil, nil
		return s
	}
	def := s.Adaptive.InForce()
	a := r.adapt
	if a == nil {
		a = &adaptive{announced: map[string]int64{}}
		r.adapt = a
	}
	a.def = def
	var rec *store.AdaptRecord // the stored state, read when a controller is made
	stored := func() *store.AdaptRecord {
		if rec == nil {
			rec = &store.AdaptRecord{}
			if raw := t.stored[r.name].Meters[store.MeterAdapt]; len(raw) > 0 {
				_ = json.Unmarshal(raw, rec) // unreadable: start at the ceilings
			}
		}
		return rec
	}
	old := a.limits
	a.limits = nil
	ctl := func(name string, ceiling float64) *broker.AIMD {
		for _, l := range old {
			if l.name == name {
				if l.ctl.Ceiling != ceiling {
					l.ctl.SetCeiling(ceiling, def.Floor*ceiling)
				}
				a.limits = append(a.limits, l)
				return l.ctl
			}
		}
		c := broker.NewAIMD(ceiling, def.Floor*ceiling, def.Decrease, def.Increase)
		if st, ok := stored().Limits[name]; ok {
			c.Restore(broker.AIMDState{Effective: st.Effective, Overloads: st.Overloads})
			a.counts = adaptCounts{rec.Throttled, rec.Unavailable, rec.Timeouts}
		}
		a.announced[name] = c.Limit()
		a.limits = append(a.limits, adaptLimit{name, c})
		return c
	}
	out := s
	if s.MaxConcurrent > 0 {
		out.MaxConcurrent = int(ctl(LimitConcurrency, float64(s.MaxConcurrent)).Limit())
	}
	if s.RateLimit > 0 {
		out.RateLimit = int(ctl(LimitRequests, float64(s.RateLimit)).Limit())
	}
	r.Ceilings = nil
	if len(s.Meters) > 0 {
		out.Meters = slices.Clone(s.Meters)
		for i, m := range s.Meters {
			out.Meters[i].Limit = ctl(m.Name, float64(m.Limit)).Limit()
			if out.Meters[i].Limit < m.Limit {
				if r.Ceilings == nil {
					r.Ceilings = map[string]int64{}
				}
				r.Ceilings[m.Name] = m.Limit
			}
		}
	}
	for _, l := range a.limits {
		l.ctl.Decrease, l.ctl.Increase = def.Decrease, def.Increase
	}
	return out
}

// adaptRun feeds the end of r to the adaptive limits of its services: sig
// (an overload, to the services held if it is a Retry-After) or, on
// success, the amounts it used. It returns the limit_adapted events to
// store with r's Finish.
func (t *resourceTable) adaptRun(r *run, sig Overload, success bool, held []string) []store.Event {
	var evs []store.Event
	for _, res := range r.lane.resources {
		a := res.adapt
		if a == nil || (sig == OverloadThrottled && !slices.Contains(held, res.name)) {
			continue
		}
		changed, cut := false, false
		switch {
		case sig != OverloadNone:
			switch sig {
			case OverloadThrottled:
				a.counts.Throttled++
			case OverloadUnavailable:
				a.counts.Unavailable++
			case OverloadTimeout:
				a.counts.Timeouts++
			}
			// A response that said which of the service's limits it ran
			// out of (its headers, Work.Observe) cuts those only: a 429
			// for tokens does not cut concurrency or requests. A timeout,
			// or a response that said nothing of them, cuts every limit.
			var only []string
			if sig != OverloadTimeout {
				only = r.pointedAt(res)
			}
			now := t.wall()
			for _, l := range a.limits {
				if len(only) > 0 && !slices.Contains(only, l.name) {
					continue
				}
				if l.ctl.Overload(r.start, now) {
					changed, cut = true, true
				}
			}
		case success:
			costs := r.costs()
			for _, l := range a.limits {
				amount := float64(1)
				if l.name != LimitConcurrency && l.name != LimitRequests {
					amount = float64(costs.Of(l.name))
					if v, ok := r.end.Used[l.name]; ok && v > 0 {
						amount = float64(v)
					}
				}
				if l.ctl.Success(amount) {
					changed = true
				}
			}
		}
		if !changed {
			continue
		}
		t.applyEffective(res)
		t.markStatus(res)
		if !cut {
			t.wakeAll(res) // room grew
		}
		if ev, ok := t.announceAdapt(res, cut); ok {
			evs = append(evs, ev)
		}
	}
	return evs
}

// applyEffective gives r's meters its adaptive limits' effective values,
// in place (applyLimits, which also sets them, rebuilds every limit from
// the service's definition: for a change of limits, not of a value).
func (t *resourceTable) applyEffective(r *resource) {
	for _, l := range r.adapt.limits {
		eff := l.ctl.Limit()
		switch l.name {
		case LimitConcurrency:
			r.Limit = int(eff)
		case LimitRequests:
			if r.Window != nil {
				r.Window.SetLimits(int(eff), r.Window.Length())
			}
		default:
			a := r.Amount(l.name)
			if a == nil {
				continue
			}
			a.SetLimits(eff, a.Length(), a.Margin(), a.ChargePolicy())
			if ceiling := int64(l.ctl.Ceiling); eff < ceiling {
				if r.Ceilings == nil {
					r.Ceilings = map[string]int64{}
				}
				r.Ceilings[l.name] = ceiling
			} else {
				delete(r.Ceilings, l.name)
			}
		}
	}
}

// announceStep is the rise, in fractions of its ceiling, that a limit
// makes before it is announced again: every cut is announced, and the
// return to the ceiling.
const announceStep = 0.05

// announceAdapt announces and persists r's adaptive limits if a cut was
// made, a limit reached its ceiling again, or one rose by announceStep of
// its ceiling since last announced; it returns the event to store.
func (t *resourceTable) announceAdapt(r *resource, cut bool) (store.Event, bool) {
	a := r.adapt
	due, atCeilings := cut, true
	for _, l := range a.limits {
		eff, last := l.ctl.Limit(), a.announced[l.name]
		ceiling := int64(math.Floor(l.ctl.Ceiling))
		if eff < ceiling {
			atCeilings = false
		}
		if eff != last && (eff >= ceiling || float64(eff-last) >= announceStep*l.ctl.Ceiling) {
			due = true
		}
	}
	if !due {
		return store.Event{}, false
	}
	if atCeilings {
		a.counts = adaptCounts{}
	}
	for _, l := range a.limits {
		a.announced[l.name] = l.ctl.Limit()
	}
	st := t.adaptStatus(r)
	t.log.Info("runcue: limit_adapted", "service", r.name, "limits", adaptSummary(st.Limits), "throttled", a.counts.Throttled,
		"unavailable", a.counts.Unavailable, "timeouts", a.counts.Timeouts)
	t.persistAdapt(r)
	t.publishAdaptGauges()
	return store.Event{Type: store.TypeLimitAdapted, Data: t.encode(AdaptEvent{Service: r.name, Class: r.class, Adaptive: *st,
		Lowered: cut})}, true
}

// AdaptEvent is a limit_adapted event's data.
type AdaptEvent struct {
	Service, Class string
	Adaptive       rt.AdaptiveStatus
	Lowered        bool
}

func adaptSummary(st []rt.AdaptiveLimit) map[string]int64 {
	out := make(map[string]int64, len(st))
	for _, s := range st {
		out[s.Limit] = s.Effective
	}
	return out
}

// adaptStatus returns r's adaptive limits now (nil when it has none).
func (t *resourceTable) adaptStatus(r *resource) *rt.AdaptiveStatus {
	if r.adapt == nil {
		return nil
	}
	c := r.adapt.counts
	out := &rt.AdaptiveStatus{Limits: make([]rt.AdaptiveLimit, 0, len(r.adapt.limits)), Throttled: c.Throttled,
		Unavailable: c.Unavailable, Timeouts: c.Timeouts}
	for _, l := range r.adapt.limits {
		out.Limits = append(out.Limits, rt.AdaptiveLimit{Limit: l.name, Configured: int64(math.Floor(l.ctl.Ceiling)), Effective: l.ctl.Limit(),
			Overloads: l.ctl.Overloads()})
	}
	return out
}

// persistAdapt writes r's adaptive state, so that a new owner goes on from
// it (not from the ceilings).
func (t *resourceTable) persistAdapt(r *resource) {
	a := r.adapt
	rec := store.AdaptRecord{Limits: make(map[string]store.AdaptLimitRecord, len(a.limits)),
		Throttled: a.counts.Throttled, Unavailable: a.counts.Unavailable, Timeouts: a.counts.Timeouts}
	for _, l := range a.limits {
		st := l.ctl.State()
		rec.Limits[l.name] = store.AdaptLimitRecord{Effective: st.Effective, Overloads: st.Overloads}
	}
	blob, _ := json.Marshal(rec)
	t.putMeterState(r.name, store.MeterAdapt, blob)
}

// publishAdaptGauges hands the effective limits to the metrics' callback:
// by class and limit, the lowest of a class's instances.
func (t *resourceTable) publishAdaptGauges() {
	g := map[[2]string]int64{}
	add := func(r *resource) {
		if r.adapt == nil {
			return
		}
		for _, st := range t.adaptStatus(r).Limits {
			k := [2]string{r.class, st.Limit}
			if v, ok := g[k]; !ok || st.Effective < v {
				g[k] = st.Effective
			}
		}
	}
	for _, r := range t.services {
		add(r)
	}
	for _, r := range t.keyed {
		add(r)
	}
	t.tel.adaptive.Store(&g)
}

// overloadOf classifies how a run ended for the adaptive limits.
func overloadOf(e ending, o outcome) (sig Overload, success bool) {
	switch {
	case e.returned && e.err == nil:
		return OverloadNone, true
	case e.returned && e.overload:
		return OverloadUnavailable, false // a 503, with a Retry-After or not
	case e.returned && e.class == ClassRetryAfter:
		return OverloadThrottled, false
	case o.fin.ErrorKind == "timeout":
		return OverloadTimeout, false
	}
	return OverloadNone, false
}
