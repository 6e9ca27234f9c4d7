package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/runcue/runcue"
)

// TestWaitWithoutOwnerWarns: Wait and Drain in a Cue that does not own the
// database, while no process owns it, log one warning naming the database
// instead of hanging silently; with an owner they do not.
func TestWaitWithoutOwnerWarns(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	id := e.submit("t")
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	_, err := e.c.Wait(ctx, id)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ctx, cancel = context.WithTimeout(e.ctx, 50*time.Millisecond)
	require.ErrorIs(t, e.c.Drain(ctx), context.DeadlineExceeded)
	cancel()
	logs := e.logs.String()
	want := "no Cue owns " + e.path + ": was Start called?"
	assert.Equal(t, 1, strings.Count(logs, "Wait: "+want), logs)
	assert.Equal(t, 1, strings.Count(logs, "Drain: "+want), logs)

	owner := e.open(runcue.Config{})
	require.NoError(t, owner.Task("t", runcue.Task{Handler: func(ctx context.Context, _ *runcue.Work) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}))
	require.NoError(t, owner.Start(e.ctx))
	other := e.open(runcue.Config{})
	id2, err := other.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	before := strings.Count(e.logs.String(), want)
	ctx, cancel = context.WithTimeout(e.ctx, 50*time.Millisecond)
	_, err = other.Wait(ctx, id2.ID)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, before, strings.Count(e.logs.String(), want), "an owner runs elsewhere: no warning")
}

// TestMethodsAfterClose: every method of a closed Cue says so (ErrClosed),
// including Submit of a task this Cue never registered (it is looked up in
// the database, which is closed) and Subscribe.
func TestMethodsAfterClose(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("api", runcue.Service{}))
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	id := e.submit("t")
	// A task registered in the database by another Cue only.
	other := e.open(runcue.Config{})
	require.NoError(t, other.Task("elsewhere", runcue.Task{Handler: noop}))
	c := e.open(runcue.Config{}) // knows no task itself
	require.NoError(t, c.Close())
	require.NoError(t, e.c.Close())
	ctx := e.ctx
	for name, call := range map[string]func(c *runcue.Cue) error{
		"Submit(unknown here)": func(c *runcue.Cue) error {
			_, err := c.Submit(ctx, runcue.Submission{Task: "elsewhere"})
			return err
		},
		"Submit": func(c *runcue.Cue) error { _, err := c.Submit(ctx, runcue.Submission{Task: "t"}); return err },
		"SubmitBatch": func(c *runcue.Cue) error {
			_, err := c.SubmitBatch(ctx, []runcue.Submission{{Task: "t"}})
			return err
		},
		"Get":           func(c *runcue.Cue) error { _, err := c.Get(ctx, id); return err },
		"List":          func(c *runcue.Cue) error { _, err := c.List(ctx, runcue.ListOptions{}); return err },
		"Wait":          func(c *runcue.Cue) error { _, err := c.Wait(ctx, id); return err },
		"Drain":         func(c *runcue.Cue) error { return c.Drain(ctx) },
		"Cancel":        func(c *runcue.Cue) error { return c.Cancel(ctx, id, runcue.CancelOptions{}) },
		"Retry":         func(c *runcue.Cue) error { return c.Retry(ctx, id) },
		"RetryFailed":   func(c *runcue.Cue) error { _, err := c.RetryFailed(ctx, runcue.RetryFilter{}); return err },
		"Prune":         func(c *runcue.Cue) error { _, err := c.Prune(ctx, time.Hour); return err },
		"Explain":       func(c *runcue.Cue) error { _, err := c.Explain(ctx, id); return err },
		"Start":         func(c *runcue.Cue) error { return c.Start(ctx) },
		"Service":       func(c *runcue.Cue) error { return c.Service("new", runcue.Service{}) },
		"Task":          func(c *runcue.Cue) error { return c.Task("new", runcue.Task{Handler: noop}) },
		"SetService":    func(c *runcue.Cue) error { return c.SetService(ctx, "api", runcue.Service{MaxConcurrent: 1}) },
		"ResetService":  func(c *runcue.Cue) error { return c.ResetService(ctx, "api") },
		"PauseService":  func(c *runcue.Cue) error { return c.PauseService(ctx, "api") },
		"ResumeService": func(c *runcue.Cue) error { return c.ResumeService(ctx, "api") },
		"Services":      func(c *runcue.Cue) error { _, err := c.Services(ctx); return err },
		"ServiceStatus": func(c *runcue.Cue) error { _, err := c.ServiceStatus(ctx, "api"); return err },
		"Subscribe": func(c *runcue.Cue) error {
			_, cancel, err := c.Subscribe(ctx, runcue.SubscribeOptions{})
			cancel()
			return err
		},
	} {
		for _, cue := range []*runcue.Cue{e.c, c} {
			assert.ErrorIs(t, call(cue), runcue.ErrClosed, name)
		}
	}
	assert.NoError(t, e.c.Close(), "Close is idempotent")
	assert.NoError(t, e.c.Stop(ctx))
	assert.Empty(t, e.c.Owner())
}

// TestCallbackErrorsReported: a priority function that panics, returns NaN
// or a value outside [0, 1], and a DependencySatisfied that panics, are
// counted in runcue.callback.errors by callback and reason, and logged, one
// line per callback and reason however often they fail.
func TestCallbackErrorsReported(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	e := newEnv(t, runcue.Config{MeterProvider: mp,
		Priority: func(pc runcue.PriorityContext) float64 {
			switch pc.Work.Target {
			case "panic":
				panic("scoring bug")
			case "nan":
				return math.NaN()
			case "big":
				return 7
			}
			return 0.5
		},
		DependencySatisfied: func(ctx context.Context, dep runcue.Dependency) (bool, error) { panic("checker bug") },
		DependencyRecheck:   time.Hour,
	})
	checks := runcue.WatchChecks(e.c)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	var subs []runcue.Submission
	for i := range 30 {
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("u", i), Target: []string{"panic", "nan", "big"}[i%3]})
	}
	subs = append(subs, runcue.Submission{Task: "t", ID: "dep"}, runcue.Submission{Task: "t", ID: "child", DependsOn: []string{"dep"}})
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	for _, s := range subs[:31] {
		assert.Equal(t, runcue.StateCompleted, e.wait(s.ID).State)
	}
	select {
	case <-checks: // reported before its answer was sent
	case <-e.ctx.Done():
		t.Fatal("the dependency check never ran")
	}
	assert.Contains(t, e.logs.String(), "runcue: a dependency callback failed")
	assert.Equal(t, runcue.StateQueued, e.get("child").State, "a panicking check counts as not satisfied")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(e.ctx, &rm))
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "runcue.callback.errors" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				cb, _ := dp.Attributes.Value("callback")
				reason, _ := dp.Attributes.Value("reason")
				counts[cb.AsString()+"/"+reason.AsString()] += dp.Value
			}
		}
	}
	for _, k := range []string{"priority/panic", "priority/nan", "priority/out_of_range"} {
		assert.GreaterOrEqual(t, counts[k], int64(10), k)
	}
	assert.GreaterOrEqual(t, counts["dependency/panic"], int64(1))
	logs := e.logs.String()
	for _, want := range []string{"reason=panic detail=\"scoring bug\"", "reason=nan", "reason=out_of_range detail=7"} {
		assert.Equal(t, 1, strings.Count(logs, want), want)
	}
	assert.Equal(t, 3, strings.Count(logs, "runcue: a priority callback failed"), "one line per reason, not one per call:\n%s", logs)
}

// TestRetryAfterUnknownService: a Retry-After naming a service the unit does
// not use (a typo) holds all of the unit's services, and says so in the log.
func TestRetryAfterUnknownService(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("openai", runcue.Service{}))
	require.NoError(t, e.c.Service("s3", runcue.Service{}))
	calls := 0
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"openai", "s3"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(context.Context, *runcue.Work) (any, error) {
			calls++
			if calls == 1 {
				return nil, runcue.RetryAfter(5*time.Second, errors.New("429"), "opneai")
			}
			return nil, nil
		}}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("call")
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, id))
	e.settle()
	for _, svc := range []string{"openai", "s3"} {
		st, err := e.c.ServiceStatus(e.ctx, svc)
		require.NoError(t, err)
		assert.True(t, st.BlockedUntil.Equal(epoch.Add(5*time.Second)), "%s is held: %v", svc, st.BlockedUntil)
	}
	assert.Contains(t, e.logs.String(), "RetryAfter names a service the unit does not use")
	assert.Contains(t, e.logs.String(), "service=opneai")
	e.clk.Advance(5 * time.Second)
	assert.Equal(t, runcue.StateCompleted, e.wait(id).State)
}

// TestRerunnableImport: an import whose keys include one of a failed unit
// can be run again: that item is refused on its own (ErrDuplicate), with the
// items that depend on it (ErrDependencyRefused); the rest is stored or
// reported Duplicate. Submit of the refused item alone returns ErrDuplicate.
func TestRerunnableImport(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if w.Target == "bad" {
				return nil, errors.New("404")
			}
			return nil, nil
		}}))
	e.start()
	batch := func() []runcue.Submission {
		return []runcue.Submission{
			{Task: "fetch", Target: "a", IdempotencyKey: "a"},
			{Task: "fetch", Target: "bad", IdempotencyKey: "bad", ID: "bad-1"},
			{Task: "fetch", Target: "c", IdempotencyKey: "c"},
		}
	}
	first, err := e.c.SubmitBatch(e.ctx, batch())
	require.NoError(t, err)
	for _, s := range first {
		require.NoError(t, s.Err)
		e.wait(s.ID)
	}
	require.Equal(t, runcue.StateFailed, e.get("bad-1").State)

	again := append(batch(), runcue.Submission{Task: "fetch", Target: "d", IdempotencyKey: "d", DependsOn: []string{"bad-2"}},
		runcue.Submission{Task: "fetch", Target: "e", IdempotencyKey: "e"})
	again[1].ID = "bad-2"
	second, err := e.c.SubmitBatch(e.ctx, again)
	require.NoError(t, err, "a duplicate is not an error of the batch")
	assert.True(t, second[0].Duplicate)
	assert.Equal(t, first[0].ID, second[0].ID)
	assert.ErrorIs(t, second[1].Err, runcue.ErrDuplicate)
	assert.True(t, second[2].Duplicate)
	assert.ErrorIs(t, second[3].Err, runcue.ErrDependencyRefused, "it depends on the refused item")
	assert.NoError(t, second[4].Err)
	assert.Equal(t, runcue.StateCompleted, e.wait(second[4].ID).State)
	_, err = e.c.Get(e.ctx, "bad-2")
	assert.ErrorIs(t, err, runcue.ErrNotFound)

	_, err = e.c.Submit(e.ctx, runcue.Submission{Task: "fetch", Target: "bad", IdempotencyKey: "bad"})
	assert.ErrorIs(t, err, runcue.ErrDuplicate)

	// Under ResubmitFailedDuplicates a new unit takes the key over.
	c := e.open(runcue.Config{FailedDuplicates: runcue.ResubmitFailedDuplicates})
	require.NoError(t, c.Task("fetch", runcue.Task{Handler: noop}))
	s, err := c.Submit(e.ctx, runcue.Submission{Task: "fetch", Target: "bad", IdempotencyKey: "bad", ID: "bad-3"})
	require.NoError(t, err)
	assert.Equal(t, "bad-3", s.ID)
	assert.False(t, s.Duplicate)
}

// TestConfigValidated: negative and contradictory settings are refused
// with ErrInvalid instead of being silently replaced by defaults; the
// documented special values stay.
func TestConfigValidated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	for name, cfg := range map[string]runcue.Config{
		"MaxConcurrent -5":                 {MaxConcurrent: -5},
		"MaxUncommitted -1":                {MaxUncommitted: -1},
		"DefaultTimeout -1s":               {DefaultTimeout: -time.Second},
		"MaxPayload -1":                    {MaxPayload: -1},
		"PollInterval -1":                  {PollInterval: -1},
		"MaxQueued -1":                     {MaxQueued: -1},
		"Overflow without MaxQueued":       {Overflow: runcue.OverflowDropOldest},
		"OnBackpressure without MaxQueued": {OnBackpressure: func(bool, int) {}},
		// Settings that would allocate without bound, spin or overflow a
		// time: an outside trial's EventBuffer of 1<<31 killed Open with a
		// fatal out-of-memory.
		"EventBuffer 1<<31":          {EventBuffer: 1 << 31},
		"MaxConcurrent 1<<40":        {MaxConcurrent: 1 << 40},
		"MaxUncommitted 1<<30":       {MaxUncommitted: 1 << 30},
		"MaxPayload 4 GiB":           {MaxPayload: 4 << 30},
		"PollInterval 1ns":           {PollInterval: time.Nanosecond},
		"QueueStatusInterval 1ns":    {QueueStatusInterval: time.Nanosecond},
		"PriorityTTL 2 days":         {PriorityTTL: 48 * time.Hour},
		"DefaultTimeout 200 years":   {DefaultTimeout: 200 * 365 * 24 * time.Hour},
		"Retention 200 years":        {Retention: 200 * 365 * 24 * time.Hour},
		"DrainSubscriptions a space": {DrainSubscriptions: []string{"has space"}},
	} {
		_, err := runcue.Open(path, cfg)
		assert.ErrorIs(t, err, runcue.ErrInvalid, name)
	}
	c, err := runcue.Open(path, runcue.Config{QueueStatusInterval: -1, Logger: quietLogger})
	require.NoError(t, err, "a negative QueueStatusInterval disables queue_status, as documented")
	require.NoError(t, c.Close())
}

// TestMaxPayload: params over Config.MaxPayload are refused at submit; a
// result over it fails the run permanently.
func TestMaxPayload(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxPayload: 1000})
	require.NoError(t, e.c.Task("echo", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		return strings.Repeat("x", len(w.Target)), nil
	}}))
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "echo", Params: strings.Repeat("p", 2000)})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
	assert.ErrorContains(t, err, "MaxPayload")
	e.start()
	small := e.wait(e.submit("echo", func(s *runcue.Submission) { s.Target = strings.Repeat("t", 10) }))
	assert.Equal(t, runcue.StateCompleted, small.State)
	big := e.wait(e.submit("echo", func(s *runcue.Submission) { s.Target = strings.Repeat("t", 2000) }))
	assert.Equal(t, runcue.StateFailed, big.State)
	assert.Equal(t, 1, big.Runs, "not retried")
	assert.Contains(t, big.Error, "exceeds Config.MaxPayload")
	assert.Empty(t, big.Result)
}

// TestServiceKeysTimeout: a ServiceKeys callback that hangs costs its unit
// (failed, with the reason counted and logged), not the dispatcher: other
// units are keyed and run meanwhile.
func TestServiceKeysTimeout(t *testing.T) {
	e := newEnv(t, runcue.Config{CallbackTimeout: 20 * time.Millisecond})
	release := make(chan struct{})
	defer close(release)
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("get", runcue.Task{Handler: noop, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		ServiceKeys: func(w *runcue.Work) []string {
			if w.Target == "stuck" {
				<-release
			}
			return []string{"host:" + w.Target}
		}}))
	e.start()
	stuck := e.submit("get", func(s *runcue.Submission) { s.Target = "stuck" })
	fine := e.submit("get", func(s *runcue.Submission) { s.Target = "fine" })
	assert.Equal(t, runcue.StateCompleted, e.wait(fine).State, "the loop went on")
	wi := e.wait(stuck)
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Contains(t, wi.Error, "ServiceKeys did not return within 20ms")
	assert.Contains(t, e.logs.String(), "callback=service_keys reason=timeout")
}
