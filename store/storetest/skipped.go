package storetest

import (
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: the skipped state, a finished outcome that is not a failure.

func testSkipped(t *testing.T, h *harness) {
	skip := h.unit("a", func(u *store.Unit) { u.IdempotencyKey = "once" })
	waiting := h.unit("b", func(u *store.Unit) { u.DependsOn = []string{skip.ID} })
	h.insert(skip, waiting)
	h.claim(skip.ID, 1)
	r := h.finish(skip.ID, 1, store.Skipped, func(f *store.Finish) {
		f.Error, f.ErrorKind = "not modified", "skipped"
		f.Result = []byte(`"ignored"`)
		f.Propagate = true // even if asked: a skip is no failure
	})
	require.True(t, r.Applied)
	got := h.get(skip.ID)
	assert.Equal(t, store.Skipped, got.State)
	assert.True(t, got.State.Terminal())
	assert.True(t, got.State.Valid())
	assert.False(t, got.FinishedAt.IsZero(), "a skipped unit is finished")
	assert.Equal(t, "not modified", got.Error)
	assert.Equal(t, "skipped", got.ErrorKind)
	assert.Zero(t, got.Failures)
	assert.Empty(t, got.Result, "only completed units store a result")
	assert.Equal(t, store.Queued, h.get(waiting.ID).State, "its dependents are not failed by the store")

	// A unit submitted after the skip may depend on it.
	late := h.unit("b", func(u *store.Unit) { u.DependsOn = []string{skip.ID} })
	r = h.insert(late)
	assert.Equal(t, store.Queued, r.Units[0].State)

	// Its idempotency key is spent, as a completed unit's is.
	again := h.unit("a", func(u *store.Unit) { u.IdempotencyKey = "once" })
	r = h.apply(&store.Insert{Units: []*store.Unit{again}, At: h.tick()})[0]
	require.NoError(t, r.Err)
	assert.True(t, r.Units[0].Duplicate)
	assert.Equal(t, skip.ID, r.Units[0].ID)

	// It is listed by state, never requeued as failed, and pruned.
	list, err := h.st.ListUnits(h.ctx, store.ListFilter{States: []store.State{store.Skipped}, Limit: 10})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, skip.ID, list[0].ID)
	r = h.apply(&store.Requeue{At: h.tick()})[0]
	assert.Empty(t, r.IDs)
	assert.Equal(t, 1, h.apply(&store.Prune{Before: h.tick()})[0].Count)
	_, err = h.st.GetUnit(h.ctx, skip.ID)
	assert.ErrorIs(t, err, store.ErrNotFound)
}
