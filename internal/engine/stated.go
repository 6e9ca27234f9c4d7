package engine

import (
	"encoding/json"
	"slices"

	rt "github.com/runcue/runcue/runcuetype"

	"github.com/runcue/runcue/store"
)

// Limits a provider states (Meter.FromProvider, Service.RateFromProvider
// for its requests): a meter's Limit follows
// what the responses of its service state of the limit (ObservedLimit.Limit),
// capped by its MaxLimit, from the configured Limit until the first
// statement. A resource keeps its own (a keyed instance per model states
// its own), persists them (meter state "stated") so that a new owner
// starts from them, and announces each change (limit_stated). Owned by
// the dispatcher goroutine.

// StatedEvent is a limit_stated event's data.
type StatedEvent struct {
	Service, Class, Meter string
	// Limit is the meter's limit now; Said what the provider stated
	// (above Limit when MaxLimit capped it).
	Limit, Said int64
}

// statedLimits returns s with the limits r's provider stated in place of
// its FromProvider meters' configured ones (read from the stored state
// the first time).
func (t *resourceTable) statedLimits(r *resource, s store.ServiceDef) store.ServiceDef {
	if !s.RateFromProvider && !slices.ContainsFunc(s.Meters, func(m store.MeterDef) bool { return m.FromProvider }) {
		return s
	}
	if r.stated == nil {
		r.stated = map[string]int64{}
		if raw := t.stored[r.name].Meters[store.MeterStated]; len(raw) > 0 {
			_ = json.Unmarshal(raw, &r.stated) // unreadable: the configured limits, until a response states them
		}
	}
	out := s
	if v, ok := r.stated[store.MeterRequests]; ok && s.RateFromProvider {
		out.RateLimit = int(statedLimit(rateDef(s), v))
	}
	out.Meters = slices.Clone(s.Meters)
	for i, m := range out.Meters {
		if v, ok := r.stated[m.Name]; ok && m.FromProvider {
			out.Meters[i].Limit = statedLimit(m, v)
		}
	}
	return out
}

// statedLimit is what a meter's limit is when its provider states said:
// said, capped by MaxLimit.
func statedLimit(m store.MeterDef, said int64) int64 {
	if m.MaxLimit > 0 {
		return min(said, m.MaxLimit)
	}
	return said
}

// stateLimit takes what a response of r's provider stated of the limit
// of meter name (said > 0): a FromProvider meter whose limit it changes
// gets it (its window keeps its entries), persisted and announced.
func (d *Engine) stateLimit(r *resource, name string, said int64) {
	s, ok := d.limits(r.name, r.class)
	if !ok {
		return
	}
	m, ok := s.Meter(name)
	if name == store.MeterRequests && s.RateFromProvider {
		m, ok = rateDef(s), true
	}
	if !ok || !m.FromProvider {
		return
	}
	if r.stated == nil {
		d.statedLimits(r, s) // reads the stored state
	}
	said = min(said, maxStated(name))
	limit := statedLimit(m, said)
	if prev, ok := r.stated[name]; ok && statedLimit(m, prev) == limit {
		r.stated[name] = said
		return
	}
	r.stated[name] = said
	d.applyLimits(r, s)
	d.limitsGen++ // lanes list their logged resources again
	d.markStatus(r)
	d.wakeAll(r) // the limit may have grown
	blob, _ := json.Marshal(r.stated)
	d.putMeterState(r.name, store.MeterStated, blob)
	d.submit(&store.AppendEvent{Epoch: d.epoch, Event: store.Event{Type: store.TypeLimitStated, Time: d.wall(),
		Data: d.encode(StatedEvent{Service: r.name, Class: r.class, Meter: name, Limit: limit, Said: said})}})
	d.log.Info("runcue: limit_stated", "service", r.name, "meter", name, "limit", limit, "said", said)
}

// isStated reports whether r's meter name has a limit its provider
// stated.
func (r *resource) isStated(name string) bool {
	_, ok := r.stated[name]
	return ok
}

// maxStated bounds what a response may state of a limit, whatever
// MaxLimit says: a meter's at MaxCost, requests at 1<<20 per window (a
// reading that shows the window used adds an entry per request).
func maxStated(name string) int64 {
	if name == store.MeterRequests {
		return 1 << 20
	}
	return rt.MaxCost
}

// rateDef is s's rate limit as a meter of requests, for the rules above.
func rateDef(s store.ServiceDef) store.MeterDef {
	return store.MeterDef{Name: store.MeterRequests, Limit: int64(s.RateLimit), FromProvider: s.RateFromProvider, MaxLimit: int64(s.MaxRate)}
}
