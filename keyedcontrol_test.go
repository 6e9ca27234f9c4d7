package runcue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runningTargets counts the running units by target.
func runningTargets(t *testing.T, e *env) map[string]int {
	t.Helper()
	page, err := e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateRunning}, Limit: 1000})
	require.NoError(t, err)
	n := map[string]int{}
	for _, u := range page.Units {
		n[u.Target]++
	}
	return n
}

// A keyed instance is paused and re-limited on its own, from another
// process; its pause and override outlive its eviction from memory; its
// class's other instances keep running.
func TestKeyedInstanceControl(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 5}))
	require.NoError(t, e.c.Task("fetch", runcue.Task{Handler: g.handler,
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} }}))
	e.start()
	other := e.open(runcue.Config{}) // registers nothing, owns nothing
	require.NoError(t, other.PauseService(e.ctx, "host:a.example"))
	require.NoError(t, other.SetService(e.ctx, "host:b.example", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	e.settle()

	var subs []runcue.Submission
	for range 3 {
		subs = append(subs, runcue.Submission{Task: "fetch", Target: "a.example"},
			runcue.Submission{Task: "fetch", Target: "b.example"}, runcue.Submission{Task: "fetch", Target: "c.example"})
	}
	out, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.settle()
	assert.Equal(t, map[string]int{"b.example": 1, "c.example": 3}, runningTargets(t, e),
		"a is paused, b holds 1 at a time, c has the class's 5")
	ex, err := e.c.Explain(e.ctx, out[0].ID)
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonPaused, ex.Reasons[0].Kind)
	assert.Equal(t, "host:a.example", ex.Reasons[0].Service)
	st, err := e.c.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	assert.Equal(t, 1, st.PausedKeys)
	assert.False(t, st.Paused, "the class is not paused")
	st, err = other.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	assert.Equal(t, 1, st.PausedKeys, "read from the database")

	// Let b and c finish: their instances are forgotten; a's stays paused.
	for range 6 {
		g.release <- nil
	}
	for _, s := range out {
		if !strings.HasPrefix(e.get(s.ID).Target, "a") {
			e.wait(s.ID)
		}
	}
	e.settle()
	assert.Equal(t, 1, e.inspect().Keyed, "only the paused instance, which has waiting units, is kept")

	// b's override survives its eviction: new units of b run one at a time.
	more, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "fetch", Target: "b.example"}, {Task: "fetch", Target: "b.example"}})
	require.NoError(t, err)
	e.settle()
	assert.Equal(t, map[string]int{"b.example": 1}, runningTargets(t, e))

	// Resumed: a runs; reset: b has the class's limit again.
	require.NoError(t, e.c.ResumeService(e.ctx, "host:a.example"))
	require.NoError(t, e.c.ResetService(e.ctx, "host:b.example"))
	e.settle()
	assert.Equal(t, map[string]int{"a.example": 3, "b.example": 2}, runningTargets(t, e))
	close(g.release)
	for _, s := range append(out, more...) {
		assert.Equal(t, runcue.StateCompleted, e.wait(s.ID).State)
	}

	// Only instances of known services, well formed.
	assert.ErrorIs(t, e.c.PauseService(e.ctx, "nope:x"), runcue.ErrUnknownService)
	assert.ErrorIs(t, e.c.PauseService(e.ctx, ":x"), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.PauseService(e.ctx, "host:"), runcue.ErrInvalid)
}

// Retention keeps the service log a keyed instance's own override needs
// (a longer window than its class's); the log is pruned per class, so the
// class's other instances keep as much, and other classes are pruned to
// their own windows.
func TestServiceLogKeptForKeyedOverride(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	for _, class := range []string{"host", "api"} {
		require.NoError(t, e.c.Service(class, runcue.Service{RateLimit: 10, RateWindow: time.Minute}))
		require.NoError(t, e.c.Task("fetch-"+class, runcue.Task{Handler: noop,
			ServiceKeys: func(w *runcue.Work) []string { return []string{class + ":" + w.Target} }}))
	}
	require.NoError(t, e.c.SetService(e.ctx, "host:slow", runcue.Service{RateLimit: 10, RateWindow: 24 * time.Hour}))
	e.start()
	out, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "fetch-host", Target: "slow"}, {Task: "fetch-api", Target: "x"}})
	require.NoError(t, err)
	for _, s := range out {
		e.wait(s.ID)
	}
	e.clk.Advance(10 * time.Minute) // past a retention pass
	e.settle()

	st, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	slow, err := st.ServiceLog(e.ctx, "host:slow", time.Time{})
	require.NoError(t, err)
	api, err := st.ServiceLog(e.ctx, "api:x", time.Time{})
	require.NoError(t, err)
	assert.Len(t, slow, 1, "the day-long window of host:slow still needs it")
	assert.Empty(t, api, "api's minute is over")
}

// Explain in a process that does not own the database reads the services'
// stored state: a paused keyed instance (named, where the task's
// ServiceKeys is registered), a rate window full by the logged starts, a
// spent budget; and says it is not live.
func TestExplainFromAnotherProcess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	keys := func(w *runcue.Work) []string { return []string{"host:" + w.Target} }
	require.NoError(t, e.c.Service("host", runcue.Service{}))
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 1, RateWindow: time.Hour}))
	require.NoError(t, e.c.Service("paid", runcue.Service{Budgets: []runcue.Budget{{Requests: 1, Per: runcue.PerDay}}}))
	require.NoError(t, e.c.Task("fetch", runcue.Task{Handler: g.handler, ServiceKeys: keys}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, e.c.Task("buy", runcue.Task{Services: []string{"paid"}, Handler: noop}))
	e.start()
	other := e.open(runcue.Config{})
	require.NoError(t, other.Task("fetch", runcue.Task{Handler: g.handler, ServiceKeys: keys})) // to derive keys; it runs nothing
	require.NoError(t, other.PauseService(e.ctx, "host:a.example"))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	e.settle()

	fetch := e.submit("fetch", func(s *runcue.Submission) { s.Target = "a.example" })
	call1, call2 := e.submit("call"), e.submit("call")
	buy1, buy2 := e.submit("buy"), e.submit("buy")
	for _, id := range []string{call1, buy1} {
		e.wait(id)
	}
	e.settle()

	reason := func(c *runcue.Cue, id string, kind runcue.ReasonKind) runcue.Reason {
		t.Helper()
		ex, err := c.Explain(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, c == e.c, ex.Live)
		assert.True(t, ex.AsOf.Equal(e.clk.Now()))
		for _, r := range ex.Reasons {
			if r.Kind == kind {
				return r
			}
		}
		t.Fatalf("%s: no %s in %+v", id, kind, ex.Reasons)
		return runcue.Reason{}
	}
	for _, c := range []*runcue.Cue{e.c, other} {
		assert.Equal(t, "host:a.example", reason(c, fetch, runcue.ReasonPaused).Service)
		r := reason(c, call2, runcue.ReasonRateLimited)
		assert.Equal(t, "api", r.Service)
		assert.True(t, r.Until.Equal(e.get(call1).StartedAt.Add(time.Hour+runcue.DefaultMargin)), "until %v", r.Until)
		r = reason(c, buy2, runcue.ReasonBudgetExhausted)
		assert.Equal(t, "paid", r.Service)
		assert.True(t, r.Until.Equal(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)))
	}
	for _, id := range []string{fetch, call2, buy2} {
		require.NoError(t, e.c.Cancel(e.ctx, id, runcue.CancelOptions{}))
	}
	require.NoError(t, e.c.Drain(e.ctx))
}

// What an operator sees of a keyed class: the class's row reports its own
// load, its instances apart (not one instance's limit against every
// instance's load); an instance has a status of its own, in the owner and
// elsewhere; a keyed Retry-After counts as a deferral of its class.
func TestKeyedOperatorView(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 2, RateLimit: 4, RateWindow: time.Second}))
	require.NoError(t, e.c.Task("fetch", runcue.Task{
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target == "slow.example" && w.Attempt == 1 {
				return nil, runcue.RetryAfter(time.Minute, errors.New("429"), "host:"+w.Target)
			}
			return g.handler(ctx, w)
		}}))
	rec := record(t, e.c)
	e.start()
	var subs []runcue.Submission
	for range 2 {
		subs = append(subs, runcue.Submission{Task: "fetch", Target: "a.example"}, runcue.Submission{Task: "fetch", Target: "b.example"})
	}
	subs = append(subs, runcue.Submission{Task: "fetch", Target: "a.example"}, runcue.Submission{Task: "fetch", Target: "slow.example"})
	out, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	for range 4 {
		g.next(t)
	}
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, out[5].ID))
	e.settle()

	class, err := e.c.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	assert.Zero(t, class.Active, "no unit lists host in its task's Services")
	assert.Zero(t, class.InWindow)
	assert.Equal(t, 3, class.Keys, "a, b and slow (held by its Retry-After)")
	assert.Equal(t, 4, class.KeysActive, "two on a, two on b, each under its own cap of 2")
	assert.Equal(t, 1, class.KeysWaiting, "a's third unit")
	assert.Equal(t, 1, class.BlockedKeys)

	a, err := e.c.ServiceStatus(e.ctx, "host:a.example")
	require.NoError(t, err)
	assert.Equal(t, "host", a.Class)
	assert.Equal(t, 2, a.Active)
	assert.Equal(t, 2, a.Limits.MaxConcurrent)
	assert.Equal(t, 2, a.InWindow)
	slow, err := e.c.ServiceStatus(e.ctx, "host:slow.example")
	require.NoError(t, err)
	assert.False(t, slow.BlockedUntil.IsZero(), "held by its Retry-After")
	_, err = e.c.ServiceStatus(e.ctx, "nohost:a.example")
	assert.ErrorIs(t, err, runcue.ErrUnknownService)

	stats, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	require.Len(t, stats.Services, 1)
	assert.Equal(t, 1, stats.Services[0].Deferred, "the keyed 429 counts for its class")

	// From a Cue that does not own the database (in this process it reads
	// what is stored).
	other := e.open(runcue.Config{})
	class, err = other.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	assert.Equal(t, 3, class.Keys, "instances with starts in the window")
	b, err := other.ServiceStatus(e.ctx, "host:b.example")
	require.NoError(t, err)
	assert.Equal(t, 2, b.InWindow, "from the service log")
	assert.Equal(t, 2, b.Limits.MaxConcurrent)
	stats, err = other.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Services[0].Deferred)
	for range 5 {
		g.release <- nil
	}
}
