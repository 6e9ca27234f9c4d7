package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// testSegmentEvents: batches of Claims and Finishes of many units (which a
// backend may write a statement per kind), some refused, some carrying
// several events or an event of another unit, some after an event
// appended for their unit earlier in the batch, and a unit claimed and
// finished in one batch: each unit's events (MatchingEvents with WorkID)
// are exactly those its ops' results returned, in order, and the log holds
// every result's events once, numbered in the ops' order.
func testSegmentEvents(t *testing.T, h *harness) {
	const n = 12
	units := make([]*store.Unit, n)
	for i := range units {
		units[i] = h.unit("a")
	}
	var all []store.Event
	keep := func(res []store.Result) {
		for _, r := range res {
			all = append(all, r.Events...)
		}
	}
	keep([]store.Result{h.insert(units...)})
	owner := "o"
	claim := func(u *store.Unit, run int, at time.Time, evs ...store.Event) *store.Claim {
		if len(evs) == 0 {
			evs = []store.Event{{Type: "work_started", Task: "a", Attempt: run}}
		}
		return &store.Claim{ID: u.ID, Owner: owner, Run: run, At: at, LeaseExpires: at.Add(time.Minute), Events: evs}
	}
	finish := func(u *store.Unit, run int, state store.State, at time.Time) *store.Finish {
		return &store.Finish{ID: u.ID, Owner: owner, Run: run, At: at, State: state, RunAt: at,
			Attempt: store.Attempt{Run: run, Start: at, End: at, Outcome: string(state)},
			Events:  []store.Event{{Type: "work_" + string(state), Task: "a", Attempt: run}}}
	}
	at := h.tick()
	// Claims of units 0-7: unit 3 with two events and one of unit 11's, unit
	// 5 claimed twice (the second refused).
	res := h.apply(claim(units[0], 1, at), claim(units[1], 1, at), claim(units[2], 1, at),
		claim(units[3], 1, at, store.Event{Type: "work_started", Task: "a", Attempt: 1},
			store.Event{Type: "note", Task: "a"}, store.Event{Type: "note", Task: "a", WorkID: units[11].ID}),
		claim(units[4], 1, at), claim(units[5], 1, at), claim(units[6], 1, at), claim(units[7], 1, at))
	for i, r := range res {
		require.NoError(t, r.Err, "claim %d", i)
		require.True(t, r.Applied, "claim %d", i)
	}
	keep(res)
	at = h.tick()
	// Finishes of 0-3 (1 with the wrong run: refused), claims of 8 and 9,
	// unit 5 claimed again (refused), a finish of 6 then a claim of 10.
	res = h.apply(finish(units[0], 1, store.Completed, at), finish(units[1], 2, store.Completed, at),
		claim(units[8], 1, at), claim(units[5], 2, at), finish(units[2], 1, store.Queued, at),
		finish(units[3], 1, store.Completed, at), finish(units[6], 1, store.Completed, at), claim(units[9], 1, at),
		claim(units[10], 1, at))
	applied := []bool{true, false, true, false, true, true, true, true, true}
	for i, r := range res {
		require.NoError(t, r.Err, "op %d", i)
		require.Equal(t, applied[i], r.Applied, "op %d", i)
	}
	keep(res)
	at = h.tick()
	// An event for unit 4 appended before its finish in the batch, then
	// finishes of 4, 5 and 8.
	res = h.apply(&store.AppendEvent{Event: store.Event{Type: "progress", WorkID: units[4].ID, Task: "a", Time: at}},
		finish(units[4], 1, store.Completed, at), finish(units[5], 1, store.Completed, at), finish(units[8], 1, store.Completed, at))
	for i, r := range res {
		require.NoError(t, r.Err, "op %d", i)
		require.True(t, r.Applied, "op %d", i)
	}
	keep(res)
	at = h.tick()
	// Unit 2 claimed and finished in one batch, unit 9's finish between.
	res = h.apply(claim(units[2], 2, at), finish(units[9], 1, store.Completed, at), finish(units[2], 2, store.Completed, at))
	for i, r := range res {
		require.NoError(t, r.Err, "op %d", i)
		require.True(t, r.Applied, "op %d", i)
	}
	keep(res)

	for k := 1; k < len(all); k++ {
		require.Equal(t, all[k-1].Seq+1, all[k].Seq, "the results' events are numbered in the ops' order")
	}
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	logged := h.events(0)
	require.Len(t, logged, len(all))
	for k := range all {
		assert.Equal(t, all[k].Seq, logged[k].Seq)
		assert.Equal(t, all[k].Type+":"+all[k].WorkID, logged[k].Type+":"+logged[k].WorkID)
	}
	for _, u := range units {
		var want []string
		for _, e := range all {
			if e.WorkID == u.ID {
				want = append(want, e.Type)
			}
		}
		got, err := h.st.MatchingEvents(h.ctx, store.EventQuery{WorkID: u.ID, Upto: last, Limit: 100})
		require.NoError(t, err)
		var types []string
		for k, e := range got {
			types = append(types, e.Type)
			if k > 0 {
				assert.Less(t, got[k-1].Seq, e.Seq, "unit %s", u.ID)
			}
		}
		assert.Equal(t, want, types, "unit %s's events", u.ID)
	}
}
