package runcue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestLimitFromProvider: a meter with FromProvider starts at its Limit
// and takes the limit its provider states (capped by MaxLimit) from the
// responses; each change is stored and announced (limit_stated), status
// shows it, and a new owner starts from it.
func TestLimitFromProvider(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{
			{Name: "tokens", Limit: 1000, Window: time.Minute, FromProvider: true, MaxLimit: 50_000}}}))
		require.NoError(t, c.Task("ask", runcue.Task{Services: []string{"llm"},
			Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 100} },
			Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, p struct{ Says int64 }) (any, error) {
				if p.Says > 0 {
					w.Observe(runcue.Observation{Limits: []runcue.ObservedLimit{{Name: "tokens", Remaining: -1, Limit: p.Says}}})
				}
				return nil, nil
			})}))
	}
	register(e.c)
	e.start()
	meter := func(c *runcue.Cue) runcue.MeterStatus {
		st, err := c.ServiceStatus(e.ctx, "llm")
		require.NoError(t, err)
		require.Len(t, st.Meters, 1)
		return st.Meters[0]
	}
	assert.Equal(t, int64(1000), meter(e.c).Limit, "the starting limit")
	assert.False(t, meter(e.c).Stated)

	ask := func(says int64) {
		s, err := e.c.Submit(e.ctx, runcue.Submission{Task: "ask", Params: map[string]int64{"Says": says}})
		require.NoError(t, err)
		e.wait(s.ID)
		_, err = e.c.Settle(e.ctx)
		require.NoError(t, err)
	}
	ask(12_000)
	assert.Equal(t, runcue.MeterStatus{Name: "tokens", Used: 100, Limit: 12_000, Window: time.Minute, Stated: true},
		withoutFrees(meter(e.c)), "the provider's limit")
	ask(90_000)
	assert.Equal(t, int64(50_000), meter(e.c).Limit, "capped by MaxLimit")
	ask(0) // a response that states nothing changes nothing
	assert.Equal(t, int64(50_000), meter(e.c).Limit)

	evs, cancel, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{After: 0, Types: []runcue.EventType{runcue.EventLimitStated}})
	require.NoError(t, err)
	var stated []string
	for len(stated) < 2 {
		ev := <-evs
		b, _ := json.Marshal(ev.Service.Meters)
		stated = append(stated, string(b))
	}
	cancel()
	assert.Equal(t, []string{`[{"name":"tokens","used":0,"limit":12000,"stated":true,"window_ms":0}]`,
		`[{"name":"tokens","used":0,"limit":50000,"stated":true,"window_ms":0}]`}, stated, "each change announced, stored")

	require.NoError(t, e.c.Close())
	next := e.open(runcue.Config{})
	register(next)
	require.NoError(t, next.Start(e.ctx))
	assert.Equal(t, int64(50_000), meter(next).Limit, "a new owner starts from the stated limit")
	assert.True(t, meter(next).Stated)
}

// TestLimitFromProviderValidated: MaxLimit caps a stated limit: it needs
// FromProvider and is at least Limit.
func TestLimitFromProviderValidated(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	for _, m := range []runcue.Meter{
		{Name: "tokens", Limit: 1000, Window: time.Minute, MaxLimit: 5000},
		{Name: "tokens", Limit: 1000, Window: time.Minute, FromProvider: true, MaxLimit: 500},
	} {
		assert.ErrorIs(t, e.c.Service("s", runcue.Service{Meters: []runcue.Meter{m}}), runcue.ErrInvalid, "%+v", m)
	}
}

func withoutFrees(m runcue.MeterStatus) runcue.MeterStatus {
	m.Frees = time.Time{}
	return m
}

// TestRateFromProvider: a rate limit read from the provider's responses
// (RateFromProvider) takes the stated number of requests, capped by
// MaxRate, in its configured window.
func TestRateFromProvider(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 10, RateWindow: time.Minute, RateFromProvider: true, MaxRate: 100}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"},
		Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, p struct{ Says int64 }) (any, error) {
			w.Observe(runcue.Observation{Limits: []runcue.ObservedLimit{{Name: "requests", Remaining: -1, Limit: p.Says}}})
			return nil, nil
		})}))
	e.start()
	rate := func() (int, bool) {
		st, err := e.c.ServiceStatus(e.ctx, "api")
		require.NoError(t, err)
		return st.Rate(), st.RateStated
	}
	r, stated := rate()
	assert.Equal(t, 10, r)
	assert.False(t, stated)
	for _, says := range []int64{60, 500} {
		s, err := e.c.Submit(e.ctx, runcue.Submission{Task: "call", Params: map[string]int64{"Says": says}})
		require.NoError(t, err)
		e.wait(s.ID)
		_, err = e.c.Settle(e.ctx)
		require.NoError(t, err)
		r, stated = rate()
		assert.Equal(t, min(int(says), 100), r, "stated %d", says)
		assert.True(t, stated)
	}
	require.NoError(t, e.c.Service("open", runcue.Service{RateLimit: 10, RateWindow: time.Minute, RateFromProvider: true}))
	require.NoError(t, e.c.Task("open", runcue.Task{Services: []string{"open"},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			w.Observe(runcue.Observation{Limits: []runcue.ObservedLimit{{Name: "requests", Remaining: 0, Limit: 1 << 40}}})
			return nil, nil
		}}))
	e.wait(e.submit("open"))
	_, err := e.c.Settle(e.ctx)
	require.NoError(t, err)
	st, err := e.c.ServiceStatus(e.ctx, "open")
	require.NoError(t, err)
	assert.Equal(t, 1<<20, st.Rate(), "a stated limit without MaxRate is bounded all the same")
	assert.ErrorIs(t, e.c.Service("bad", runcue.Service{RateLimit: 10, RateWindow: time.Minute, MaxRate: 100}), runcue.ErrInvalid, "MaxRate without RateFromProvider")
	assert.ErrorIs(t, e.c.Service("bad", runcue.Service{RateFromProvider: true}), runcue.ErrInvalid, "no starting RateLimit")
}
