package runcue

import (
	"encoding/json"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// storedAdaptive reads a service's persisted adaptive state (raw), for a
// Cue that does not own the database; nil when l is not adaptive.
func storedAdaptive(raw []byte, l Service) *AdaptiveStatus {
	if l.Adaptive == nil {
		return nil
	}
	var rec store.AdaptRecord
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &rec) // unreadable: reported at the ceilings
	}
	st := &AdaptiveStatus{Throttled: rec.Throttled, Unavailable: rec.Unavailable, Timeouts: rec.Timeouts}
	def := vocab.AdaptDef(l.Adaptive).InForce()
	add := func(name string, configured int64) {
		// The owner's rule: the stored state within this configuration.
		ctl := broker.NewAIMD(float64(configured), def.Floor*float64(configured), def.Decrease, def.Increase)
		if r, ok := rec.Limits[name]; ok {
			ctl.Restore(broker.AIMDState{Effective: r.Effective, Overloads: r.Overloads})
		}
		st.Limits = append(st.Limits, AdaptiveLimit{Limit: name, Configured: configured, Effective: ctl.Limit(), Overloads: ctl.Overloads()})
	}
	if l.MaxConcurrent > 0 {
		add("concurrency", int64(l.MaxConcurrent))
	}
	if l.RateLimit > 0 {
		add(store.MeterRequests, int64(l.RateLimit))
	}
	for _, m := range l.Meters {
		add(m.Name, m.Limit)
	}
	return st
}
