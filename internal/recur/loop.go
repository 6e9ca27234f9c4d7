package recur

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store"
)

// Loop runs an owner's schedules: it records each period as it falls due
// (Fire), one at a time, in the order they fell due. It is the owner's:
// it runs from the owner's takeover until its engine ends, and its
// records are fenced by the owner's epoch.
type Loop struct {
	clock clock.Clock
	load  func(context.Context) ([]store.ScheduleRecord, error)
	fire  func(context.Context, Firing) (store.Result, error)
	log   *slog.Logger

	reload chan struct{}
	syncs  chan chan struct{}
}

// Deps are what a Loop needs: the clock, a read of the stored schedules
// and the record of a firing (the unit made and written with the cursor,
// in one transaction; the Result is store.Fire's).
type Deps struct {
	Clock clock.Clock
	Load  func(context.Context) ([]store.ScheduleRecord, error)
	Fire  func(context.Context, Firing) (store.Result, error)
	Log   *slog.Logger
}

// NewLoop returns a Loop; Run runs it.
func NewLoop(d Deps) *Loop {
	return &Loop{clock: d.Clock, load: d.Load, fire: d.Fire, log: d.Log,
		reload: make(chan struct{}, 1), syncs: make(chan chan struct{})}
}

// Reload makes the loop read the stored schedules again (one changed). It
// does not block.
func (l *Loop) Reload() {
	select {
	case l.reload <- struct{}{}:
	default:
	}
}

// Sync returns once the loop has recorded every period due at the
// clock's present (or ctx ended, or the loop stopped: done closed).
func (l *Loop) Sync(ctx context.Context, done <-chan struct{}) error {
	ch := make(chan struct{})
	select {
	case l.syncs <- ch:
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryPause bounds the wait before a failed read or record is tried
// again.
const retryPause = time.Second

// Run runs the loop until ctx ends or the owner is deposed.
func (l *Loop) Run(ctx context.Context) {
	type entry struct {
		s *Sched
		// since: periods due before it were missed (it is when this
		// owner began running the schedule, or its pause ended).
		since time.Time
	}
	var scheds []*entry
	var waiting []chan struct{}
	dirty := true
	var retryAt time.Time
	began := l.clock.Now()
	for {
		select {
		case <-l.reload: // a Reload before a Sync is read before the Sync's answer
			dirty, retryAt = true, time.Time{}
		default:
		}
		now := l.clock.Now()
		if dirty && !now.Before(retryAt) {
			recs, err := l.load(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				l.log.Warn("runcue: reading the schedules failed; trying again", "error", err)
				retryAt = now.Add(retryPause)
			} else {
				dirty = false
				old := map[string]*entry{}
				for _, e := range scheds {
					old[e.s.Name] = e
				}
				scheds = scheds[:0]
				for _, rec := range recs {
					s, err := Decode(rec)
					if err != nil {
						l.log.Error("runcue: a stored schedule cannot run", "schedule", rec.Name, "error", err)
						continue
					}
					e := &entry{s: s, since: now}
					switch o := old[s.Name]; {
					case o != nil && !o.s.Paused && !s.Paused:
						e.since = o.since // it ran on: what fell due since is not missed
					case s.Cursor.Key == "" && s.Cursor.Nominal.After(began) && s.Cursor.Nominal.Before(now):
						// Registered (or given a new timing) while this owner
						// ran, read at its next poll: nothing of it was missed.
						e.since = s.Cursor.Nominal
					}
					scheds = append(scheds, e)
				}
			}
		}
		var next time.Time
		failed := false
		for _, e := range scheds {
			if e.s.Paused || dirty || failed {
				continue
			}
			for _, f := range Plan(e.s, e.since, now) {
				res, err := l.fire(ctx, f)
				if err == nil && f.Submit && refused(res.Err) {
					// The store refused the period's unit (a failed unit
					// holds its key, say): the same record would be refused
					// again, so the period is skipped, with the reason.
					l.log.Error("runcue: a schedule's period was refused; it is skipped", "schedule", e.s.Name,
						"period", f.Period.Key, "error", res.Err)
					f = Firing{Schedule: f.Schedule, Period: f.Period, Reason: "refused: " + res.Err.Error(), Skipped: 1,
						FirstSkipped: f.Period.Key}
					res, err = l.fire(ctx, f)
				}
				if err == nil {
					err = res.Err
				}
				switch {
				case err == nil:
					e.s.Cursor = Cursor{f.Period.Nominal, f.Period.Key}
					if len(res.Units) > 0 {
						e.s.LastUnit = res.Units[0].ID
					}
					continue
				case errors.Is(err, store.ErrNotOwner) || ctx.Err() != nil:
					return
				case errors.Is(err, store.ErrScheduleMoved):
					dirty = true // changed or deleted meanwhile: read it again
				default:
					l.log.Warn("runcue: recording a schedule's period failed; trying again", "schedule", e.s.Name,
						"period", f.Period.Key, "error", err)
					failed, retryAt = true, now.Add(retryPause)
				}
				break
			}
			if p, ok := e.s.Spec.After(e.s.Cursor); ok && !dirty && !failed {
				if next.IsZero() || p.Due.Before(next) {
					next = p.Due
				}
			}
		}
		if dirty || failed {
			next = retryAt
			if !next.After(now) {
				continue
			}
		}
		if !dirty && !failed {
			for _, ch := range waiting {
				close(ch)
			}
			waiting = waiting[:0]
		}
		var timer clock.Timer
		var fired <-chan time.Time
		if !next.IsZero() {
			timer = l.clock.NewTimer(next.Sub(now))
			fired = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-fired:
		case <-l.reload:
			dirty = true
			retryAt = time.Time{}
		case ch := <-l.syncs:
			waiting = append(waiting, ch)
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// refused reports whether a Fire's own error is the store's refusal of
// its unit, which a retry would meet again (not a moved cursor, not a
// lost ownership).
func refused(err error) bool {
	return err != nil && !errors.Is(err, store.ErrScheduleMoved) && !errors.Is(err, store.ErrNotOwner)
}
