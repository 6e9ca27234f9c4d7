package storetest

import (
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: Insert (IDs, all-or-none, idempotency, dependencies, the queue bound).

func testInsertGet(t *testing.T, h *harness) {
	runAt := h.now.Add(time.Hour)
	u := h.unit("fetch", func(u *store.Unit) {
		u.Target = "https://example.org"
		u.Params = []byte(`{"a":1}`)
		u.Timeout = 90 * time.Second
		u.RunAt = runAt
		u.IdempotencyKey = "k1"
		u.DependencyDeadline = runAt.Add(time.Minute)
		u.Retry = []byte(`{"max":5}`)
		u.Trace = []byte(`{"traceparent":"x"}`)
		u.Costs = map[string]int64{"tokens": 1200, "requests": 1}
	})
	u2 := h.unit("fetch")
	r := h.insert(u, u2)
	require.True(t, r.Applied)
	require.Len(t, r.Units, 2)
	assert.Equal(t, u.ID, r.Units[0].ID)
	assert.False(t, r.Units[0].Duplicate)
	assert.Equal(t, store.Queued, r.Units[0].State)
	assert.Greater(t, r.Units[1].Seq, r.Units[0].Seq, "Seq follows submission order")
	require.Len(t, r.Events, 2)
	assert.Equal(t, store.EventWorkQueued, r.Events[0].Type)
	assert.Equal(t, u.ID, r.Events[0].WorkID)
	assert.Equal(t, "fetch", r.Events[0].Task)
	assert.Equal(t, r.Events[0].Seq+1, r.Events[1].Seq)
	assert.Equal(t, h.now.UnixNano(), r.Events[0].Time.UnixNano(), "event time defaults to the op's time")

	got := h.get(u.ID)
	assert.Equal(t, r.Units[0].Seq, got.Seq)
	assert.Equal(t, "fetch", got.Task)
	assert.Equal(t, "https://example.org", got.Target)
	assert.JSONEq(t, `{"a":1}`, string(got.Params))
	assert.Equal(t, store.Queued, got.State)
	assert.Equal(t, 90*time.Second, got.Timeout)
	assert.True(t, got.RunAt.Equal(runAt))
	assert.True(t, got.CreatedAt.Equal(h.now), "CreatedAt defaults to the op's time")
	assert.Equal(t, "k1", got.IdempotencyKey)
	assert.True(t, got.DependencyDeadline.Equal(runAt.Add(time.Minute)))
	assert.Equal(t, `{"max":5}`, string(got.Retry))
	assert.Equal(t, `{"traceparent":"x"}`, string(got.Trace))
	assert.Equal(t, map[string]int64{"tokens": 1200, "requests": 1}, got.Costs)
	assert.Nil(t, h.get(u2.ID).Costs, "no costs: nil")
	assert.Zero(t, got.Runs)
	assert.True(t, got.StartedAt.IsZero())

	_, err := h.st.GetUnit(h.ctx, "nope")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

func testInsertDuplicateID(t *testing.T, h *harness) {
	h.insert(h.unit("a", func(u *store.Unit) { u.ID = "same" }))
	other := h.unit("a")
	res := h.apply(
		&store.Insert{Units: []*store.Unit{{ID: "same", Task: "a"}}, At: h.tick()},
		&store.Insert{Units: []*store.Unit{other}, At: h.tick()},
	)
	assert.ErrorIs(t, res[0].Err, store.ErrDuplicateID)
	assert.Empty(t, res[0].Events)
	require.NoError(t, res[1].Err, "a failed op does not fail its batch")
	h.get(other.ID)
	// The same ID twice in one insert.
	res = h.apply(&store.Insert{Units: []*store.Unit{{ID: "x", Task: "a"}, {ID: "x", Task: "a"}}, At: h.tick()})
	assert.ErrorIs(t, res[0].Err, store.ErrDuplicateID)
	_, err := h.st.GetUnit(h.ctx, "x")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

func testInsertAllOrNone(t *testing.T, h *harness) {
	h.insert(h.unit("a", func(u *store.Unit) { u.ID = "taken" }))
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	a, b := h.unit("a"), h.unit("a", func(u *store.Unit) { u.ID = "taken" })
	res := h.apply(&store.Insert{Units: []*store.Unit{a, b}, At: h.tick()})
	require.ErrorIs(t, res[0].Err, store.ErrDuplicateID)
	_, err = h.st.GetUnit(h.ctx, a.ID)
	assert.ErrorIs(t, err, store.ErrNotFound, "no unit of a failed insert is stored")
	last2, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, last, last2, "no event of a failed insert is stored")
	// Event sequence numbers stay contiguous after a rolled-back op.
	r := h.insert(h.unit("a"))
	assert.Equal(t, last+1, r.Events[0].Seq)
}

func testIdempotency(t *testing.T, h *harness) {
	key := func(k string) func(*store.Unit) { return func(u *store.Unit) { u.IdempotencyKey = k } }
	first := h.insert(h.unit("a", key("k")))
	dup := h.insert(h.unit("a", key("k")))
	assert.True(t, dup.Units[0].Duplicate)
	assert.Equal(t, first.Units[0].ID, dup.Units[0].ID)
	assert.Equal(t, store.Queued, dup.Units[0].State)
	assert.Empty(t, dup.Events, "a duplicate appends no event")

	// Running and completed units keep their key.
	id := first.Units[0].ID
	h.claim(id, 1)
	assert.True(t, h.insert(h.unit("a", key("k"))).Units[0].Duplicate)
	h.finish(id, 1, store.Completed)
	d := h.insert(h.unit("a", key("k")))
	assert.True(t, d.Units[0].Duplicate)
	assert.Equal(t, store.Completed, d.Units[0].State)

	// A failed unit: reject or resubmit.
	f := h.insert(h.unit("a", key("f")))
	fid := f.Units[0].ID
	h.claim(fid, 1)
	h.finish(fid, 1, store.Failed)
	// Rejected: that unit alone, and the units of the batch that depend on
	// it; the rest of the batch is stored.
	refusedU := h.unit("a", key("f"))
	dependent := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{refusedU.ID} })
	transitive := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{dependent.ID} })
	other := h.unit("a")
	res := h.apply(&store.Insert{Units: []*store.Unit{transitive, refusedU, dependent, other}, At: h.tick()})
	require.NoError(t, res[0].Err)
	assert.ErrorIs(t, res[0].Units[1].Refused, store.ErrDuplicate)
	assert.ErrorIs(t, res[0].Units[2].Refused, store.ErrDependencyRefused)
	assert.ErrorIs(t, res[0].Units[0].Refused, store.ErrDependencyRefused)
	assert.NoError(t, res[0].Units[3].Refused)
	assert.Equal(t, store.Queued, h.get(other.ID).State)
	for _, u := range []*store.Unit{refusedU, dependent, transitive} {
		_, err := h.st.GetUnit(h.ctx, u.ID)
		assert.ErrorIs(t, err, store.ErrNotFound, "a refused unit is not stored")
	}
	assert.Equal(t, []string{"work_queued:" + other.ID}, types(res[0].Events))
	fresh := h.unit("a", key("f"))
	res = h.apply(&store.Insert{Units: []*store.Unit{fresh}, At: h.tick(), OnFailedDuplicate: store.ResubmitFailedDuplicate})
	require.NoError(t, res[0].Err)
	assert.False(t, res[0].Units[0].Duplicate)
	assert.Equal(t, fresh.ID, res[0].Units[0].ID)
	assert.Equal(t, "f", h.get(fresh.ID).IdempotencyKey)
	assert.Empty(t, h.get(fid).IdempotencyKey, "the key moved to the new unit")
	// A cancelled unit's key is handled like a failed one's.
	cn := h.insert(h.unit("a", key("c")))
	h.apply(&store.Cancel{ID: cn.Units[0].ID, At: h.tick()})
	res = h.apply(&store.Insert{Units: []*store.Unit{h.unit("a", key("c"))}, At: h.tick()})
	require.NoError(t, res[0].Err)
	assert.ErrorIs(t, res[0].Units[0].Refused, store.ErrDuplicate)
	// Two units with one key in one insert: the second is a duplicate.
	a, b := h.unit("a", key("pair")), h.unit("a", key("pair"))
	r := h.insert(a, b)
	assert.False(t, r.Units[0].Duplicate)
	assert.True(t, r.Units[1].Duplicate)
	assert.Equal(t, a.ID, r.Units[1].ID)
	// A dependent of a duplicate depends on the existing unit.
	again := h.unit("a", key("pair"))
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{again.ID} })
	r = h.insert(again, dep)
	assert.True(t, r.Units[0].Duplicate)
	assert.Equal(t, []string{a.ID}, h.get(dep.ID).DependsOn)
}

func testDependencies(t *testing.T, h *harness) {
	root := h.unit("a")
	h.insert(root)
	// Forward reference inside the batch: b depends on c, which comes later.
	b := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{"c-later", root.ID} })
	c := h.unit("a", func(u *store.Unit) { u.ID = "c-later" })
	r := h.insert(b, c)
	assert.Equal(t, []string{"c-later", root.ID}, h.get(b.ID).DependsOn, "dependencies keep their order")
	assert.Less(t, r.Units[1].Seq, r.Units[0].Seq, "a dependency is stored before its dependent")
	deps, err := h.st.Dependents(h.ctx, root.ID)
	require.NoError(t, err)
	assert.Equal(t, []string{b.ID}, deps)

	res := h.apply(&store.Insert{Units: []*store.Unit{h.unit("a", func(u *store.Unit) { u.DependsOn = []string{"ghost"} })}, At: h.tick()})
	assert.ErrorIs(t, res[0].Err, store.ErrUnknownDependency)

	x := h.unit("a", func(u *store.Unit) { u.ID = "x"; u.DependsOn = []string{"z"} })
	y := h.unit("a", func(u *store.Unit) { u.ID = "y"; u.DependsOn = []string{"x"} })
	z := h.unit("a", func(u *store.Unit) { u.ID = "z"; u.DependsOn = []string{"y"} })
	free := h.unit("a")
	res = h.apply(&store.Insert{Units: []*store.Unit{free, x, y, z}, At: h.tick()})
	var ce *store.CycleError
	require.ErrorAs(t, res[0].Err, &ce)
	assert.ErrorIs(t, res[0].Err, store.ErrCycle)
	assert.ElementsMatch(t, []string{"x", "y", "z"}, ce.Members)
	_, err = h.st.GetUnit(h.ctx, free.ID)
	assert.ErrorIs(t, err, store.ErrNotFound, "nothing of a cyclic batch is stored")
}

func testDeadDependency(t *testing.T, h *harness) {
	dead := h.unit("a")
	h.insert(dead)
	h.claim(dead.ID, 1)
	h.finish(dead.ID, 1, store.Failed)
	gone := h.unit("a")
	h.insert(gone)
	h.apply(&store.Cancel{ID: gone.ID, At: h.tick()})

	d1 := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{dead.ID} })
	d2 := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{gone.ID} })
	d3 := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{d1.ID} })
	res := h.apply(&store.Insert{Units: []*store.Unit{d1, d2, d3}, At: h.tick()})
	require.NoError(t, res[0].Err)
	assert.Equal(t, store.Failed, res[0].Units[0].State)
	assert.Equal(t, "prerequisite_failed", h.get(d1.ID).ErrorKind)
	assert.Equal(t, "prerequisite_cancelled", h.get(d2.ID).ErrorKind)
	assert.Equal(t, store.Failed, h.get(d3.ID).State, "a dependent of a unit failed in the same insert fails too")
	assert.Equal(t, []string{"work_queued:" + d1.ID, "work_failed:" + d1.ID, "work_queued:" + d2.ID, "work_failed:" + d2.ID,
		"work_queued:" + d3.ID, "work_failed:" + d3.ID}, types(res[0].Events))
}

func testBackpressure(t *testing.T, h *harness) {
	var first []*store.Unit
	for range 3 {
		first = append(first, h.unit("a"))
	}
	h.insert(first...)
	over := []*store.Unit{h.unit("a"), h.unit("a")}
	r := h.apply(&store.Insert{Units: over, At: h.tick(), MaxQueued: 4})[0]
	require.ErrorIs(t, r.Err, store.ErrBackpressure)
	_, err := h.st.GetUnit(h.ctx, over[0].ID)
	assert.ErrorIs(t, err, store.ErrNotFound, "a refused insert stores nothing")
	n, _ := h.st.QueuedCount(h.ctx)
	assert.Equal(t, 3, n)
	r = h.apply(&store.Insert{Units: []*store.Unit{h.unit("a")}, At: h.tick(), MaxQueued: 4})[0]
	require.NoError(t, r.Err, "room for one")

	// Running units do not count.
	h.claim(first[0].ID, 1)
	r = h.apply(&store.Insert{Units: []*store.Unit{h.unit("a")}, At: h.tick(), MaxQueued: 4})[0]
	require.NoError(t, r.Err)

	// Drop oldest: the oldest queued units are cancelled to make room,
	// one at a time, and the dependents failed with a dropped unit count
	// towards the room: here one drop makes room for two.
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{first[1].ID} })
	h.insert(dep) // now 5 queued
	fresh := []*store.Unit{h.unit("a"), h.unit("a")}
	r = h.apply(&store.Insert{Units: fresh, At: h.tick(), MaxQueued: 5, DropOldest: true})[0]
	require.NoError(t, r.Err)
	got := h.get(first[1].ID)
	assert.Equal(t, store.Cancelled, got.State)
	assert.Equal(t, "dropped", got.ErrorKind)
	assert.Equal(t, store.Queued, h.get(first[2].ID).State, "no more dropped than needed")
	assert.Equal(t, "prerequisite_cancelled", h.get(dep.ID).ErrorKind, "dropping propagates")
	var dropped int
	for _, e := range r.Events {
		if e.Type == store.EventWorkCancelled {
			dropped++
			assert.JSONEq(t, `{"reason":"dropped"}`, string(e.Data))
		}
	}
	assert.Equal(t, 1, dropped)
	n, _ = h.st.QueuedCount(h.ctx)
	assert.Equal(t, 5, n)
	// Without dependents, one drop per unit over the bound.
	r = h.apply(&store.Insert{Units: []*store.Unit{h.unit("a"), h.unit("a")}, At: h.tick(), MaxQueued: 5, DropOldest: true})[0]
	require.NoError(t, r.Err)
	assert.Equal(t, store.Cancelled, h.get(first[2].ID).State)
	n, _ = h.st.QueuedCount(h.ctx)
	assert.Equal(t, 5, n)
	// An insert larger than the bound cannot make room by dropping.
	var big []*store.Unit
	for range 6 {
		big = append(big, h.unit("a"))
	}
	r = h.apply(&store.Insert{Units: big, At: h.tick(), MaxQueued: 5, DropOldest: true})[0]
	assert.ErrorIs(t, r.Err, store.ErrBackpressure)
}
