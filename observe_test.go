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
)

// TestProviderHeadersFeedMeters: what the provider's headers say, reported
// through httplimit.Report, corrects the meters. OpenAI's response says
// 3,000 tokens are left where runcue counts 1,000 of 10,000 used: the
// other 6,000 were used from elsewhere, and the meter keeps room for that
// use ahead (and a tenth more): with no newer reading, for a window after
// the reading, then less and less, none after two windows. A header with
// nothing left and an absurd reset (year 9999) holds the meter the same
// way, two windows at most. Anthropic's output-token limit applies to the
// meter of that name only. A 429 with Retry-After holds the service as
// RetryAfter does, the unit coming back without spending its retry budget.
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
	m := meter("tokens")
	assert.Equal(t, int64(6000), m.FromElsewhere, "6,000 used from elsewhere")
	assert.Equal(t, int64(6600), m.Elsewhere, "room kept for it, and a tenth more (at least a twentieth of the limit)")
	assert.Equal(t, int64(7600), m.Used, "1,000 of ours and the room kept")
	assert.Equal(t, int64(100), meter("output_tokens").Used, "a limit the headers do not name is left alone")
	e.clk.Advance(30 * time.Second)
	assert.Equal(t, int64(7600), meter("tokens").Used, "no newer reading: the room is kept for a window")
	e.clk.Advance(30*time.Second + runcue.DefaultMargin + time.Millisecond)
	assert.InDelta(t, 6600, meter("tokens").Used, 10, "ours left the window; the room has just begun to fall")
	e.clk.Advance(30 * time.Second)
	assert.InDelta(t, 3500, meter("tokens").Used, 20, "then less and less: half the 6,000 and a twentieth of the limit")
	e.clk.Advance(30 * time.Second)
	assert.Equal(t, int64(0), meter("tokens").Used, "none two windows after the reading")

	submit("anthropic", http.Header{
		"Anthropic-Ratelimit-Output-Tokens-Limit": {"4000"}, "Anthropic-Ratelimit-Output-Tokens-Remaining": {"0"},
		"Anthropic-Ratelimit-Output-Tokens-Reset": {"9999-12-31T23:59:59Z"},
	}, http.StatusOK)
	assert.GreaterOrEqual(t, meter("output_tokens").Used, int64(4000), "nothing left: the meter is held")
	assert.Equal(t, int64(1000), meter("tokens").Used, "only the limit named")
	e.clk.Advance(2*time.Minute + runcue.DefaultMargin + time.Millisecond)
	assert.Equal(t, int64(0), meter("output_tokens").Used, "an absurd reset holds the meter for two windows at most")

	mu.Lock()
	headers["throttled"], status["throttled"] = http.Header{"Retry-After": {"20"}}, http.StatusTooManyRequests
	mu.Unlock()
	_, err := e.c.Submit(e.ctx, runcue.Submission{ID: "throttled", Task: "chat", Cost: cost})
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
	assert.Equal(t, int64(3000), st.Meters[0].FromElsewhere, "3,000 of others'")
	assert.Equal(t, int64(5500), st.Meters[0].Used, "1,000 and 1,000 of runcue's, room for the others' 3,000 and a twentieth of the limit")
	release["second"] <- struct{}{}
	e.wait(second)
}

// TestRoomKeptForOthersShown: a reading showing others' use of a shared
// key: ServiceStatus says how much and the room kept, and Explain of a
// unit the room holds back says it in so many words.
func TestRoomKeptForOthersShown(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 12_000, Window: 2 * time.Second}}}))
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target != "first" {
				return nil, nil
			}
			w.Used(runcue.Costs{"tokens": 1000})
			// 1,000 of runcue's and 4,800 of another program's.
			h := http.Header{"X-Ratelimit-Limit-Tokens": {"12000"}, "X-Ratelimit-Remaining-Tokens": {"6200"}}
			return nil, httplimit.Report(w, h, http.StatusOK, e.clk.Now())
		}}))
	e.start()
	first := e.submit("chat", func(s *runcue.Submission) { s.Target = "first"; s.Cost = runcue.Costs{"tokens": 1200} })
	e.wait(first)
	e.settle()
	st, err := e.c.ServiceStatus(e.ctx, "llm")
	require.NoError(t, err)
	m := st.Meters[0]
	assert.Equal(t, int64(4800), m.FromElsewhere)
	assert.Equal(t, int64(5400), m.Elsewhere, "the others' use and a twentieth of the limit (more than a tenth of it)")
	assert.Equal(t, int64(6400), m.Used, "runcue's 1,000 and the room kept")

	held := e.submit("chat", func(s *runcue.Submission) { s.Cost = runcue.Costs{"tokens": 6000} })
	e.settle()
	x, err := e.c.Explain(e.ctx, held)
	require.NoError(t, err)
	require.NotEmpty(t, x.Reasons)
	assert.Equal(t, runcue.ReasonMeterFull, x.Reasons[0].Kind)
	assert.Contains(t, x.Reasons[0].Detail, "tokens: 4,800 of 12,000 used by others in the last 2s, room kept (5,400)")
	e.clk.Advance(2*time.Second + runcue.DefaultMargin)
	e.wait(held) // runcue's 1,000 left the window: 5,400 + 6,000 fit
}
