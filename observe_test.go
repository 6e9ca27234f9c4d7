package runcue_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
	"github.com/runcue/runcue/store/sqlite"
)

// TestProviderHeadersFeedMeters: what the provider's headers say, reported
// through httplimit.Report, corrects the meters. OpenAI's response says
// 3,000 tokens are left where runcue counts 1,000 of 10,000 used: the
// other 6,000 were used from elsewhere and count until the reset the
// headers give (30 s), and are logged for the next owner. A header with
// nothing left and an absurd reset (year 9999) holds the meter for at
// most its window. Anthropic's output-token limit applies to the meter of
// that name only. A 429 with Retry-After holds the service as RetryAfter
// does, the unit coming back without spending its retry budget.
func TestProviderHeadersFeedMeters(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{RateLimit: 100, RateWindow: time.Minute, Meters: []runcue.Meter{
		{Name: "tokens", Limit: 10_000, Window: time.Minute}, {Name: "output_tokens", Limit: 4_000, Window: time.Minute}}}))
	var mu sync.Mutex
	headers := map[string]http.Header{}
	status := map[string]int{}
	runs := map[string]int{}
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			h, code := headers[w.ID], status[w.ID]
			runs[w.ID]++
			if runs[w.ID] > 1 {
				h, code = http.Header{}, http.StatusOK // the retry succeeds
			}
			mu.Unlock()
			return nil, httplimit.Report(w, h, code, e.clk.Now())
		}}))
	e.start()
	cost := runcue.Costs{"tokens": 1000, "output_tokens": 100}
	submit := func(id string, h http.Header, code int) {
		mu.Lock()
		headers[id], status[id] = h, code
		mu.Unlock()
		_, err := e.c.Submit(e.ctx, runcue.Submission{ID: id, Task: "chat", Cost: cost})
		require.NoError(t, err)
		_, err = e.c.Wait(e.ctx, id)
		require.NoError(t, err)
		e.settle()
	}
	// returned settles until no handler runs: the handler's report, its
	// return and their consequences are applied.
	returned := func() {
		for {
			running, err := e.c.Settle(e.ctx)
			require.NoError(t, err)
			if running == 0 {
				return
			}
		}
	}
	meter := func(name string) runcue.MeterStatus {
		st, err := e.c.ServiceStatus(e.ctx, "llm")
		require.NoError(t, err)
		for _, m := range st.Meters {
			if m.Name == name {
				return m
			}
		}
		t.Fatalf("no meter %s", name)
		return runcue.MeterStatus{}
	}

	submit("openai", http.Header{
		"X-Ratelimit-Limit-Tokens": {"10000"}, "X-Ratelimit-Remaining-Tokens": {"3000"}, "X-Ratelimit-Reset-Tokens": {"30s"},
	}, http.StatusOK)
	assert.Equal(t, int64(7000), meter("tokens").Used, "1,000 of ours and 6,000 from elsewhere")
	assert.Equal(t, int64(100), meter("output_tokens").Used, "a limit the headers do not name is left alone")
	// The usage from elsewhere is in the service log.
	st2, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st2.Close()
	logged, err := st2.ServiceLog(e.ctx, "llm", epoch.Add(-time.Hour)) // placed to leave at the reset: before the start
	require.NoError(t, err)
	var found bool
	for _, l := range logged {
		found = found || (l.Meter == "tokens" && l.Amount == 6000)
	}
	assert.True(t, found, "the 6,000 tokens used elsewhere are logged: %+v", logged)
	e.clk.Advance(30 * time.Second)
	assert.Equal(t, int64(1000), meter("tokens").Used, "the usage from elsewhere left at the reset")
	e.clk.Advance(31 * time.Second)
	assert.Equal(t, int64(0), meter("tokens").Used)

	submit("anthropic", http.Header{
		"Anthropic-Ratelimit-Output-Tokens-Limit": {"4000"}, "Anthropic-Ratelimit-Output-Tokens-Remaining": {"0"},
		"Anthropic-Ratelimit-Output-Tokens-Reset": {"9999-12-31T23:59:59Z"},
	}, http.StatusOK)
	assert.GreaterOrEqual(t, meter("output_tokens").Used, int64(4000), "nothing left: the meter is held")
	assert.Equal(t, int64(1000), meter("tokens").Used, "only the limit named")
	e.clk.Advance(time.Minute + runcue.DefaultMargin + time.Millisecond)
	assert.Equal(t, int64(0), meter("output_tokens").Used, "an absurd reset holds the meter for its window at most")

	mu.Lock()
	headers["throttled"], status["throttled"] = http.Header{"Retry-After": {"20"}}, http.StatusTooManyRequests
	mu.Unlock()
	_, err = e.c.Submit(e.ctx, runcue.Submission{ID: "throttled", Task: "chat", Cost: cost})
	require.NoError(t, err)
	returned()
	st, err := e.c.ServiceStatus(e.ctx, "llm")
	require.NoError(t, err)
	assert.True(t, st.BlockedUntil.Equal(e.clk.Now().Add(20*time.Second)), "a 429 holds the service for its Retry-After: %v", st.BlockedUntil)
	e.clk.Advance(20 * time.Second)
	info, err := e.c.Wait(e.ctx, "throttled")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, info.State, "deferred, then run again (MaxAttempts 1: no budget spent)")

	assert.True(t, errors.Is(httplimit.Report(&runcue.Work{}, http.Header{}, http.StatusTooManyRequests, epoch), httplimit.ErrThrottled))
}

// TestReadingComparedAtArrival: the provider computes what remains when a
// request arrives. A run started at t0 (1,000 tokens) answers after a
// second run started (1,000 more) with what remained at its arrival: 6,000
// of 10,000, others having used 3,000. Compared with runcue's count as it
// stood at t0, the reading shows the 3,000; compared at the answer (2,000
// counted) it showed 2,000, counting the second run twice.
func TestReadingComparedAtArrival(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}}}))
	// Each run waits for its own release: with one channel for both, the
	// second could take the first's release (on a loaded machine the
	// second reached its wait first).
	started := make(chan string, 2)
	release := map[string]chan struct{}{"first": make(chan struct{}, 1), "second": make(chan struct{}, 1)}
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 1000} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			started <- w.Target
			select {
			case <-release[w.Target]:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			if w.Target != "first" {
				return nil, nil
			}
			h := http.Header{"X-Ratelimit-Limit-Tokens": {"10000"}, "X-Ratelimit-Remaining-Tokens": {"6000"}, "X-Ratelimit-Reset-Tokens": {"30s"}}
			return nil, httplimit.Report(w, h, http.StatusOK, e.clk.Now())
		}}))
	e.start()
	first := e.submit("chat", func(s *runcue.Submission) { s.Target = "first" })
	require.Equal(t, "first", <-started)
	e.clk.Advance(time.Second)
	second := e.submit("chat", func(s *runcue.Submission) { s.Target = "second" })
	require.Equal(t, "second", <-started)
	e.clk.Advance(time.Second)
	release["first"] <- struct{}{} // the first answers, with the second running
	e.wait(first)
	e.settle()
	st, err := e.c.ServiceStatus(e.ctx, "llm")
	require.NoError(t, err)
	assert.Equal(t, int64(5000), st.Meters[0].Used, "1,000 and 1,000 of runcue's, 3,000 of others'")
	release["second"] <- struct{}{}
	e.wait(second)
}
