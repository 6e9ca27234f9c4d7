package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Conformance: schedules, their run-time changes, and Fire: a period
// submitted once, the cursor moved in the same transaction, whoever
// fires it again.

func scheduleData(t *testing.T, ev store.Event) store.ScheduleEventData {
	t.Helper()
	var d store.ScheduleEventData
	require.NoError(t, json.Unmarshal(ev.Data, &d))
	return d
}

func schedule(t *testing.T, h *harness, name string) store.ScheduleRecord {
	t.Helper()
	recs, err := h.st.Schedules(h.ctx)
	require.NoError(t, err)
	for _, r := range recs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("schedule %q not stored", name)
	return store.ScheduleRecord{}
}

func testSchedules(t *testing.T, h *harness) {
	recs, err := h.st.Schedules(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, recs)
	created := h.tick()
	r := h.apply(&store.PutSchedule{Name: "nightly", Def: []byte(`{"v":1}`), At: created})
	require.True(t, r[0].Applied)
	require.Len(t, r[0].Events, 1)
	assert.Equal(t, store.TypeScheduleChanged, r[0].Events[0].Type)
	assert.Equal(t, "registered", scheduleData(t, r[0].Events[0]).Change)
	rec := schedule(t, h, "nightly")
	assert.Equal(t, store.ScheduleRecord{Name: "nightly", Def: []byte(`{"v":1}`), Created: created, LastAt: created}, rec)

	// The same definition again changes nothing; run-time changes stick
	// until the definition itself changes.
	r = h.apply(&store.PutSchedule{Name: "nightly", Def: []byte(`{"v":1}`), At: h.tick()})
	assert.False(t, r[0].Applied)
	assert.Empty(t, r[0].Events)
	timing, paused := []byte(`{"every_ms":60000}`), true
	r = h.apply(&store.PutSchedule{Name: "nightly", Timing: &timing, At: h.tick()}, &store.PutSchedule{Name: "nightly", Paused: &paused, At: h.tick()},
		&store.PutSchedule{Name: "ghost", Paused: &paused, At: h.tick()})
	assert.Equal(t, "retimed", scheduleData(t, r[0].Events[0]).Change)
	assert.Equal(t, "paused", scheduleData(t, r[1].Events[0]).Change)
	assert.ErrorIs(t, r[2].Err, store.ErrUnknownSchedule)
	h.apply(&store.PutSchedule{Name: "nightly", Def: []byte(`{"v":1}`), At: h.tick()})
	rec = schedule(t, h, "nightly")
	assert.Equal(t, timing, rec.Timing)
	assert.Equal(t, r[0].Events[0].Time, rec.LastAt, "a new timing starts from the change")
	assert.True(t, rec.Paused)
	other := h.again()
	defer other.Close()
	recs, err = other.Schedules(h.ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.True(t, recs[0].Paused, "stored: another handle reads it")
	changedAt := h.tick()
	r = h.apply(&store.PutSchedule{Name: "nightly", Def: []byte(`{"v":2}`), At: changedAt})
	assert.True(t, r[0].Applied)
	rec = schedule(t, h, "nightly")
	assert.Equal(t, changedAt, rec.LastAt, "a changed definition starts from the change")
	assert.Nil(t, rec.Timing, "a changed definition clears the run-time timing")
	assert.False(t, rec.Paused, "and the pause")
	assert.Equal(t, created, rec.Created)

	// Fire: the unit and the cursor in one transaction.
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "owner"})
	require.NoError(t, err)
	ep := own.Epoch()
	p1 := created.Add(time.Hour)
	unit := func(key string) *store.Unit {
		u := h.unit("report")
		u.IdempotencyKey = "schedule:nightly:" + key
		u.CreatedAt = h.now
		return u
	}
	u1 := unit("p1")
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p1", Nominal: p1, At: h.tick(), Unit: u1})
	require.NoError(t, r[0].Err)
	require.Len(t, r[0].Units, 1)
	assert.Equal(t, u1.ID, r[0].Units[0].ID)
	assert.Equal(t, []string{store.TypeWorkQueued + ":" + u1.ID, store.TypeScheduleSubmitted + ":" + u1.ID}, types(r[0].Events))
	d := scheduleData(t, r[0].Events[1])
	assert.Equal(t, store.ScheduleEventData{Schedule: "nightly", Period: "p1"}, d)
	rec = schedule(t, h, "nightly")
	assert.Equal(t, p1, rec.LastAt)
	assert.Equal(t, "p1", rec.LastKey)
	assert.Equal(t, u1.ID, rec.LastUnit)

	// The same period again (a second owner's view, a retry): refused,
	// nothing stored.
	again := unit("p1")
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p1", Nominal: p1, At: h.tick(), Unit: again})
	assert.ErrorIs(t, r[0].Err, store.ErrScheduleMoved)
	_, err = h.st.GetUnit(h.ctx, again.ID)
	assert.ErrorIs(t, err, store.ErrNotFound, "the refused period's unit is not stored")
	// An earlier period too.
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p0", Nominal: created.Add(time.Minute), At: h.tick(), Unit: unit("p0")})
	assert.ErrorIs(t, r[0].Err, store.ErrScheduleMoved)

	// Overlap: u1 is still queued, so the next period is skipped.
	p2 := p1.Add(time.Hour)
	u2 := unit("p2")
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p2", Nominal: p2, At: h.tick(), Unit: u2, Prev: u1.ID, SkipIfRunning: true})
	require.NoError(t, r[0].Err)
	assert.Empty(t, r[0].Units)
	assert.Equal(t, []string{store.TypeScheduleSkipped + ":"}, types(r[0].Events))
	assert.Equal(t, store.ScheduleEventData{Schedule: "nightly", Period: "p2", Reason: "overlap", Skipped: 1, FirstSkipped: "p2"},
		scheduleData(t, r[0].Events[0]))
	_, err = h.st.GetUnit(h.ctx, u2.ID)
	assert.ErrorIs(t, err, store.ErrNotFound)
	rec = schedule(t, h, "nightly")
	assert.Equal(t, "p2", rec.LastKey)
	assert.Equal(t, u1.ID, rec.LastUnit, "the last unit submitted")

	// Missed periods skipped with the latest submitted.
	p5 := p2.Add(3 * time.Hour)
	u5 := unit("p5")
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p5", Nominal: p5, At: h.tick(), Unit: u5, Reason: "missed",
		Skipped: 2, FirstSkipped: "p3"})
	require.NoError(t, r[0].Err)
	assert.Equal(t, store.ScheduleEventData{Schedule: "nightly", Period: "p5", Reason: "missed", Skipped: 2, FirstSkipped: "p3"},
		scheduleData(t, r[0].Events[1]))

	// A deposed owner fires nothing.
	require.NoError(t, own.Release())
	own2, err := h.st.Acquire(h.ctx, store.Holder{Owner: "next"})
	require.NoError(t, err)
	defer own2.Release()
	u6 := unit("p6")
	r = h.apply(&store.Fire{Epoch: ep, Schedule: "nightly", Key: "p6", Nominal: p5.Add(time.Hour), At: h.tick(), Unit: u6})
	assert.ErrorIs(t, r[0].Err, store.ErrNotOwner)
	_, err = h.st.GetUnit(h.ctx, u6.ID)
	assert.ErrorIs(t, err, store.ErrNotFound)

	// Deleted: gone, and a Fire of it is refused.
	r = h.apply(&store.PutSchedule{Name: "nightly", Delete: true, At: h.tick()})
	assert.True(t, r[0].Applied)
	assert.Equal(t, "deleted", scheduleData(t, r[0].Events[0]).Change)
	recs, err = h.st.Schedules(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, recs)
	r = h.apply(&store.Fire{Epoch: own2.Epoch(), Schedule: "nightly", Key: "p6", Nominal: p5.Add(time.Hour), At: h.tick(), Unit: unit("p6b")})
	assert.ErrorIs(t, r[0].Err, store.ErrScheduleMoved)
	r = h.apply(&store.PutSchedule{Name: "nightly", Delete: true, At: h.tick()})
	assert.ErrorIs(t, r[0].Err, store.ErrUnknownSchedule)
}
