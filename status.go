package runcue

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// Service status: service_status events (coalesced), the status snapshot
// the owner serves, and the open-circuit gauge.

// statusBoard holds the resources whose status may have changed since the
// last service_status events.
type statusBoard struct {
	dirty map[*resource]struct{}
}

// statusKey is what a service_status event reports.
type statusKey struct {
	circuit   broker.CircuitState
	paused    bool
	blocked   bool
	saturated bool
}

func (d *dispatcher) keyOf(r *resource, now time.Time) statusKey {
	k := statusKey{paused: r.paused, blocked: r.blockedUntil.After(now)}
	if r.circuit != nil {
		k.circuit = r.circuit.State
	}
	k.saturated = k.paused || k.blocked || (r.limit > 0 && r.active >= r.limit) ||
		(r.window != nil && r.window.Used(now) >= r.window.Limit()) || (r.circuit != nil && r.circuit.State != broker.Closed)
	return k
}

func (b *statusBoard) markStatus(r *resource) {
	if r.class != "" {
		b.dirty[r] = struct{}{}
	}
}

// statusEvery is the least time between two service_status events of a
// service that only report saturation; changes of circuit, pause and
// Retry-After are reported at once.
const statusEvery = time.Second

// flushStatus publishes the service_status events that are due.
func (d *dispatcher) flushStatus() {
	if len(d.dirty) == 0 {
		return
	}
	now := d.now()
	var evs []store.Event
	for r := range d.dirty {
		k := d.keyOf(r, now)
		if k == r.lastStatus {
			delete(d.dirty, r)
			continue
		}
		onlySaturation := k.circuit == r.lastStatus.circuit && k.paused == r.lastStatus.paused && k.blocked == r.lastStatus.blocked
		if onlySaturation && r.keyed {
			delete(d.dirty, r) // keyed instances report changes of health, not load
			r.lastStatus = k
			continue
		}
		if onlySaturation && now.Sub(r.statusAt) < statusEvery {
			if !r.statusTimer {
				r.statusTimer = true
				d.pushTimer(&timerEntry{at: r.statusAt.Add(statusEvery), kind: tStatus, res: r})
			}
			delete(d.dirty, r)
			continue
		}
		delete(d.dirty, r)
		r.lastStatus, r.statusAt = k, now
		st := d.statusOf(r, now)
		data, _ := json.Marshal(st)
		evs = append(evs, store.Event{Type: string(EventServiceStatus), Time: d.wall(), Data: data})
	}
	if len(evs) > 0 {
		d.hub.Publish(evs)
	}
}

// statusOf reports one resource.
func (d *dispatcher) statusOf(r *resource, now time.Time) ServiceStatus {
	s, _ := d.effective(r.class)
	st := ServiceStatus{Name: r.name, Class: r.class, Limits: s, Overridden: len(d.stored[r.class].Override) > 0,
		Active: r.active, Paused: r.paused, Circuit: CircuitClosed, Waiting: r.waiters.Len()}
	if r.window != nil {
		st.InWindow = r.window.Used(now)
	}
	if r.circuit != nil {
		st.Circuit = CircuitState(r.circuit.State)
		if r.circuit.State == broker.Open {
			st.CircuitOpenUntil = d.toWall(r.circuit.Until)
		}
	}
	if r.blockedUntil.After(now) {
		st.BlockedUntil = d.toWall(r.blockedUntil)
	}
	st.NextCapacity = d.toWall(d.nextCapacity(r, now))
	return st
}

// nextCapacity is when r may next admit a dispatch: zero if it may now or
// will only when something else happens (a run ends, a resume).
func (d *dispatcher) nextCapacity(r *resource, now time.Time) time.Time {
	// Step through the refusals forward in time: each says until when it
	// holds; the first instant none holds is the answer.
	next := now
	for range 8 {
		rf, refused := r.refusal(next)
		switch {
		case !refused:
			return next
		case rf.until.IsZero() || !rf.until.After(next):
			return time.Time{}
		}
		next = rf.until
	}
	return time.Time{}
}

// statusAll reports every registered service, with its keyed instances
// folded into it.
func (d *dispatcher) statusAll() []ServiceStatus {
	now := d.now()
	var out []ServiceStatus
	for _, name := range sortedNames(d.services) {
		st := d.statusOf(d.services[name], now)
		for _, kr := range d.keyed {
			if kr.class != name {
				continue
			}
			st.Keys++
			st.Active += kr.active
			st.InWindow += kr.window.UsedOrZero(now)
			st.Waiting += kr.waiters.Len()
			if kr.circuit != nil && kr.circuit.State != broker.Closed {
				st.OpenKeys++
			}
			if kr.blockedUntil.After(now) {
				st.BlockedKeys++
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
func (d *dispatcher) countOpenCircuits() {
	open := map[string]int64{}
	count := func(r *resource) {
		if r.circuit != nil {
			if r.circuit.State != broker.Closed {
				open[r.class]++
			} else if _, ok := open[r.class]; !ok {
				open[r.class] = 0
			}
		}
	}
	for _, r := range d.services {
		count(r)
	}
	for _, r := range d.keyed {
		count(r)
	}
	d.tel.openCircuit.Store(&open)
}
