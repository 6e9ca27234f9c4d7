package runcue

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/runcue/runcue/internal/vocab"
	"github.com/runcue/runcue/store"
)

// Stats: the operator's summary of a database, from any process.

// StatsWindow is the recent period Stats reports throughput and queue
// wait over.
const StatsWindow = time.Hour

// Stats returns a summary of the database. See Stats (the type).
func (c *Cue) Stats(ctx context.Context) (Stats, error) {
	if err := c.checkOpen(); err != nil {
		return Stats{}, err
	}
	now := c.clock.Now()
	s := Stats{At: now, States: map[State]int{}, Tasks: map[string]map[State]int{}}
	counts, err := c.st.Counts(ctx)
	if err != nil {
		return Stats{}, c.readErr(err)
	}
	for _, n := range counts {
		if n.N == 0 {
			continue
		}
		s.States[n.State] += n.N
		if s.Tasks[n.Task] == nil {
			s.Tasks[n.Task] = map[State]int{}
		}
		s.Tasks[n.Task][n.State] += n.N
	}
	if s.OldestQueued, _, err = c.st.OldestQueued(ctx); err != nil {
		return Stats{}, c.readErr(err)
	}
	p, err := c.st.Pauses(ctx)
	if err != nil {
		return Stats{}, c.readErr(err)
	}
	s.QueuePaused, s.PausedTasks = p.Queue, p.Tasks
	if s.Schedules, err = c.Schedules(ctx); err != nil {
		return Stats{}, err
	}
	if s.Backpressure, err = c.backpressureStats(ctx); err != nil {
		return Stats{}, err
	}
	since := now.Add(-StatsWindow).Truncate(time.Minute).Add(time.Minute)
	waits, err := c.st.QueueWaits(ctx, since)
	if err != nil {
		return Stats{}, c.readErr(err)
	}
	s.QueueWait = queueWaitStats(waits)
	acts, err := c.st.Activity(ctx, since)
	if err != nil {
		return Stats{}, c.readErr(err)
	}
	s.Minutes = make([]MinuteStats, int(StatsWindow/time.Minute))
	for i := range s.Minutes {
		s.Minutes[i].Minute = since.Add(time.Duration(i) * time.Minute)
	}
	deferredBy := map[string]int{} // service (a keyed instance's class) -> deferrals
	for _, a := range acts {
		i := int(a.Minute.Sub(since) / time.Minute)
		if i < 0 || i >= len(s.Minutes) {
			continue
		}
		m := &s.Minutes[i]
		switch a.Kind {
		case "work_started":
			m.Started += a.N
		case "work_completed":
			m.Completed += a.N
		case "work_failed":
			m.Failed += a.N
		case "work_failed_retry":
			m.Retried += a.N
		case "work_skipped":
			m.Skipped += a.N
		case "work_cancelled":
			m.Cancelled += a.N
		case "work_deferred":
			m.Deferred += a.N
		case store.ActivityServiceDeferred:
			deferredBy[a.Task] += a.N
		}
	}
	if s.Services, s.Live, err = c.serviceStats(ctx, now, deferredBy); err != nil {
		return Stats{}, err
	}
	if s.Patterns, err = c.patternStats(ctx); err != nil {
		return Stats{}, err
	}
	return s, nil
}

// patternStats counts the debounce keys settling (from the database) and,
// from the owner (this Cue's dispatcher, or asked), its sequences.
func (c *Cue) patternStats(ctx context.Context) (PatternStats, error) {
	var p PatternStats
	if d := c.disp.Load(); d != nil {
		live, ok, err := d.sequences(ctx)
		if err != nil {
			return p, err
		}
		if ok {
			p = live
		}
	} else if c.askOwner(ctx, store.OwnerQuestion{Kind: "sequences"}, &p) {
		p.Live = true
	}
	if dr, ok := c.st.(store.DebounceReader); ok {
		n, err := dr.Debouncing(ctx)
		if err != nil {
			return p, c.readErr(err)
		}
		p.Debouncing = n
	}
	return p, nil
}

// backpressureStats reads the state of backpressure: from the dispatcher
// if this Cue owns the database, else from the last backpressure event.
func (c *Cue) backpressureStats(ctx context.Context) (BackpressureStats, error) {
	var b BackpressureStats
	ev, ok, err := c.st.LastOfTypes(ctx, []string{string(EventBackpressureActive), string(EventBackpressureCleared)})
	if err != nil {
		return b, c.readErr(err)
	}
	if ok {
		e := eventFrom(&ev)
		b = BackpressureStats{Active: e.Type == EventBackpressureActive, MaxQueued: e.MaxQueued, Queued: e.Queued, Since: e.Time}
	}
	if d := c.disp.Load(); d != nil {
		live, ok, err := d.backpressure(ctx)
		if err != nil {
			return b, err
		}
		if ok {
			if live.Active == b.Active {
				live.Since = b.Since
			}
			return live, nil
		}
	}
	return b, nil
}

// queueWaitStats reads percentiles from a histogram of store.QueueWaitBounds.
func queueWaitStats(h []int64) QueueWaitStats {
	var q QueueWaitStats
	for _, n := range h {
		q.Count += n
	}
	if q.Count == 0 {
		return q
	}
	at := func(p float64) time.Duration {
		rank := int64(float64(q.Count)*p + 0.999999)
		var seen int64
		for i, n := range h {
			seen += n
			if seen >= rank {
				return store.QueueWaitBounds[min(i, len(store.QueueWaitBounds)-1)]
			}
		}
		return store.QueueWaitBounds[len(store.QueueWaitBounds)-1]
	}
	q.P50, q.P90, q.P95, q.P99 = at(0.5), at(0.9), at(0.95), at(0.99)
	return q
}

// serviceStats reports the services with their deferrals (by service,
// keyed instances' counted in their class) and busiest keys.
func (c *Cue) serviceStats(ctx context.Context, now time.Time, deferred map[string]int) ([]ServiceStats, bool, error) {
	if d := c.disp.Load(); d != nil {
		out, ok, err := d.serviceStats(ctx)
		if err != nil {
			return nil, false, err
		}
		if ok {
			for i := range out {
				out[i].Deferred = deferred[out[i].Name]
			}
			return out, true, nil
		}
	} else {
		var live []ServiceStats
		if c.askOwner(ctx, store.OwnerQuestion{Kind: "services"}, &live) {
			for i := range live {
				live[i].Deferred = deferred[live[i].Name]
			}
			return live, true, nil
		}
	}
	all, err := c.storedStatus(ctx)
	if err != nil {
		return nil, false, err
	}
	recs, err := c.st.Services(ctx)
	if err != nil {
		return nil, false, c.readErr(err)
	}
	out := make([]ServiceStats, len(all))
	for i, st := range all {
		out[i] = ServiceStats{ServiceStatus: st, Deferred: deferred[st.Name]}
		window := time.Minute
		if st.Limits.RateLimit > 0 {
			window = vocab.Hold(st.Limits)
		}
		logs, err := c.st.ServiceLogPrefix(ctx, st.Name+":", now.Add(-window))
		if err != nil {
			return nil, false, c.readErr(err)
		}
		keys := map[string]*ServiceStatus{}
		for name, times := range logs {
			keys[name] = &ServiceStatus{Name: name, Class: st.Name, Limits: st.Limits, InWindow: len(requestTimes(times)), Circuit: CircuitClosed}
		}
		for _, r := range recs {
			if !strings.HasPrefix(r.Name, st.Name+":") || (!r.Paused && len(r.Meters[store.MeterCircuit]) == 0 && len(r.Override) == 0) {
				continue
			}
			k := keys[r.Name]
			if k == nil {
				k = &ServiceStatus{Name: r.Name, Class: st.Name, Limits: st.Limits, Circuit: CircuitClosed}
				keys[r.Name] = k
			}
			k.Paused, k.Overridden = r.Paused || st.Paused, len(r.Override) > 0 || st.Overridden
			if ov, ok := decodeService(r.Override); ok {
				k.Limits = ov
			}
			storedCircuit(r.Meters[store.MeterCircuit], now, k)
			k.Adaptive = storedAdaptive(r.Meters[store.MeterAdapt], k.Limits)
		}
		for _, k := range keys {
			out[i].Keys = append(out[i].Keys, *k)
		}
		// The busiest by logged starts in the window, then by name.
		slices.SortFunc(out[i].Keys, func(a, b ServiceStatus) int {
			return cmp.Or(cmp.Compare(b.InWindow, a.InWindow), strings.Compare(a.Name, b.Name))
		})
		out[i].Keys = out[i].Keys[:min(len(out[i].Keys), StatsKeys)]
	}
	return out, false, nil
}
