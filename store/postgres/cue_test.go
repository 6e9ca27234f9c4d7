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
