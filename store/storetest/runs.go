package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: a run's ops (Claim, Finish, history, Recover, Heartbeat, merged claim and finish, concurrent Apply).

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
	h.finish(u.ID, 3, store.Completed, func(f *store.Finish) { f.Attempt.Used = map[string]int64{"tokens": 123, "a\"b": 1} })
	got = h.get(u.ID)
	assert.Equal(t, 3, got.Runs)
	require.Len(t, got.Attempts, 3)
	assert.Nil(t, got.Attempts[0].Used)
	assert.Equal(t, map[string]int64{"tokens": 123, "a\"b": 1}, got.Attempts[2].Used, "the amounts the run used are kept")
	assert.Equal(t, []string{"failed", "deferred", "completed"}, []string{got.Attempts[0].Outcome, got.Attempts[1].Outcome, got.Attempts[2].Outcome})
	assert.Equal(t, "boom", got.Attempts[0].Error)
}

func testRecover(t *testing.T, h *harness) {
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "owner"})
	require.NoError(t, err)
	e1 := own.Epoch()
	require.NoError(t, own.Release())
	a, b, q, l := h.unit("a"), h.unit("b"), h.unit("a"), h.unit("a")
	h.insert(a, b, q, l)
	claim := func(u *store.Unit, lease time.Duration) {
		at := h.tick()
		require.True(t, h.apply(&store.Claim{Epoch: e1, ID: u.ID, Owner: "owner", Run: 1, At: at, LeaseExpires: at.Add(lease)})[0].Applied)
	}
	claim(a, time.Minute)
	claim(b, time.Minute)
	claim(l, time.Hour)
	assert.Equal(t, e1, h.get(a.ID).Epoch, "a run records its owner's epoch")
	h.apply(&store.Cancel{ID: b.ID, At: h.tick()})
	dep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{b.ID} })
	h.insert(dep)
	own, err = h.st.Acquire(h.ctx, store.Holder{Owner: "next"})
	require.NoError(t, err)
	defer own.Release()
	e2 := own.Epoch()
	require.Greater(t, e2, e1, "taking ownership moves the epoch on")

	// An owner not proven dead: only expired leases go.
	r := h.apply(&store.Recover{Epoch: e2, At: h.tick()})[0]
	assert.Empty(t, r.IDs, "every lease holds")
	assert.ElementsMatch(t, []string{a.ID, b.ID, l.ID}, r.Held)
	assert.Equal(t, store.Running, h.get(a.ID).State)
	h.now = h.now.Add(2 * time.Minute)
	r = h.apply(&store.Recover{Epoch: e2, At: h.tick()})[0]
	assert.Equal(t, []string{a.ID}, r.IDs, "a's lease expired; b's too, but b is cancelled instead")
	assert.Equal(t, []string{l.ID}, r.Held)
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

	// A dead owner's runs go at once; Only limits the look.
	r = h.apply(&store.Recover{Epoch: e2, At: h.tick(), PreviousDead: true, Only: []string{q.ID}})[0]
	assert.Empty(t, r.IDs)
	r = h.apply(&store.Recover{Epoch: e2, At: h.tick(), PreviousDead: true})[0]
	assert.Equal(t, []string{l.ID}, r.IDs)
	assert.Empty(t, h.apply(&store.Recover{Epoch: e2, At: h.tick(), PreviousDead: true})[0].IDs, "nothing left to recover")
}

// testFencing: once ownership moved on, every op of the earlier epoch
// fails alone with ErrNotOwner in a batch whose other ops commit; an op
// with no epoch (a client's) is not checked.
func testFencing(t *testing.T, h *harness) {
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "old"})
	require.NoError(t, err)
	old := own.Epoch()
	require.NoError(t, own.Release())
	u, v := h.unit("a"), h.unit("a")
	h.insert(u, v)
	at := h.tick()
	require.True(t, h.apply(&store.Claim{Epoch: old, ID: u.ID, Owner: "old", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
		Log: requests("svc")})[0].Applied)
	own, err = h.st.Acquire(h.ctx, store.Holder{Owner: "new"})
	require.NoError(t, err)
	defer own.Release()
	at = h.tick()
	ops := []store.Op{
		&store.Claim{Epoch: old, ID: v.ID, Owner: "old", Run: 1, At: at, LeaseExpires: at.Add(time.Minute), Log: requests("svc")},
		&store.Finish{Epoch: old, ID: u.ID, Owner: "old", Run: 1, At: at, State: store.Completed,
			Events: []store.Event{{Type: store.TypeWorkCompleted, Task: "a", Attempt: 1}}},
		&store.Heartbeat{Epoch: old, ID: u.ID, Owner: "old", Run: 1, At: at, LeaseExpires: at.Add(time.Hour)},
		&store.AppendEvent{Epoch: old, Event: store.Event{Type: "owner_event", Time: at}},
		&store.PutMeterState{Epoch: old, Service: "svc", Meter: store.MeterCircuit, State: []byte(`{}`)},
		&store.Recover{Epoch: old, At: at, PreviousDead: true},
		&store.Prune{Epoch: old, Before: at.Add(time.Hour)},
		&store.FailQueued{Epoch: old, ID: v.ID, At: at, Error: "x", ErrorKind: "x"},
		&store.Reconcile{Epoch: old, Service: "svc", Meter: store.MeterRequests, WorkID: u.ID, At: at, Amount: 5},
		// A client's ops, and the new owner's, go through.
		&store.AppendEvent{Event: store.Event{Type: "client_event", Time: at}},
		&store.Cancel{ID: v.ID, At: at},
		&store.AppendEvent{Epoch: own.Epoch(), Event: store.Event{Type: "new_owner_event", Time: at}},
	}
	res := h.apply(ops...)
	for i, r := range res[:9] {
		assert.ErrorIs(t, r.Err, store.ErrNotOwner, "op %d (%T)", i, ops[i])
		assert.Empty(t, r.Events, "op %d", i)
	}
	for i, r := range res[9:] {
		assert.NoError(t, r.Err, "op %d", 9+i)
		assert.True(t, r.Applied, "op %d", 9+i)
	}
	assert.Equal(t, store.Running, h.get(u.ID).State, "the old owner's finish was not stored")
	assert.Equal(t, store.Cancelled, h.get(v.ID).State)
	svcs, err := h.st.Services(h.ctx)
	require.NoError(t, err)
	assert.Empty(t, svcs, "no meter state stored")
	log, err := h.st.ServiceLog(h.ctx, "svc", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 1, "only the claim made before the new epoch")
	assert.Equal(t, int64(1), log[0].Amount, "not reconciled")
	var types []string
	for _, e := range h.events(0) {
		types = append(types, e.Type)
	}
	assert.NotContains(t, types, "owner_event")
	assert.Contains(t, types, "client_event")
	assert.Contains(t, types, "new_owner_event")
}

// testReconcile: a start's logged amount is replaced once by the actual
// charge; a second reconcile, or one of an entry that does not exist,
// applies nothing.
func testReconcile(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	at := h.tick()
	require.True(t, h.apply(&store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
		Log: []store.LogEntry{{Service: "llm", Meter: store.MeterRequests, Amount: 1}, {Service: "llm", Meter: "tokens", Amount: 900}}})[0].Applied)
	rec := func(meter string, amount int64, when time.Time) bool {
		return h.apply(&store.Reconcile{Service: "llm", Meter: meter, WorkID: u.ID, At: when, Amount: amount})[0].Applied
	}
	assert.True(t, rec("tokens", 640, at))
	assert.False(t, rec("tokens", 700, at), "once only")
	assert.False(t, rec("tokens", 700, at.Add(time.Second)), "no such entry")
	log, err := h.st.ServiceLog(h.ctx, "llm", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 2)
	byMeter := map[string]store.Logged{}
	for _, l := range log {
		byMeter[l.Meter] = l
	}
	assert.Equal(t, store.Logged{At: byMeter["tokens"].At, Meter: "tokens", Amount: 640, Reconciled: true}, byMeter["tokens"])
	assert.Equal(t, int64(1), byMeter[store.MeterRequests].Amount)
	assert.True(t, byMeter["tokens"].At.Equal(at))
}

// testLogUsage: usage reported from elsewhere is a service log entry of
// its own, read back with the starts, in order.
func testLogUsage(t *testing.T, h *harness) {
	u := h.unit("a")
	h.insert(u)
	at := h.tick()
	require.True(t, h.apply(&store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute),
		Log: []store.LogEntry{{Service: "llm", Meter: "tokens", Amount: 900}}})[0].Applied)
	later := h.tick()
	require.True(t, h.apply(&store.LogUsage{Service: "llm", Meter: "tokens", At: later, Amount: 2500})[0].Applied)
	log, err := h.st.ServiceLog(h.ctx, "llm", time.Time{})
	require.NoError(t, err)
	require.Len(t, log, 2)
	assert.Equal(t, int64(900), log[0].Amount)
	assert.Equal(t, int64(2500), log[1].Amount)
	assert.True(t, log[1].At.Equal(later))
	assert.Equal(t, "tokens", log[1].Meter)
	byPrefix, err := h.st.ServiceLogPrefix(h.ctx, "ll", time.Time{})
	require.NoError(t, err)
	assert.Len(t, byPrefix["llm"], 2)
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
				b, err := st.Apply(h.ctx, []store.Op{&store.Insert{Units: []*store.Unit{u}, At: time.Now()}})
				if err == nil && b.Results[0].Err != nil {
					err = b.Results[0].Err
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

// testClaimFinishOneBatch checks that a claim and its finish in one batch
// (which a store may merge) behave exactly as in two batches.
func testClaimFinishOneBatch(t *testing.T, h *harness) {
	us := h.units(4)
	at := h.tick()
	claim := func(u *store.Unit) *store.Claim {
		return &store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute), Log: []store.LogEntry{{Service: "svc", Meter: store.MeterRequests, Amount: 1}},
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

// testClaimFinishSegment checks a batch of nothing but Claims and
// Finishes (which a store may write a statement per kind, and a unit
// claimed and finished in it as one write): twice, first with every op
// applying, then with a claim refused (its finish with it), a finish of
// another run than the one claimed, a claim without its finish and a
// finish without its claim. Each op's outcome, each unit's row and each
// unit's events are as when the ops are applied one at a time.
func testClaimFinishSegment(t *testing.T, h *harness) {
	at := h.tick()
	claim := func(u *store.Unit, run int) *store.Claim {
		return &store.Claim{ID: u.ID, Owner: "o", Run: run, At: at, LeaseExpires: at.Add(time.Minute),
			Log:    []store.LogEntry{{Service: "svc", Meter: store.MeterRequests, Amount: 1}},
			Events: []store.Event{{Type: "work_started", Task: "a", Attempt: run}}}
	}
	end := at.Add(time.Millisecond)
	finish := func(u *store.Unit, run int, st store.State) *store.Finish {
		f := &store.Finish{ID: u.ID, Owner: "o", Run: run, At: end, State: st,
			Attempt: store.Attempt{Run: run, Start: at, End: end, Outcome: string(st)},
			Events:  []store.Event{{Type: "work_" + string(st), Task: "a", Attempt: run}}}
		switch st {
		case store.Completed:
			f.Result = []byte(`"r` + u.ID + `"`)
		case store.Queued:
			f.Events[0].Type = store.TypeWorkRetrying
			f.SpendBudget, f.RunAt, f.Error, f.ErrorKind = true, end.Add(time.Hour), "boom", "handler"
		}
		return f
	}
	events := map[string][]store.Event{}
	keep := func(res []store.Result) {
		var prev int64
		for _, r := range res {
			for _, e := range r.Events {
				assert.Greater(t, e.Seq, prev, "events numbered in op order")
				prev = e.Seq
				events[e.WorkID] = append(events[e.WorkID], e)
			}
		}
	}
	applied := func(res []store.Result) []bool {
		var out []bool
		for _, r := range res {
			require.NoError(t, r.Err)
			out = append(out, r.Applied)
		}
		return out
	}

	// Every op applies.
	us := h.units(3)
	res := h.apply(claim(us[0], 1), claim(us[1], 1), claim(us[2], 1),
		finish(us[0], 1, store.Completed), finish(us[1], 1, store.Queued), finish(us[2], 1, store.Failed))
	keep(res)
	assert.Equal(t, []bool{true, true, true, true, true, true}, applied(res))
	u0 := h.get(us[0].ID)
	assert.Equal(t, store.Completed, u0.State)
	assert.Equal(t, 1, u0.Runs)
	assert.True(t, u0.StartedAt.Equal(at))
	assert.True(t, u0.FinishedAt.Equal(end))
	assert.Equal(t, `"r`+us[0].ID+`"`, string(u0.Result))
	assert.Empty(t, u0.LeasedBy)
	require.Len(t, u0.Attempts, 1)
	u1 := h.get(us[1].ID)
	assert.Equal(t, store.Queued, u1.State, "a retry")
	assert.Equal(t, 1, u1.Runs)
	assert.Equal(t, 1, u1.Failures)
	assert.True(t, u1.RunAt.Equal(end.Add(time.Hour)))
	assert.True(t, u1.FinishedAt.IsZero())
	assert.Equal(t, "boom", u1.Error)
	require.Len(t, u1.Attempts, 1)
	assert.Equal(t, store.Failed, h.get(us[2].ID).State)

	// Some do not apply. vs[0] is cancelled, so neither its claim nor its
	// finish applies; vs[1]'s finish names another run; vs[2] is only
	// claimed; vs[3], claimed before, is only finished; vs[4] is claimed
	// and finished; us[1] (its retry) is claimed and finished again.
	vs := h.units(5)
	h.apply(&store.Cancel{ID: vs[0].ID, At: h.tick()})
	keep(h.apply(claim(vs[3], 1)))
	res = h.apply(claim(vs[0], 1), claim(vs[1], 1), claim(vs[2], 1), claim(vs[4], 1), claim(us[1], 2),
		finish(vs[0], 1, store.Completed), finish(vs[1], 2, store.Completed), finish(vs[3], 1, store.Completed),
		finish(vs[4], 1, store.Completed), finish(us[1], 2, store.Completed))
	keep(res)
	assert.Equal(t, []bool{false, true, true, true, true, false, false, true, true, true}, applied(res))
	assert.Equal(t, store.Cancelled, h.get(vs[0].ID).State)
	v1 := h.get(vs[1].ID)
	assert.Equal(t, store.Running, v1.State, "a finish of another run leaves the claim's run running")
	assert.Equal(t, "o", v1.LeasedBy)
	assert.Equal(t, store.Running, h.get(vs[2].ID).State)
	assert.Equal(t, store.Completed, h.get(vs[3].ID).State)
	assert.Equal(t, store.Completed, h.get(vs[4].ID).State)
	u1 = h.get(us[1].ID)
	assert.Equal(t, store.Completed, u1.State)
	assert.Equal(t, 2, u1.Runs)
	assert.Equal(t, 1, u1.Failures)
	require.Len(t, u1.Attempts, 2)

	log, err := h.st.ServiceLog(h.ctx, "svc", time.Time{})
	require.NoError(t, err)
	assert.Len(t, log, 8, "each applied claim logs its dispatch")
	last, err := h.st.LastSeq(h.ctx)
	require.NoError(t, err)
	for _, u := range append(us, vs...) {
		got, err := h.st.MatchingEvents(h.ctx, store.EventQuery{WorkID: u.ID, Upto: last, Limit: 100})
		require.NoError(t, err)
		var want, have []string
		for _, e := range events[u.ID] {
			want = append(want, fmt.Sprint(e.Seq, e.Type))
		}
		for _, e := range got {
			if e.Type != store.TypeWorkQueued && e.Type != store.TypeWorkCancelled { // the insert's and the Cancel's
				have = append(have, fmt.Sprint(e.Seq, e.Type))
			}
		}
		assert.Equal(t, want, have, "the events of %s", u.ID)
	}
}
