package engine

import (
	"context"

	"github.com/runcue/runcue/store"
)

// Limits changed at run time: an override or a pause of a service (or of
// a keyed instance) stored by any process, read back and applied by the
// dispatcher goroutine.

// reloadService re-reads a service's stored record (its override or pause
// changed), on the reader goroutine, applies it, and closes applied (if
// not nil). Reads are answered in order, so a change is never overtaken
// by an older read.
func (d *Engine) reloadService(name string, applied chan struct{}) {
	d.read(func(ctx context.Context) func(*Engine) {
		svcs, err := d.st.Services(ctx)
		return func(d *Engine) {
			if applied != nil {
				defer close(applied)
			}
			if err != nil {
				d.log.Error("runcue: read services", "error", err)
				return
			}
			d.applyService(name, svcs)
		}
	})
}

// applyService applies the stored record of name, from svcs: a service
// (and so its keyed instances) or one keyed instance ("host:example.org").
func (t *resourceTable) applyService(name string, svcs []store.ServiceRecord) {
	for _, rec := range svcs {
		if rec.Name == name {
			cur := t.stored[name]
			rec.Meters = cur.Meters // the owner's own state wins
			t.stored[name] = rec
		}
	}
	apply := func(r *resource) {
		s, ok := t.limits(r.name, r.class)
		if !ok {
			return
		}
		t.applyLimits(r, s)
		t.limitsGen++ // lanes list their logged resources again
		wasPaused := r.Paused
		r.Paused = t.pausedOf(r.name, r.class)
		if wasPaused != r.Paused {
			state := "resumed"
			if r.Paused {
				state = "paused"
			}
			t.log.Info("runcue: service "+state, "service", r.name)
		}
		t.markStatus(r)
		t.wakeAll(r) // limits may have grown
	}
	if r := t.keyed[name]; r != nil {
		apply(r) // a keyed instance; one not in memory reads its record when made
		return
	}
	if r := t.services[name]; r != nil {
		apply(r)
	}
	for _, r := range t.keyed {
		if r.class == name {
			apply(r)
		}
	}
}
