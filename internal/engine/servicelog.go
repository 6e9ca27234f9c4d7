package engine

import (
	"context"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/broker"
	"github.com/runcue/runcue/store"
)

// The service log as the engine reads it: what earlier owners logged,
// restored into the meters of a resource when it is created, and how far
// back retention may cut it.

// priorLog returns, on the wall clock, the starts of a service's runs by
// previous owners that may still count in its window or budgets (this
// owner's own are in memory). The log records when each dispatch was
// decided; its handler started at most MaxStartDelay later (a later start
// is refused) and before this owner took over (its owner was dead, or had
// stopped starting handlers, by then). So each entry t counts as a start
// at min(t+MaxStartDelay, this owner's start): the latest instant it can
// have had. That also clamps entries stamped in the future by a wall clock
// that was set back since. For keyed instances one query per class serves
// every key: it is read on the first key's creation.
func (t *resourceTable) priorLog(name, class string, s store.ServiceDef, horizon time.Duration, now time.Time) []store.Logged {
	lag := t.cfg.MaxStartDelay
	since := t.priorSince(s, now)
	if horizon > 0 && now.Sub(t.startMono) < horizon+lag {
		since = earliest(since, t.started.Add(-horizon-lag))
	}
	if since.IsZero() {
		return nil // everything a previous owner started has left the window and periods
	}
	var times []store.Logged
	if name == class {
		var err error
		times, err = t.st.ServiceLog(context.Background(), name, since)
		if err != nil {
			t.log.Error("runcue: read service log; rate window starts empty", "service", name, "error", err)
		}
	} else {
		logs, ok := t.classLogs[class]
		if !ok {
			// One read for the class: as far back as the class's limits
			// or any instance's own override needs.
			if cs, ok := t.effective(class); ok {
				since = earliest(since, t.priorSince(cs, now))
			}
			for key, rec := range t.stored {
				if len(key) > len(class) && key[len(class)] == ':' && key[:len(class)] == class {
					if o, ok := store.DecodeServiceDef(rec.Override); ok {
						since = earliest(since, t.priorSince(o, now))
					}
				}
			}
			var err error
			logs, err = t.st.ServiceLogPrefix(context.Background(), class+":", since)
			if err != nil {
				t.log.Error("runcue: read service log; rate windows start empty", "service", class, "error", err)
			}
			t.classLogs[class] = logs
		}
		times = logs[name]
		delete(logs, name)
	}
	return times
}

// extraHorizon is how far back r's meters that say so (Horizoned) need
// the log.
func extraHorizon(r *resource) time.Duration {
	var h time.Duration
	for _, m := range r.Meters() {
		if hm, ok := m.(broker.Horizoned); ok {
			h = max(h, hm.Horizon())
		}
	}
	return h
}

// restoreMeters counts prior (the service log of previous owners, see
// priorLog) in r's meters, by amount. Each entry at t counts as a start at
// min(t+MaxStartDelay, this owner's start), the latest instant it can
// have had, placed on the scheduling timeline; with remote tasks at
// t+MaxStartDelay, since an executor may start a run an earlier owner
// assigned after this owner took over (it adopts the run).
func (t *resourceTable) restoreMeters(r *resource, prior []store.Logged, now time.Time) {
	if len(prior) == 0 {
		return
	}
	starts := make(map[string][]broker.Logged, 1)
	for _, e := range prior {
		latest := e.At.Add(t.cfg.MaxStartDelay)
		if latest.After(t.started) && !t.remote {
			latest = t.started
		}
		starts[e.Meter] = append(starts[e.Meter], broker.Logged{At: t.startMono.Add(latest.Sub(t.started)), Wall: latest, Amount: e.Amount})
	}
	t.syncBudgets(r)
	r.Restore(starts, now)
	t.syncBudgets(r)
}

// priorSince returns the earliest wall instant whose logged starts may
// still count in s's window or budgets at now (see priorLog), or zero if
// no start of a previous owner can.
func (t *resourceTable) priorSince(s store.ServiceDef, now time.Time) time.Time {
	lag := t.cfg.MaxStartDelay
	var since time.Time
	if h := s.LogHold(); h > 0 && now.Sub(t.startMono) < h+lag {
		since = t.started.Add(-h - lag)
	}
	if b := budgetsSince(s, t.wall(), lag+margin(s)); !b.IsZero() && b.Before(t.started) {
		since = earliest(since, b) // a current period began before this owner took over
	}
	return since
}

// earliest returns the earlier of a and b, a zero time meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// logCutoffs returns, per rate-limited or budgeted service (and per class
// of keyed instances, under "class:"), the time before which its log is no
// longer needed. A keyed instance's own override may need more of the
// class's log than the class does.
func (t *resourceTable) logCutoffs(now time.Time) map[string]time.Time {
	out := make(map[string]time.Time)
	earliest := func(key string, at time.Time) {
		if cur, ok := out[key]; !at.IsZero() && (!ok || at.Before(cur)) {
			out[key] = at
		}
	}
	for name := range t.services {
		s, _ := t.effective(name)
		cut := t.logCut(s, now)
		earliest(name, cut)
		earliest(name+":", cut)
	}
	for name := range t.stored {
		if i := strings.IndexByte(name, ':'); i > 0 {
			if s, ok := t.limits(name, name[:i]); ok {
				earliest(name[:i+1], t.logCut(s, now))
			}
		}
	}
	return out
}

// logCut is the time before which s's windows and budgets need no log
// entry: a logged decision may count for MaxStartDelay more than its
// window and margin, at a restart (see priorLog), and as long as the
// current period of a budget (its margin and MaxStartDelay before it
// included). Zero if s has neither.
func (t *resourceTable) logCut(s store.ServiceDef, now time.Time) time.Time {
	var cut time.Time
	if h := s.LogHold(); h > 0 {
		cut = now.Add(-h - t.cfg.MaxStartDelay)
	}
	if b := budgetsSince(s, now, t.cfg.MaxStartDelay+margin(s)); !b.IsZero() && (cut.IsZero() || b.Before(cut)) {
		cut = b
	}
	return cut
}
