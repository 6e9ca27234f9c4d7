package runcue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// TestExecutorFollowUp: a handler run by an executor (made with
// Cue.Executor from a Cue that registered the tasks as the scheduler
// did) reads its dependencies' results and submits a follow-up through
// Work.Cue; the follow-up's cost comes from its task's Estimate, and it
// runs, within the meter.
func TestExecutorFollowUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	ctx := t.Context()
	tokens := runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: time.Minute}}}
	tasks := map[string]runcue.Task{
		"fetch":     {Remote: true},
		"parent":    {Remote: true},
		"summarize": {Remote: true, Services: []string{"llm"}, Estimate: func(s runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": int64(100 * len(s.Target))} }},
	}
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("llm", tokens))
		for name, task := range tasks {
			require.NoError(t, c.Task(name, task))
		}
	}
	sched, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer sched.Close()
	register(sched)
	require.NoError(t, sched.Start(ctx))

	// The executor's process: a Cue on the same database, not started.
	c, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	register(c)
	_, err = c.Executor(runcue.ExecutorConfig{}, map[string]runcue.Handler{"unknown": noop})
	assert.ErrorIs(t, err, runcue.ErrInvalid, "a task not registered here")
	followUps := make(chan string, 1)
	x, err := c.Executor(runcue.ExecutorConfig{PollInterval: 10 * time.Millisecond}, map[string]runcue.Handler{
		"fetch": func(ctx context.Context, w *runcue.Work) (any, error) { return "page of " + w.Target, nil },
		"parent": func(ctx context.Context, w *runcue.Work) (any, error) {
			deps, err := w.Cue().DependencyResults(ctx, w.ID)
			if err != nil {
				return nil, err
			}
			var page string
			if err := json.Unmarshal(deps["f1"], &page); err != nil {
				return nil, fmt.Errorf("dependency f1: %w (%v)", err, deps)
			}
			s, err := w.Cue().Submit(ctx, runcue.Submission{Task: "summarize", Target: page}) // no Cost: the Estimate's
			if err != nil {
				return nil, err
			}
			followUps <- s.ID
			return s.ID, nil
		},
		"summarize": func(ctx context.Context, w *runcue.Work) (any, error) { return len(w.Target), nil },
	})
	require.NoError(t, err)
	xctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(xctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	_, err = sched.SubmitBatch(ctx, []runcue.Submission{{ID: "f1", Task: "fetch", Target: "a"},
		{ID: "p1", Task: "parent", DependsOn: []string{"f1"}}})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	info, err := sched.Wait(wctx, "p1")
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, info.State, "%+v", info)
	id := <-followUps
	follow, err := sched.Wait(wctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, follow.State)
	assert.Equal(t, runcue.Costs{"tokens": 900}, follow.Cost, `the Estimate's: 100 per byte of "page of a"`)
	assert.JSONEq(t, `9`, string(follow.Result))
	got, err := sched.DependencyResults(ctx, "p1")
	require.NoError(t, err)
	assert.Equal(t, map[string]json.RawMessage{"f1": json.RawMessage(`"page of a"`)}, got)
}

// TestWorkCueLocal: a handler run in process gets the Cue that runs it,
// and submits through it with the follow-up task's Estimate.
func TestWorkCueLocal(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: time.Minute}}}))
	var got *runcue.Cue
	require.NoError(t, e.c.Task("next", runcue.Task{Services: []string{"llm"}, Handler: noop,
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 7} }}))
	require.NoError(t, e.c.Task("first", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		got = w.Cue()
		s, err := w.Cue().Submit(ctx, runcue.Submission{ID: "n1", Task: "next"})
		return s.ID, err
	}}))
	e.start()
	e.wait(e.submit("first"))
	assert.Same(t, e.c, got)
	assert.Equal(t, runcue.Costs{"tokens": 7}, e.wait("n1").Cost)
	assert.Nil(t, (&runcue.Work{}).Cue(), "outside a run")
}

// TestExecutorObservationsReachOwner: what a remote handler reports of
// its service's limits (httplimit.Report: no token left for 30 s) reaches
// the owner with the run's end, as a local handler's does: the meter is
// held, and the next unit waits.
func TestExecutorObservationsReachOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	ctx := t.Context()
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}}}))
		require.NoError(t, c.Task("ask", runcue.Task{Remote: true, Services: []string{"llm"},
			Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 100} }}))
	}
	sched, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer sched.Close()
	register(sched)
	require.NoError(t, sched.Start(ctx))
	c, err := runcue.Open(path, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	register(c)
	x, err := c.Executor(runcue.ExecutorConfig{PollInterval: 10 * time.Millisecond}, map[string]runcue.Handler{
		"ask": func(ctx context.Context, w *runcue.Work) (any, error) {
			h := http.Header{"X-Ratelimit-Limit-Tokens": {"10000"}, "X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"30s"}}
			return nil, httplimit.Report(w, h, http.StatusOK, time.Now())
		}})
	require.NoError(t, err)
	xctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(xctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	s, err := sched.Submit(ctx, runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	info, err := sched.Wait(wctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, info.State)
	require.NoError(t, runcue.Settle(ctx, sched))
	st, err := sched.ServiceStatus(ctx, "llm")
	require.NoError(t, err)
	require.Len(t, st.Meters, 1)
	assert.GreaterOrEqual(t, st.Meters[0].Used, int64(10_000), "the provider's zero holds the meter")
	next, err := sched.Submit(ctx, runcue.Submission{Task: "ask"})
	require.NoError(t, err)
	require.NoError(t, runcue.Settle(ctx, sched))
	ex, err := sched.Explain(ctx, next.ID)
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonMeterFull, ex.Reasons[0].Kind, "%+v", ex.Reasons)
	require.NoError(t, sched.Cancel(ctx, next.ID, runcue.CancelOptions{}))
}

// TestWorkFrom: a handler's context, and one derived from it, carry its
// Work (an SDK's middleware reports through it); a batch handler's carry
// the batch's first Work, and what is reported through it adds up with
// the others'. Any other context carries none.
func TestWorkFrom(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: time.Minute}}}))
	var same, derived bool
	estimate := func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 10} }
	require.NoError(t, e.c.Task("one", runcue.Task{Services: []string{"llm"}, Estimate: estimate, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		same = runcue.WorkFrom(ctx) == w
		sub, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		derived = runcue.WorkFrom(sub) == w
		runcue.WorkFrom(sub).Used(runcue.Costs{"tokens": 3})
		return nil, nil
	}}))
	var first bool
	require.NoError(t, e.c.Task("many", runcue.Task{Services: []string{"llm"}, Estimate: estimate, Batch: &runcue.Batch{Max: 2,
		Handler: func(ctx context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
			first = runcue.WorkFrom(ctx) == ws[0]
			runcue.WorkFrom(ctx).Used(runcue.Costs{"tokens": 5})
			ws[1].Used(runcue.Costs{"tokens": 6})
			return make([]runcue.Outcome, len(ws)), nil
		}}}))
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{ID: "b1", Task: "many"}, {ID: "b2", Task: "many"}})
	require.NoError(t, err)
	e.start()
	info := e.wait(e.submit("one"))
	assert.True(t, same, "the handler's context")
	assert.True(t, derived, "a context derived from it")
	require.Len(t, info.Attempts, 1)
	assert.Equal(t, runcue.Costs{"tokens": 3}, info.Attempts[0].Used)
	b1 := e.wait("b1")
	assert.True(t, first, "a batch's context: its first Work")
	require.Len(t, b1.Attempts, 1)
	assert.Equal(t, runcue.Costs{"tokens": 11}, b1.Attempts[0].Used, "the batch's uses add up, on its first unit")
	assert.Nil(t, runcue.WorkFrom(context.Background()))
}
