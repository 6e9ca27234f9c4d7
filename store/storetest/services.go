package storetest

import (
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: tasks, services, the service log and retention.

func testTasksServices(t *testing.T, h *harness) {
	h.apply(&store.PutTask{Name: "a", Def: []byte(`{"v":1}`)}, &store.PutTask{Name: "b", Def: []byte(`{}`)})
	h.apply(&store.PutTask{Name: "a", Def: []byte(`{"v":2}`)})
	tasks, err := h.st.Tasks(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string][]byte{"a": []byte(`{"v":2}`), "b": []byte(`{}`)}, tasks)

	yes, no := true, false
	h.apply(&store.PutService{Name: "api", Def: []byte(`{"c":1}`)})
	h.apply(&store.PutService{Name: "api", Override: []byte(`{"c":5}`), Paused: &yes},
		&store.PutMeterState{Service: "api", Meter: store.MeterCircuit, State: []byte(`{"open":true}`)})
	h.apply(&store.PutService{Name: "s3", Def: []byte(`{}`)})
	svcs, err := h.st.Services(h.ctx)
	require.NoError(t, err)
	require.Len(t, svcs, 2)
	assert.Equal(t, store.ServiceRecord{Name: "api", Def: []byte(`{"c":1}`), Override: []byte(`{"c":5}`), Paused: true,
		Meters: map[string][]byte{store.MeterCircuit: []byte(`{"open":true}`)}}, svcs[0], "a nil Def keeps the stored one")
	h.apply(&store.PutService{Name: "api", Override: []byte{}, Paused: &no},
		&store.PutMeterState{Service: "api", Meter: store.MeterCircuit, State: []byte{}})
	svcs, _ = h.st.Services(h.ctx)
	assert.Nil(t, svcs[0].Override, "an empty override clears it")
	assert.False(t, svcs[0].Paused)
	assert.Nil(t, svcs[0].Meters, "an empty state deletes it")
	// A keyed instance's meter state, without a service record, is listed.
	h.apply(&store.PutMeterState{Service: "api:k", Meter: store.MeterCircuit, State: []byte(`{}`)})
	svcs, _ = h.st.Services(h.ctx)
	require.Len(t, svcs, 3)
	assert.Equal(t, "api:k", svcs[1].Name)
	assert.Equal(t, []byte(`{}`), svcs[1].Meters[store.MeterCircuit])
}

func testServiceLog(t *testing.T, h *harness) {
	u1, u2 := h.unit("a"), h.unit("a")
	h.insert(u1, u2)
	at := h.tick()
	h.apply(&store.Claim{ID: u1.ID, Owner: "o", Run: 1, At: at, Log: requests("api", "s3")})
	at2 := h.tick()
	h.apply(&store.Claim{ID: u2.ID, Owner: "o", Run: 1, At: at2, Log: requests("api")})
	h.apply(&store.Claim{ID: u2.ID, Owner: "o", Run: 1, At: h.tick(), Log: requests("api")}) // not applied: no entry
	log, err := h.st.ServiceLog(h.ctx, "api", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 2)
	assert.True(t, log[0].At.Equal(at) && log[1].At.Equal(at2))
	assert.Equal(t, store.Logged{At: log[0].At, Meter: store.MeterRequests, Amount: 1}, log[0])
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
	h.apply(&store.Claim{ID: us[0].ID, Owner: "o", Run: 1, At: old, Log: requests("host:a.example", "hosting")})
	h.apply(&store.Claim{ID: us[1].ID, Owner: "o", Run: 1, At: old, Log: requests("host:b.example")})
	cut := h.tick()
	h.apply(&store.Claim{ID: us[2].ID, Owner: "o", Run: 1, At: h.tick(), Log: requests("host:a.example")})
	h.apply(&store.Prune{LogBefore: map[string]time.Time{"host:": cut}})
	for svc, want := range map[string]int{"host:a.example": 1, "host:b.example": 0, "hosting": 1} {
		log, err := h.st.ServiceLog(h.ctx, svc, time.Time{})
		require.NoError(t, err)
		assert.Len(t, log, want, svc)
	}
	h.apply(&store.Claim{ID: us[3].ID, Owner: "o", Run: 1, At: h.tick(), Log: requests("host:b.example", "host;x")})
	byKey, err := h.st.ServiceLogPrefix(h.ctx, "host:", time.Time{})
	require.NoError(t, err)
	assert.Len(t, byKey, 2, "only services with the prefix: %v", byKey)
	assert.Len(t, byKey["host:a.example"], 1)
	assert.Len(t, byKey["host:b.example"], 1)
	byKey, err = h.st.ServiceLogPrefix(h.ctx, "host:", h.now)
	require.NoError(t, err)
	assert.Equal(t, map[string][]store.Logged{"host:b.example": {{At: h.now, Meter: store.MeterRequests, Amount: 1}}}, byKey,
		"since is inclusive")
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
		require.True(t, h.apply(&store.Claim{ID: lu.ID, Owner: "owner", Run: 1, At: h.tick(), Log: requests("svc0")})[0].Applied)
		h.finish(lu.ID, 1, store.Queued)
	}
	r = h.apply(&store.Prune{LogBefore: map[string]time.Time{"svc0": h.tick()}, Limit: 2})[0]
	assert.True(t, r.More)
	r = h.apply(&store.Prune{LogBefore: map[string]time.Time{"svc0": h.tick()}, Limit: 2})[0]
	assert.False(t, r.More)
}
