package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// testExecutors: the executors' protocol (store.ExecutorStore). An
// assignment is made only for the run the owner holds; reports apply only
// to the run still assigned to their executor (ErrStaleRun otherwise, nil
// for a repeat); an executor's heartbeat keeps its runs' leases, which a
// new owner's recovery holds while it lives, even when the earlier owner
// is proven dead; once it is gone, its runs are requeued and their
// assignments deleted, and its late reports refused.
func testExecutors(t *testing.T, h *harness) {
	es, ok := h.st.(store.ExecutorStore)
	if !ok {
		t.Skip("the store does not implement store.ExecutorStore")
	}
	now, err := es.Now(h.ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), now, time.Minute, "the store's clock (this host's, or the server's on it)")
	rec := store.ExecutorRecord{ID: "ex-1", Host: "h1", PID: 7, Tasks: []string{"a", "b"}, Capacity: 4, Poll: 50 * time.Millisecond, TTL: time.Minute}
	assert.True(t, h.apply(&store.RegisterExecutor{Executor: rec})[0].Applied)
	execs, at, err := es.Executors(h.ctx)
	require.NoError(t, err)
	require.Len(t, execs, 1)
	got := execs[0]
	assert.Equal(t, []string{"a", "b"}, got.Tasks)
	assert.Equal(t, 4, got.Capacity)
	assert.Equal(t, time.Minute, got.TTL)
	assert.True(t, got.Live(at), "just registered")
	assert.False(t, got.Live(at.Add(time.Minute)), "a TTL after its last heartbeat, gone")

	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "sched-1"})
	require.NoError(t, err)
	e1 := own.Epoch()
	require.NoError(t, own.Release())
	u, v := h.unit("a", func(u *store.Unit) { u.Target = "t-u"; u.Params = []byte(`{"p":1}`) }), h.unit("b")
	h.insert(u, v)
	wall := time.Now()
	for _, x := range []*store.Unit{u, v} {
		require.True(t, h.apply(&store.Claim{Epoch: e1, ID: x.ID, Owner: "sched-1", Run: 1, At: wall, LeaseExpires: wall.Add(time.Second)})[0].Applied)
	}
	startBy := wall.Add(time.Second)
	res := h.apply(
		&store.Assign{Epoch: e1, ID: u.ID, Owner: "sched-1", Run: 2, Executor: "ex-1"},
		&store.Assign{Epoch: e1, ID: u.ID, Owner: "other", Run: 1, Executor: "ex-1"},
		&store.Assign{Epoch: e1, ID: u.ID, Owner: "sched-1", Run: 1, Executor: "ex-1", StartBy: startBy, Timeout: time.Minute},
		&store.Assign{Epoch: e1, ID: v.ID, Owner: "sched-1", Run: 1, Executor: "ex-1", Timeout: time.Minute})
	assert.False(t, res[0].Applied, "not the unit's run")
	assert.False(t, res[1].Applied, "not the unit's owner")
	assert.True(t, res[2].Applied)
	assert.True(t, res[3].Applied)
	as, err := es.Assigned(h.ctx, "ex-1")
	require.NoError(t, err)
	require.Len(t, as, 2)
	byID := map[string]store.Assignment{}
	for _, a := range as {
		byID[a.ID] = a
	}
	a := byID[u.ID]
	assert.Equal(t, store.Assignment{ID: u.ID, Run: 1, Executor: "ex-1", Task: "a", Target: "t-u", Params: []byte(`{"p":1}`),
		StartBy: time.Unix(0, startBy.UnixNano()), Timeout: time.Minute}, a)
	none, err := es.Assigned(h.ctx, "ex-2")
	require.NoError(t, err)
	assert.Empty(t, none)

	started := time.Now()
	res = h.apply(
		&store.ReportStart{Executor: "ex-2", ID: u.ID, Run: 1, At: started},
		&store.ReportStart{Executor: "ex-1", ID: u.ID, Run: 2, At: started},
		&store.ReportStart{Executor: "ex-1", ID: u.ID, Run: 1, At: started},
		&store.ReportStart{Executor: "ex-1", ID: u.ID, Run: 1, At: started.Add(time.Second)},
		&store.CancelAssigned{Epoch: e1, ID: v.ID, Run: 1, Cause: "cancelled"})
	assert.ErrorIs(t, res[0].Err, store.ErrStaleRun, "another executor's report")
	assert.ErrorIs(t, res[1].Err, store.ErrStaleRun, "another run's report")
	assert.True(t, res[2].Applied)
	assert.False(t, res[3].Applied, "a repeated start is not applied")
	assert.NoError(t, res[3].Err, "nor refused")
	assert.True(t, res[4].Applied)
	rep, err := es.Reported(h.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep, 1)
	assert.Equal(t, store.AssignStarted, rep[0].State)
	assert.Equal(t, time.Unix(0, started.UnixNano()), rep[0].Started)
	as, err = es.Assigned(h.ctx, "ex-1")
	require.NoError(t, err)
	for _, a := range as {
		if a.ID == v.ID {
			assert.Equal(t, "cancelled", a.Cancel)
		}
	}

	// The executor's heartbeat extends its runs' leases past the owner's.
	before := time.Now()
	assert.True(t, h.apply(&store.ExecutorBeat{ID: "ex-1", TTL: time.Hour})[0].Applied)
	assert.False(t, h.apply(&store.ExecutorBeat{ID: "ex-2", TTL: time.Hour})[0].Applied, "not registered")
	assert.False(t, h.get(u.ID).LeaseExpiresAt.Before(before.Add(time.Hour)))

	// A new owner, the earlier one proven dead: the executor's runs hold.
	own, err = h.st.Acquire(h.ctx, store.Holder{Owner: "sched-2"})
	require.NoError(t, err)
	defer own.Release()
	e2 := own.Epoch()
	r := h.apply(&store.Recover{Epoch: e2, At: time.Now(), PreviousDead: true})[0]
	assert.ElementsMatch(t, []string{u.ID, v.ID}, r.Held, "runs of a live executor survive the owner")
	assert.Empty(t, r.IDs)

	// v ends: its report, then the owner's Finish with its Unassign.
	res = h.apply(&store.ReportEnd{Executor: "ex-1", ID: v.ID, Run: 1, Ending: []byte(`{"ok":true}`)})
	assert.True(t, res[0].Applied)
	rep, err = es.Reported(h.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep, 2)
	for _, a := range rep {
		if a.ID == v.ID {
			assert.Equal(t, store.AssignEnded, a.State)
			assert.JSONEq(t, `{"ok":true}`, string(a.Ending))
		}
	}
	fin := time.Now()
	res = h.apply(&store.Finish{Epoch: e2, ID: v.ID, Owner: "sched-1", Run: 1, At: fin, State: store.Completed,
		Attempt: store.Attempt{Run: 1, Start: wall, End: fin, Outcome: "completed"}},
		&store.Unassign{Epoch: e2, ID: v.ID, Run: 1})
	assert.True(t, res[0].Applied, "the new owner finishes the run under its lease's name")
	assert.True(t, res[1].Applied)
	assert.Equal(t, store.Completed, h.get(v.ID).State)

	// The executor goes: its run is requeued, its late report refused.
	assert.True(t, h.apply(&store.RemoveExecutor{ID: "ex-1"})[0].Applied)
	r = h.apply(&store.Recover{Epoch: e2, At: time.Now()})[0]
	assert.Equal(t, []string{u.ID}, r.IDs)
	got2 := h.get(u.ID)
	assert.Equal(t, store.Queued, got2.State)
	require.Len(t, got2.Attempts, 1)
	assert.Equal(t, "executor stopped before the run finished", got2.Attempts[0].Error)
	rep, err = es.Reported(h.ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, rep, "the requeued run's assignment is deleted")
	res = h.apply(&store.ReportEnd{Executor: "ex-1", ID: u.ID, Run: 1, Ending: []byte(`{}`)})
	assert.ErrorIs(t, res[0].Err, store.ErrStaleRun)
	assert.Equal(t, store.Queued, h.get(u.ID).State)

	// Batches of several units' ops (a backend may write them a statement
	// per kind): each op's result is as if applied alone, in order.
	assert.True(t, h.apply(&store.RegisterExecutor{Executor: rec})[0].Applied)
	w, x, y := h.unit("a"), h.unit("a"), h.unit("b")
	h.insert(w, x, y)
	at = time.Now()
	res = h.apply(
		&store.Claim{Epoch: e2, ID: w.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Claim{Epoch: e2, ID: x.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Claim{Epoch: e2, ID: y.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Assign{Epoch: e2, ID: w.ID, Owner: "sched-2", Run: 1, Executor: "ex-1"},
		&store.Assign{Epoch: e2, ID: x.ID, Owner: "sched-1", Run: 1, Executor: "ex-1"},
		&store.Assign{Epoch: e2, ID: y.ID, Owner: "sched-2", Run: 1, Executor: "ex-1"},
		&store.Unassign{Epoch: e2, ID: v.ID, Run: 1})
	assert.Equal(t, []bool{true, true, true, true, false, true, false}, applied(res), "x's Assign names another owner; v has no assignment left")
	res = h.apply(
		&store.ReportStart{Executor: "ex-1", ID: w.ID, Run: 1, At: at},
		&store.ReportStart{Executor: "ex-1", ID: x.ID, Run: 1, At: at},
		&store.ReportStart{Executor: "ex-1", ID: y.ID, Run: 1, At: at},
		&store.ReportEnd{Executor: "ex-1", ID: w.ID, Run: 1, Ending: []byte(`{"w":1}`)},
		&store.ReportEnd{Executor: "ex-2", ID: y.ID, Run: 1, Ending: []byte(`{}`)})
	assert.Equal(t, []bool{true, false, true, true, false}, applied(res))
	assert.ErrorIs(t, res[1].Err, store.ErrStaleRun, "x was never assigned")
	assert.ErrorIs(t, res[4].Err, store.ErrStaleRun, "y is another executor's")
	rep, err = es.Reported(h.ctx, nil)
	require.NoError(t, err)
	states := map[string]store.AssignState{}
	for _, a := range rep {
		states[a.ID] = a.State
	}
	assert.Equal(t, map[string]store.AssignState{w.ID: store.AssignEnded, y.ID: store.AssignStarted}, states)
	// What the reader knows is left out while the state is at most the
	// known one, for the run known only.
	for _, c := range []struct {
		known []store.Known
		want  []string
	}{
		{[]store.Known{{ID: w.ID, Run: 1, State: store.AssignEnded}, {ID: y.ID, Run: 1, State: store.AssignStarted}}, nil},
		{[]store.Known{{ID: y.ID, Run: 1, State: store.AssignStarted}}, []string{w.ID}},
		{[]store.Known{{ID: w.ID, Run: 1, State: store.AssignStarted}}, []string{w.ID, y.ID}},
		{[]store.Known{{ID: w.ID, Run: 2, State: store.AssignEnded}, {ID: y.ID, Run: 2, State: store.AssignEnded}}, []string{w.ID, y.ID}},
		{[]store.Known{{ID: x.ID, Run: 1, State: store.AssignEnded}, {ID: y.ID, Run: 1, State: store.AssignEnded}}, []string{w.ID}},
	} {
		rep, err := es.Reported(h.ctx, c.known)
		require.NoError(t, err)
		var got []string
		for _, a := range rep {
			got = append(got, a.ID)
		}
		assert.ElementsMatch(t, c.want, got, "known %v", c.known)
	}
	// A claim refused (x runs already) beside an Assign of x's current run
	// and an Assign naming the refused claim's run: each as if alone.
	res = h.apply(
		&store.Claim{Epoch: e2, ID: x.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Claim{Epoch: e2, ID: w.ID, Owner: "sched-2", Run: 2, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Assign{Epoch: e2, ID: x.ID, Owner: "sched-2", Run: 1, Executor: "ex-1"},
		&store.Assign{Epoch: e2, ID: w.ID, Owner: "sched-2", Run: 2, Executor: "ex-1"})
	assert.Equal(t, []bool{false, false, true, false}, applied(res), "x's run 1 is assigned; w's run 2 was never claimed")
	as, err = es.Assigned(h.ctx, "ex-1")
	require.NoError(t, err)
	for _, a := range as {
		if a.ID == x.ID {
			assert.Equal(t, store.AssignPending, a.State, "x's assignment again, from its start")
		}
	}
	for _, id := range []string{w.ID, x.ID, y.ID} {
		h.apply(&store.Finish{Epoch: e2, ID: id, Owner: "sched-2", Run: 1, At: at, State: store.Completed,
			Attempt: store.Attempt{Run: 1, Start: at, End: at, Outcome: "completed"}}, &store.Unassign{Epoch: e2, ID: id, Run: 1})
	}

	// One executor's batch of reports (a backend may write it as one
	// statement): a run's start and end together, an end with no start
	// (not started), a start after its run's end, a finished run's report.
	p, q := h.unit("a"), h.unit("a")
	h.insert(p, q)
	at = time.Now()
	res = h.apply(
		&store.Claim{Epoch: e2, ID: p.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Claim{Epoch: e2, ID: q.ID, Owner: "sched-2", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)},
		&store.Assign{Epoch: e2, ID: p.ID, Owner: "sched-2", Run: 1, Executor: "ex-1"},
		&store.Assign{Epoch: e2, ID: q.ID, Owner: "sched-2", Run: 1, Executor: "ex-1"})
	assert.Equal(t, []bool{true, true, true, true}, applied(res))
	res = h.apply(
		&store.ReportStart{Executor: "ex-1", ID: p.ID, Run: 1, At: at},
		&store.ReportEnd{Executor: "ex-1", ID: q.ID, Run: 1, Ending: []byte(`{"not_started":true}`)},
		&store.ReportEnd{Executor: "ex-1", ID: p.ID, Run: 1, Ending: []byte(`{"p":1}`)},
		&store.ReportStart{Executor: "ex-1", ID: q.ID, Run: 1, At: at},
		&store.ReportEnd{Executor: "ex-1", ID: w.ID, Run: 1, Ending: []byte(`{}`)})
	assert.Equal(t, []bool{true, true, true, false, false}, applied(res))
	assert.NoError(t, res[3].Err, "a start after the end is not applied, nor refused")
	assert.ErrorIs(t, res[4].Err, store.ErrStaleRun, "w is finished")
	rep, err = es.Reported(h.ctx, nil)
	require.NoError(t, err)
	ended := map[string]store.Assignment{}
	for _, a := range rep {
		ended[a.ID] = a
	}
	require.Len(t, ended, 2)
	assert.Equal(t, store.AssignEnded, ended[p.ID].State)
	assert.Equal(t, time.Unix(0, at.UnixNano()), ended[p.ID].Started)
	assert.JSONEq(t, `{"p":1}`, string(ended[p.ID].Ending))
	assert.Equal(t, store.AssignEnded, ended[q.ID].State)
	assert.True(t, ended[q.ID].Started.IsZero() || ended[q.ID].Started.UnixNano() == 0, "q never started: %v", ended[q.ID].Started)
}

func applied(res []store.Result) []bool {
	out := make([]bool, len(res))
	for i, r := range res {
		out[i] = r.Applied
	}
	return out
}

// testExecutorIDFenced: two live processes never share an executor ID. A
// registration of the ID by another host or PID is refused
// (ErrExecutorTaken) while the holder's heartbeat is fresher than its TTL;
// a beat or a removal of that other process does not touch the holder's
// registration; the holder registers again freely; once its heartbeat is
// older than its TTL, another process takes the ID over, and the old
// holder's beats no longer apply.
func testExecutorIDFenced(t *testing.T, h *harness) {
	if _, ok := h.st.(store.ExecutorStore); !ok {
		t.Skip("the store does not implement store.ExecutorStore")
	}
	a := store.ExecutorRecord{ID: "dup", Host: "h1", PID: 7, Tasks: []string{"a"}, Capacity: 1, Poll: 50 * time.Millisecond, TTL: time.Minute}
	b := a
	b.Host, b.PID = "h2", 9
	require.True(t, h.apply(&store.RegisterExecutor{Executor: a})[0].Applied)
	res := h.apply(&store.RegisterExecutor{Executor: b})
	assert.False(t, res[0].Applied, "a second live process of the ID")
	assert.ErrorIs(t, res[0].Err, store.ErrExecutorTaken)
	assert.False(t, h.apply(&store.ExecutorBeat{ID: "dup", TTL: time.Minute, Host: "h2", PID: 9})[0].Applied, "the other process's beat")
	assert.False(t, h.apply(&store.RemoveExecutor{ID: "dup", Host: "h2", PID: 9})[0].Applied, "the other process's removal")
	assert.True(t, h.apply(&store.ExecutorBeat{ID: "dup", TTL: time.Minute, Host: "h1", PID: 7})[0].Applied, "the holder's beat")
	assert.True(t, h.apply(&store.RegisterExecutor{Executor: a})[0].Applied, "the holder registers again")

	// The holder's heartbeat goes stale: a TTL of a nanosecond.
	a.TTL = time.Nanosecond
	require.True(t, h.apply(&store.RegisterExecutor{Executor: a})[0].Applied)
	time.Sleep(time.Millisecond)
	assert.True(t, h.apply(&store.RegisterExecutor{Executor: b})[0].Applied, "the ID taken over once the holder is stale")
	assert.False(t, h.apply(&store.ExecutorBeat{ID: "dup", TTL: time.Minute, Host: "h1", PID: 7})[0].Applied, "the old holder's beat")
	assert.True(t, h.apply(&store.RemoveExecutor{ID: "dup", Host: "h2", PID: 9})[0].Applied)
}
