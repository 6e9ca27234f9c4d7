package runcue_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// TestUnmatchedAmountsReported: a run reports tokens (Work.Used, and
// httplimit.Report's "tokens" reading) to a service whose meter is named
// llm_tokens. Without an alias the reports change nothing, and runcue
// says so: one warning per name, the name in ServiceStatus.Unmatched and
// in Explain's notes. With Aliases {"tokens"} the same reports reach the
// meter: the start's charge is reconciled to what was used, and the
// provider's zero holds the meter.
func TestUnmatchedAmountsReported(t *testing.T) {
	for _, alias := range []bool{false, true} {
		t.Run(map[bool]string{false: "no alias", true: "alias"}[alias], func(t *testing.T) {
			e := newEnv(t, runcue.Config{})
			m := runcue.Meter{Name: "llm_tokens", Limit: 10_000, Window: time.Minute}
			if alias {
				m.Aliases = []string{"tokens"}
			}
			require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{m}}))
			headers := http.Header{}
			require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"},
				Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"llm_tokens": 500} },
				Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
					if w.Target == "used" {
						w.Used(runcue.Costs{"tokens": 50})
						return nil, nil
					}
					return nil, httplimit.Report(w, headers, http.StatusOK, e.clk.Now())
				}}))
			e.start()
			meter := func() runcue.MeterStatus {
				st, err := e.c.ServiceStatus(e.ctx, "llm")
				require.NoError(t, err)
				require.Len(t, st.Meters, 1)
				return st.Meters[0]
			}
			e.wait(e.submit("chat", func(s *runcue.Submission) { s.Target = "used" }))
			e.wait(e.submit("chat", func(s *runcue.Submission) { s.Target = "used" }))
			e.settle()
			st, err := e.c.ServiceStatus(e.ctx, "llm")
			require.NoError(t, err)
			if !alias {
				assert.Equal(t, int64(1000), meter().Used, "the estimates stand: nothing reconciled them")
				assert.Equal(t, []string{"tokens"}, st.Unmatched)
				assert.Equal(t, 1, strings.Count(e.logs.String(), "a reported amount was ignored"), "logged once per name:\n%s", e.logs.String())
			} else {
				assert.Equal(t, int64(100), meter().Used, "each start's charge reconciled to the 50 used")
				assert.Empty(t, st.Unmatched)
				assert.NotContains(t, e.logs.String(), "a reported amount was ignored")
			}

			// The provider says no token is left for 30 s.
			headers.Set("X-Ratelimit-Limit-Tokens", "10000")
			headers.Set("X-Ratelimit-Remaining-Tokens", "0")
			headers.Set("X-Ratelimit-Reset-Tokens", "30s")
			e.wait(e.submit("chat"))
			e.settle()
			if !alias {
				assert.Equal(t, int64(1500), meter().Used, "the provider's zero was not taken")
			} else {
				assert.GreaterOrEqual(t, meter().Used, int64(10_000), "the provider's zero holds the meter")
			}
			st, err = e.c.ServiceStatus(e.ctx, "llm")
			require.NoError(t, err)
			var want []string
			if !alias {
				want = []string{"tokens"}
			}
			assert.Equal(t, want, st.Unmatched)

			// Explain names them for a unit of the service.
			require.NoError(t, e.c.PauseService(e.ctx, "llm"))
			id := e.submit("chat")
			e.settle()
			ex, err := e.c.Explain(e.ctx, id)
			require.NoError(t, err)
			require.Len(t, ex.Notes, len(want))
			if !alias {
				assert.Contains(t, ex.Notes[0], `service llm: runs reported an amount of "tokens"`)
			}
			require.NoError(t, e.c.Cancel(e.ctx, id, runcue.CancelOptions{}))
		})
	}
}

// TestMeterAliasesValidated: an alias is a name no other meter of the
// service takes, by name or alias, and not one of runcue's own.
func TestMeterAliasesValidated(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	for _, ms := range [][]runcue.Meter{
		{{Name: "a", Limit: 1, Window: time.Second, Aliases: []string{"b"}}, {Name: "b", Limit: 1, Window: time.Second}},
		{{Name: "a", Limit: 1, Window: time.Second, Aliases: []string{"t"}}, {Name: "b", Limit: 1, Window: time.Second, Aliases: []string{"t"}}},
		{{Name: "a", Limit: 1, Window: time.Second, Aliases: []string{"requests"}}},
		{{Name: "a", Limit: 1, Window: time.Second, Aliases: []string{""}}},
	} {
		assert.ErrorIs(t, e.c.Service("s", runcue.Service{Meters: ms}), runcue.ErrInvalid, "%+v", ms)
	}
	require.NoError(t, e.c.Service("s", runcue.Service{Meters: []runcue.Meter{
		{Name: "input", Limit: 1, Window: time.Second, Aliases: []string{"input_tokens", "prompt_tokens"}}}}))
}

// TestWaitingUnitsCounted: a service's status counts the units it holds
// back, beside the groups they wait in (one per task type and keys).
func TestWaitingUnitsCounted(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("one", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("a", runcue.Task{Services: []string{"one"}, Handler: g.handler}))
	require.NoError(t, e.c.Task("b", runcue.Task{Services: []string{"one"}, Handler: g.handler}))
	e.start()
	e.submit("a")
	g.next(t)
	for _, task := range []string{"a", "a", "b"} {
		e.submit(task)
	}
	e.settle()
	st, err := e.c.ServiceStatus(e.ctx, "one")
	require.NoError(t, err)
	assert.Equal(t, 2, st.Waiting, "the groups of a and of b")
	assert.Equal(t, 3, st.WaitingUnits)
	assert.Equal(t, 1, st.Concurrency())
	assert.Equal(t, "off", st.CircuitShown())
	for range 4 {
		g.release <- nil
	}
	require.NoError(t, e.c.Drain(e.ctx))
}
