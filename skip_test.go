package runcue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A handler that returns Skip ends its unit as skipped: its own state, no
// retry budget, no circuit count, a work_skipped event and metric; its
// dependents (listed before it) run.
func TestSkipEndsUnitAndSatisfiesDependents(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	e := newEnv(t, runcue.Config{MeterProvider: mp})
	c := e.c
	require.NoError(t, c.Service("site", runcue.Service{MaxConcurrent: 1, CircuitThreshold: 1, CircuitTimeout: time.Hour}))
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"site"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if strings.HasPrefix(w.Target, "skip") {
				return nil, fmt.Errorf("fetch %s: %w", w.Target, runcue.Skip("not modified")) // wrapped: still a skip
			}
			return "body", nil
		}}))
	require.NoError(t, c.Task("parse", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		return "parsed", nil
	}}))
	rec := record(t, c)
	out, err := c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "parse-1", Task: "parse", DependsOn: []string{"fetch-1"}}, // the dependent first
		{ID: "fetch-1", Task: "fetch", Target: "skip-me"},
		{ID: "fetch-2", Task: "fetch", Target: "fresh"},
	})
	require.NoError(t, err)
	require.Len(t, out, 3)
	require.NoError(t, c.Start(e.ctx))

	skipped := e.wait("fetch-1")
	assert.Equal(t, runcue.StateSkipped, skipped.State)
	assert.Equal(t, "not modified", skipped.Error)
	assert.Equal(t, "skipped", skipped.ErrorKind)
	assert.Zero(t, skipped.Failures, "no retry budget spent")
	assert.Equal(t, 1, skipped.Runs)
	require.Len(t, skipped.Attempts, 1)
	assert.Equal(t, "skipped", skipped.Attempts[0].Outcome)
	assert.False(t, skipped.FinishedAt.IsZero())
	assert.Equal(t, runcue.StateCompleted, e.wait("parse-1").State, "a skipped dependency satisfies by default")
	assert.Equal(t, runcue.StateCompleted, e.wait("fetch-2").State, "the skip did not open the circuit (threshold 1)")
	st, err := c.ServiceStatus(e.ctx, "site")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitClosed, st.Circuit)

	evs := rec.waitFor(t, 1, ofType(runcue.EventWorkSkipped, "fetch-1"))
	assert.Equal(t, "not modified", evs[0].Reason)
	assert.Equal(t, 1, evs[0].Attempt)
	for _, ev := range rec.all() {
		if ev.WorkID == "fetch-1" {
			assert.NotEqual(t, runcue.EventWorkFailed, ev.Type)
			assert.NotEqual(t, runcue.EventWorkCompleted, ev.Type)
		}
	}

	page, err := c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateSkipped}})
	require.NoError(t, err)
	require.Len(t, page.Units, 1)
	assert.Equal(t, "fetch-1", page.Units[0].ID)
	ex, err := c.Explain(e.ctx, "fetch-1")
	require.NoError(t, err)
	require.Len(t, ex.Reasons, 1)
	assert.Equal(t, runcue.ReasonFinished, ex.Reasons[0].Kind)
	assert.Equal(t, "the unit is skipped: not modified", ex.Reasons[0].Detail)

	require.NoError(t, runcue.Settle(e.ctx, c))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(e.ctx, &rm))
	count := func(name, task string) int64 {
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if data, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
					for _, dp := range data.DataPoints {
						if matches(dp.Attributes, map[string]string{"task": task}) {
							n += dp.Value
						}
					}
				}
			}
		}
		return n
	}
	assert.Equal(t, int64(1), count("runcue.work.skipped", "fetch"))
	assert.Equal(t, int64(1), count("runcue.work.completed", "fetch"))
	assert.Zero(t, count("runcue.work.failed", "fetch"))
	assert.Contains(t, e.logs.String(), "work_skipped")
}

// A task with FailOnSkippedDependency fails its units when a dependency is
// skipped (prerequisite_skipped), whether they waited for it or came
// after, and the failure propagates; units of other tasks run.
func TestSkippedDependencyFailsStrictDependents(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	g := newGate()
	done := func(context.Context, *runcue.Work) (any, error) { return "ok", nil }
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: g.handler}))
	require.NoError(t, c.Task("strict", runcue.Task{FailOnSkippedDependency: true, Handler: done}))
	require.NoError(t, c.Task("lenient", runcue.Task{Handler: done}))
	_, err := c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "child", Task: "lenient", DependsOn: []string{"strict-1"}},
		{ID: "strict-1", Task: "strict", DependsOn: []string{"fetch-1"}},
		{ID: "lenient-1", Task: "lenient", DependsOn: []string{"fetch-1"}},
		{ID: "fetch-1", Task: "fetch"},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(e.ctx))
	require.Equal(t, "fetch-1", g.next(t))
	g.release <- runcue.Skip("robots.txt forbids it")

	strict := e.wait("strict-1")
	assert.Equal(t, runcue.StateFailed, strict.State)
	assert.Equal(t, "prerequisite_skipped", strict.ErrorKind)
	assert.Contains(t, strict.Error, "fetch-1")
	assert.Zero(t, strict.Runs, "it never ran")
	child := e.wait("child")
	assert.Equal(t, runcue.StateFailed, child.State)
	assert.Equal(t, "prerequisite_failed", child.ErrorKind, "the failure propagates as any failure does")
	assert.Equal(t, runcue.StateCompleted, e.wait("lenient-1").State)

	// Submitted after the skip: the dispatcher learns the state from the store.
	_, err = c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "strict-2", Task: "strict", DependsOn: []string{"fetch-1"}},
		{ID: "lenient-2", Task: "lenient", DependsOn: []string{"fetch-1"}},
	})
	require.NoError(t, err)
	strict2 := e.wait("strict-2")
	assert.Equal(t, runcue.StateFailed, strict2.State)
	assert.Equal(t, "prerequisite_skipped", strict2.ErrorKind)
	assert.Equal(t, runcue.StateCompleted, e.wait("lenient-2").State)
	ex, err := c.Explain(e.ctx, "strict-2")
	require.NoError(t, err)
	assert.Contains(t, ex.Reasons[0].Detail, "prerequisite_skipped")
}

// Explain of a dependent still waiting says which of its dependencies were
// skipped and count as satisfied, in the owner and in any other process.
func TestExplainShowsSkippedDependencies(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	skipper, holder := newGate(), newGate()
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: skipper.handler}))
	require.NoError(t, c.Task("slow", runcue.Task{Handler: holder.handler}))
	require.NoError(t, c.Task("parse", runcue.Task{Handler: noop}))
	_, err := c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "parse", Task: "parse", DependsOn: []string{"fetch-1", "slow-1"}},
		{ID: "fetch-1", Task: "fetch"},
		{ID: "slow-1", Task: "slow"},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(e.ctx))
	require.Equal(t, "fetch-1", skipper.next(t))
	require.Equal(t, "slow-1", holder.next(t))
	skipper.release <- runcue.Skip("not modified")
	assert.Equal(t, runcue.StateSkipped, e.wait("fetch-1").State)
	require.NoError(t, runcue.Settle(e.ctx, c))

	kinds := func(ex runcue.Explanation) map[runcue.ReasonKind][]string {
		m := map[runcue.ReasonKind][]string{}
		for _, r := range ex.Reasons {
			m[r.Kind] = r.Dependencies
		}
		return m
	}
	ex, err := c.Explain(e.ctx, "parse")
	require.NoError(t, err)
	got := kinds(ex)
	assert.Equal(t, []string{"slow-1"}, got[runcue.ReasonDependencies])
	assert.Equal(t, []string{"fetch-1"}, got[runcue.ReasonDependenciesSkipped])

	other := e.open(runcue.Config{}) // a process that does not own the database
	ex, err = other.Explain(e.ctx, "parse")
	require.NoError(t, err)
	got = kinds(ex)
	assert.Equal(t, []string{"slow-1"}, got[runcue.ReasonDependencies])
	assert.Equal(t, []string{"fetch-1"}, got[runcue.ReasonDependenciesSkipped])

	holder.release <- nil
	assert.Equal(t, runcue.StateCompleted, e.wait("parse").State)
}

// A strict dependent filed while one dependency runs here and another's
// state is being read: the running one is skipped before the read is
// answered. The answer must not take the skipped dependency for completed.
func TestSkipDuringDependencyRead(t *testing.T) {
	e, hs := newHeldEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("fetch", runcue.Task{Handler: g.handler}))
	require.NoError(t, e.c.Task("strict", runcue.Task{FailOnSkippedDependency: true, Handler: noop}))
	e.start()
	done := e.submit("fetch")
	require.Equal(t, done, g.next(t))
	g.release <- nil
	require.Equal(t, runcue.StateCompleted, e.wait(done).State)
	running := e.submit("fetch")
	require.Equal(t, running, g.next(t))

	states := hs.HoldRead("UnitStates")
	strict := e.submit("strict", func(s *runcue.Submission) { s.DependsOn = []string{running, done} })
	recv(e, states.Entered, "the read of the completed dependency's state")
	g.release <- runcue.Skip("not needed")
	require.Equal(t, runcue.StateSkipped, e.wait(running).State)
	require.NoError(t, runcue.SyncWriter(e.ctx, e.c)) // its commit message is in the inbox before the answer
	states.Release()
	wi := e.wait(strict)
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, "prerequisite_skipped", wi.ErrorKind)
}
