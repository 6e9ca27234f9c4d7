package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// testUnitEvents: a unit's events (MatchingEvents with WorkID) are all of
// them, in order, however they were written: its insert, claims alone and
// claims merged with their finish in one batch, retries, events appended
// for it before its insert in the same batch, other units' events between
// its own, far more of them than a backend's per-unit record may hold;
// read from any cursor, filtered by type, limited, and after retention
// cut the log inside a batch's events.
func testUnitEvents(t *testing.T, h *harness) {
	busy, other := h.unit("a"), h.unit("a")
	var want []store.Event
	keep := func(res []store.Result) {
		for _, r := range res {
			for _, e := range r.Events {
				if e.WorkID == busy.ID {
					e.Detail = nil
					want = append(want, e)
				}
			}
		}
	}
	keep(h.apply(&store.AppendEvent{Event: store.Event{Type: "note", WorkID: busy.ID, Task: "a", Time: h.tick()}},
		&store.Insert{Units: []*store.Unit{busy, other}, At: h.tick()}))
	claim := func(id string, run int, at time.Time) *store.Claim {
		return &store.Claim{ID: id, Owner: "o", Run: run, At: at, LeaseExpires: at.Add(time.Minute),
			Events: []store.Event{{Type: "work_started", Task: "a", Attempt: run}}}
	}
	retry := func(id string, run int, at time.Time) *store.Finish {
		return &store.Finish{ID: id, Owner: "o", Run: run, At: at, State: store.Queued, RunAt: at,
			Attempt: store.Attempt{Run: run, Start: at, End: at, Outcome: "failed"},
			Events:  []store.Event{{Type: "work_retrying", Task: "a", Attempt: run}}}
	}
	run := 0
	for round := range 300 {
		at := h.tick()
		run++
		ops := []store.Op{claim(busy.ID, run, at)}
		for i := range 3 {
			ops = append(ops, &store.AppendEvent{Event: store.Event{Type: "noise", WorkID: other.ID, Task: "a", Attempt: i, Time: at}})
		}
		if round%2 == 0 { // claim and finish in one batch
			ops = append(ops, retry(busy.ID, run, at))
			keep(h.apply(ops...))
		} else { // apart
			keep(h.apply(ops...))
			keep(h.apply(&store.AppendEvent{Event: store.Event{Type: "progress", WorkID: busy.ID, Task: "a", Time: at}},
				retry(busy.ID, run, h.tick())))
		}
	}
	require.Greater(t, len(want), 700)
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	read := func(q store.EventQuery) []store.Event {
		t.Helper()
		q.WorkID, q.Upto = busy.ID, last
		evs, err := h.st.MatchingEvents(h.ctx, q)
		require.NoError(t, err)
		return evs
	}
	same := func(want, got []store.Event, what string) {
		t.Helper()
		require.Len(t, got, len(want), what)
		for i := range want {
			assert.Equal(t, want[i].Seq, got[i].Seq, "%s: event %d", what, i)
			assert.Equal(t, want[i].Type, got[i].Type, "%s: event %d", what, i)
			assert.Equal(t, want[i].Attempt, got[i].Attempt, "%s: event %d", what, i)
			assert.True(t, want[i].Time.Equal(got[i].Time), "%s: event %d", what, i)
		}
	}
	same(want, read(store.EventQuery{Limit: 10000}), "all")
	same(want[300:], read(store.EventQuery{After: want[299].Seq, Limit: 10000}), "after 300")
	same(want[100:117], read(store.EventQuery{After: want[99].Seq, Limit: 17}), "17 after 100")
	var retries []store.Event
	for _, e := range want {
		if e.Type == "work_retrying" {
			retries = append(retries, e)
		}
	}
	same(retries, read(store.EventQuery{Types: []string{"work_retrying"}, Limit: 10000}), "retries")
	assert.Empty(t, read(store.EventQuery{Tasks: []string{"b"}, Limit: 10000}), "another task")

	// Retention inside a batch: the cut is an event of busy's claim in a
	// batch that also holds other events.
	cut := want[200]
	h.apply(&store.Prune{EventsBefore: cut.Time})
	first, err := h.st.FirstSeq(h.ctx)
	require.NoError(t, err)
	var left []store.Event
	for _, e := range want {
		if e.Seq >= first {
			left = append(left, e)
		}
	}
	require.NotEmpty(t, left)
	require.Less(t, len(left), len(want))
	same(left, read(store.EventQuery{Limit: 10000}), "after retention")
}
