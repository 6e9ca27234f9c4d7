package runcue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/recur"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// starts records the handler starts of a task: unit ID to start time.
type starts struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (s *starts) handler(ctx context.Context, w *runcue.Work) (any, error) {
	s.mu.Lock()
	if s.at == nil {
		s.at = map[string]time.Time{}
	}
	s.at[w.ID] = w.Started
	s.mu.Unlock()
	return nil, nil
}

// byPeriod returns the started units by schedule and period.
func (s *starts) byPeriod(t *testing.T, e *env) map[string]map[string]time.Time {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]time.Time{}
	for id, at := range s.at {
		wi := e.get(id)
		require.NotEmpty(t, wi.Schedule, "%s was not submitted by a schedule", id)
		if out[wi.Schedule] == nil {
			out[wi.Schedule] = map[string]time.Time{}
		}
		_, dup := out[wi.Schedule][wi.Period]
		require.False(t, dup, "%s's period %s ran twice", wi.Schedule, wi.Period)
		out[wi.Schedule][wi.Period] = at.UTC()
	}
	return out
}

// runUntil steps a started Cue's fake clock from due period to due period
// (at most step at a time) until end, settling at each instant.
func runUntil(t *testing.T, e *env, c *runcue.Cue, end time.Time, step time.Duration) {
	t.Helper()
	stepUntil(t, e, c, end, step, true)
}

// stepUntil is runUntil; with returned, it waits at each instant for the
// handlers to return before the clock moves (a jump past a task's timeout
// would time out a handler the machine had not yet run).
func stepUntil(t *testing.T, e *env, c *runcue.Cue, end time.Time, step time.Duration, returned bool) {
	t.Helper()
	for {
		for running := 1; running > 0; {
			var err error
			running, err = c.Settle(e.ctx)
			require.NoError(t, err)
			if !returned {
				break
			}
			if running > 0 {
				time.Sleep(time.Millisecond)
			}
		}
		now := e.clk.Now()
		if !now.Before(end) {
			return
		}
		to := now.Add(step)
		scheds, err := c.Schedules(e.ctx)
		require.NoError(t, err)
		for _, s := range scheds {
			if !s.NextAt.IsZero() && s.NextAt.After(now) && s.NextAt.Before(to) {
				to = s.NextAt
			}
		}
		if to.After(end) {
			to = end
		}
		e.clk.Advance(to.Sub(now))
	}
}

// TestScheduleEvery: a schedule every minute, registered before the
// owner starts, submits one unit per period, started when the period is
// due; the unit says which schedule and period made it (Get, Explain),
// and the events record each submission.
func TestScheduleEvery(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var s starts
	require.NoError(t, e.c.Task("report", runcue.Task{Handler: s.handler}))
	rec := record(t, e.c)
	t0 := e.clk.Now()
	require.NoError(t, e.c.Schedule(e.ctx, "minutely", runcue.Schedule{
		Submission: runcue.Submission{Task: "report", Params: map[string]int{"n": 1}},
		Timing:     runcue.Timing{Every: time.Minute, Anchor: t0.Add(10 * time.Second)},
	}))
	// Registering the same definition again (a restart) changes nothing.
	require.NoError(t, e.c.Schedule(e.ctx, "minutely", runcue.Schedule{
		Submission: runcue.Submission{Task: "report", Params: map[string]int{"n": 1}},
		Timing:     runcue.Timing{Every: time.Minute, Anchor: t0.Add(10 * time.Second)},
	}))
	e.start()
	runUntil(t, e, e.c, t0.Add(5*time.Minute+30*time.Second), time.Minute)
	got := s.byPeriod(t, e)["minutely"]
	require.Len(t, got, 6)
	for i := range 6 {
		nominal := t0.Add(10*time.Second + time.Duration(i)*time.Minute)
		at, ok := got[nominal.UTC().Format(time.RFC3339Nano)]
		if assert.True(t, ok, "period %v", nominal) {
			assert.Equal(t, nominal, at, "started when due")
		}
	}
	subs := rec.waitFor(t, 6, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleSubmitted })
	assert.Equal(t, "minutely", subs[0].Schedule)
	assert.NotEmpty(t, subs[0].WorkID)
	ex, err := e.c.Explain(e.ctx, subs[0].WorkID)
	require.NoError(t, err)
	assert.Equal(t, "minutely", ex.Schedule)
	assert.Equal(t, subs[0].Period, ex.Period)
	changed := rec.waitFor(t, 1, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleChanged })
	assert.Equal(t, "registered", changed[0].Reason)
	assert.Len(t, changed, 1, "the second registration changed nothing")

	st, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	require.Len(t, st.Schedules, 1)
	assert.Equal(t, t0.Add(6*time.Minute+10*time.Second), st.Schedules[0].NextAt)
	assert.Equal(t, "report", st.Schedules[0].Task)
}

// TestScheduleRefusals: what a schedule may not be.
func TestScheduleRefusals(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("report", runcue.Task{Handler: noop}))
	ok := runcue.Timing{Every: time.Hour}
	for _, c := range []struct {
		name string
		s    runcue.Schedule
	}{
		{"", runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: ok}},
		{"a:b", runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: ok}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report", ID: "fixed"}, Timing: ok}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report", IdempotencyKey: "k"}, Timing: ok}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report", DependsOn: []string{"u"}}, Timing: ok}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: runcue.Timing{Cron: "bad"}}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: runcue.Timing{Cron: "@daily", Zone: "Nowhere/Land"}}},
		{"x", runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: ok, Missed: "sometimes"}},
	} {
		assert.ErrorIs(t, e.c.Schedule(e.ctx, c.name, c.s), runcue.ErrInvalid, "%q %+v", c.name, c.s)
	}
	assert.ErrorIs(t, e.c.Schedule(e.ctx, "x", runcue.Schedule{Submission: runcue.Submission{Task: "ghost"}, Timing: ok}), runcue.ErrUnknownTask)
	assert.ErrorIs(t, e.c.PauseSchedule(e.ctx, "ghost"), runcue.ErrUnknownSchedule)
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "report", IdempotencyKey: "schedule:x:1"})
	assert.ErrorIs(t, err, runcue.ErrInvalid, "a schedule's keys are its own")
}

// TestScheduleMissedPolicies: an owner stopped for ten periods of a
// one-minute schedule; the next owner handles the missed periods as each
// policy says, records them, and goes on with the periods due after.
func TestScheduleMissedPolicies(t *testing.T) {
	for _, c := range []struct {
		missed        runcue.Missed
		maxMissed     int
		runs, skipped int
	}{
		{runcue.MissedLatest, 0, 1, 9},
		{runcue.MissedSkip, 0, 0, 10},
		{runcue.MissedEach, 3, 3, 7},
		{runcue.MissedEach, 0, 10, 0}, // MaxMissed 10 by default
	} {
		t.Run(fmt.Sprintf("%s-%d", c.missed, c.maxMissed), func(t *testing.T) {
			e := newEnv(t, runcue.Config{})
			var s starts
			require.NoError(t, e.c.Task("report", runcue.Task{Handler: s.handler}))
			t0 := e.clk.Now()
			require.NoError(t, e.c.Schedule(e.ctx, "m", runcue.Schedule{Submission: runcue.Submission{Task: "report"},
				Timing: runcue.Timing{Every: time.Minute, Anchor: t0}, Missed: c.missed, MaxMissed: c.maxMissed}))
			e.start()
			runUntil(t, e, e.c, t0.Add(3*time.Minute+30*time.Second), time.Minute) // periods 1, 2, 3
			require.NoError(t, e.c.Stop(e.ctx))
			e.clk.Advance(10 * time.Minute) // periods 4 to 13 fall due with no owner
			rec := record(t, e.c)
			require.NoError(t, e.c.Start(e.ctx))
			runUntil(t, e, e.c, t0.Add(15*time.Minute+30*time.Second), time.Minute) // then 14 and 15, on time
			got := s.byPeriod(t, e)["m"]
			assert.Len(t, got, 3+c.runs+2)
			for k := 14 - c.runs; k <= 15; k++ {
				_, ok := got[t0.Add(time.Duration(k)*time.Minute).UTC().Format(time.RFC3339Nano)]
				assert.True(t, ok, "period %d ran", k)
			}
			evs := rec.waitFor(t, c.runs+2, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleSubmitted })
			skipped := 0
			for _, ev := range rec.all() {
				if (ev.Type == runcue.EventScheduleSubmitted || ev.Type == runcue.EventScheduleSkipped) && ev.Reason == "missed" && ev.Skipped > 0 {
					skipped += ev.Skipped
					assert.Equal(t, t0.Add(4*time.Minute).UTC().Format(time.RFC3339Nano), ev.FirstSkipped)
				}
			}
			assert.Equal(t, c.skipped, skipped, "%+v", evs)
		})
	}
}

// TestScheduleSkipIfRunning: while a period's unit runs, the next periods
// are skipped (reason overlap), and the one after it ends is submitted.
func TestScheduleSkipIfRunning(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	release := make(chan struct{})
	var mu sync.Mutex
	var ran []string
	require.NoError(t, e.c.Task("slow", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		ran = append(ran, w.ID)
		first := len(ran) == 1
		mu.Unlock()
		if first {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, nil
	}}))
	rec := record(t, e.c)
	t0 := e.clk.Now()
	require.NoError(t, e.c.Schedule(e.ctx, "s", runcue.Schedule{Submission: runcue.Submission{Task: "slow", Timeout: time.Hour},
		Timing: runcue.Timing{Every: time.Minute, Anchor: t0}, SkipIfRunning: true}))
	e.start()
	stepUntil(t, e, e.c, t0.Add(3*time.Minute+30*time.Second), time.Minute, false) // 1 runs; 2 and 3 skipped
	close(release)
	mu.Lock()
	first := ran[0]
	mu.Unlock()
	e.wait(first)
	runUntil(t, e, e.c, t0.Add(4*time.Minute+30*time.Second), time.Minute) // 4 runs
	skips := rec.waitFor(t, 2, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleSkipped })
	assert.Equal(t, "overlap", skips[0].Reason)
	assert.Equal(t, t0.Add(2*time.Minute).UTC().Format(time.RFC3339Nano), skips[0].Period)
	rec.waitFor(t, 2, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleSubmitted })
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, ran, 2)
}

// TestScheduleChangedElsewhere: a schedule paused, retimed and resumed
// from another process takes effect at the owner at its next poll.
func TestScheduleChangedElsewhere(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var s starts
	require.NoError(t, e.c.Task("report", runcue.Task{Handler: s.handler}))
	t0 := e.clk.Now()
	require.NoError(t, e.c.Schedule(e.ctx, "h", runcue.Schedule{Submission: runcue.Submission{Task: "report"},
		Timing: runcue.Timing{Every: time.Hour, Anchor: t0}, Missed: runcue.MissedSkip}))
	e.start()
	other := e.open(runcue.Config{})
	require.NoError(t, other.PauseSchedule(e.ctx, "h"))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	runUntil(t, e, e.c, t0.Add(2*time.Hour+time.Minute), time.Hour) // paused: periods 1 and 2 fall due
	assert.Empty(t, s.byPeriod(t, e)["h"])
	scheds, err := other.Schedules(e.ctx)
	require.NoError(t, err)
	assert.True(t, scheds[0].Paused)

	require.NoError(t, other.RetimeSchedule(e.ctx, "h", runcue.Timing{Every: 10 * time.Minute, Anchor: t0}))
	require.NoError(t, other.ResumeSchedule(e.ctx, "h"))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	runUntil(t, e, e.c, t0.Add(2*time.Hour+35*time.Minute), 10*time.Minute)
	got := s.byPeriod(t, e)["h"]
	assert.Len(t, got, 3, "2:10, 2:20 and 2:30 of the new timing; none of the pause: %v", got)
	scheds, err = e.c.Schedules(e.ctx)
	require.NoError(t, err)
	assert.True(t, scheds[0].Retimed)
	assert.Equal(t, 10*time.Minute, scheds[0].Timing.Every)

	// Re-registered with the same definition, the run-time timing holds;
	// with a new one, it goes.
	def := runcue.Schedule{Submission: runcue.Submission{Task: "report"}, Timing: runcue.Timing{Every: time.Hour, Anchor: t0}, Missed: runcue.MissedSkip}
	require.NoError(t, other.Schedule(e.ctx, "h", def))
	scheds, err = e.c.Schedules(e.ctx)
	require.NoError(t, err)
	assert.True(t, scheds[0].Retimed)
	def.Timing.Every = 2 * time.Hour
	require.NoError(t, other.Schedule(e.ctx, "h", def))
	scheds, err = e.c.Schedules(e.ctx)
	require.NoError(t, err)
	assert.False(t, scheds[0].Retimed)

	require.NoError(t, other.DeleteSchedule(e.ctx, "h"))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	n := len(s.byPeriod(t, e)["h"])
	runUntil(t, e, e.c, t0.Add(8*time.Hour), time.Hour)
	assert.Len(t, s.byPeriod(t, e)["h"], n, "deleted: nothing more")
}

// TestScheduleAcrossDST: a daily 02:30 and an hourly cron schedule, for
// the day before each change of 2026 in four zones, its day and the day
// after (Lord Howe's change is
// 30 minutes; Santiago's is at midnight), end to end on the fake clock:
// each period runs once, started when due, exactly the periods
// internal/recur computes (its tests check them against the wall clock
// minute by minute).
func TestScheduleAcrossDST(t *testing.T) {
	changes := map[string][]string{
		"Europe/Berlin":       {"2026-03-29", "2026-10-25"},
		"America/New_York":    {"2026-03-08", "2026-11-01"},
		"Australia/Lord_Howe": {"2026-04-05", "2026-10-04"},
		"America/Santiago":    {"2026-04-05", "2026-09-06"},
	}
	for zone, days := range changes {
		for _, day := range days {
			t.Run(zone+"/"+day, func(t *testing.T) {
				t.Parallel()
				loc, err := time.LoadLocation(zone)
				require.NoError(t, err)
				d, err := time.ParseInLocation("2006-01-02", day, loc)
				require.NoError(t, err)
				start, end := d.AddDate(0, 0, -1).Add(-time.Minute), d.AddDate(0, 0, 2)
				e := newEnvAt(t, start)
				// Three days of hours, stepped and settled one at a time,
				// eight at once: more than the usual liveness wait on a
				// loaded machine (a week of them timed out at 30 s on CI).
				ctx, cancel := context.WithTimeout(context.Background(), 4*wait)
				t.Cleanup(cancel)
				e.ctx = ctx
				var s starts
				require.NoError(t, e.c.Task("report", runcue.Task{Handler: s.handler}))
				specs := map[string]string{"daily": "30 2 * * *", "hourly": "0 * * * *"}
				for name, cron := range specs {
					require.NoError(t, e.c.Schedule(e.ctx, name, runcue.Schedule{Submission: runcue.Submission{Task: "report"},
						Timing: runcue.Timing{Cron: cron, Zone: zone}}))
				}
				e.start()
				runUntil(t, e, e.c, end, time.Hour)
				got := s.byPeriod(t, e)
				for name, cron := range specs {
					spec, err := recur.Compile(name, runcue.Timing{Cron: cron, Zone: zone})
					require.NoError(t, err)
					want := map[string]time.Time{}
					for c := (recur.Cursor{Nominal: start}); ; {
						p, ok := spec.After(c)
						require.True(t, ok)
						if p.Due.After(end) {
							break
						}
						want[p.Key] = p.Due.UTC()
						c = recur.Cursor{Nominal: p.Nominal, Key: p.Key}
					}
					for k, due := range want {
						if at, ok := got[name][k]; !ok || !at.Equal(due) {
							t.Errorf("%s %s: due %v, started %v (%v)", name, k, due, at, ok)
						}
					}
					for k := range got[name] {
						if _, ok := want[k]; !ok {
							t.Errorf("%s %s ran, not a period", name, k)
						}
					}
				}
				assert.Len(t, got["daily"], 3)
			})
		}
	}
}

// TestScheduleInvalidAtFire: a period whose unit the template no longer
// makes (the task's Estimate now panics) is skipped, with the reason, and
// the schedule goes on.
func TestScheduleInvalidAtFire(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var s starts
	var broken atomic.Bool
	require.NoError(t, e.c.Task("call", runcue.Task{Handler: s.handler, Estimate: func(runcue.Submission) runcue.Costs {
		if broken.Load() {
			panic("the estimator broke")
		}
		return nil
	}}))
	rec := record(t, e.c)
	t0 := e.clk.Now()
	require.NoError(t, e.c.Schedule(e.ctx, "m", runcue.Schedule{Submission: runcue.Submission{Task: "call"},
		Timing: runcue.Timing{Every: time.Minute, Anchor: t0}}))
	e.start()
	runUntil(t, e, e.c, t0.Add(90*time.Second), time.Minute)
	broken.Store(true)
	runUntil(t, e, e.c, t0.Add(150*time.Second), time.Minute)
	broken.Store(false)
	runUntil(t, e, e.c, t0.Add(210*time.Second), time.Minute)
	skips := rec.waitFor(t, 1, func(ev runcue.Event) bool { return ev.Type == runcue.EventScheduleSkipped })
	assert.Contains(t, skips[0].Reason, "refused: ")
	assert.Contains(t, skips[0].Reason, "the estimator broke")
	assert.Equal(t, t0.Add(2*time.Minute).UTC().Format(time.RFC3339Nano), skips[0].Period)
	assert.Len(t, s.byPeriod(t, e)["m"], 2, "the first and third periods ran; the second was skipped")
}

// TestScheduleUnreadable: a stored schedule this runcue cannot run (a
// definition from a newer version, here a cron expression it refuses)
// is listed with the reason, does not hide the others or fail Stats, and
// the owner runs the others.
func TestScheduleUnreadable(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var s starts
	require.NoError(t, e.c.Task("report", runcue.Task{Handler: s.handler}))
	t0 := e.clk.Now()
	require.NoError(t, e.c.Schedule(e.ctx, "good", runcue.Schedule{Submission: runcue.Submission{Task: "report"},
		Timing: runcue.Timing{Every: time.Minute, Anchor: t0}}))
	st, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	b, err := st.Apply(e.ctx, []store.Op{&store.PutSchedule{Name: "future", At: t0,
		Def: []byte(`{"template":{"task":"report"},"timing":{"cron":"61 * * * *"}}`)}})
	require.NoError(t, err)
	require.NoError(t, b.Results[0].Err)
	all, err := e.c.Schedules(e.ctx)
	require.NoError(t, err)
	require.Len(t, all, 2)
	assert.Contains(t, all[0].Error, "61", "future: the reason")
	assert.Empty(t, all[1].Error)
	stats, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Len(t, stats.Schedules, 2)
	e.start()
	runUntil(t, e, e.c, t0.Add(150*time.Second), time.Minute)
	assert.Len(t, s.byPeriod(t, e)["good"], 2)
}
