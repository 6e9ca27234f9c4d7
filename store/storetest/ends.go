package storetest

import (
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: ends and returns (propagation, Cancel, Requeue, FailQueued).

func testPropagate(t *testing.T, h *harness) {
	c := chain(h, 4)
	side := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{c[1].ID} })
	h.insert(side)
	h.claim(c[0].ID, 1)
	r := h.finish(c[0].ID, 1, store.Failed, func(f *store.Finish) { f.Propagate = true })
	require.True(t, r.Applied)
	for _, u := range append(c[1:], side) {
		got := h.get(u.ID)
		assert.Equal(t, store.Failed, got.State, u.ID)
		assert.Equal(t, "prerequisite_failed", got.ErrorKind, u.ID)
	}
	assert.Len(t, r.Events, 4, "one event per failed dependent, in the same transaction")

	// A cancelled root: direct dependents fail with prerequisite_cancelled,
	// theirs with prerequisite_failed.
	c = chain(h, 3)
	h.claim(c[0].ID, 1)
	h.finish(c[0].ID, 1, store.Cancelled, func(f *store.Finish) { f.Propagate = true })
	assert.Equal(t, "prerequisite_cancelled", h.get(c[1].ID).ErrorKind)
	assert.Equal(t, "prerequisite_failed", h.get(c[2].ID).ErrorKind)

	// Cascade: dependents are cancelled.
	c = chain(h, 3)
	h.claim(c[0].ID, 1)
	h.finish(c[0].ID, 1, store.Cancelled, func(f *store.Finish) { f.Propagate, f.CascadeCancel = true, true })
	assert.Equal(t, store.Cancelled, h.get(c[1].ID).State)
	assert.Equal(t, store.Cancelled, h.get(c[2].ID).State)

	// Without Propagate nothing happens to dependents.
	c = chain(h, 2)
	h.claim(c[0].ID, 1)
	h.finish(c[0].ID, 1, store.Failed)
	assert.Equal(t, store.Queued, h.get(c[1].ID).State)
}

func testCancel(t *testing.T, h *harness) {
	q := h.unit("a")
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{q.ID} })
	h.insert(q, dep)
	r := h.apply(&store.Cancel{ID: q.ID, At: h.tick(), Reason: "user"})[0]
	require.True(t, r.Applied)
	assert.Equal(t, store.Queued, r.State)
	got := h.get(q.ID)
	assert.Equal(t, store.Cancelled, got.State)
	assert.Equal(t, "user", got.Error)
	assert.Equal(t, "prerequisite_cancelled", h.get(dep.ID).ErrorKind)
	require.NotEmpty(t, r.Events)
	assert.Equal(t, store.EventWorkCancelled, r.Events[0].Type)
	assert.Equal(t, "a", r.Events[0].Task)

	// Cascade.
	q2 := h.unit("a")
	dep2 := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{q2.ID} })
	h.insert(q2, dep2)
	h.apply(&store.Cancel{ID: q2.ID, At: h.tick(), Cascade: true})
	assert.Equal(t, store.Cancelled, h.get(dep2.ID).State)

	// Running: only a request.
	run := h.unit("a")
	h.insert(run)
	h.claim(run.ID, 1)
	r = h.apply(&store.Cancel{ID: run.ID, At: h.tick(), Cascade: true})[0]
	assert.False(t, r.Applied)
	assert.Equal(t, store.Running, r.State)
	assert.True(t, h.get(run.ID).CancelRequested)
	assert.Equal(t, store.Running, h.get(run.ID).State)
	require.Len(t, r.Events, 1, "the request is an event, so the owner learns of it")
	assert.Equal(t, store.EventWorkCancelRequested, r.Events[0].Type)
	assert.JSONEq(t, `{"cascade":true,"reason":""}`, string(r.Events[0].Data))
	r = h.apply(&store.Cancel{ID: run.ID, At: h.tick()})[0]
	assert.Empty(t, r.Events, "asked once")

	// Finished units are unchanged; unknown IDs are reported.
	done := h.unit("a")
	h.insert(done)
	h.claim(done.ID, 1)
	h.finish(done.ID, 1, store.Completed)
	r = h.apply(&store.Cancel{ID: done.ID, At: h.tick()})[0]
	assert.False(t, r.Applied)
	assert.Equal(t, store.Completed, r.State)
	assert.Equal(t, store.Completed, h.get(done.ID).State)
	r = h.apply(&store.Cancel{ID: "ghost", At: h.tick()})[0]
	assert.ErrorIs(t, r.Err, store.ErrNotFound)

	// A queued unit with cancel requested cannot be claimed.
	q3 := h.unit("a")
	h.insert(q3)
	h.claim(q3.ID, 1)
	h.apply(&store.Cancel{ID: q3.ID, At: h.tick()})
	h.finish(q3.ID, 1, store.Queued)
	assert.False(t, h.get(q3.ID).CancelRequested, "finishing clears the request")
}

func testRequeue(t *testing.T, h *harness) {
	failA, failB, other := h.unit("a"), h.unit("b"), h.unit("a")
	h.insert(failA, failB, other)
	for _, u := range []*store.Unit{failA, failB} {
		h.claim(u.ID, 1)
		h.finish(u.ID, 1, store.Failed, func(f *store.Finish) { f.SpendBudget = true; f.Propagate = true })
	}
	cutoff := h.tick()
	late := h.unit("a")
	h.insert(late)
	h.claim(late.ID, 1)
	h.finish(late.ID, 1, store.Failed)
	r := h.apply(&store.Requeue{Tasks: []string{"a"}, FinishedBefore: cutoff, At: h.tick()})[0]
	assert.Equal(t, []string{failA.ID}, r.IDs, "only failed units of the task that finished before the cutoff")
	got := h.get(failA.ID)
	assert.Equal(t, store.Queued, got.State)
	assert.Zero(t, got.Failures, "a fresh budget")
	assert.Empty(t, got.Error)
	assert.True(t, got.FinishedAt.IsZero())
	assert.Equal(t, store.Failed, h.get(failB.ID).State)
	assert.Equal(t, store.Failed, h.get(late.ID).State)
	assert.Equal(t, store.Queued, h.get(other.ID).State)

	// By ID, with dependents that failed only because of it.
	c := chain(h, 3)
	alsoDead := h.unit("a")
	h.insert(alsoDead)
	h.claim(alsoDead.ID, 1)
	h.finish(alsoDead.ID, 1, store.Failed)
	two := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{c[0].ID, alsoDead.ID} })
	h.insert(two)
	h.claim(c[0].ID, 1)
	h.finish(c[0].ID, 1, store.Failed, func(f *store.Finish) { f.Propagate = true })
	require.Equal(t, store.Failed, h.get(c[2].ID).State)
	r = h.apply(&store.Requeue{IDs: []string{c[0].ID}, At: h.tick()})[0]
	assert.Equal(t, []string{c[0].ID, c[1].ID, c[2].ID}, r.IDs)
	for _, u := range c {
		assert.Equal(t, store.Queued, h.get(u.ID).State)
	}
	assert.Equal(t, store.Failed, h.get(two.ID).State, "a dependent with another dead dependency stays failed")
	assert.Len(t, r.Events, 3)
	// Requeueing a unit that is not failed does nothing.
	r = h.apply(&store.Requeue{IDs: []string{other.ID}, At: h.tick()})[0]
	assert.Empty(t, r.IDs)
	assert.False(t, r.Applied)
}

func testFailQueued(t *testing.T, h *harness) {
	c := chain(h, 3)
	r := h.apply(&store.FailQueued{ID: c[0].ID, At: h.tick(), Error: "waited too long", ErrorKind: "dependency_timeout",
		Events: []store.Event{{Type: "work_failed", Task: "a"}}})[0]
	require.True(t, r.Applied)
	got := h.get(c[0].ID)
	assert.Equal(t, store.Failed, got.State)
	assert.Equal(t, "dependency_timeout", got.ErrorKind)
	assert.Equal(t, "prerequisite_failed", h.get(c[2].ID).ErrorKind)
	assert.Len(t, r.Events, 3)
	assert.False(t, h.apply(&store.FailQueued{ID: c[0].ID, At: h.tick()})[0].Applied, "only a queued unit")
}
