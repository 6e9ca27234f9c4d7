package runcue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tally counts the stored units by state and by task and state, paging
// through List: what Stats must match exactly.
func tally(t *testing.T, e *env, c *runcue.Cue) (map[runcue.State]int, map[string]map[runcue.State]int) {
	t.Helper()
	states, tasks := map[runcue.State]int{}, map[string]map[runcue.State]int{}
	cursor := ""
	for {
		page, err := c.List(e.ctx, runcue.ListOptions{Limit: 1000, Cursor: cursor})
		require.NoError(t, err)
		for _, u := range page.Units {
			states[u.State]++
			if tasks[u.Task] == nil {
				tasks[u.Task] = map[runcue.State]int{}
			}
			tasks[u.Task][u.State]++
		}
		if cursor = page.Next; cursor == "" {
			return states, tasks
		}
	}
}

// Stats, in the owner and in a process that does not own the database:
// counts that match the store exactly, the oldest queued unit, the last
// hour's minutes, queue waits, and services with their Retry-Afters and
// busiest keyed instances.
func TestStatsFromAnyProcess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	g := newGate()
	require.NoError(t, c.Service("host", runcue.Service{MaxConcurrent: 5}))
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 5}))
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: g.handler,
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} }}))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			switch w.Target {
			case "skip":
				return nil, runcue.Skip("nothing to do")
			case "fail":
				return nil, runcue.Permanent(errors.New("bad input"))
			case "429":
				return nil, runcue.RetryAfter(time.Hour, errors.New("429"))
			}
			return "ok", nil
		}}))
	e.start()
	var ids []string
	for _, target := range []string{"ok", "ok", "skip", "fail", "429"} {
		ids = append(ids, e.submit("call", func(s *runcue.Submission) { s.Target = target }))
	}
	for _, id := range ids[:4] {
		e.wait(id)
	}
	for _, target := range []string{"a.example", "a.example", "b.example"} {
		e.submit("fetch", func(s *runcue.Submission) { s.Target = target })
	}
	for range 3 {
		g.next(t)
	}
	require.NoError(t, c.PauseService(e.ctx, "host:c.example"))
	e.clk.Advance(2 * time.Minute)
	require.NoError(t, runcue.Settle(e.ctx, c))

	other := e.open(runcue.Config{})
	for _, cue := range []*runcue.Cue{c, other} {
		s, err := cue.Stats(e.ctx)
		require.NoError(t, err)
		assert.Equal(t, cue == c, s.Live)
		states, tasks := tally(t, e, cue)
		assert.Equal(t, states, s.States, "counts by state match the store")
		assert.Equal(t, tasks, s.Tasks)
		assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 2, runcue.StateSkipped: 1, runcue.StateFailed: 1,
			runcue.StateQueued: 1, runcue.StateRunning: 3}, s.States)
		deferredUnit := e.get(ids[4])
		assert.True(t, s.OldestQueued.Equal(deferredUnit.CreatedAt), "the deferred unit is the only one queued")

		require.Len(t, s.Minutes, 60)
		assert.True(t, s.Minutes[59].Minute.Equal(e.clk.Now().Truncate(time.Minute)))
		var sum runcue.MinuteStats
		for _, m := range s.Minutes {
			sum.Started += m.Started
			sum.Completed += m.Completed
			sum.Failed += m.Failed
			sum.Skipped += m.Skipped
			sum.Deferred += m.Deferred
		}
		assert.Equal(t, runcue.MinuteStats{Started: 8, Completed: 2, Failed: 1, Skipped: 1, Deferred: 1}, sum)
		assert.Equal(t, int64(8), s.QueueWait.Count, "one wait per dispatch")

		byName := map[string]runcue.ServiceStats{}
		for _, st := range s.Services {
			byName[st.Name] = st
		}
		assert.Equal(t, 1, byName["api"].Deferred, "the 429")
		var keys []string
		for _, k := range byName["host"].Keys {
			keys = append(keys, k.Name)
			if k.Name == "host:c.example" {
				assert.True(t, k.Paused)
			}
		}
		assert.Contains(t, keys, "host:c.example", "a paused instance is listed")
		if cue == c {
			require.GreaterOrEqual(t, len(keys), 3)
			assert.Equal(t, []string{"host:a.example", "host:b.example"}, keys[:2], "busiest first: 2 running, then 1")
			assert.Equal(t, 2, byName["host"].Keys[0].Active)
		}
	}
	close(g.release)
	require.NoError(t, c.Cancel(e.ctx, ids[4], runcue.CancelOptions{}))
	require.NoError(t, c.Drain(e.ctx))
}

// TestStatsBackpressure: Stats reports backpressure, from the owner's own
// state and, in another Cue on the file, from the last backpressure event.
func TestStatsBackpressure(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxQueued: 10})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	rec := record(t, e.c)
	reader := e.open(runcue.Config{})
	check := func(c *runcue.Cue, want runcue.BackpressureStats, msg string) {
		t.Helper()
		st, err := c.Stats(e.ctx)
		require.NoError(t, err)
		got := st.Backpressure
		assert.True(t, want.Since.Equal(got.Since), "%s: since %v, want %v", msg, got.Since, want.Since)
		got.Since, want.Since = time.Time{}, time.Time{}
		assert.Equal(t, want, got, msg)
	}
	check(reader, runcue.BackpressureStats{}, "nothing recorded yet")

	require.NoError(t, e.c.PauseQueue(e.ctx))
	for range 10 {
		e.submit("t")
	}
	e.start()
	active := rec.waitFor(t, 1, ofType(runcue.EventBackpressureActive, ""))[0]
	check(e.c, runcue.BackpressureStats{Active: true, MaxQueued: 10, Queued: 10, Since: active.Time}, "the owner's")
	check(reader, runcue.BackpressureStats{Active: true, MaxQueued: 10, Queued: 10, Since: active.Time}, "from the log")

	require.NoError(t, e.c.ResumeQueue(e.ctx))
	require.NoError(t, e.c.Drain(e.ctx))
	cleared := rec.waitFor(t, 1, ofType(runcue.EventBackpressureCleared, ""))[0]
	check(reader, runcue.BackpressureStats{MaxQueued: 10, Queued: cleared.Queued, Since: cleared.Time}, "cleared, from the log")
	check(e.c, runcue.BackpressureStats{MaxQueued: 10, Since: cleared.Time}, "cleared, the owner's")
}
