package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Conformance: debounce keys. An insert with a key skips the queued,
// never-started unit that holds it, in the same transaction, and runs
// Period after the insert, at the latest MaxWait after the burst began; a
// holder that started leaves the next insert a new burst; two writers
// inserting one key leave exactly one unit queued.

func debounced(key string) func(*store.Unit) {
	return func(u *store.Unit) {
		u.Debounce = &store.Debounce{Key: key, Period: 10 * time.Second, MaxWait: 25 * time.Second}
	}
}

func testDebounce(t *testing.T, h *harness) {
	u1 := h.unit("a", debounced("k"))
	t0 := h.tick()
	r := h.apply(&store.Insert{Units: []*store.Unit{u1}, At: t0})[0]
	require.NoError(t, r.Err)
	assert.True(t, h.get(u1.ID).RunAt.Equal(t0.Add(10*time.Second)), "Period after the insert")

	u2 := h.unit("a", debounced("k"))
	r = h.apply(&store.Insert{Units: []*store.Unit{u2}, At: t0.Add(time.Second)})[0]
	require.NoError(t, r.Err)
	old := h.get(u1.ID)
	assert.Equal(t, store.Skipped, old.State)
	assert.Equal(t, store.DebounceKind, old.ErrorKind)
	assert.Equal(t, "replaced by "+u2.ID, old.Error)
	var skipped []string
	for _, ev := range r.Events {
		if ev.Type == store.EventWorkSkipped {
			skipped = append(skipped, ev.WorkID)
			assert.Contains(t, string(ev.Data), "debounced: replaced by "+u2.ID)
			assert.Equal(t, "a", ev.Task)
		}
	}
	assert.Equal(t, []string{u1.ID}, skipped, "the replaced unit's event is in the insert's result")
	assert.True(t, h.get(u2.ID).RunAt.Equal(t0.Add(11*time.Second)))

	// Twenty seconds into the burst: MaxWait (25 s from its first insert)
	// comes before Period.
	u3 := h.unit("a", debounced("k"))
	require.NoError(t, h.apply(&store.Insert{Units: []*store.Unit{u3}, At: t0.Add(20 * time.Second)})[0].Err)
	assert.Equal(t, store.Skipped, h.get(u2.ID).State)
	assert.True(t, h.get(u3.ID).RunAt.Equal(t0.Add(25*time.Second)), "MaxWait bounds the burst: %v", h.get(u3.ID).RunAt.Sub(t0))

	// Started: not replaced; the next insert begins a new burst.
	require.True(t, h.claim(u3.ID, 1).Applied)
	u4 := h.unit("a", debounced("k"))
	require.NoError(t, h.apply(&store.Insert{Units: []*store.Unit{u4}, At: t0.Add(21 * time.Second)})[0].Err)
	assert.Equal(t, store.Running, h.get(u3.ID).State)
	assert.True(t, h.get(u4.ID).RunAt.Equal(t0.Add(31*time.Second)))
	// Requeued for a retry, it has started once: still not replaced.
	h.finish(u3.ID, 1, store.Queued)
	u5 := h.unit("a", debounced("k"))
	require.NoError(t, h.apply(&store.Insert{Units: []*store.Unit{u5}, At: t0.Add(22 * time.Second)})[0].Err)
	assert.Equal(t, store.Queued, h.get(u3.ID).State, "a unit that ran is not replaced")
	assert.Equal(t, store.Skipped, h.get(u4.ID).State)
	assert.True(t, h.get(u5.ID).RunAt.Equal(t0.Add(32*time.Second)), "Period after its insert, within MaxWait of u4, the burst's first")

	// Another key is apart; two of one key in one batch: the first is
	// replaced by the second.
	v1, v2, w1 := h.unit("b", debounced("k2")), h.unit("b", debounced("k2")), h.unit("b", debounced("k3"))
	require.NoError(t, h.apply(&store.Insert{Units: []*store.Unit{v1, v2, w1}, At: t0.Add(23 * time.Second)})[0].Err)
	assert.Equal(t, store.Skipped, h.get(v1.ID).State)
	assert.Equal(t, store.Queued, h.get(v2.ID).State)
	assert.Equal(t, store.Queued, h.get(w1.ID).State)
	assert.Equal(t, store.Queued, h.get(u5.ID).State)
	// An explicit RunAt later than the burst's end stands.
	late := h.unit("c", debounced("k4"), func(u *store.Unit) { u.RunAt = t0.Add(time.Hour) })
	require.NoError(t, h.apply(&store.Insert{Units: []*store.Unit{late}, At: t0})[0].Err)
	assert.True(t, h.get(late.ID).RunAt.Equal(t0.Add(time.Hour)))

	if dr, ok := h.st.(store.DebounceReader); ok {
		n, err := dr.Debouncing(h.ctx)
		require.NoError(t, err)
		assert.Equal(t, 4, n, "k (u5), k2, k3 and k4 settle")
		key, since, held, err := dr.DebounceOf(h.ctx, u5.ID)
		require.NoError(t, err)
		assert.True(t, held)
		assert.Equal(t, "k", key)
		assert.True(t, since.Equal(t0.Add(21*time.Second)))
		_, _, held, err = dr.DebounceOf(h.ctx, u4.ID)
		require.NoError(t, err)
		assert.False(t, held, "replaced")
	}
}

func testTwoWritersDebounce(t *testing.T, h *harness) {
	const n = 30
	at := h.tick()
	h.writers(func(w int, st store.Store) {
		for i := range n {
			u := &store.Unit{ID: fmt.Sprintf("w%d-%02d", w, i), Task: "a", Debounce: &store.Debounce{Key: "shared", Period: time.Minute}}
			r := h.applyOn(st, &store.Insert{Units: []*store.Unit{u}, At: at})[0]
			assert.NoError(t, r.Err)
		}
	})
	all, err := h.st.ListUnits(h.ctx, store.ListFilter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, all, 2*n)
	var queued []string
	for _, u := range all {
		switch u.State {
		case store.Queued:
			queued = append(queued, u.ID)
		case store.Skipped:
			assert.Equal(t, store.DebounceKind, u.ErrorKind)
		default:
			t.Errorf("%s is %s", u.ID, u.State)
		}
	}
	assert.Len(t, queued, 1, "one unit holds the key: %v", queued)
}

// CheckDebounceMigrated checks a store opened on the fixture the
// backends' mkschema programs write before debounce keys (SQLite schema
// 15, PostgreSQL schema 5: a completed unit done-1, a queued one queued-1,
// a schedule hourly, a question n1 answered "[]"), once migrated: they
// are as they were, and a debounced insert replaces the unit holding its
// key.
func CheckDebounceMigrated(t *testing.T, st store.Store) {
	t.Helper()
	ctx := t.Context()
	states, err := st.UnitStates(ctx, []string{"done-1", "queued-1"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"done-1": store.Completed, "queued-1": store.Queued}, states)
	recs, err := st.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	answer, answered, err := st.(store.Questioner).Answered(ctx, "n1")
	require.NoError(t, err)
	assert.True(t, answered)
	assert.Equal(t, "[]", string(answer))

	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	b, err := st.Apply(ctx, []store.Op{&store.Insert{At: at, Units: []*store.Unit{
		{ID: "d-1", Task: "report", Debounce: &store.Debounce{Key: "doc", Period: time.Second}},
		{ID: "d-2", Task: "report", Debounce: &store.Debounce{Key: "doc", Period: time.Second}},
	}}})
	require.NoError(t, err)
	require.NoError(t, b.Results[0].Err)
	states, err = st.UnitStates(ctx, []string{"d-1", "d-2"})
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{"d-1": store.Skipped, "d-2": store.Queued}, states)
}
