package storetest

import (
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: what Stats reads (the kept counts are checked after every
// test by Run).

func testStats(t *testing.T, h *harness) {
	_, ok, err := h.st.OldestQueued(h.ctx)
	require.NoError(t, err)
	assert.False(t, ok, "nothing queued")

	a, b, c := h.unit("a"), h.unit("a"), h.unit("b")
	h.insert(a, b, c)
	first := h.now
	oldest, ok, err := h.st.OldestQueued(h.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, oldest.Equal(first))

	minute := h.now.Truncate(time.Minute)
	at := h.tick()
	for i, u := range []*store.Unit{a, b} {
		h.apply(&store.Claim{ID: u.ID, Owner: "owner", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
			Wait:   []time.Duration{3 * time.Millisecond, 2 * time.Second}[i],
			Events: []store.Event{{Type: "work_started", Task: "a", Attempt: 1}}})
	}
	h.finish(a.ID, 1, store.Completed, func(f *store.Finish) {
		f.Events = []store.Event{{Type: "work_completed", Task: "a", Attempt: 1}}
	})
	h.finish(b.ID, 1, store.Queued, func(f *store.Finish) {
		f.Events = []store.Event{{Type: "work_failed", Task: "a", Attempt: 1, Detail: &store.EventData{Error: "x", WillRetry: true}},
			{Type: "work_retrying", Task: "a", Attempt: 1}}
	})
	oldest, _, err = h.st.OldestQueued(h.ctx)
	require.NoError(t, err)
	assert.True(t, oldest.Equal(first), "b is queued again, and was submitted first")

	acts, err := h.st.Activity(h.ctx, minute)
	require.NoError(t, err)
	got := map[string]int{}
	for _, x := range acts {
		assert.False(t, x.Minute.Before(minute))
		got[x.Task+":"+x.Kind] += x.N
	}
	assert.Equal(t, map[string]int{"a:work_started": 2, "a:work_completed": 1, "a:work_failed_retry": 1}, got,
		"a plain work_retrying is not counted")
	evs := h.events(0)
	assert.JSONEq(t, `{"error":"x","will_retry":true}`, string(evs[len(evs)-2].Data), "Data is written from Detail")
	waits, err := h.st.QueueWaits(h.ctx, minute)
	require.NoError(t, err)
	require.Len(t, waits, len(store.QueueWaitBounds)+1)
	assert.Equal(t, int64(1), waits[store.WaitBucket(3*time.Millisecond)])
	assert.Equal(t, int64(1), waits[store.WaitBucket(2*time.Second)])
	assert.Equal(t, 1, store.WaitBucket(3*time.Millisecond), "up to 5ms")

	// Pruned after their minute.
	h.apply(&store.Prune{ActivityBefore: h.now.Add(2 * time.Minute)})
	acts, err = h.st.Activity(h.ctx, time.Time{})
	require.NoError(t, err)
	assert.Empty(t, acts)
	waits, err = h.st.QueueWaits(h.ctx, time.Time{})
	require.NoError(t, err)
	assert.Equal(t, make([]int64, len(store.QueueWaitBounds)+1), waits)
}
