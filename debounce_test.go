package runcue_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestDebounce: ten submissions of one document, a second apart, run once,
// Period after the last, with the last's params; the nine others end
// skipped, each naming the unit that replaced it, and a dependent of a
// replaced unit goes on as after any skip. Another process's submission
// replaces this one's. A burst that does not settle runs at MaxWait.
// Once the unit has started, the next submission begins a new burst.
func TestDebounce(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	var ran []string
	type edit struct{ Rev int }
	task := runcue.Task{Debounce: &runcue.Debounce{Period: 5 * time.Second, MaxWait: 20 * time.Second},
		Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, p edit) (int, error) {
			mu.Lock()
			ran = append(ran, w.Target)
			mu.Unlock()
			return p.Rev, nil
		})}
	require.NoError(t, e.c.Task("index", task))
	require.NoError(t, e.c.Task("after", runcue.Task{Handler: noop}))
	e.start()
	var ids []string
	for rev := range 10 {
		ids = append(ids, e.submit("index", func(s *runcue.Submission) { s.Target = "doc-1"; s.Params = edit{rev} }))
		if rev == 0 {
			e.submit("after", func(s *runcue.Submission) { s.ID = "dependent"; s.DependsOn = []string{ids[0]} })
		}
		e.settle()
		e.clk.Advance(time.Second)
	}
	for i, id := range ids[:9] {
		wi := e.get(id)
		assert.Equal(t, runcue.StateSkipped, wi.State, "%d", i)
		assert.Equal(t, "debounced", wi.ErrorKind)
		assert.Equal(t, "replaced by "+ids[i+1], wi.Error)
	}
	assert.Equal(t, runcue.StateCompleted, e.wait("dependent").State, "a replaced dependency is a skipped one")
	last := e.get(ids[9])
	assert.Equal(t, runcue.StateQueued, last.State)
	assert.True(t, last.RunAt.Equal(epoch.Add(9*time.Second+5*time.Second)), "Period after the last: %v", last.RunAt.Sub(epoch))
	assert.Equal(t, "doc-1", last.DebounceKey)
	assert.True(t, last.DebounceSince.Equal(epoch), "the burst began with the first")
	st, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Patterns.Debouncing, "doc-1's burst settles")
	ex, err := e.c.Explain(e.ctx, ids[9])
	require.NoError(t, err)
	require.Len(t, ex.Notes, 1)
	assert.Contains(t, ex.Notes[0], `debounced: key "doc-1"`)
	e.clk.Advance(4 * time.Second)
	wi := e.wait(ids[9])
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Empty(t, wi.DebounceKey, "it ran: a submission now begins a new burst")
	assert.JSONEq(t, `9`, string(wi.Result), "the latest params")
	assert.Equal(t, []string{"doc-1"}, ran, "one run")

	// Another process's submission replaces this one's; the burst began
	// here, so MaxWait counts from it.
	other := e.open(runcue.Config{})
	require.NoError(t, other.Task("index", task))
	start := e.clk.Now()
	mine := e.submit("index", func(s *runcue.Submission) { s.Target = "doc-2"; s.Params = edit{1} })
	var theirs string
	for i := range 5 {
		e.clk.Advance(min(4*time.Second, 19*time.Second-e.clk.Now().Sub(start))) // the last at 19 s: before MaxWait
		s, err := other.Submit(e.ctx, runcue.Submission{Task: "index", Target: "doc-2", Params: edit{2 + i}})
		require.NoError(t, err)
		theirs = s.ID
		require.NoError(t, runcue.PollNow(e.ctx, e.c))
		e.settle()
	}
	assert.Equal(t, runcue.StateSkipped, e.get(mine).State)
	got := e.get(theirs)
	assert.True(t, got.RunAt.Equal(start.Add(20*time.Second)), "MaxWait from the burst's first: %v", got.RunAt.Sub(start))
	e.clk.Advance(time.Second)
	wi = e.wait(theirs)
	assert.JSONEq(t, `6`, string(wi.Result))

	// Started: the next submission is a new burst, not a replacement.
	g := newGate()
	require.NoError(t, e.c.Task("slow", runcue.Task{Debounce: &runcue.Debounce{Period: time.Second}, Handler: g.handler}))
	first := e.submit("slow", func(s *runcue.Submission) { s.Target = "doc-3" })
	e.settle()
	e.clk.Advance(time.Second)
	g.next(t)
	second := e.submit("slow", func(s *runcue.Submission) { s.Target = "doc-3" })
	e.settle()
	assert.Equal(t, runcue.StateRunning, e.get(first).State)
	assert.Equal(t, runcue.StateQueued, e.get(second).State)
	g.release <- nil
	e.clk.Advance(time.Second)
	g.next(t)
	g.release <- nil
	assert.Equal(t, runcue.StateCompleted, e.wait(first).State)
	assert.Equal(t, runcue.StateCompleted, e.wait(second).State)
	b, err := json.Marshal(e.get(ids[0]))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"error_kind":"debounced"`)

	for _, d := range []*runcue.Debounce{{}, {Period: time.Second, MaxWait: time.Millisecond}, {Period: time.Second, MaxWait: -1}} {
		assert.ErrorIs(t, e.c.Task("bad", runcue.Task{Handler: noop, Debounce: d}), runcue.ErrInvalid, "%+v", d)
	}
}
