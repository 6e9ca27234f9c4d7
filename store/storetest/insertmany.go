package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: Inserts of many units at once. A backend may write a large
// batch another way than a few units (PostgreSQL copies 16 or more): the
// rows, their events, their refusals and the numbers they give back are
// the same.

// manyUnits is how many units these cases insert at once: above every
// backend's threshold for its bulk path.
const manyUnits = 40

// testInsertManyGet: every field of every unit of a large Insert is
// stored as given, with its dependencies (on a stored unit, on one of the
// batch, on a failed unit: the unit and its dependent in the batch are
// stored failed), and each unit's
// work_queued event is found by its unit.
func testInsertManyGet(t *testing.T, h *harness) {
	stored := h.units(1)[0]
	dead := h.unit("a")
	h.insert(dead)
	h.claim(dead.ID, 1)
	h.finish(dead.ID, 1, store.Failed)
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)

	base := h.now
	var us []*store.Unit
	for i := range manyUnits {
		us = append(us, h.unit("fetch", func(u *store.Unit) {
			u.Target = fmt.Sprintf("https://example.org/%d", i)
			u.Timeout = time.Duration(i+1) * time.Second
			u.RunAt = base.Add(time.Duration(i) * time.Minute)
			if i%2 == 0 {
				u.Params = fmt.Appendf(nil, `{"i":%d}`, i)
				u.IdempotencyKey = fmt.Sprintf("many-%d", i)
				u.Costs = map[string]int64{"tokens": int64(100 + i)}
			}
			if i%5 == 0 {
				u.Retry = []byte(`{"max":3}`)
				u.Trace = []byte(`{"traceparent":"y"}`)
			}
			switch {
			case i == 13:
				u.DependsOn = []string{dead.ID}
			case i%3 == 0:
				u.DependsOn = []string{stored.ID}
				u.DependencyDeadline = base.Add(time.Hour)
			case i%7 == 0:
				u.DependsOn = []string{us[i-1].ID, stored.ID}
			}
		}))
	}
	r := h.insert(us...)
	require.Len(t, r.Units, manyUnits)
	queued := map[string]int64{}
	for _, e := range r.Events {
		if e.Type == store.EventWorkQueued {
			queued[e.WorkID] = e.Seq
		}
	}
	require.Len(t, queued, manyUnits, "a work_queued event a unit")
	for i, u := range us {
		got := h.get(u.ID)
		assert.Equal(t, r.Units[i].Seq, got.Seq, "unit %d", i)
		if i > 0 {
			assert.Greater(t, got.Seq, r.Units[i-1].Seq, "Seq follows submission order")
		}
		assert.Equal(t, u.Task, got.Task)
		assert.Equal(t, u.Target, got.Target)
		assert.Equal(t, string(u.Params), string(got.Params))
		assert.Equal(t, u.Timeout, got.Timeout)
		assert.True(t, got.RunAt.Equal(u.RunAt), "unit %d: run at %v, want %v", i, got.RunAt, u.RunAt)
		assert.Equal(t, u.IdempotencyKey, got.IdempotencyKey)
		assert.True(t, got.DependencyDeadline.Equal(u.DependencyDeadline), "unit %d", i)
		assert.Equal(t, string(u.Retry), string(got.Retry))
		assert.Equal(t, string(u.Trace), string(got.Trace))
		assert.Equal(t, u.Costs, got.Costs)
		assert.Equal(t, u.DependsOn, got.DependsOn)
		if i == 13 || i == 14 { // 14 depends on 13
			assert.Equal(t, store.Failed, got.State, "unit %d: a dependent of a failed unit is stored failed", i)
			assert.Equal(t, "prerequisite_failed", got.ErrorKind)
			assert.False(t, got.FinishedAt.IsZero())
		} else {
			assert.Equal(t, store.Queued, got.State, "unit %d", i)
			assert.Empty(t, got.ErrorKind)
			assert.True(t, got.FinishedAt.IsZero())
		}
		evs, err := h.st.MatchingEvents(h.ctx, store.EventQuery{WorkID: u.ID, After: last, Upto: r.Events[len(r.Events)-1].Seq, Limit: 10})
		require.NoError(t, err)
		require.NotEmpty(t, evs, "unit %d's events", i)
		assert.Equal(t, queued[u.ID], evs[0].Seq, "unit %d's work_queued is found by its unit", i)
	}
}

// testInsertManyDuplicateID: a large Insert with an ID already stored, or
// with one ID twice, fails alone (ErrDuplicateID), stores nothing and
// gives its events' numbers back; the other ops of its batch, large or
// small, apply.
func testInsertManyDuplicateID(t *testing.T, h *harness) {
	taken := h.unit("a")
	h.insert(taken)
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	many := func(dup string, at int) []*store.Unit {
		var us []*store.Unit
		for i := range manyUnits {
			u := h.unit("a")
			if i == at {
				u.ID = dup
			}
			us = append(us, u)
		}
		return us
	}
	refused := many(taken.ID, manyUnits/2)
	twice := many("", -1)
	twice[manyUnits-1].ID = twice[3].ID
	after := many("", -1)
	small := h.unit("a")
	res := h.apply(
		&store.Insert{Units: refused, At: h.tick()},
		&store.Insert{Units: twice, At: h.tick()},
		&store.Insert{Units: after, At: h.tick()},
		&store.Insert{Units: []*store.Unit{small}, At: h.tick()},
	)
	assert.ErrorIs(t, res[0].Err, store.ErrDuplicateID)
	assert.ErrorIs(t, res[1].Err, store.ErrDuplicateID)
	assert.Empty(t, res[0].Events)
	assert.Empty(t, res[1].Events)
	for i, u := range append(refused[:len(refused):len(refused)], twice...) {
		if i == manyUnits/2 {
			continue // the stored unit's ID
		}
		_, err := h.st.GetUnit(h.ctx, u.ID)
		assert.ErrorIs(t, err, store.ErrNotFound, "no unit of a failed insert is stored (unit %d)", i)
	}
	assert.Equal(t, "a", h.get(taken.ID).Task, "the stored unit is kept")
	require.NoError(t, res[2].Err)
	require.NoError(t, res[3].Err)
	require.Len(t, res[2].Events, manyUnits)
	for i, e := range append(res[2].Events, res[3].Events...) {
		assert.Equal(t, last+1+int64(i), e.Seq, "the refused inserts' numbers are given again")
	}
	for _, u := range append(after, small) {
		assert.Equal(t, store.Queued, h.get(u.ID).State)
	}
}
