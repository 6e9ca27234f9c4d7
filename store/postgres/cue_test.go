package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/postgres"
)

// TestCueOnPostgres: a Cue on PostgreSQL runs a graph of units submitted
// dependents first, each once and after its dependencies; a second handle
// (another process's, as far as the database knows) sees every unit
// completed and reads the log the owner wrote.
func TestCueOnPostgres(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var mu sync.Mutex
	done := map[string]bool{}
	var early []string
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		var p struct{ Dep string }
		_ = w.Bind(&p)
		mu.Lock()
		defer mu.Unlock()
		if p.Dep != "" && !done[p.Dep] {
			early = append(early, w.ID)
		}
		done[w.ID] = true
		return map[string]string{"id": w.ID}, nil
	}}))
	var subs []runcue.Submission
	for i := range 50 {
		dep := fmt.Sprint("p", i)
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("d", i), DependsOn: []string{dep}, Params: map[string]string{"Dep": dep}})
	}
	for i := range 50 {
		subs = append(subs, runcue.Submission{Task: "t", ID: fmt.Sprint("p", i)})
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Drain(ctx))
	require.NoError(t, c.Stop(ctx))
	require.NoError(t, c.Close())
	require.NoError(t, st.Close())
	assert.Empty(t, early, "dependents started before their dependencies completed")
	assert.Len(t, done, 100)

	other, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer other.Close()
	reader, err := runcue.New(other, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer reader.Close()
	stats, err := reader.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 100, stats.States[runcue.StateCompleted])
	evs, err := reader.WorkEvents(ctx, "d7", 0, 100)
	require.NoError(t, err)
	var types []runcue.EventType
	for _, e := range evs {
		types = append(types, e.Type)
	}
	assert.Equal(t, []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted}, types)
}

// TestPollOnly: with Options.PollOnly (a transaction-pooling proxy) there
// is no LISTEN; an owner still finds units another process submitted, by
// polling.
func TestPollOnly(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	st, err := postgres.Open(ctx, u, postgres.Options{PollOnly: true})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Watch(ctx)
	require.Error(t, err, "no change notifications")
	c, err := runcue.New(st, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	noop := runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}
	require.NoError(t, c.Task("t", noop))
	require.NoError(t, c.Start(ctx))

	other, err := postgres.Open(ctx, u, postgres.Options{PollOnly: true})
	require.NoError(t, err)
	defer other.Close()
	submitter, err := runcue.New(other, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer submitter.Close()
	require.NoError(t, submitter.Task("t", noop))
	sub, err := submitter.Submit(ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wi, err := c.Wait(wctx, sub.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	require.NoError(t, c.Stop(ctx))
}

// TestDurableSubscriptionOnPostgres: a durable subscription read by a Cue
// that does not own the database (another host's, as far as the database
// knows) resumes after its acknowledged position when opened again, from
// another handle, and receives the rest exactly.
func TestDurableSubscriptionOnPostgres(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	owner, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer owner.Close()
	noop := runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}
	require.NoError(t, owner.Task("t", noop))

	reader := func() (*runcue.Cue, func()) {
		rs, err := postgres.Open(ctx, u, postgres.Options{})
		require.NoError(t, err)
		c, err := runcue.New(rs, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		return c, func() { c.Close(); rs.Close() }
	}
	r1, close1 := reader()
	evs, cancel, err := r1.Subscribe(ctx, runcue.SubscribeOptions{Name: "ui", Types: []runcue.EventType{runcue.EventWorkCompleted}, After: runcue.SeqNow})
	require.NoError(t, err)
	var subs []runcue.Submission
	for range 10 {
		subs = append(subs, runcue.Submission{Task: "t"})
	}
	_, err = owner.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	require.NoError(t, owner.Start(ctx))
	var got []string
	for len(got) < 4 {
		select {
		case ev := <-evs:
			got = append(got, ev.WorkID)
			require.NoError(t, r1.Ack(ctx, "ui", ev.Seq))
		case <-time.After(time.Minute):
			t.Fatal("no completion delivered")
		}
	}
	cancel()
	close1()
	require.NoError(t, owner.Drain(ctx))

	r2, close2 := reader()
	defer close2()
	evs, cancel, err = r2.Subscribe(ctx, runcue.SubscribeOptions{Name: "ui"})
	require.NoError(t, err)
	defer cancel()
	for len(got) < 10 {
		select {
		case ev := <-evs:
			got = append(got, ev.WorkID)
		case <-time.After(time.Minute):
			t.Fatalf("resumed subscription delivered %d of 10", len(got))
		}
	}
	seen := map[string]bool{}
	for _, id := range got {
		assert.False(t, seen[id], "%s delivered twice", id)
		seen[id] = true
	}
	require.NoError(t, owner.Stop(ctx))
}

// TestBatchOnPostgres: a batch task on PostgreSQL: each batch's claims
// commit together and its first unit logs the batch's summed tokens;
// every unit ends with its own outcome (one failing its first run is
// retried alone), and the service log holds, per batch, one start of the
// batch's tokens.
func TestBatchOnPostgres(t *testing.T) {
	ctx := context.Background()
	u := schemaURL(t)
	st, err := postgres.Open(ctx, u, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("embed", runcue.Service{RateLimit: 1000, RateWindow: time.Minute,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 1_000_000, Window: time.Minute}}}))
	var mu sync.Mutex
	var sizes []int
	require.NoError(t, c.Task("embed", runcue.Task{Services: []string{"embed"},
		Retry: runcue.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Batch: &runcue.Batch{Max: 20, MaxCost: runcue.Costs{"tokens": 500},
			Handler: func(_ context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
				mu.Lock()
				sizes = append(sizes, len(ws))
				mu.Unlock()
				out := make([]runcue.Outcome, len(ws))
				for i, w := range ws {
					if w.ID == "u7" && w.Attempt == 1 {
						out[i].Err = fmt.Errorf("rejected")
					} else {
						out[i].Result = w.ID
					}
				}
				return out, nil
			}}}))
	var subs []runcue.Submission
	for i := range 200 {
		subs = append(subs, runcue.Submission{Task: "embed", ID: fmt.Sprint("u", i), Cost: runcue.Costs{"tokens": 40}})
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Drain(ctx))
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 200, stats.States[runcue.StateCompleted])
	info, err := c.Get(ctx, "u7")
	require.NoError(t, err)
	assert.Equal(t, 2, info.Runs, "retried alone")
	mu.Lock()
	defer mu.Unlock()
	units := 0
	for _, n := range sizes {
		assert.LessOrEqual(t, n, 12, "at most 500 tokens (12 units of 40) a batch")
		units += n
	}
	assert.Equal(t, 201, units)
	sv, err := c.ServiceStatus(ctx, "embed")
	require.NoError(t, err)
	require.Len(t, sv.Meters, 1)
	assert.Equal(t, int64(201*40), sv.Meters[0].Used, "the batches' summed tokens")
	assert.Equal(t, len(sizes), sv.InWindow, "one request a batch")
	require.NoError(t, c.Stop(ctx))

	// A new owner rebuilds both from the service log.
	next, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer next.Close()
	require.NoError(t, next.Service("embed", runcue.Service{RateLimit: 1000, RateWindow: time.Minute,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 1_000_000, Window: time.Minute}}}))
	require.NoError(t, next.Start(ctx))
	sv, err = next.ServiceStatus(ctx, "embed")
	require.NoError(t, err)
	require.Len(t, sv.Meters, 1)
	assert.Equal(t, int64(201*40), sv.Meters[0].Used, "restored from the log")
	assert.Equal(t, len(sizes), sv.InWindow, "restored from the log")
	t.Logf("%d batches for 201 runs", len(sizes))
}
