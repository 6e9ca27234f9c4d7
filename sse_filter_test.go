package runcue_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// countingStore counts the events a store hands to subscribers.
type countingStore struct {
	store.Store
	read atomic.Int64
}

func (s *countingStore) EventsAfter(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	evs, err := s.Store.EventsAfter(ctx, after, limit)
	s.read.Add(int64(len(evs)))
	return evs, err
}

func (s *countingStore) MatchingEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	evs, err := s.Store.MatchingEvents(ctx, q)
	s.read.Add(int64(len(evs)))
	return evs, err
}

// TestFilteredSubscriptionReadsOnlyMatches: a subscription from the start
// of the log with a task or type filter reads only the events it delivers
// from the store, not the whole retained log (an SSE client asking for
// ?after=0&task=nothing used to make the Cue read everything).
func TestFilteredSubscriptionReadsOnlyMatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	cs := &countingStore{Store: st}
	c, err := runcue.New(cs, runcue.Config{Logger: quietLogger, EventBuffer: 16})
	require.NoError(t, err)
	defer c.Close()
	ctx := t.Context()
	require.NoError(t, c.Task("a", runcue.Task{Handler: noop}))
	require.NoError(t, c.Task("b", runcue.Task{Handler: noop}))
	require.NoError(t, c.Start(ctx))
	_, err = c.SubmitBatch(ctx, batchOf("a", 2000))
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))
	b, err := c.Submit(ctx, runcue.Submission{Task: "b"})
	require.NoError(t, err)
	_, err = c.Wait(ctx, b.ID)
	require.NoError(t, err)
	require.NoError(t, c.Drain(ctx))

	for _, o := range []runcue.SubscribeOptions{
		{After: 0, Tasks: []string{"b"}},
		{After: 0, Tasks: []string{"b"}, Types: []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted}},
	} {
		cs.read.Store(0)
		evs, cancel, err := c.Subscribe(ctx, o)
		require.NoError(t, err)
		for _, want := range []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted, runcue.EventWorkCompleted} {
			ev := <-evs
			assert.Equal(t, want, ev.Type)
			assert.Equal(t, b.ID, ev.WorkID)
		}
		cancel()
		assert.LessOrEqual(t, cs.read.Load(), int64(10), "read %d events from the store for 3 delivered (the log has over 6,000)", cs.read.Load())
	}
	cs.read.Store(0)
	evs, cancel, err := c.Subscribe(ctx, runcue.SubscribeOptions{After: 0, Types: []runcue.EventType{runcue.EventWorkCompleted}, Tasks: []string{"b"}})
	require.NoError(t, err)
	assert.Equal(t, b.ID, (<-evs).WorkID)
	cancel()
	assert.LessOrEqual(t, cs.read.Load(), int64(3))
}
