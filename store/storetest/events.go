package storetest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: the event log (sequence numbers, filtered reads, Changed).

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
	// So does a type of any spelling (a store may treat the types it
	// writes often specially).
	for _, typ := range []string{"noted_by_test", "Custom.Type-1", "o'quote", "x_y"} {
		r := h.apply(&store.AppendEvent{Event: store.Event{Type: typ, Time: h.tick()}})[0]
		require.True(t, r.Applied)
		got, err := h.st.EventsAfter(h.ctx, r.Events[0].Seq-1, 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, typ, got[0].Type)
	}

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
		if rnd.IntN(3) == 0 {
			// One unit's events (any unit, or none when the pick has no unit).
			q.WorkID = all[rnd.IntN(len(all))].WorkID
			q.After, q.Upto, q.Limit = 0, last, 1000
			if rnd.IntN(2) == 0 {
				q.Types, q.Tasks = nil, nil
			}
		}
		var want []int64
		for _, e := range all {
			if e.Seq > q.After && e.Seq <= q.Upto && len(want) < q.Limit && (q.WorkID == "" || q.WorkID == e.WorkID) &&
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

// testLastOfTypes: the last event of some types, among many of other
// types and tasks.
func testLastOfTypes(t *testing.T, h *harness) {
	kinds := []string{"backpressure_active", "backpressure_cleared"}
	_, ok, err := h.st.LastOfTypes(h.ctx, kinds)
	require.NoError(t, err)
	assert.False(t, ok, "none yet")
	rnd := rand.New(rand.NewPCG(7, 7))
	var want int64
	wantType := ""
	for range 50 {
		var ops []store.Op
		for range 1 + rnd.IntN(4) {
			if rnd.IntN(6) == 0 {
				typ := kinds[rnd.IntN(2)]
				ops = append(ops, &store.AppendEvent{Event: store.Event{Type: typ, Time: h.tick()}})
				continue
			}
			ops = append(ops, &store.Insert{Units: []*store.Unit{h.unit("a")}, At: h.tick()})
		}
		res := h.apply(ops...)
		for i, op := range ops {
			if ae, ok := op.(*store.AppendEvent); ok && res[i].Err == nil {
				for _, e := range res[i].Events {
					want, wantType = e.Seq, ae.Event.Type
				}
			}
		}
	}
	require.NotZero(t, want, "the seed appends some")
	got, ok, err := h.st.LastOfTypes(h.ctx, kinds)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, want, got.Seq)
	assert.Equal(t, wantType, got.Type)
	only, ok, err := h.st.LastOfTypes(h.ctx, []string{"no_such_type"})
	require.NoError(t, err)
	assert.False(t, ok, "%+v", only)
}

// testEventSeqs: the sequence numbers an Apply reports are the ones
// stored, strictly increasing in append order, through ops that fail and
// roll back alone in the same transaction, and across two handles on one
// database taking turns.
func testEventSeqs(t *testing.T, h *harness) {
	other := h.again()
	defer other.Close()
	var reported []store.Event
	for round := range 20 {
		st := h.st
		if round%2 == 1 {
			st = other
		}
		dup := h.unit("a")
		reported = append(reported, h.insert(dup).Events...)
		ops := []store.Op{
			&store.Insert{Units: []*store.Unit{h.unit("a"), h.unit("b")}, At: h.tick()},
			// Fails alone, after its first unit and that unit's event (a
			// duplicate ID second): both are rolled back with it.
			&store.Insert{Units: []*store.Unit{h.unit("b"), dup}, At: h.tick()},
			&store.AppendEvent{Event: store.Event{Type: "backpressure_active", Time: h.tick()}},
			// A type a backend may not write as a literal.
			&store.AppendEvent{Event: store.Event{Type: "Custom.Type-1", Time: h.tick()}},
			&store.Insert{Units: []*store.Unit{h.unit("c")}, At: h.tick()},
		}
		b, err := st.Apply(h.ctx, ops)
		require.NoError(t, err)
		res := b.Results
		require.Error(t, res[1].Err, "the duplicate fails")
		assert.Empty(t, res[1].Events)
		for _, r := range res {
			reported = append(reported, r.Events...)
		}
	}
	stored := map[int64]store.Event{}
	var last int64
	for _, e := range h.events(0) {
		assert.Greater(t, e.Seq, last, "strictly increasing")
		last = e.Seq
		stored[e.Seq] = e
	}
	for _, e := range reported {
		s, ok := stored[e.Seq]
		require.True(t, ok, "reported seq %d is stored", e.Seq)
		assert.Equal(t, e.Type, s.Type)
		assert.Equal(t, e.WorkID, s.WorkID)
	}
	assert.Len(t, stored, len(reported), "every stored event was reported: none of a rolled-back op")
	n, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, last, n)
}

// testManyEventTypes: transactions of many distinct event types (more
// than a backend may cache per type) store every event.
func testManyEventTypes(t *testing.T, h *harness) {
	want := 0
	for round := range 3 {
		var ops []store.Op
		for i := range 150 {
			typ := fmt.Sprintf("type_%c_%c", 'a'+rune(i%26), 'a'+rune((i/26+round)%26))
			ops = append(ops, &store.AppendEvent{Event: store.Event{Type: typ, Time: h.tick()}})
		}
		h.apply(ops...)
		want += len(ops)
	}
	assert.Len(t, h.events(0), want)
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
