package runcue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"
	_ "time/tzdata" // America/New_York, whatever the machine has

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func newYork(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	return loc
}

// budgetEnv starts a Cue whose task "call" uses service "api", with a
// budget of requests per UTC day, and n units of it submitted.
func budgetEnv(t *testing.T, cfg runcue.Config, requests, n int) (*env, []runcue.Submitted) {
	t.Helper()
	e := newEnv(t, cfg)
	require.NoError(t, e.c.Service("api", runcue.Service{Budgets: []runcue.Budget{{Requests: requests, Per: runcue.PerDay}}}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	out, err := e.c.SubmitBatch(e.ctx, batchOf("call", n))
	require.NoError(t, err)
	require.NoError(t, e.c.Start(e.ctx))
	return e, out
}

func countStates(t *testing.T, e *env) map[runcue.State]int {
	t.Helper()
	n := map[runcue.State]int{}
	cursor := ""
	for {
		page, err := e.c.List(e.ctx, runcue.ListOptions{Limit: 1000, Cursor: cursor})
		require.NoError(t, err)
		for _, u := range page.Units {
			n[u.State]++
		}
		if page.Next == "" {
			return n
		}
		cursor = page.Next
	}
}

// A daily budget of 100 in America/New_York: Drain returns when only
// budget-held work is left; the budget resets at local midnight, 23 hours
// later across the spring-forward change; budget_exhausted fires once per
// period, and not for a period that is not spent.
func TestDailyBudgetAcrossDST(t *testing.T) {
	ny := newYork(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	e := newEnv(t, runcue.Config{DrainOnSpentBudget: true, MeterProvider: mp})
	e.clk.Set(time.Date(2026, 3, 7, 20, 0, 0, 0, ny)) // the eve of the change
	c := e.c
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 10,
		Budgets: []runcue.Budget{{Requests: 100, Per: runcue.PerDay, Location: ny}}}))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	rec := record(t, c)
	_, err := c.SubmitBatch(e.ctx, batchOf("call", 250))
	require.NoError(t, err)
	require.NoError(t, c.Start(e.ctx))

	// The 7th: 100 run, then Drain returns with 150 held by the budget.
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 100, runcue.StateQueued: 150}, countStates(t, e))
	midnight8 := time.Date(2026, 3, 8, 0, 0, 0, 0, ny)
	st, err := c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	require.Len(t, st.Budgets, 1)
	assert.Equal(t, 100, st.Budgets[0].Used)
	assert.True(t, st.Budgets[0].Exhausted)
	assert.True(t, st.Budgets[0].Resets.Equal(midnight8), "resets %v", st.Budgets[0].Resets)
	assert.True(t, st.NextCapacity.Equal(midnight8))
	page, err := c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}, Limit: 1})
	require.NoError(t, err)
	ex, err := c.Explain(e.ctx, page.Units[0].ID)
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonBudgetExhausted, ex.Reasons[0].Kind)
	assert.Equal(t, "api", ex.Reasons[0].Service)
	assert.True(t, ex.Reasons[0].Until.Equal(midnight8), "until %v", ex.Reasons[0].Until)
	evs := rec.waitFor(t, 1, ofType(runcue.EventBudgetExhausted, ""))
	require.NotNil(t, evs[0].Budget)
	assert.Equal(t, "api", evs[0].Service.Name)
	assert.Equal(t, "call", evs[0].Task, "stored with the claim of the unit that took the last request")
	assert.NotEmpty(t, evs[0].WorkID)
	assert.True(t, evs[0].Budget.Resets.Equal(midnight8))
	assert.Equal(t, 100, evs[0].Budget.Budget.Requests)

	// Nothing runs before local midnight; at midnight the next 100 do.
	e.clk.Set(midnight8.Add(-time.Second))
	require.NoError(t, runcue.Settle(e.ctx, c))
	assert.Equal(t, 150, countStates(t, e)[runcue.StateQueued])
	e.clk.Set(midnight8)
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 200, runcue.StateQueued: 50}, countStates(t, e))

	// The 8th has 23 hours: the budget resets at 00:00 EDT on the 9th.
	midnight9 := time.Date(2026, 3, 9, 0, 0, 0, 0, ny)
	require.Equal(t, 23*time.Hour, midnight9.Sub(midnight8))
	page, err = c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}, Limit: 1})
	require.NoError(t, err)
	ex, err = c.Explain(e.ctx, page.Units[0].ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonBudgetExhausted, ex.Reasons[0].Kind)
	assert.True(t, ex.Reasons[0].Until.Equal(midnight9), "until %v", ex.Reasons[0].Until)
	e.clk.Set(midnight9.Add(-time.Second))
	require.NoError(t, runcue.Settle(e.ctx, c))
	assert.Equal(t, 50, countStates(t, e)[runcue.StateQueued], "24 hours of UTC have not passed, but that is not the rule either way")
	e.clk.Set(midnight9)
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 250}, countStates(t, e))
	e.clk.Advance(time.Second) // the budget gauges are refreshed at most once a second
	require.NoError(t, runcue.Settle(e.ctx, c))

	var spent []runcue.Event
	for _, ev := range rec.all() {
		if ev.Type == runcue.EventBudgetExhausted {
			spent = append(spent, ev)
		}
	}
	require.Len(t, spent, 2, "once for the 7th, once for the 8th, not for the 9th (50 of 100)")
	assert.True(t, spent[1].Budget.PeriodStart.Equal(midnight8))
	assert.True(t, spent[1].Budget.Resets.Equal(midnight9))
	stored, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Types: []runcue.EventType{runcue.EventBudgetExhausted}})
	require.NoError(t, err)
	defer stop()
	first := recv(e, stored, "the stored budget_exhausted event")
	assert.Equal(t, runcue.EventBudgetExhausted, first.Type)
	assert.NotZero(t, first.Seq, "durable")
	b, err := json.Marshal(first.Budget.Budget)
	require.NoError(t, err)
	assert.JSONEq(t, `{"requests":100,"per":"day","location":"America/New_York"}`, string(b))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(e.ctx, &rm))
	values := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					if matches(dp.Attributes, map[string]string{"service": "api", "period": "day"}) {
						values[m.Name] += dp.Value
					}
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					if matches(dp.Attributes, map[string]string{"service": "api", "period": "day"}) {
						values[m.Name] += dp.Value
					}
				}
			}
		}
	}
	assert.Equal(t, int64(2), values["runcue.service.budget_exhausted"])
	assert.Equal(t, int64(50), values["runcue.service.budget_used"])
	assert.Equal(t, int64(0), values["runcue.service.budget_spent"])
}

// Without DrainOnSpentBudget, Drain waits for budget-held work.
func TestDrainWaitsForBudgetByDefault(t *testing.T) {
	e, out := budgetEnv(t, runcue.Config{}, 1, 2)
	c := e.c
	assert.Equal(t, runcue.StateCompleted, e.wait(out[0].ID).State)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Drain(ctx) }()
	require.NoError(t, runcue.Settle(e.ctx, c))
	select {
	case err := <-done:
		t.Fatalf("Drain returned (%v) with budget-held work", err)
	default:
	}
	e.clk.Set(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)) // UTC midnight
	require.NoError(t, <-done)
	cancel()
}

// The wall clock decides when a period ends: set forward past midnight (a
// machine resumed from suspension, whose monotonic clock stood still), the
// budget resets within a minute; set back, the spent period is not
// reopened.
func TestBudgetFollowsWallClockSteps(t *testing.T) {
	e, _ := budgetEnv(t, runcue.Config{DrainOnSpentBudget: true}, 2, 8)
	c := e.c
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, 2, countStates(t, e)[runcue.StateCompleted])

	e.clk.StepWall(24 * time.Hour) // the 2nd by the wall clock; no time passed
	e.clk.Advance(runcue.BudgetRecheckEvery)
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, 4, countStates(t, e)[runcue.StateCompleted], "the 2nd's budget, seen at the recheck")

	// Set forward again, and Drain at once: Drain sees the reset itself,
	// without waiting for the recheck.
	e.clk.StepWall(24 * time.Hour)
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, 6, countStates(t, e)[runcue.StateCompleted], "the 3rd's budget")

	e.clk.StepWall(-36 * time.Hour) // back to the 1st, 12:01
	e.clk.Advance(time.Hour)
	require.NoError(t, runcue.Settle(e.ctx, c))
	assert.Equal(t, 6, countStates(t, e)[runcue.StateCompleted], "no earlier day is reopened, the 3rd stays spent")
	st, err := c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.Budgets[0].PeriodStart.Equal(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)))
	assert.True(t, st.Budgets[0].Exhausted)
}

// A restart in the middle of a day counts the starts logged before it:
// the new owner runs only what is left of the budget.
func TestBudgetSurvivesRestart(t *testing.T) {
	ny := newYork(t)
	cfg := runcue.Config{DrainOnSpentBudget: true}
	e := newEnv(t, cfg)
	e.clk.Set(time.Date(2026, 6, 10, 9, 0, 0, 0, ny))
	svc := runcue.Service{Budgets: []runcue.Budget{{Requests: 10, Per: runcue.PerDay, Location: ny}, {Requests: 12, Per: runcue.PerMonth, Location: ny}}}
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("api", svc))
		require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Handler: noop}))
	}
	register(e.c)
	out, err := e.c.SubmitBatch(e.ctx, batchOf("call", 6))
	require.NoError(t, err)
	require.NoError(t, e.c.Start(e.ctx))
	require.NoError(t, e.c.Drain(e.ctx))
	for _, s := range out {
		require.Equal(t, runcue.StateCompleted, e.get(s.ID).State)
	}
	require.NoError(t, e.c.Stop(e.ctx))
	require.NoError(t, e.c.Close())

	e.clk.Advance(time.Hour)
	c := e.open(cfg)
	register(c)
	_, err = c.SubmitBatch(e.ctx, batchOf("call", 10))
	require.NoError(t, err)
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, c.Drain(e.ctx))
	e.c = c
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 10, runcue.StateQueued: 6}, countStates(t, e),
		"6 before the restart + 4 after = the day's 10")
	st, err := c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	require.Len(t, st.Budgets, 2)
	assert.Equal(t, 10, st.Budgets[0].Used)
	assert.Equal(t, 10, st.Budgets[1].Used)

	// The next day the month's budget (12) is what holds: 2 more.
	e.clk.Set(time.Date(2026, 6, 11, 0, 0, 0, 0, ny))
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 12, runcue.StateQueued: 4}, countStates(t, e))
	page, err := c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}, Limit: 1})
	require.NoError(t, err)
	ex, err := c.Explain(e.ctx, page.Units[0].ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonBudgetExhausted, ex.Reasons[0].Kind)
	assert.True(t, ex.Reasons[0].Until.Equal(time.Date(2026, 7, 1, 0, 0, 0, 0, ny)), "until %v", ex.Reasons[0].Until)
	assert.Contains(t, ex.Reasons[0].Detail, "12 requests per month (America/New_York)")

	// A process that does not own the database reads the same from the log.
	other := e.open(runcue.Config{})
	st, err = other.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	require.Len(t, st.Budgets, 2)
	assert.Equal(t, 2, st.Budgets[0].Used, "the 11th's")
	assert.Equal(t, 12, st.Budgets[1].Used)
	assert.True(t, st.Budgets[1].Exhausted)
	assert.True(t, st.Budgets[1].Resets.Equal(time.Date(2026, 7, 1, 0, 0, 0, 0, ny)))
}

// Keyed instances each have the class's budget; dependents of budget-held
// units count as budget-held for Drain; an override changes the limit and
// keeps the count.
func TestBudgetKeyedAndOverride(t *testing.T) {
	e := newEnv(t, runcue.Config{DrainOnSpentBudget: true})
	c := e.c
	require.NoError(t, c.Service("host", runcue.Service{Budgets: []runcue.Budget{{Requests: 1, Per: runcue.PerDay}}}))
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: noop,
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} }}))
	require.NoError(t, c.Task("parse", runcue.Task{Handler: noop}))
	_, err := c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "a1", Task: "fetch", Target: "a.example"},
		{ID: "a2", Task: "fetch", Target: "a.example"},
		{ID: "b1", Task: "fetch", Target: "b.example"},
		{ID: "b2", Task: "fetch", Target: "b.example"},
		{ID: "parse-a2", Task: "parse", DependsOn: []string{"a2"}},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, c.Drain(e.ctx))
	n := countStates(t, e)
	assert.Equal(t, 2, n[runcue.StateCompleted], "one per host")
	assert.Equal(t, 3, n[runcue.StateQueued], "a second per host, and a dependent of one")
	ex, err := c.Explain(e.ctx, "a2")
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonBudgetExhausted, ex.Reasons[0].Kind)
	assert.Equal(t, "host:a.example", ex.Reasons[0].Service)

	// Raised to 2 a day: the keyed instances keep their counts (1 each).
	require.NoError(t, c.SetService(e.ctx, "host", runcue.Service{Budgets: []runcue.Budget{{Requests: 2, Per: runcue.PerDay}}}))
	require.NoError(t, c.Drain(e.ctx))
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 5}, countStates(t, e))
}

// Budgets are validated.
func TestBudgetValidation(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	for _, b := range []runcue.Budget{
		{Requests: 0, Per: runcue.PerDay},
		{Requests: 10},
		{Requests: 10, Per: runcue.PerDay, Location: time.FixedZone("made-up", 3600)},
	} {
		err := e.c.Service("api", runcue.Service{Budgets: []runcue.Budget{b}})
		assert.ErrorIs(t, err, runcue.ErrInvalid, "%+v", b)
	}
	require.NoError(t, e.c.Service("api", runcue.Service{Budgets: []runcue.Budget{{Requests: 10, Per: runcue.PerMonth, Location: newYork(t)}}}))
	var b runcue.Budget
	require.NoError(t, json.Unmarshal([]byte(`{"requests":5,"per":"month","location":"America/New_York"}`), &b))
	assert.Equal(t, runcue.Budget{Requests: 5, Per: runcue.PerMonth, Location: newYork(t)}.Location.String(), b.Location.String())
	assert.Error(t, json.Unmarshal([]byte(`{"requests":5,"per":"week"}`), &b))
}
