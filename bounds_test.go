package runcue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestSubmissionBounds: what a submission may hold is bounded (targets,
// keys, IDs, names) and checked (UTF-8, no NUL, times a store can hold),
// each refused with ErrInvalid, and nothing of a refused batch is stored.
// Before, a RunAt in 2263 was stored as 1678 and ran at once, a 17 MiB
// target was copied into every event of its unit, and a NUL or Latin-1
// byte was stored as given.
func TestSubmissionBounds(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Service("host", runcue.Service{}))
	at2263 := time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, s := range map[string]runcue.Submission{
		"RunAt in 2263":             {RunAt: at2263},
		"RunAt in 9999":             {RunAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)},
		"RunAt in 1600":             {RunAt: time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)},
		"a target over MaxTarget":   {Target: strings.Repeat("t", runcue.MaxTarget+1)},
		"a 17 MiB target":           {Target: strings.Repeat("t", 17<<20)},
		"NUL in a target":           {Target: "a\x00b"},
		"Latin-1 in a target":       {Target: "caf\xe9"},
		"a 1 MiB idempotency key":   {IdempotencyKey: strings.Repeat("k", 1<<20)},
		"NUL in an idempotency key": {IdempotencyKey: "k\x00"},
		"Latin-1 in a key":          {IdempotencyKey: "k\xe9"},
		"Latin-1 in an ID":          {ID: "id-\xff"},
		"an ID over MaxID":          {ID: strings.Repeat("i", runcue.MaxID+1)},
		"a timeout of 200 years":    {Timeout: 200 * 365 * 24 * time.Hour},
		"a dependency timeout":      {DependencyTimeout: 200 * 365 * 24 * time.Hour},
		"NUL in a dependency":       {DependsOn: []string{"a\x00"}},
		"a dependency over MaxID":   {DependsOn: []string{strings.Repeat("d", runcue.MaxID+1)}},
	} {
		if s.Task == "" {
			s.Task = "t"
		}
		_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "t", ID: "fine-" + name}, s})
		assert.ErrorIs(t, err, runcue.ErrInvalid, name)
		_, err = e.c.Get(e.ctx, "fine-"+name)
		assert.ErrorIs(t, err, runcue.ErrNotFound, "%s: nothing of the batch is stored", name)
	}
	// At the bounds: stored.
	edge := runcue.Submission{Task: "t", Target: strings.Repeat("é", runcue.MaxTarget/2), IdempotencyKey: strings.Repeat("k", runcue.MaxIdempotencyKey),
		ID: strings.Repeat("i", runcue.MaxID), RunAt: time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC), Timeout: runcue.MaxTimeout}
	got, err := e.c.Submit(e.ctx, edge)
	require.NoError(t, err)
	wi := e.get(got.ID)
	assert.Equal(t, edge.Target, wi.Target)
	assert.True(t, wi.RunAt.Equal(edge.RunAt), "stored as given: %v", wi.RunAt)

	// Names: tasks, services, keyed instances, subscriptions.
	h := func(context.Context, *runcue.Work) (any, error) { return nil, nil }
	assert.ErrorIs(t, e.c.Task("caf\xe9", runcue.Task{Handler: h}), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.Task("bell\a", runcue.Task{Handler: h}), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.Task("long", runcue.Task{Handler: h, Timeout: 200 * 365 * 24 * time.Hour}), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.Service("caf\xe9", runcue.Service{}), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.PauseService(e.ctx, "host:caf\xe9"), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.PauseService(e.ctx, "host:a\x1b]0;x\a"), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.PauseService(e.ctx, "host:"+strings.Repeat("k", runcue.MaxKeyedName)), runcue.ErrInvalid)
	require.NoError(t, e.c.PauseService(e.ctx, "host:"+strings.Repeat("k", runcue.MaxKeyedName-len("host:"))))
	_, _, err = e.c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "caf\xe9"})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}

// TestBadServiceKeysFailTheUnit: a key that ServiceKeys derives at run time
// is checked like one given to SetService: a unit whose key is not UTF-8
// fails permanently without running its handler.
func TestBadServiceKeysFailTheUnit(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1}))
	ran := make(chan string, 2)
	require.NoError(t, e.c.Task("fetch", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			ran <- w.Target
			return nil, nil
		}}))
	e.start()
	bad := e.wait(e.submit("fetch", func(s *runcue.Submission) { s.Target = "caf\u00e9 bar" }))
	assert.Equal(t, runcue.StateFailed, bad.State)
	assert.Contains(t, bad.Error, "whitespace")
	good := e.wait(e.submit("fetch", func(s *runcue.Submission) { s.Target = "café.example" }))
	assert.Equal(t, runcue.StateCompleted, good.State)
	assert.Equal(t, "café.example", <-ran)
}

// TestDrainRefusesUnknownSubscription: Drain names an unknown durable
// subscription of Config.DrainSubscriptions at once, rather than after the
// work is done.
func TestDrainRefusesUnknownSubscription(t *testing.T) {
	e := newEnv(t, runcue.Config{DrainSubscriptions: []string{"nobody"}})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	g := newGate()
	require.NoError(t, e.c.Task("held", runcue.Task{Handler: g.handler}))
	e.start()
	e.submit("held")
	g.next(t)
	err := e.c.Drain(e.ctx)
	assert.ErrorIs(t, err, runcue.ErrUnknownSubscription)
	g.release <- nil
}

// TestLogLevels: routine failures (one that will be retried, a 429) log at
// Debug; a unit that fails for good at Warn. An outside trial's
// application logs had a line at INFO for every 429 and failure.
func TestLogLevels(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, Jitter: runcue.JitterNone},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			switch {
			case w.Target == "429" && w.Attempt == 1:
				return nil, runcue.RetryAfter(time.Millisecond, errors.New("429 too many requests"))
			case w.Target == "bad":
				return nil, errors.New("500 internal error")
			}
			return nil, nil
		}}))
	e.start()
	slow := e.submit("t", func(s *runcue.Submission) { s.Target = "429" })
	bad := e.submit("t", func(s *runcue.Submission) { s.Target = "bad" })
	// Settle does not wait for handlers: the clock moves past the retry's
	// instant only once the first run's end is stored and handled, or the
	// retry would be scheduled after the move and wait forever.
	deadline := time.Now().Add(time.Minute)
	for wi := e.get(slow); wi.Runs < 1 || wi.State != runcue.StateQueued; wi = e.get(slow) {
		require.True(t, time.Now().Before(deadline), "the first run of %s did not end: %+v", slow, wi)
		time.Sleep(5 * time.Millisecond)
	}
	e.settle()
	e.clk.Advance(time.Second)
	e.wait(slow)
	e.wait(bad)
	logs := e.logs.String()
	lines := func(msg string) []string {
		var out []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "msg="+msg+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	deferred := lines("work_deferred")
	require.Len(t, deferred, 1)
	assert.Contains(t, deferred[0], "level=DEBUG")
	failed := lines("work_failed")
	require.Len(t, failed, 2)
	assert.Contains(t, failed[0], "level=DEBUG")
	assert.Contains(t, failed[0], "will_retry=true")
	assert.Contains(t, failed[1], "level=WARN")
	assert.Contains(t, failed[1], "will_retry=false")
	assert.NotContains(t, logs, "level=INFO msg=work_", "no unit's routine event at Info")
}
