package runcue_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// adaptiveLimit returns the adaptive limit named of service name now.
func adaptiveLimit(t *testing.T, c *runcue.Cue, name, limit string) (runcue.AdaptiveLimit, *runcue.AdaptiveStatus) {
	t.Helper()
	st, err := c.ServiceStatus(context.Background(), name)
	require.NoError(t, err)
	require.NotNil(t, st.Adaptive, "service %s reports no adaptive limits", name)
	for _, l := range st.Adaptive.Limits {
		if l.Limit == limit {
			return l, st.Adaptive
		}
	}
	t.Fatalf("no adaptive limit %s of %s", limit, name)
	return runcue.AdaptiveLimit{}, nil
}

// TestAdaptiveLimits: a service's 429s (RetryAfter), 503s (Overloaded)
// and timeouts cut each of its limits (concurrency, rate window, meter)
// to Decrease of itself, one cut per burst; successes raise them back to
// the configured ones, never beyond; every cut is announced by a durable
// event, the state shown in status and Explain and kept by the next
// owner.
func TestAdaptiveLimits(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	svc := runcue.Service{MaxConcurrent: 10, RateLimit: 100, RateWindow: time.Minute,
		Meters:   []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}},
		Adaptive: &runcue.Adaptive{}}
	require.NoError(t, e.c.Service("api", svc))
	hung := make(chan struct{}, 1)
	var mu sync.Mutex
	answerErr := errors.New("none") // the error the service answers
	answer := struct {
		Store func(error)
		Load  func() error
	}{
		func(err error) { mu.Lock(); answerErr = err; mu.Unlock() },
		func() error { mu.Lock(); defer mu.Unlock(); return answerErr }}
	task := runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1}, Timeout: time.Minute,
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 100} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Attempt > 1 {
				return nil, nil // a deferred unit's next run: served
			}
			switch err := answer.Load(); err.Error() {
			case "none":
				return nil, nil
			case "hang":
				hung <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			default:
				return nil, err
			}
		}}
	require.NoError(t, e.c.Task("call", task))
	e.start()
	events := e.c.Events(e.ctx)
	// run submits n units and waits for their ends (a Retry-After's:
	// its deferral).
	run := func(n int) {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			ids[i] = e.submit("call")
		}
		if _, ok := answer.Load().(*runcue.RetryAfterError); ok {
			// Deferred: they run again once the hold passes. Wait for
			// their handlers' return and its consequences.
			for {
				running, err := e.c.Settle(e.ctx)
				require.NoError(t, err)
				if running == 0 {
					break
				}
			}
			e.settle()
			return
		}
		for _, id := range ids {
			e.wait(id)
		}
	}
	effective := func(limit string) int64 {
		l, _ := adaptiveLimit(t, e.c, "api", limit)
		return l.Effective
	}
	nextAdapted := func() runcue.Event {
		t.Helper()
		for {
			select {
			case ev := <-events:
				if ev.Type == runcue.EventLimitAdapted {
					return ev
				}
			case <-e.ctx.Done():
				t.Fatal("no limit_adapted event")
			}
		}
	}

	// A 429: every limit is cut to 0.8 of itself.
	answer.Store(runcue.RetryAfter(time.Second, errors.New("429")))
	run(1)
	assert.Equal(t, int64(80), effective("requests"))
	assert.Equal(t, int64(8), effective("concurrency"))
	assert.Equal(t, int64(8000), effective("tokens"))
	ev := nextAdapted()
	assert.Equal(t, "lowered", ev.Reason)
	require.NotNil(t, ev.Service)
	assert.Equal(t, "api", ev.Service.Name)
	assert.Equal(t, 1, ev.Service.Adaptive.Throttled)
	assert.NotEmpty(t, ev.WorkID, "stored with the Finish of the run that made the change")

	// A burst: three runs started together, each answered 503, make one
	// cut (the second and third started before it).
	e.clk.Advance(2 * time.Second) // the Retry-After passes
	hold := make(chan struct{})
	var started sync.WaitGroup
	started.Add(3)
	task.Handler = func(ctx context.Context, w *runcue.Work) (any, error) {
		started.Done()
		<-hold
		return nil, runcue.Overloaded(errors.New("503"))
	}
	require.NoError(t, e.c.Task("burst", task))
	var ids []string
	for range 3 {
		ids = append(ids, e.submit("burst"))
	}
	e.settle()
	started.Wait()
	close(hold)
	for _, id := range ids {
		e.wait(id)
	}
	e.settle()
	assert.Equal(t, int64(64), effective("requests"), "one burst, one cut")
	_, st := adaptiveLimit(t, e.c, "api", "requests")
	assert.Equal(t, 3, st.Unavailable)
	l, _ := adaptiveLimit(t, e.c, "api", "requests")
	assert.Equal(t, 4, l.Overloads, "every signal counted")
	assert.Equal(t, "lowered", nextAdapted().Reason)

	// A timeout cuts too (a run started after the last cut).
	e.clk.Advance(time.Second)
	answer.Store(errors.New("hang"))
	id := e.submit("call")
	<-hung
	e.clk.Advance(time.Minute + time.Second)
	e.wait(id)
	e.settle()
	assert.Equal(t, int64(51), effective("requests"))
	_, st = adaptiveLimit(t, e.c, "api", "requests")
	assert.Equal(t, 1, st.Timeouts)
	full, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Contains(t, st.Describe(full.Limits), "effective limit 51/min (configured 100), lowered after 1 429, 3 503s, 1 timeout")
	for _, m := range full.Meters {
		assert.Equal(t, effective("tokens"), m.Limit, "a meter's status gives the limit in force")
		assert.Less(t, m.Limit, int64(6000))
	}

	// Explain: a unit held back by the lowered rate window says so.
	answer.Store(errors.New("none"))
	run(51) // successes: the limit rises by 2 (0.02 x 100 per 51)
	e.clk.Advance(time.Second)
	var extra []string
	for range 5 {
		id = e.submit("call")
		extra = append(extra, id)
	}
	e.settle()
	ex, err := e.c.Explain(e.ctx, id)
	require.NoError(t, err)
	found := false
	for _, r := range ex.Reasons {
		if r.Kind == runcue.ReasonRateLimited {
			found = true
			assert.Contains(t, r.Detail, "effective limit")
			assert.Contains(t, r.Detail, "configured 100")
		}
	}
	assert.True(t, found, "rate limited: %+v", ex.Reasons)

	e.clk.Advance(time.Minute + time.Second)
	for _, id := range extra {
		e.wait(id)
	}

	// Successes raise every limit back to its ceiling, never beyond (an
	// override with a steeper Increase, so that it takes a few windows:
	// each success adds 0.5 x 100 / the effective limit).
	fast := svc
	fast.Adaptive = &runcue.Adaptive{Increase: 0.5}
	require.NoError(t, e.c.SetService(e.ctx, "api", fast))
	e.settle()
	for range 10 {
		e.clk.Advance(time.Minute + time.Second)
		run(int(effective("requests")))
		if effective("requests") == 100 {
			break
		}
	}
	assert.Equal(t, int64(100), effective("requests"))
	assert.Equal(t, int64(10), effective("concurrency"))
	assert.Equal(t, int64(10_000), effective("tokens"))
	_, st = adaptiveLimit(t, e.c, "api", "requests")
	assert.Zero(t, st.Throttled+st.Unavailable+st.Timeouts, "back at the ceilings, the signals are forgotten")
	assert.False(t, st.Lowered())

	// A new owner goes on from the stored state: cut once more, restart.
	e.clk.Advance(time.Minute + time.Second)
	answer.Store(runcue.RetryAfter(time.Second, errors.New("429")))
	run(1)
	require.Equal(t, int64(80), effective("requests"))
	require.NoError(t, e.c.Close())
	c := e.open(runcue.Config{})
	require.NoError(t, c.Service("api", svc))
	require.NoError(t, c.Task("call", task))
	require.NoError(t, c.Start(e.ctx))
	l, st = adaptiveLimit(t, c, "api", "requests")
	assert.Equal(t, int64(80), l.Effective, "restored, not reset to the ceiling")
	assert.Equal(t, 1, st.Throttled)
	assert.True(t, strings.HasPrefix(st.Describe(svc)[0], "effective limit 8 at once (configured 10)"), st.Describe(svc))

	// A ceiling changed at run time: the effective limit keeps its
	// fraction of it (0.8 of 50).
	lower := svc
	lower.RateLimit = 50
	require.NoError(t, c.SetService(e.ctx, "api", lower))
	e.settle(c)
	l, _ = adaptiveLimit(t, c, "api", "requests")
	assert.Equal(t, runcue.AdaptiveLimit{Limit: "requests", Configured: 50, Effective: 40, Overloads: 1}, l)
}

// TestAdaptiveAndShareValidation: fractions outside their ranges, a
// negative or non-finite weight, a minimum above the maximum and a share
// that is no amount's name are refused.
func TestAdaptiveAndShareValidation(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	for _, s := range []runcue.Service{
		{RateLimit: 1, RateWindow: time.Second, Adaptive: &runcue.Adaptive{Decrease: 1}},
		{RateLimit: 1, RateWindow: time.Second, Adaptive: &runcue.Adaptive{Floor: 1.5}},
		{RateLimit: 1, RateWindow: time.Second, Adaptive: &runcue.Adaptive{Increase: -0.1}},
		{Weight: -1},
		{Weight: math.Inf(1)},
		{MaxConcurrent: 1, MinConcurrent: 2},
		{MinConcurrent: -1},
		{Share: "two words"},
		{Meters: []runcue.Meter{{Name: "concurrency", Limit: 1, Window: time.Second}}}, // the adaptive limits' own names
		{Meters: []runcue.Meter{{Name: "adapt", Limit: 1, Window: time.Second}}},
	} {
		assert.ErrorIs(t, e.c.Service("x", s), runcue.ErrInvalid, "%+v", s)
	}
	assert.NoError(t, e.c.Service("ok", runcue.Service{MaxConcurrent: 2, MinConcurrent: 2, Weight: 0.5, Share: "tokens",
		Adaptive: &runcue.Adaptive{Floor: 0.5, Decrease: 0.5, Increase: 0.1}}))
}

// TestAdaptiveMetric: runcue.service.limit_effective reports an adaptive
// limit in force, by class and limit.
func TestAdaptiveMetric(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e := newEnv(t, runcue.Config{MeterProvider: mp})
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 60, RateWindow: time.Minute, Adaptive: &runcue.Adaptive{}}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(context.Context, *runcue.Work) (any, error) { return nil, runcue.Overloaded(errors.New("503")) }}))
	e.start()
	e.wait(e.submit("call"))
	e.settle()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(e.ctx, &rm))
	var got []int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "runcue.service.limit_effective" {
				for _, dp := range g.DataPoints {
					if matches(dp.Attributes, map[string]string{"service": "api", "limit": "requests"}) {
						got = append(got, dp.Value)
					}
				}
			}
		}
	}
	assert.Equal(t, []int64{48}, got)
}

// TestAdaptiveCutsTheNamedLimit: a 429 whose headers say requests remain
// and tokens do not lowers the token limit only; one whose headers name
// no exhausted limit (or a timeout) lowers every limit, as before; a 429
// for a limit the service does not adapt cuts nothing.
func TestAdaptiveCutsTheNamedLimit(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{MaxConcurrent: 8, RateLimit: 60, RateWindow: time.Minute,
		Meters:   []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}},
		Adaptive: &runcue.Adaptive{}}))
	var mu sync.Mutex
	headers := map[string]http.Header{}
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 500} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Attempt > 1 {
				return nil, nil
			}
			mu.Lock()
			h := headers[w.Target]
			mu.Unlock()
			return nil, httplimit.Report(w, h, http.StatusTooManyRequests, e.clk.Now())
		}}))
	e.start()
	limits := func() map[string]int64 {
		st, err := e.c.ServiceStatus(e.ctx, "llm")
		require.NoError(t, err)
		out := map[string]int64{}
		for _, l := range st.Adaptive.Limits {
			out[l.Limit] = l.Effective
		}
		return out
	}
	throttle := func(target string, h http.Header) {
		t.Helper()
		mu.Lock()
		headers[target] = h
		mu.Unlock()
		id := e.submit("chat", func(s *runcue.Submission) { s.Target = target })
		// Until its retry completed: its first run throttled (after any
		// hold of the meters), then the Retry-After and the burst passed.
		for e.get(id).State != runcue.StateCompleted {
			for {
				running, err := e.c.Settle(e.ctx)
				require.NoError(t, err)
				if running == 0 {
					break
				}
			}
			e.clk.Advance(time.Minute)
		}
		e.settle()
	}
	full := map[string]int64{"concurrency": 8, "requests": 60, "tokens": 10_000}
	require.Equal(t, full, limits())

	throttle("tokens", http.Header{"Retry-After": {"1"},
		"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"45"},
		"X-Ratelimit-Limit-Tokens": {"10000"}, "X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"1s"}})
	got := limits()
	assert.Less(t, got["tokens"], int64(10_000), "the token limit is cut")
	assert.Equal(t, int64(8), got["concurrency"], "concurrency is not")
	assert.Equal(t, int64(60), got["requests"], "requests are not")
	tokens := got["tokens"]

	// Tokens left, but fewer than the unit's 500: exhausted for it.
	throttle("short", http.Header{"Retry-After": {"1"},
		"X-Ratelimit-Remaining-Requests": {"45"}, "X-Ratelimit-Remaining-Tokens": {"120"}})
	got = limits()
	assert.Less(t, got["tokens"], tokens)
	assert.Equal(t, int64(8), got["concurrency"])
	assert.Equal(t, int64(60), got["requests"])

	// Headers that say every named limit has room: nothing points at one.
	throttle("unsaid", http.Header{"Retry-After": {"1"}, "X-Ratelimit-Remaining-Requests": {"45"}})
	got = limits()
	assert.Less(t, got["concurrency"], int64(8), "no limit named as exhausted: every limit is cut")
	assert.Less(t, got["requests"], int64(60))

	// Out of a limit the service does not meter: no limit of its is cut.
	before := limits()
	throttle("other", http.Header{"Retry-After": {"1"}, "Anthropic-Ratelimit-Input-Tokens-Limit": {"1000"},
		"Anthropic-Ratelimit-Input-Tokens-Remaining": {"0"}})
	got = limits()
	for name, v := range before {
		assert.GreaterOrEqual(t, got[name], v, "%s is not cut", name)
	}
}
