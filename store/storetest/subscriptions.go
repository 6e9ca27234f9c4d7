package storetest

import (
	"testing"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: named subscriptions, and the events retention keeps for
// them.

func testSubscriptions(t *testing.T, h *harness) {
	subs, err := h.st.Subscriptions(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, subs)
	r := h.apply(&store.Ack{Name: "follow", Seq: 0, At: h.tick(), Create: true})
	assert.True(t, r[0].Applied)
	r = h.apply(&store.Ack{Name: "follow", Seq: 99, At: h.tick(), Create: true})
	assert.False(t, r[0].Applied, "exists: created once, at its first position")

	// Six events, a second apart.
	u := h.unit("a")
	h.insert(u)
	for range 5 {
		h.apply(&store.AppendEvent{Event: store.Event{Type: "e", Time: h.tick()}})
	}
	evs := h.events(0)
	require.Len(t, evs, 6)
	h.apply(&store.Ack{Name: "follow", Seq: evs[1].Seq, At: h.tick()})
	h.apply(&store.Ack{Name: "follow", Seq: evs[0].Seq, At: h.tick()}) // never backwards
	subs, err = h.st.Subscriptions(h.ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, evs[1].Seq, subs[0].Acked)
	assert.True(t, subs[0].AckedAt.Equal(h.now), "the time of the last ack")

	// Retention would delete all six; the subscription keeps those after
	// its position, down to the hard bound.
	all := h.tick()
	h.apply(&store.Prune{EventsBefore: all, EventsHardBefore: evs[2].Time})
	left := h.events(0)
	require.Len(t, left, 4)
	assert.Equal(t, evs[2].Seq, left[0].Seq)
	h.apply(&store.Prune{EventsBefore: all, EventsHardBefore: evs[4].Time})
	left = h.events(0)
	require.Len(t, left, 2, "the hard bound wins")
	assert.Equal(t, evs[4].Seq, left[0].Seq)

	// A filtered subscription: its filter is stored at its creation and
	// replaced by SetFilter; Passed lets retention delete what it passed.
	r = h.apply(&store.Ack{Name: "narrow", Seq: evs[3].Seq, At: h.tick(), Create: true, Types: []string{"e"}, Tasks: []string{"t1"}})
	require.True(t, r[0].Applied)
	subs, err = h.st.Subscriptions(h.ctx)
	require.NoError(t, err)
	require.Len(t, subs, 2)
	assert.Equal(t, "narrow", subs[1].Name, "by name")
	assert.Equal(t, []string{"e"}, subs[1].Types)
	assert.Equal(t, []string{"t1"}, subs[1].Tasks)
	assert.Empty(t, subs[0].Types, "follow has no filter")
	r = h.apply(&store.Ack{Name: "narrow", SetFilter: true, Types: []string{"f", "g"}})
	require.True(t, r[0].Applied)
	subs, err = h.st.Subscriptions(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"f", "g"}, subs[1].Types)
	assert.Empty(t, subs[1].Tasks)
	assert.Equal(t, evs[3].Seq, subs[1].Acked, "SetFilter leaves the position")
	h.apply(&store.Ack{Name: "follow", Seq: evs[5].Seq, At: h.tick()})
	h.apply(&store.Prune{EventsBefore: all, EventsHardBefore: evs[0].Time, Passed: map[string]int64{"narrow": evs[4].Seq}})
	left = h.events(0)
	require.Len(t, left, 1, "narrow passed up to the fifth event")
	assert.Equal(t, evs[5].Seq, left[0].Seq)
	h.apply(&store.Ack{Name: "narrow", Remove: true})

	// Without the bound's field, named subscriptions do not hold events.
	h.apply(&store.Ack{Name: "follow", Remove: true})
	subs, err = h.st.Subscriptions(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, subs)
	h.apply(&store.Prune{EventsBefore: all})
	assert.Empty(t, h.events(0))
}
