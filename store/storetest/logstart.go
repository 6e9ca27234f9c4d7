package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// testLogStart: starts logged ahead of their claims (LogStart) are service
// log entries of their units, reconciled like a claim's; one logged again
// (a write repeated after its outcome was lost) adds nothing; a batch of
// them alone (which a StartLogger writes outside the writers' turns) and
// one among other ops apply alike; a deposed owner's are refused, in a
// batch with the live owner's; the unit's claim behind it logs nothing
// more.
func testLogStart(t *testing.T, h *harness) {
	us := []*store.Unit{h.unit("a"), h.unit("a"), h.unit("a")}
	h.insert(us...)
	at := h.tick()
	start := func(epoch int64, u *store.Unit, at time.Time) *store.LogStart {
		return &store.LogStart{Epoch: epoch, WorkID: u.ID, Run: 1, At: at,
			Log: []store.LogEntry{{Service: "llm", Meter: store.MeterRequests, Amount: 1}, {Service: "llm", Meter: "tokens", Amount: 900}}}
	}
	logged := func() []store.Logged {
		t.Helper()
		log, err := h.st.ServiceLog(h.ctx, "llm", time.Time{})
		require.NoError(t, err)
		return log
	}
	res := h.apply(start(0, us[0], at), start(0, us[1], at))
	assert.True(t, res[0].Applied)
	assert.True(t, res[1].Applied)
	assert.Empty(t, res[0].Events, "no event")
	require.Len(t, logged(), 4)
	// Again, alone and among other ops: nothing more.
	assert.True(t, h.apply(start(0, us[0], at))[0].Applied)
	res = h.apply(&store.AppendEvent{Event: store.Event{Type: "note", Time: at}}, start(0, us[1], at))
	assert.True(t, res[1].Applied)
	require.Len(t, logged(), 4, "a start logged again adds nothing")
	// The claim behind the start logs nothing; the entry is reconciled.
	require.True(t, h.apply(&store.Claim{ID: us[0].ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})[0].Applied)
	require.Len(t, logged(), 4)
	assert.True(t, h.apply(&store.Reconcile{Service: "llm", Meter: "tokens", WorkID: us[0].ID, At: at, Amount: 640})[0].Applied)
	var tokens []int64
	for _, l := range logged() {
		if l.Meter == "tokens" {
			tokens = append(tokens, l.Amount)
		}
	}
	assert.ElementsMatch(t, []int64{640, 900}, tokens)

	// A deposed owner's start is refused beside the live owner's.
	old, own := h.deposed()
	defer own.Release()
	later := h.tick()
	res = h.apply(start(old, us[2], later), start(own.Epoch(), us[1], later))
	assert.ErrorIs(t, res[0].Err, store.ErrNotOwner)
	assert.False(t, res[0].Applied)
	assert.True(t, res[1].Applied)
	res = h.apply(&store.AppendEvent{Event: store.Event{Type: "note", Time: later}}, start(old, us[2], later))
	assert.ErrorIs(t, res[1].Err, store.ErrNotOwner)
	n := 0
	for _, l := range logged() {
		if l.At.Equal(later) {
			n++
		}
	}
	assert.Equal(t, 2, n, "only the live owner's start is logged")
}
