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
