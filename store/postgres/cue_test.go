package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

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
