package runcue_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store/sqlite"
)

// TestSchema9FixtureRuns opens a database written by the runcue of schema 9
// (store/sqlite/testdata/schema9.db), before submissions were bounded: its
// queued units with a 20 KiB target, NUL and Latin-1 in targets, a
// non-UTF-8 ID and idempotency key and a 2 KiB key load and run, and its
// Latin-1 keyed instance is listed.
func TestSchema9FixtureRuns(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("store", "sqlite", "testdata", "schema9.db"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "schema9.db")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	ctx := t.Context()
	c, err := runcue.Open(path, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 2}))
	var mu sync.Mutex // b's handlers run at once
	seen := map[string]string{}
	require.NoError(t, c.Task("a", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, c.Task("b", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		seen[w.ID] = w.Target
		return nil, nil
	}}))
	require.NoError(t, c.ResumeTask(ctx, "b"))
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Drain(ctx))
	for _, id := range []string{"queued-1", "queued-2", "long-target", "nul-target", "latin1-target", "id-\xff", "long-key", "latin1-key"} {
		wi, err := c.Get(ctx, id)
		require.NoError(t, err, id)
		assert.Equal(t, runcue.StateCompleted, wi.State, id)
	}
	assert.Equal(t, strings.Repeat("t", 20<<10), seen["long-target"])
	assert.Equal(t, "a\x00b", seen["nul-target"])
	assert.Equal(t, "caf\xe9", seen["latin1-target"])
	st, err := c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 2, st.PausedKeys, "api:slow and the Latin-1 instance")
	// A name stored before keys were checked can still be controlled.
	require.NoError(t, c.ResumeService(ctx, "api:caf\xe9"))
	st, err = c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 1, st.PausedKeys)
	assert.ErrorIs(t, c.PauseService(ctx, "api:na\xefve"), runcue.ErrInvalid, "a new one cannot be made")
}

// TestSchema10FixtureRecovers opens a database whose owner died mid-run
// under schema 10 (store/sqlite/testdata/schema10.db): the new owner (on a
// clock a minute after the fixture's starts) runs the unit left running
// again, counts the logged starts in its rate window and budget as one
// request each, and keeps the keyed instance's open circuit.
func TestSchema10FixtureRecovers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("store", "sqlite", "testdata", "schema10.db"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "schema10.db")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	ctx := t.Context()
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	logged, err := st.ServiceLog(ctx, "api", time.Time{})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	require.Len(t, logged, 4)
	clk := clock.NewFake(logged[3].At.Add(time.Minute))
	c, err := runcue.Open(path, runcue.Config{Logger: quietLogger, Clock: clk})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 4, RateLimit: 10, RateWindow: time.Hour,
		Budgets: []runcue.Budget{{Requests: 100, Per: runcue.PerDay}}}))
	require.NoError(t, c.Service("host", runcue.Service{CircuitThreshold: 1, CircuitTimeout: time.Hour}))
	require.NoError(t, c.Task("a", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, c.Task("k", runcue.Task{ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} },
		Handler: noop}))
	require.NoError(t, c.Task("b", runcue.Task{Handler: noop}))
	require.NoError(t, c.Start(ctx))
	wi, err := c.Wait(ctx, "running-1")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	require.Len(t, wi.Attempts, 2)
	assert.Equal(t, "abandoned", wi.Attempts[0].Outcome, "the dead owner's run")
	api, err := c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 5, api.InWindow, "4 logged starts, and the run again")
	require.Len(t, api.Budgets, 1)
	assert.Equal(t, 5, api.Budgets[0].Used)
	host, err := c.ServiceStatus(ctx, "host:example.org")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitOpen, host.Circuit, "restored from its circuit meter's state")
}
