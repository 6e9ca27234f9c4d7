package engine

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/vocab"
	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Service status: service_status events (coalesced), the status snapshot
// the owner serves, and the open-circuit gauge.

// statusBoard holds the resources whose status may have changed since the
// last service_status events.
type statusBoard struct {
	dirty map[*resource]struct{}
	// budgetsDirty: a budget's count may have changed since the gauges'
	// view was refreshed (snapshotBudgets), at budgetsAt. The view is
	// refreshed at most once per statusEvery: it walks every budgeted
	// resource, keyed instances included. budgetsTimer: a tBudgets timer
	// is pending for the next refresh.
	budgetsDirty bool
	budgetsAt    time.Time
	budgetsTimer bool
}

// statusKey is what a service_status event reports.
type statusKey struct {
	circuitState rt.CircuitState
	isPaused     bool
	blocked      bool
	saturated    bool
}

func (t *resourceTable) keyOf(r *resource, now time.Time) statusKey {
	k := statusKey{isPaused: r.Paused, blocked: r.BlockedUntil.After(now)}
	if r.Circuit != nil {
		k.circuitState = r.Circuit.State
	}
	k.saturated = k.isPaused || k.blocked || (r.Limit > 0 && r.Active >= r.Limit) || r.SpentBudget(now) != nil ||
		(r.Window != nil && r.Window.Used(now) >= r.Window.Limit()) || (r.Circuit != nil && r.Circuit.State != rt.CircuitClosed)
	return k
}

func (b *statusBoard) markStatus(r *resource) {
	if r.class != "" {
		b.dirty[r] = struct{}{}
	}
	if len(r.Budgets) > 0 {
		b.budgetsDirty = true
	}
}

// statusEvery is the least time between two service_status events of a
// service that only report saturation; changes of circuit, pause and
// Retry-After are reported at once.
const statusEvery = time.Second

// flushStatus publishes the service_status events that are due.
func (t *resourceTable) flushStatus() {
	if t.budgetsDirty {
		if now := t.now(); t.budgetsAt.IsZero() || now.Sub(t.budgetsAt) >= statusEvery {
			t.snapshotBudgets()
			t.budgetsAt = now
		} else if !t.budgetsTimer {
			t.budgetsTimer = true
			t.pushTimer(&timerEntry{at: t.budgetsAt.Add(statusEvery), kind: tBudgets})
		}
	}
	if len(t.dirty) == 0 {
		return
	}
	now := t.now()
	var evs []store.Event
	for r := range t.dirty {
		k := t.keyOf(r, now)
		if k == r.lastStatus {
			delete(t.dirty, r)
			continue
		}
		onlySaturation := k.circuitState == r.lastStatus.circuitState && k.isPaused == r.lastStatus.isPaused && k.blocked == r.lastStatus.blocked
		if onlySaturation && r.keyed {
			delete(t.dirty, r) // keyed instances report changes of health, not load
			r.lastStatus = k
			continue
		}
		if onlySaturation && now.Sub(r.statusAt) < statusEvery {
			if !r.statusTimer {
				r.statusTimer = true
				t.pushTimer(&timerEntry{at: r.statusAt.Add(statusEvery), kind: tStatus, res: r})
			}
			delete(t.dirty, r)
			continue
		}
		delete(t.dirty, r)
		r.lastStatus, r.statusAt = k, now
		evs = append(evs, store.Event{Type: store.TypeServiceStatus, Time: t.wall(), Data: t.encode(t.statusOf(r, now))})
	}
	if len(evs) > 0 {
		t.hub.Publish(evs)
	}
}

// statusOf reports one resource.
func (t *resourceTable) statusOf(r *resource, now time.Time) rt.ServiceStatus {
	t.syncBudgets(r)
	s, _ := t.limits(r.name, r.class)
	s = t.statedLimits(r, s)
	overridden := len(t.stored[r.class].Override) > 0 || (r.keyed && len(t.stored[r.name].Override) > 0)
	st := rt.ServiceStatus{Name: r.name, Class: r.class, Limits: vocab.ServiceOf(s), Overridden: overridden, RateStated: r.isStated(store.MeterRequests),
		Active: r.Active, Paused: r.Paused, Circuit: rt.CircuitClosed, Waiting: r.waiters.Len()}
	for _, l := range r.waiters.Items() {
		st.WaitingUnits += l.units.Len()
	}
	if r.Window != nil {
		st.InWindow = r.Window.Used(now)
	}
	if r.Circuit != nil {
		st.Circuit = r.Circuit.State
		if r.Circuit.State == rt.CircuitOpen {
			st.CircuitOpenUntil = t.toWall(r.Circuit.Until)
		}
	}
	if r.BlockedUntil.After(now) {
		st.BlockedUntil = t.toWall(r.BlockedUntil)
	}
	for i, b := range r.Budgets {
		st.Budgets = append(st.Budgets, budgetStatus(r.budgetSpecs[i], b, now))
	}
	st.Unmatched = slices.Clone(t.unmatched[r.class])
	for _, a := range r.Amounts {
		ms := rt.MeterStatus{Name: a.Name(), Used: a.Used(now), Limit: a.Limit(), Window: a.Length(), Stated: r.isStated(a.Name())}
		ms.Frees = t.toWall(a.Frees(now))
		ms.Elsewhere = a.Elsewhere(now)
		ms.FromElsewhere, ms.ElsewhereShare = a.FromElsewhere(now)
		st.Meters = append(st.Meters, ms)
	}
	if r.adapt != nil {
		st.Adaptive = t.adaptStatus(r)
	}
	st.NextCapacity = t.toWall(t.nextCapacity(r, now))
	return st
}

// nextCapacity is when r may next admit a dispatch: zero if it may now or
// will only when something else happens (a run ends, a resume).
func (t *resourceTable) nextCapacity(r *resource, now time.Time) time.Time {
	// Step through the refusals forward in time: each says until when it
	// holds; the first instant none holds is the answer.
	next := now
	for range 8 {
		rf, refused := r.Refusal(next, nil)
		switch {
		case !refused:
			return next
		case rf.Until.IsZero() || !rf.Until.After(next):
			return time.Time{}
		}
		next = rf.Until
	}
	return time.Time{}
}

// statusAll reports every registered service, with its keyed instances
// folded into it.
func (t *resourceTable) statusAll() []rt.ServiceStatus {
	now := t.now()
	var out []rt.ServiceStatus
	for _, name := range sortedNames(t.services) {
		st := t.statusOf(t.services[name], now)
		for _, kr := range t.keyed {
			if kr.class != name {
				continue
			}
			st.Keys++
			st.KeysActive += kr.Active
			st.KeysWaiting += kr.waiters.Len()
			if kr.Circuit != nil && kr.Circuit.State != rt.CircuitClosed {
				st.OpenKeys++
			}
			if kr.BlockedUntil.After(now) {
				st.BlockedKeys++
			}
			if kr.Paused && !st.Paused {
				st.PausedKeys++
			}
		}
		// Instances paused on their own that are not in memory now.
		for key, rec := range t.stored {
			if rec.Paused && !st.Paused && t.keyed[key] == nil && strings.HasPrefix(key, name+":") {
				st.PausedKeys++
			}
		}
		out = append(out, st)
	}
	return out
}

func sortedNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// countOpenCircuits refreshes the metrics' view of open circuits, by class.
func (t *resourceTable) countOpenCircuits() {
	open := map[string]int64{}
	count := func(r *resource) {
		if r.Circuit != nil {
			if r.Circuit.State != rt.CircuitClosed {
				open[r.class]++
			} else if _, ok := open[r.class]; !ok {
				open[r.class] = 0
			}
		}
	}
	for _, r := range t.services {
		count(r)
	}
	for _, r := range t.keyed {
		count(r)
	}
	t.tel.openCircuit.Store(&open)
}

// liveKeyStatus reports keyed instance name if it is in memory, on the
// dispatcher goroutine.
func (t *resourceTable) liveKeyStatus(name string) *rt.ServiceStatus {
	r := t.keyed[name]
	if r == nil {
		return nil
	}
	st := t.statusOf(r, t.now())
	return &st
}

// serviceStats reports, on the dispatcher goroutine, every service with
// its busiest keyed instances.
func (t *resourceTable) serviceStats() []rt.ServiceStats {
	now := t.now()
	all := t.statusAll()
	// The instances by class, in one pass: those in memory, and those not
	// in memory with a stored pause or override.
	keys := make(map[string][]rt.ServiceStatus)
	for _, kr := range t.keyed {
		keys[kr.class] = append(keys[kr.class], t.statusOf(kr, now))
	}
	for name, rec := range t.stored {
		class, _, keyed := strings.Cut(name, ":")
		if keyed && t.keyed[name] == nil && (rec.Paused || len(rec.Override) > 0) {
			s, _ := t.limits(name, class)
			keys[class] = append(keys[class], rt.ServiceStatus{Name: name, Class: class, Limits: vocab.ServiceOf(s), Circuit: rt.CircuitClosed,
				Paused: rec.Paused || t.stored[class].Paused, Overridden: len(rec.Override) > 0})
		}
	}
	out := make([]rt.ServiceStats, len(all))
	for i, st := range all {
		out[i] = rt.ServiceStats{ServiceStatus: st, Keys: busiest(keys[st.Name], t.cfg.StatsKeys)}
	}
	return out
}

// busiest orders keyed instances by units running, waiting, starts in the
// window, then name, and keeps the first n.
func busiest(keys []rt.ServiceStatus, n int) []rt.ServiceStatus {
	slices.SortFunc(keys, func(a, b rt.ServiceStatus) int {
		return cmp.Or(cmp.Compare(b.Active, a.Active), cmp.Compare(b.Waiting, a.Waiting),
			cmp.Compare(b.InWindow, a.InWindow), strings.Compare(a.Name, b.Name))
	})
	return keys[:min(len(keys), n)]
}
