// Package storetest is the conformance suite for runcue stores. Every
// backend must pass Run:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) { ... })
//	}
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Opener returns a new, empty store, and a function that opens another
// handle (its own connections) on the same database. Both are closed by the
// suite.
type Opener func(t *testing.T) (st store.Store, again func() store.Store)

// Run runs the conformance suite.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"InsertGet", testInsertGet},
		{"InsertDuplicateID", testInsertDuplicateID},
		{"InsertAllOrNone", testInsertAllOrNone},
		{"Idempotency", testIdempotency},
		{"Dependencies", testDependencies},
		{"UnitStates", testUnitStates},
		{"DeadDependency", testDeadDependency},
		{"ClaimFinish", testClaimFinish},
		{"FinishPreconditions", testFinishPreconditions},
		{"ClaimFinishOneBatch", testClaimFinishOneBatch},
		{"RetryAndHistory", testRetryAndHistory},
		{"Propagate", testPropagate},
		{"Recover", testRecover},
		{"Cancel", testCancel},
		{"Requeue", testRequeue},
		{"Heartbeat", testHeartbeat},
		{"TasksServices", testTasksServices},
		{"ServiceLog", testServiceLog},
		{"Prune", testPrune},
		{"List", testList},
		{"LoadActiveCount", testLoadActiveCount},
		{"Events", testEvents},
		{"MatchingEvents", testMatchingEvents},
		{"Changed", testChanged},
		{"Acquire", testAcquire},
		{"ConcurrentApply", testConcurrentApply},
		{"ConcurrentReads", testConcurrentReads},
		{"Backpressure", testBackpressure},
		{"FailQueued", testFailQueued},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, again := open(t)
			h := &harness{t: t, st: st, again: again, ctx: context.Background(), now: time.Unix(1_800_000_000, 0)}
			t.Cleanup(func() { st.Close() })
			tc.fn(t, h)
			// Every test also checks the maintained queued count.
			n, err := st.QueuedCount(h.ctx)
			require.NoError(t, err)
			queued, err := st.ListUnits(h.ctx, store.ListFilter{States: []store.State{store.Queued}, Limit: 1 << 30})
			require.NoError(t, err)
			assert.Equal(t, len(queued), n, "QueuedCount after the test's ops")
		})
	}
}

type harness struct {
	t     *testing.T
	st    store.Store
	again func() store.Store
	ctx   context.Context
	now   time.Time
	n     int
}

func (h *harness) tick() time.Time {
	h.now = h.now.Add(time.Second)
	return h.now
}

func (h *harness) apply(ops ...store.Op) []store.Result {
	h.t.Helper()
	res, err := h.st.Apply(h.ctx, ops)
	require.NoError(h.t, err)
	require.Len(h.t, res, len(ops))
	return res
}

func (h *harness) unit(task string, mods ...func(*store.Unit)) *store.Unit {
	h.n++
	u := &store.Unit{ID: fmt.Sprintf("u%04d", h.n), Task: task, State: store.Queued}
	for _, m := range mods {
		m(u)
	}
	return u
}

func (h *harness) insert(units ...*store.Unit) store.Result {
	h.t.Helper()
	r := h.apply(&store.Insert{Units: units, At: h.tick()})[0]
	require.NoError(h.t, r.Err)
	return r
}

func (h *harness) get(id string) *store.Unit {
	h.t.Helper()
	u, err := h.st.GetUnit(h.ctx, id)
	require.NoError(h.t, err)
	return u
}

func (h *harness) claim(id string, run int) store.Result {
	h.t.Helper()
	at := h.tick()
	return h.apply(&store.Claim{ID: id, Owner: "owner", Run: run, At: at, LeaseExpires: at.Add(time.Minute),
		Events: []store.Event{{Type: "work_started", Task: "t", Attempt: run}}})[0]
}

func (h *harness) finish(id string, run int, state store.State, mods ...func(*store.Finish)) store.Result {
	h.t.Helper()
	at := h.tick()
	f := &store.Finish{ID: id, Owner: "owner", Run: run, At: at, State: state,
		Attempt: store.Attempt{Run: run, Start: at.Add(-time.Second), End: at, Outcome: string(state)}}
	for _, m := range mods {
		m(f)
	}
	return h.apply(f)[0]
}

func (h *harness) events(after int64) []store.Event {
	h.t.Helper()
	evs, err := h.st.EventsAfter(h.ctx, after, 10000)
	require.NoError(h.t, err)
	return evs
}

func types(evs []store.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+":"+e.WorkID)
	}
	return out
}

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

func testUnitStates(t *testing.T, h *harness) {
	q, r, c := h.unit("a"), h.unit("a"), h.unit("a")
	h.insert(q, r, c)
	h.claim(r.ID, 1)
	h.claim(c.ID, 1)
	h.finish(c.ID, 1, store.Completed)
	ids := []string{q.ID, r.ID, c.ID, "ghost"}
	for i := range 1200 { // more than one query's worth of IDs
		ids = append(ids, fmt.Sprintf("missing-%d", i))
	}
	states, err := h.st.UnitStates(h.ctx, ids)
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{q.ID: store.Queued, r.ID: store.Running, c.ID: store.Completed}, states)
	states, err = h.st.UnitStates(h.ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, states)
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

func testClaimFinish(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	r := h.claim(u.ID, 1)
	require.True(t, r.Applied)
	require.Len(t, r.Events, 1)
	assert.Equal(t, u.ID, r.Events[0].WorkID, "the store fills in the event's unit")
	got := h.get(u.ID)
	assert.Equal(t, store.Running, got.State)
	assert.Equal(t, 1, got.Runs)
	assert.Equal(t, "owner", got.LeasedBy)
	assert.True(t, got.LeaseExpiresAt.Equal(got.StartedAt.Add(time.Minute)))
	assert.False(t, h.claim(u.ID, 2).Applied, "a running unit cannot be claimed")

	fr := h.finish(u.ID, 1, store.Completed, func(f *store.Finish) {
		f.Result = []byte(`{"ok":true}`)
		f.Events = []store.Event{{Type: "work_completed", Task: "a", Attempt: 1}}
	})
	require.True(t, fr.Applied)
	got = h.get(u.ID)
	assert.Equal(t, store.Completed, got.State)
	assert.JSONEq(t, `{"ok":true}`, string(got.Result))
	assert.Empty(t, got.LeasedBy)
	assert.True(t, got.LeaseExpiresAt.IsZero())
	assert.True(t, got.FinishedAt.Equal(h.now))
	require.Len(t, got.Attempts, 1)
	assert.Equal(t, 1, got.Attempts[0].Run)
	assert.Equal(t, "completed", got.Attempts[0].Outcome)
	assert.Equal(t, time.Second, got.Attempts[0].End.Sub(got.Attempts[0].Start))
	// Exactly one completion: finishing again does nothing.
	assert.False(t, h.finish(u.ID, 1, store.Completed).Applied)
	assert.False(t, h.claim(u.ID, 2).Applied, "a completed unit cannot be claimed")
	evs := h.events(0)
	n := 0
	for _, e := range evs {
		if e.Type == "work_completed" {
			n++
			assert.JSONEq(t, `{"ok":true}`, string(e.Result), "EventsAfter joins the result")
		}
	}
	assert.Equal(t, 1, n)
}

func testFinishPreconditions(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	assert.False(t, h.finish(u.ID, 1, store.Completed).Applied, "a queued unit cannot finish")
	h.claim(u.ID, 1)
	f := &store.Finish{ID: u.ID, Owner: "someone-else", Run: 1, At: h.tick(), State: store.Completed}
	assert.False(t, h.apply(f)[0].Applied, "only the lease holder finishes")
	assert.False(t, h.finish(u.ID, 2, store.Completed).Applied, "only the current run finishes")
	assert.Equal(t, store.Running, h.get(u.ID).State)
	assert.True(t, h.finish(u.ID, 1, store.Completed).Applied)
}

func testRetryAndHistory(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	next := h.now.Add(time.Hour)
	h.claim(u.ID, 1)
	r := h.finish(u.ID, 1, store.Queued, func(f *store.Finish) {
		f.RunAt, f.SpendBudget, f.Error, f.ErrorKind = next, true, "boom", "error"
		f.Attempt.Outcome, f.Attempt.Error = "failed", "boom"
		f.Events = []store.Event{{Type: "work_failed", Task: "a", Data: []byte(`{"will_retry":true}`)}, {Type: "work_retrying", Task: "a"}}
	})
	require.True(t, r.Applied)
	require.Len(t, r.Events, 2)
	assert.Equal(t, r.Events[0].Seq+1, r.Events[1].Seq)
	got := h.get(u.ID)
	assert.Equal(t, store.Queued, got.State)
	assert.True(t, got.RunAt.Equal(next))
	assert.Equal(t, 1, got.Failures)
	assert.Equal(t, "boom", got.Error)
	assert.True(t, got.FinishedAt.IsZero(), "a retrying unit is not finished")

	h.claim(u.ID, 2)
	h.finish(u.ID, 2, store.Queued, func(f *store.Finish) { f.Deferral = true; f.Attempt.Outcome = "deferred" })
	got = h.get(u.ID)
	assert.Equal(t, 1, got.Failures, "a deferral spends no budget")
	assert.Equal(t, 1, got.Deferrals)
	h.claim(u.ID, 3)
	h.finish(u.ID, 3, store.Completed)
	got = h.get(u.ID)
	assert.Equal(t, 3, got.Runs)
	require.Len(t, got.Attempts, 3)
	assert.Equal(t, []string{"failed", "deferred", "completed"}, []string{got.Attempts[0].Outcome, got.Attempts[1].Outcome, got.Attempts[2].Outcome})
	assert.Equal(t, "boom", got.Attempts[0].Error)
}

func chain(h *harness, n int) []*store.Unit {
	var units []*store.Unit
	for i := range n {
		u := h.unit("a")
		if i > 0 {
			u.DependsOn = []string{units[i-1].ID}
		}
		units = append(units, u)
	}
	h.insert(units...)
	return units
}

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

func testRecover(t *testing.T, h *harness) {
	a, b, q := h.unit("a"), h.unit("b"), h.unit("a")
	h.insert(a, b, q)
	h.claim(a.ID, 1)
	h.claim(b.ID, 1)
	h.apply(&store.Cancel{ID: b.ID, At: h.tick()})
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{b.ID} })
	h.insert(dep)
	r := h.apply(&store.Recover{At: h.tick()})[0]
	assert.Equal(t, []string{a.ID}, r.IDs)
	got := h.get(a.ID)
	assert.Equal(t, store.Queued, got.State)
	assert.Empty(t, got.LeasedBy)
	assert.Equal(t, 1, got.Runs, "the interrupted run is counted")
	assert.Zero(t, got.Failures, "but spends no budget")
	require.Len(t, got.Attempts, 1)
	assert.Equal(t, "abandoned", got.Attempts[0].Outcome)
	assert.Equal(t, store.Cancelled, h.get(b.ID).State, "a unit asked to cancel is cancelled, not requeued")
	assert.Equal(t, store.Failed, h.get(dep.ID).State)
	assert.Equal(t, store.Queued, h.get(q.ID).State)
	var kinds []string
	for _, e := range r.Events {
		kinds = append(kinds, e.Type+":"+e.WorkID)
	}
	assert.Contains(t, kinds, "work_recovered:"+a.ID)
	assert.Contains(t, kinds, "work_cancelled:"+b.ID)
	assert.Empty(t, h.apply(&store.Recover{At: h.tick()})[0].IDs, "nothing left to recover")
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

func testHeartbeat(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	h.claim(u.ID, 1)
	lease := h.get(u.ID).LeaseExpiresAt
	at := h.tick()
	later := lease.Add(time.Hour)
	assert.True(t, h.apply(&store.Heartbeat{ID: u.ID, Owner: "owner", Run: 1, At: at, LeaseExpires: later})[0].Applied)
	got := h.get(u.ID)
	assert.True(t, got.LeaseExpiresAt.Equal(later))
	assert.True(t, got.HeartbeatAt.Equal(at))
	assert.True(t, h.apply(&store.Heartbeat{ID: u.ID, Owner: "owner", Run: 1, At: h.tick(), LeaseExpires: lease})[0].Applied)
	assert.True(t, h.get(u.ID).LeaseExpiresAt.Equal(later), "a lease never shrinks")
	assert.False(t, h.apply(&store.Heartbeat{ID: u.ID, Owner: "x", Run: 1, At: h.tick(), LeaseExpires: later})[0].Applied)
	assert.False(t, h.apply(&store.Heartbeat{ID: u.ID, Owner: "owner", Run: 2, At: h.tick(), LeaseExpires: later})[0].Applied)
}

func testTasksServices(t *testing.T, h *harness) {
	h.apply(&store.PutTask{Name: "a", Def: []byte(`{"v":1}`)}, &store.PutTask{Name: "b", Def: []byte(`{}`)})
	h.apply(&store.PutTask{Name: "a", Def: []byte(`{"v":2}`)})
	tasks, err := h.st.Tasks(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string][]byte{"a": []byte(`{"v":2}`), "b": []byte(`{}`)}, tasks)

	yes, no := true, false
	h.apply(&store.PutService{Name: "api", Def: []byte(`{"c":1}`)})
	h.apply(&store.PutService{Name: "api", Override: []byte(`{"c":5}`), Paused: &yes, Circuit: []byte(`{"open":true}`)})
	h.apply(&store.PutService{Name: "s3", Def: []byte(`{}`)})
	svcs, err := h.st.Services(h.ctx)
	require.NoError(t, err)
	require.Len(t, svcs, 2)
	assert.Equal(t, store.ServiceRecord{Name: "api", Def: []byte(`{"c":1}`), Override: []byte(`{"c":5}`), Paused: true,
		Circuit: []byte(`{"open":true}`)}, svcs[0], "a nil Def keeps the stored one")
	h.apply(&store.PutService{Name: "api", Override: []byte{}, Paused: &no, Circuit: []byte{}})
	svcs, _ = h.st.Services(h.ctx)
	assert.Nil(t, svcs[0].Override, "an empty override clears it")
	assert.False(t, svcs[0].Paused)
	assert.Nil(t, svcs[0].Circuit)
}

func testServiceLog(t *testing.T, h *harness) {
	u1, u2 := h.unit("a"), h.unit("a")
	h.insert(u1, u2)
	at := h.tick()
	h.apply(&store.Claim{ID: u1.ID, Owner: "o", Run: 1, At: at, ServiceLog: []string{"api", "s3"}})
	at2 := h.tick()
	h.apply(&store.Claim{ID: u2.ID, Owner: "o", Run: 1, At: at2, ServiceLog: []string{"api"}})
	h.apply(&store.Claim{ID: u2.ID, Owner: "o", Run: 1, At: h.tick(), ServiceLog: []string{"api"}}) // not applied: no entry
	log, err := h.st.ServiceLog(h.ctx, "api", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 2)
	assert.True(t, log[0].Equal(at) && log[1].Equal(at2))
	log, _ = h.st.ServiceLog(h.ctx, "api", at2)
	assert.Len(t, log, 1, "since is inclusive")
	log, _ = h.st.ServiceLog(h.ctx, "s3", time.Time{})
	assert.Len(t, log, 1)
	h.apply(&store.Prune{LogBefore: map[string]time.Time{"api": at2}})
	log, _ = h.st.ServiceLog(h.ctx, "api", time.Time{})
	assert.Len(t, log, 1)
	log, _ = h.st.ServiceLog(h.ctx, "s3", time.Time{})
	assert.Len(t, log, 1, "other services' logs are kept")

	// A class prefix covers its keyed instances and nothing else.
	var us []*store.Unit
	for range 4 {
		us = append(us, h.unit("a"))
	}
	h.insert(us...)
	old := h.tick()
	h.apply(&store.Claim{ID: us[0].ID, Owner: "o", Run: 1, At: old, ServiceLog: []string{"host:a.example", "hosting"}})
	h.apply(&store.Claim{ID: us[1].ID, Owner: "o", Run: 1, At: old, ServiceLog: []string{"host:b.example"}})
	cut := h.tick()
	h.apply(&store.Claim{ID: us[2].ID, Owner: "o", Run: 1, At: h.tick(), ServiceLog: []string{"host:a.example"}})
	h.apply(&store.Prune{LogBefore: map[string]time.Time{"host:": cut}})
	for svc, want := range map[string]int{"host:a.example": 1, "host:b.example": 0, "hosting": 1} {
		log, err := h.st.ServiceLog(h.ctx, svc, time.Time{})
		require.NoError(t, err)
		assert.Len(t, log, want, svc)
	}
	h.apply(&store.Claim{ID: us[3].ID, Owner: "o", Run: 1, At: h.tick(), ServiceLog: []string{"host:b.example", "host;x"}})
	byKey, err := h.st.ServiceLogPrefix(h.ctx, "host:", time.Time{})
	require.NoError(t, err)
	assert.Len(t, byKey, 2, "only services with the prefix: %v", byKey)
	assert.Len(t, byKey["host:a.example"], 1)
	assert.Len(t, byKey["host:b.example"], 1)
	byKey, err = h.st.ServiceLogPrefix(h.ctx, "host:", h.now)
	require.NoError(t, err)
	assert.Equal(t, map[string][]time.Time{"host:b.example": {h.now}}, byKey, "since is inclusive")
}

func testPrune(t *testing.T, h *harness) {
	old, oldFail, queued := h.unit("a"), h.unit("a"), h.unit("a")
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{old.ID} })
	h.insert(old, oldFail, queued, dep)
	h.claim(old.ID, 1)
	h.finish(old.ID, 1, store.Completed)
	h.claim(oldFail.ID, 1)
	h.finish(oldFail.ID, 1, store.Failed)
	cutoff := h.tick()
	recent := h.unit("a")
	h.insert(recent)
	h.claim(recent.ID, 1)
	h.finish(recent.ID, 1, store.Completed)
	firstBefore, _ := h.st.FirstSeq(h.ctx)
	lastBefore, _ := h.st.LastSeq(h.ctx)

	r := h.apply(&store.Prune{Before: cutoff, EventsBefore: cutoff})[0]
	assert.Equal(t, 2, r.Count)
	for _, id := range []string{old.ID, oldFail.ID} {
		_, err := h.st.GetUnit(h.ctx, id)
		assert.ErrorIs(t, err, store.ErrNotFound)
	}
	for _, id := range []string{queued.ID, dep.ID, recent.ID} {
		h.get(id)
	}
	assert.Empty(t, h.get(dep.ID).DependsOn, "the pruned dependency's edge goes too")
	first, _ := h.st.FirstSeq(h.ctx)
	last, _ := h.st.LastSeq(h.ctx)
	assert.Greater(t, first, firstBefore)
	assert.Equal(t, lastBefore, last)
	for _, e := range h.events(0) {
		assert.False(t, e.Time.Before(cutoff), "events before the cutoff are gone")
	}
	// Pruning everything never lets a sequence number be reused.
	h.apply(&store.Prune{EventsBefore: h.tick()})
	r2 := h.insert(h.unit("a"))
	assert.Equal(t, last+1, r2.Events[0].Seq)
	// Limit.
	var batch []*store.Unit
	for range 5 {
		u := h.unit("z")
		batch = append(batch, u)
	}
	h.insert(batch...)
	for _, u := range batch {
		h.claim(u.ID, 1)
		h.finish(u.ID, 1, store.Completed)
	}
	r = h.apply(&store.Prune{Before: h.tick(), Limit: 2})[0]
	assert.Equal(t, 2, r.Count)
	assert.True(t, r.More, "the limit was reached")
	r = h.apply(&store.Prune{Before: h.tick(), Limit: 100})[0]
	assert.Equal(t, 4, r.Count, "the other 3 of the batch and recent")
	assert.False(t, r.More)
	// More covers the service log too.
	lu := h.unit("z")
	h.insert(lu)
	for range 3 {
		require.True(t, h.apply(&store.Claim{ID: lu.ID, Owner: "owner", Run: 1, At: h.tick(), ServiceLog: []string{"svc0"}})[0].Applied)
		h.finish(lu.ID, 1, store.Queued)
	}
	r = h.apply(&store.Prune{LogBefore: map[string]time.Time{"svc0": h.tick()}, Limit: 2})[0]
	assert.True(t, r.More)
	r = h.apply(&store.Prune{LogBefore: map[string]time.Time{"svc0": h.tick()}, Limit: 2})[0]
	assert.False(t, r.More)
}

func testList(t *testing.T, h *harness) {
	var ids []string
	for i := range 10 {
		task := "a"
		if i%2 == 1 {
			task = "b"
		}
		u := h.unit(task)
		h.insert(u)
		ids = append(ids, u.ID)
	}
	h.claim(ids[0], 1)
	h.finish(ids[0], 1, store.Failed)
	h.claim(ids[2], 1)
	list := func(f store.ListFilter) []string {
		units, err := h.st.ListUnits(h.ctx, f)
		require.NoError(t, err)
		var out []string
		for _, u := range units {
			out = append(out, u.ID)
		}
		return out
	}
	assert.Equal(t, ids, list(store.ListFilter{}))
	assert.Equal(t, []string{ids[9], ids[8]}, list(store.ListFilter{Desc: true, Limit: 2}))
	assert.Equal(t, []string{ids[0]}, list(store.ListFilter{States: []store.State{store.Failed}}))
	assert.Equal(t, []string{ids[0], ids[2]}, list(store.ListFilter{States: []store.State{store.Failed, store.Running}}))
	assert.Equal(t, []string{ids[1], ids[3], ids[5], ids[7], ids[9]}, list(store.ListFilter{Tasks: []string{"b"}}))
	assert.Equal(t, []string{ids[4], ids[6], ids[8]}, list(store.ListFilter{Tasks: []string{"a"}, States: []store.State{store.Queued}}))
	seq := h.get(ids[4]).Seq
	assert.Equal(t, ids[5:7], list(store.ListFilter{AfterSeq: seq, Limit: 2}))
	assert.Equal(t, []string{ids[3], ids[2]}, list(store.ListFilter{BeforeSeq: seq, Desc: true, Limit: 2}))
	units, _ := h.st.ListUnits(h.ctx, store.ListFilter{Limit: 1})
	assert.Equal(t, "failed", units[0].Attempts[0].Outcome, "listed units are whole")
	assert.Equal(t, []string{ids[1], ids[4], ids[6]}, list(store.ListFilter{IDs: []string{ids[6], "missing", ids[1], ids[4]}}), "by ID, in Seq order")
	assert.Equal(t, []string{ids[4]}, list(store.ListFilter{IDs: []string{ids[2], ids[4]}, States: []store.State{store.Queued}}))

	// Many IDs: more than a backend may bind in one query.
	var many []string
	for range 1200 {
		u := h.unit("c")
		h.insert(u)
		many = append(many, u.ID)
	}
	shuffled := slices.Clone(many)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	assert.Equal(t, many, list(store.ListFilter{IDs: shuffled, Limit: len(many)}))
	assert.Equal(t, many[:3], list(store.ListFilter{IDs: shuffled, Limit: 3}))
	want := slices.Clone(many[len(many)-3:])
	slices.Reverse(want)
	assert.Equal(t, want, list(store.ListFilter{IDs: shuffled, Desc: true, Limit: 3}))
}

func testLoadActiveCount(t *testing.T, h *harness) {
	var want []string
	for i := range 2500 { // more than one page
		u := h.unit([]string{"a", "b"}[i%2])
		if i%3 == 0 {
			u.Params = []byte(`{"big":true}`)
			u.DependsOn = nil
		}
		h.insert(u)
		want = append(want, u.ID)
	}
	h.claim(want[0], 1)
	h.claim(want[1], 1)
	h.finish(want[1], 1, store.Completed)
	withDep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{want[2]} })
	h.insert(withDep)
	h.claim(want[4], 1)
	h.finish(want[4], 1, store.Queued, func(f *store.Finish) {
		f.RunAt, f.Error, f.ErrorKind, f.Deferral = h.now.Add(time.Minute), "429", "retry_after", true
	})
	var got []string
	var seqs []int64
	err := h.st.LoadActive(h.ctx, func(u *store.Unit) error {
		got = append(got, u.ID)
		seqs = append(seqs, u.Seq)
		if u.ID == want[4] {
			assert.Equal(t, "retry_after", u.ErrorKind, "LoadActive includes ErrorKind")
			assert.False(t, u.StartedAt.IsZero(), "and StartedAt")
		}
		if u.ID == want[0] {
			assert.Equal(t, store.Running, u.State)
		}
		if u.ID == withDep.ID {
			assert.Equal(t, []string{want[2]}, u.DependsOn)
		}
		if u.ID == want[0] || u.ID == want[3] {
			assert.JSONEq(t, `{"big":true}`, string(u.Params), "LoadActive includes Params")
		}
		return nil
	})
	require.NoError(t, err)
	expect := append([]string{want[0]}, want[2:]...)
	expect = append(expect, withDep.ID)
	assert.Equal(t, expect, got)
	assert.True(t, slices.IsSorted(seqs))
	stop := errors.New("stop")
	assert.ErrorIs(t, h.st.LoadActive(h.ctx, func(*store.Unit) error { return stop }), stop)

	counts, err := h.st.CountActive(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"a": 1251, "b": 1249}, counts, "want[1] completed; withDep added")
}

func testEvents(t *testing.T, h *harness) {
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	assert.Zero(t, last)
	first, err := h.st.FirstSeq(h.ctx)
	require.NoError(t, err)
	assert.Zero(t, first)
	var units []*store.Unit
	for range 30 {
		units = append(units, h.unit("a"))
	}
	h.insert(units...)
	r := h.apply(&store.AppendEvent{Event: store.Event{Type: "backpressure_active", Time: h.tick(), Data: []byte(`{"queued":5}`)}})[0]
	require.True(t, r.Applied)
	require.Len(t, r.Events, 1)
	assert.Equal(t, int64(31), r.Events[0].Seq)
	evs := h.events(0)
	require.Len(t, evs, 31)
	for i, e := range evs {
		assert.Equal(t, int64(i+1), e.Seq)
	}
	assert.Equal(t, "backpressure_active", evs[30].Type)
	assert.Equal(t, `{"queued":5}`, string(evs[30].Data))
	page, err := h.st.EventsAfter(h.ctx, 10, 5)
	require.NoError(t, err)
	require.Len(t, page, 5)
	assert.Equal(t, int64(11), page[0].Seq)
	last, _ = h.st.LastSeq(h.ctx)
	assert.Equal(t, int64(31), last)
	first, _ = h.st.FirstSeq(h.ctx)
	assert.Equal(t, int64(1), first)
	// Event data round-trips.
	var d map[string]any
	require.NoError(t, json.Unmarshal(evs[30].Data, &d))

	// Filtered reads.
	b := h.unit("b")
	h.insert(b)
	h.claim(b.ID, 1) // work_started of task t (the harness's claim event)
	m, err := h.st.MatchingEvents(h.ctx, store.EventQuery{After: 0, Upto: 1000, Tasks: []string{"b"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"work_queued:" + b.ID}, types(m), "by task")
	m, err = h.st.MatchingEvents(h.ctx, store.EventQuery{After: 0, Upto: 1000, Types: []string{"backpressure_active", "work_started"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"backpressure_active:", "work_started:" + b.ID}, types(m), "by type")
	m, err = h.st.MatchingEvents(h.ctx, store.EventQuery{After: 5, Upto: 8, Tasks: []string{"a"}, Types: []string{"work_queued"}})
	require.NoError(t, err)
	require.Len(t, m, 3, "bounded by After and Upto")
	assert.Equal(t, int64(6), m[0].Seq)
	m, err = h.st.MatchingEvents(h.ctx, store.EventQuery{After: 0, Upto: 1000, Tasks: []string{"a"}, Limit: 4})
	require.NoError(t, err)
	assert.Len(t, m, 4, "limited")
	m, err = h.st.MatchingEvents(h.ctx, store.EventQuery{After: 0, Upto: 1000, Tasks: []string{"nothing"}})
	require.NoError(t, err)
	assert.Empty(t, m)
}

// testMatchingEvents compares MatchingEvents with EventsAfter filtered by
// hand, over transactions that mix tasks and types, for many queries.
func testMatchingEvents(t *testing.T, h *harness) {
	rnd := rand.New(rand.NewPCG(5, 5))
	tasks := []string{"a", "b", "c"}
	for range 60 {
		var ops []store.Op
		for range 1 + rnd.IntN(5) {
			task := tasks[rnd.IntN(len(tasks))]
			if rnd.IntN(10) == 0 {
				ops = append(ops, &store.AppendEvent{Event: store.Event{Type: "backpressure_active", Time: h.tick()}})
				continue
			}
			ops = append(ops, &store.Insert{Units: []*store.Unit{h.unit(task)}, At: h.tick()})
		}
		h.apply(ops...)
	}
	all := h.events(0)
	last := all[len(all)-1].Seq
	for range 200 {
		q := store.EventQuery{After: rnd.Int64N(last), Limit: 1 + rnd.IntN(20)}
		q.Upto = q.After + 1 + rnd.Int64N(last-q.After)
		if rnd.IntN(2) == 0 {
			q.Tasks = []string{tasks[rnd.IntN(3)]}
		}
		if rnd.IntN(2) == 0 || len(q.Tasks) == 0 {
			q.Types = []string{[]string{"work_queued", "backpressure_active"}[rnd.IntN(2)]}
		}
		var want []int64
		for _, e := range all {
			if e.Seq > q.After && e.Seq <= q.Upto && len(want) < q.Limit &&
				(len(q.Types) == 0 || q.Types[0] == e.Type) && (len(q.Tasks) == 0 || q.Tasks[0] == e.Task) {
				want = append(want, e.Seq)
			}
		}
		got, err := h.st.MatchingEvents(h.ctx, q)
		require.NoError(t, err)
		var seqs []int64
		for _, e := range got {
			seqs = append(seqs, e.Seq)
		}
		require.Equal(t, want, seqs, "query %+v", q)
	}
}

func testChanged(t *testing.T, h *harness) {
	_, err := h.st.Changed(h.ctx)
	require.NoError(t, err)
	h.insert(h.unit("a"))
	changed, err := h.st.Changed(h.ctx)
	require.NoError(t, err)
	assert.False(t, changed, "own commits are not changes")
	other := h.again()
	defer other.Close()
	_, err = other.Apply(h.ctx, []store.Op{&store.Insert{Units: []*store.Unit{h.unit("a")}, At: h.tick()}})
	require.NoError(t, err)
	changed, err = h.st.Changed(h.ctx)
	require.NoError(t, err)
	assert.True(t, changed, "another handle's commit is a change")
	changed, _ = h.st.Changed(h.ctx)
	assert.False(t, changed, "reported once")
}

func testAcquire(t *testing.T, h *harness) {
	since := time.Unix(1_800_000_000, 0)
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "first", PID: 4242, Host: "hostA", Since: since})
	require.NoError(t, err)
	other := h.again()
	defer other.Close()
	_, err = other.Acquire(h.ctx, store.Holder{Owner: "second"})
	require.ErrorIs(t, err, store.ErrLocked)
	var le *store.LockedError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "first", le.Holder.Owner)
	assert.Equal(t, 4242, le.Holder.PID)
	assert.Equal(t, "hostA", le.Holder.Host)
	assert.True(t, le.Holder.Since.Equal(since))
	assert.Contains(t, err.Error(), "4242")
	_, err = h.st.Acquire(h.ctx, store.Holder{Owner: "again"})
	assert.ErrorIs(t, err, store.ErrLocked, "the same handle cannot acquire twice")
	require.NoError(t, own.Release())
	require.NoError(t, own.Release(), "Release is idempotent")
	own2, err := other.Acquire(h.ctx, store.Holder{Owner: "second"})
	require.NoError(t, err)
	require.NoError(t, own2.Release())
}

func testConcurrentApply(t *testing.T, h *harness) {
	other := h.again()
	defer other.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		st := h.st
		if g%2 == 1 {
			st = other
		}
		wg.Go(func() {
			for i := range 25 {
				u := &store.Unit{ID: fmt.Sprintf("g%d-%d", g, i), Task: "a"}
				res, err := st.Apply(h.ctx, []store.Op{&store.Insert{Units: []*store.Unit{u}, At: time.Now()}})
				if err == nil && res[0].Err != nil {
					err = res[0].Err
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	evs := h.events(0)
	require.Len(t, evs, 200)
	for i, e := range evs {
		assert.Equal(t, int64(i+1), e.Seq, "sequence numbers are unique and contiguous across writers")
	}
	counts, _ := h.st.CountActive(h.ctx)
	assert.Equal(t, 200, counts["a"])
}

func testConcurrentReads(t *testing.T, h *harness) {
	var units []*store.Unit
	for range 50 {
		units = append(units, h.unit("a"))
	}
	h.insert(units...)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := h.st.GetUnit(ctx, units[0].ID); err != nil && ctx.Err() == nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
				if _, err := h.st.ListUnits(ctx, store.ListFilter{Limit: 10}); err != nil && ctx.Err() == nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		})
	}
	for i, u := range units {
		h.claim(u.ID, 1)
		if i%2 == 0 {
			h.finish(u.ID, 1, store.Completed)
		}
	}
	cancel()
	wg.Wait()
	assert.Empty(t, failures, "reads never fail while the writer works")
}

// testClaimFinishOneBatch checks that a claim and its finish in one batch
// (which a store may merge) behave exactly as in two batches.
func testClaimFinishOneBatch(t *testing.T, h *harness) {
	mk := func(n int) []*store.Unit {
		var us []*store.Unit
		for range n {
			us = append(us, h.unit("a"))
		}
		h.insert(us...)
		return us
	}
	us := mk(4)
	at := h.tick()
	claim := func(u *store.Unit) *store.Claim {
		return &store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute), ServiceLog: []string{"svc"},
			Events: []store.Event{{Type: "work_started", Task: "a", Attempt: 1}}}
	}
	finish := func(u *store.Unit, st store.State) *store.Finish {
		return &store.Finish{ID: u.ID, Owner: "o", Run: 1, At: at.Add(time.Millisecond), State: st, Result: []byte(`1`),
			SpendBudget: st != store.Completed, Propagate: true,
			Attempt: store.Attempt{Run: 1, Start: at, End: at.Add(time.Millisecond), Outcome: string(st)},
			Events:  []store.Event{{Type: "work_" + string(st), Task: "a", Attempt: 1}}}
	}
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{us[1].ID} })
	h.insert(dep)
	// us[2]: a cancel request lands between its claim and finish; us[3]: its
	// claim is refused (the unit was cancelled), so its finish must not apply.
	h.apply(&store.Cancel{ID: us[3].ID, At: h.tick()})
	res := h.apply(
		claim(us[0]), claim(us[1]), claim(us[2]),
		&store.AppendEvent{Event: store.Event{Type: "between"}},
		finish(us[0], store.Completed),
		&store.Cancel{ID: us[2].ID, At: at},
		finish(us[1], store.Failed),
		finish(us[2], store.Completed),
		claim(us[3]), finish(us[3], store.Completed),
	)
	for i := range 3 {
		assert.True(t, res[i].Applied, "claim %d", i)
	}
	assert.True(t, res[4].Applied)
	assert.True(t, res[6].Applied)
	assert.True(t, res[7].Applied, "a cancel request does not stop a run that finishes")
	assert.False(t, res[8].Applied, "a cancelled unit is not claimed")
	assert.False(t, res[9].Applied, "so its finish does not apply")

	u0 := h.get(us[0].ID)
	assert.Equal(t, store.Completed, u0.State)
	assert.Equal(t, 1, u0.Runs)
	assert.True(t, u0.StartedAt.Equal(at))
	assert.Equal(t, "1", string(u0.Result))
	assert.Empty(t, u0.LeasedBy)
	require.Len(t, u0.Attempts, 1)
	u1 := h.get(us[1].ID)
	assert.Equal(t, store.Failed, u1.State)
	assert.Equal(t, 1, u1.Failures)
	assert.Equal(t, store.Failed, h.get(dep.ID).State, "propagation runs for a merged finish")
	assert.Equal(t, store.Completed, h.get(us[2].ID).State)
	assert.Equal(t, store.Cancelled, h.get(us[3].ID).State)
	log, err := h.st.ServiceLog(h.ctx, "svc", time.Time{})
	require.NoError(t, err)
	assert.Len(t, log, 3, "each applied claim logs its dispatch")
	// Events are in op order: claims, the marker, then the finishes.
	var got []string
	for _, r := range res {
		for _, e := range r.Events {
			got = append(got, e.Type+":"+e.WorkID)
		}
	}
	want := []string{"work_started:" + us[0].ID, "work_started:" + us[1].ID, "work_started:" + us[2].ID, "between:",
		"work_completed:" + us[0].ID, "work_cancel_requested:" + us[2].ID, "work_failed:" + us[1].ID, "work_failed:" + dep.ID,
		"work_completed:" + us[2].ID}
	assert.Equal(t, want, got)
	var prev int64
	for _, r := range res {
		for _, e := range r.Events {
			assert.Greater(t, e.Seq, prev)
			prev = e.Seq
		}
	}
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

	// Drop oldest: the oldest queued units are cancelled to make room.
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{first[1].ID} })
	h.insert(dep) // now 5 queued
	fresh := []*store.Unit{h.unit("a"), h.unit("a")}
	r = h.apply(&store.Insert{Units: fresh, At: h.tick(), MaxQueued: 5, DropOldest: true})[0]
	require.NoError(t, r.Err)
	got := h.get(first[1].ID)
	assert.Equal(t, store.Cancelled, got.State)
	assert.Equal(t, "dropped", got.ErrorKind)
	assert.Equal(t, store.Cancelled, h.get(first[2].ID).State, "two dropped for two new")
	assert.Equal(t, "prerequisite_cancelled", h.get(dep.ID).ErrorKind, "dropping propagates")
	var dropped int
	for _, e := range r.Events {
		if e.Type == store.EventWorkCancelled {
			dropped++
			assert.JSONEq(t, `{"reason":"dropped"}`, string(e.Data))
		}
	}
	assert.Equal(t, 2, dropped)
	n, _ = h.st.QueuedCount(h.ctx)
	assert.LessOrEqual(t, n, 5)
	// An insert larger than the bound cannot make room by dropping.
	var big []*store.Unit
	for range 6 {
		big = append(big, h.unit("a"))
	}
	r = h.apply(&store.Insert{Units: big, At: h.tick(), MaxQueued: 5, DropOldest: true})[0]
	assert.ErrorIs(t, r.Err, store.ErrBackpressure)
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
