package runcue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ids(page runcue.WorkPage) []string {
	var out []string
	for _, u := range page.Units {
		out = append(out, u.ID)
	}
	return out
}

// List filters by submission and finish time, target prefix and error
// text; RetryWhere and CancelWhere act on what the same filter selects,
// with a dry run that only counts.
func TestListFiltersAndBulk(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	var healed atomic.Bool
	require.NoError(t, c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			switch {
			case healed.Load():
				return "ok", nil
			case w.Target == "https://b.example/1":
				return nil, errors.New("timeout talking to b")
			}
			return nil, errors.New("HTTP 429 from a")
		}}))
	e.start()
	a1 := e.submit("fetch", func(s *runcue.Submission) { s.ID, s.Target = "a1", "https://a.example/1" })
	e.wait(a1)
	e.clk.Advance(time.Minute)
	mid := e.clk.Now()
	a2 := e.submit("fetch", func(s *runcue.Submission) { s.ID, s.Target = "a2", "https://a.example/2" })
	b1 := e.submit("fetch", func(s *runcue.Submission) { s.ID, s.Target = "b1", "https://b.example/1" })
	e.wait(a2)
	e.wait(b1)

	list := func(o runcue.ListOptions) []string {
		page, err := c.List(e.ctx, o)
		require.NoError(t, err)
		return ids(page)
	}
	assert.Equal(t, []string{a1, a2}, list(runcue.ListOptions{TargetPrefix: "https://a.example/"}))
	assert.Equal(t, []string{a1, a2}, list(runcue.ListOptions{ErrorContains: "429"}))
	assert.Equal(t, []string{b1}, list(runcue.ListOptions{ErrorContains: "timeout"}))
	assert.Equal(t, []string{a2, b1}, list(runcue.ListOptions{SubmittedAfter: mid}))
	assert.Equal(t, []string{a1}, list(runcue.ListOptions{SubmittedBefore: mid}))
	assert.Equal(t, []string{a2, b1}, list(runcue.ListOptions{FinishedAfter: mid}))
	assert.Empty(t, list(runcue.ListOptions{TargetPrefix: "https://a.example/3"}))

	n, err := c.RetryWhere(e.ctx, runcue.ListOptions{ErrorContains: "429"}, true)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "dry run")
	assert.Equal(t, runcue.StateFailed, e.get(a1).State, "a dry run changes nothing")
	healed.Store(true)
	n, err = c.RetryWhere(e.ctx, runcue.ListOptions{ErrorContains: "429"}, false)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, runcue.StateCompleted, e.wait(a1).State)
	assert.Equal(t, runcue.StateCompleted, e.wait(a2).State)
	assert.Equal(t, runcue.StateFailed, e.get(b1).State, "not selected")

	// Cancel what a paused queue holds, by target.
	require.NoError(t, c.PauseQueue(e.ctx))
	var held []string
	for _, target := range []string{"https://a.example/4", "https://a.example/5", "https://c.example/1"} {
		held = append(held, e.submit("fetch", func(s *runcue.Submission) { s.Target = target }))
	}
	n, err = c.CancelWhere(e.ctx, runcue.ListOptions{TargetPrefix: "https://a.example/"}, runcue.CancelOptions{Reason: "site gone"}, true)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "dry run: only the queued ones of a")
	n, err = c.CancelWhere(e.ctx, runcue.ListOptions{TargetPrefix: "https://a.example/"}, runcue.CancelOptions{Reason: "site gone"}, false)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, id := range held[:2] {
		wi := e.get(id)
		assert.Equal(t, runcue.StateCancelled, wi.State)
		assert.Equal(t, "site gone", wi.Error)
	}
	assert.Equal(t, runcue.StateQueued, e.get(held[2]).State)
	n, err = c.CancelWhere(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateCompleted}}, runcue.CancelOptions{}, false)
	require.NoError(t, err)
	assert.Zero(t, n, "finished units are not cancelled")
	require.NoError(t, c.ResumeQueue(e.ctx))
	require.NoError(t, c.Drain(e.ctx))
}

// A bulk operation reads page after page: more units than a page.
func TestCancelWhereManyPages(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	require.NoError(t, c.Task("t", runcue.Task{Handler: noop}))
	require.NoError(t, c.PauseQueue(e.ctx))
	e.start()
	_, err := c.SubmitBatch(e.ctx, batchOf("t", 2100))
	require.NoError(t, err)
	n, err := c.CancelWhere(e.ctx, runcue.ListOptions{Tasks: []string{"t"}}, runcue.CancelOptions{}, true)
	require.NoError(t, err)
	assert.Equal(t, 2100, n)
	n, err = c.CancelWhere(e.ctx, runcue.ListOptions{Tasks: []string{"t"}}, runcue.CancelOptions{}, false)
	require.NoError(t, err)
	assert.Equal(t, 2100, n)
	s, err := c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[runcue.State]int{runcue.StateCancelled: 2100}, s.States)
}
