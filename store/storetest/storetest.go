// Package storetest is the conformance suite for runcue stores. Every
// backend must pass Run:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) { ... })
//	}
package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Opener returns a new, empty store, and a function that opens another
// handle (its own connections) on the same database. Both are closed by the
// suite.
type Opener func(t *testing.T) (st store.Store, again func() store.Store)

// Run runs the conformance suite.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"InsertGet", testInsertGet},
		{"InsertDuplicateID", testInsertDuplicateID},
		{"InsertAllOrNone", testInsertAllOrNone},
		{"InsertManyGet", testInsertManyGet},
		{"InsertManyDuplicateID", testInsertManyDuplicateID},
		{"Idempotency", testIdempotency},
		{"Dependencies", testDependencies},
		{"UnitStates", testUnitStates},
		{"DeadDependency", testDeadDependency},
		{"ClaimFinish", testClaimFinish},
		{"FinishPreconditions", testFinishPreconditions},
		{"ClaimFinishOneBatch", testClaimFinishOneBatch},
		{"ClaimFinishSegment", testClaimFinishSegment},
		{"RetryAndHistory", testRetryAndHistory},
		{"Propagate", testPropagate},
		{"Recover", testRecover},
		{"Fencing", testFencing},
		{"Reconcile", testReconcile},
		{"LogUsage", testLogUsage},
		{"LogStart", testLogStart},
		{"Cancel", testCancel},
		{"Requeue", testRequeue},
		{"Heartbeat", testHeartbeat},
		{"TasksServices", testTasksServices},
		{"ServiceLog", testServiceLog},
		{"Prune", testPrune},
		{"List", testList},
		{"LoadActiveCount", testLoadActiveCount},
		{"Events", testEvents},
		{"MatchingEvents", testMatchingEvents},
		{"LastOfTypes", testLastOfTypes},
		{"UnitEvents", testUnitEvents},
		{"SegmentEvents", testSegmentEvents},
		{"EventSeqs", testEventSeqs},
		{"ManyEventTypes", testManyEventTypes},
		{"Changed", testChanged},
		{"Acquire", testAcquire},
		{"ConcurrentApply", testConcurrentApply},
		{"TwoWritersSameKey", testTwoWritersSameKey},
		{"TwoWritersDependentVsEnd", testTwoWritersDependentVsEnd},
		{"TwoWritersQueueBound", testTwoWritersQueueBound},
		{"TwoWritersCancelVsRun", testTwoWritersCancelVsRun},
		{"TwoWritersRecoverVsFinish", testTwoWritersRecoverVsFinish},
		{"TwoWritersReader", testTwoWritersReader},
		{"ConcurrentReads", testConcurrentReads},
		{"Backpressure", testBackpressure},
		{"FailQueued", testFailQueued},
		{"Skipped", testSkipped},
		{"Pauses", testPauses},
		{"Schedules", testSchedules},
		{"Questions", testQuestions},
		{"Debounce", testDebounce},
		{"TwoWritersDebounce", testTwoWritersDebounce},
		{"Stats", testStats},
		{"Subscriptions", testSubscriptions},
		{"EventTargets", testEventTargets},
		{"Executors", testExecutors},
		{"ExecutorIDFenced", testExecutorIDFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, again := open(t)
			h := &harness{t: t, st: st, again: again, ctx: context.Background(), now: time.Unix(1_800_000_000, 0)}
			t.Cleanup(func() { st.Close() })
			tc.fn(t, h)
			// Every test also checks the maintained queued count.
			n, err := st.QueuedCount(h.ctx)
			require.NoError(t, err)
			queued, err := st.ListUnits(h.ctx, store.ListFilter{States: []store.State{store.Queued}, Limit: 1 << 30})
			require.NoError(t, err)
			assert.Equal(t, len(queued), n, "QueuedCount after the test's ops")
			// And the kept counts by task and state.
			all, err := st.ListUnits(h.ctx, store.ListFilter{Limit: 1 << 30})
			require.NoError(t, err)
			want := map[store.UnitCount]bool{}
			byKey := map[[2]string]int{}
			for _, u := range all {
				byKey[[2]string{u.Task, string(u.State)}]++
			}
			for k, n := range byKey {
				want[store.UnitCount{Task: k[0], State: store.State(k[1]), N: n}] = true
			}
			counts, err := st.Counts(h.ctx)
			require.NoError(t, err)
			got := map[store.UnitCount]bool{}
			for _, c := range counts {
				if c.N != 0 {
					got[c] = true
				}
			}
			assert.Equal(t, want, got, "Counts after the test's ops")
		})
	}
}

type harness struct {
	t     *testing.T
	st    store.Store
	again func() store.Store
	ctx   context.Context
	now   time.Time
	n     int
}

func (h *harness) tick() time.Time {
	h.now = h.now.Add(time.Second)
	return h.now
}

func (h *harness) apply(ops ...store.Op) []store.Result {
	h.t.Helper()
	b, err := h.st.Apply(h.ctx, ops)
	require.NoError(h.t, err)
	require.Len(h.t, b.Results, len(ops))
	return b.Results
}

func (h *harness) unit(task string, mods ...func(*store.Unit)) *store.Unit {
	h.n++
	u := &store.Unit{ID: fmt.Sprintf("u%04d", h.n), Task: task, State: store.Queued}
	for _, m := range mods {
		m(u)
	}
	return u
}

func (h *harness) insert(units ...*store.Unit) store.Result {
	h.t.Helper()
	r := h.apply(&store.Insert{Units: units, At: h.tick()})[0]
	require.NoError(h.t, r.Err)
	return r
}

// units inserts n queued units of task a and returns them.
func (h *harness) units(n int) []*store.Unit {
	h.t.Helper()
	var us []*store.Unit
	for range n {
		us = append(us, h.unit("a"))
	}
	h.insert(us...)
	return us
}

// deposed takes ownership as "old", releases it and takes it as "new": it
// returns old's epoch, now deposed, and new's ownership, which the caller
// releases.
func (h *harness) deposed() (int64, store.Ownership) {
	h.t.Helper()
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "old"})
	require.NoError(h.t, err)
	old := own.Epoch()
	require.NoError(h.t, own.Release())
	own, err = h.st.Acquire(h.ctx, store.Holder{Owner: "new"})
	require.NoError(h.t, err)
	return old, own
}

func (h *harness) get(id string) *store.Unit {
	h.t.Helper()
	u, err := h.st.GetUnit(h.ctx, id)
	require.NoError(h.t, err)
	return u
}

func (h *harness) claim(id string, run int) store.Result {
	h.t.Helper()
	at := h.tick()
	return h.apply(&store.Claim{ID: id, Owner: "owner", Run: run, At: at, LeaseExpires: at.Add(time.Minute),
		Events: []store.Event{{Type: "work_started", Task: "t", Attempt: run}}})[0]
}

func (h *harness) finish(id string, run int, state store.State, mods ...func(*store.Finish)) store.Result {
	h.t.Helper()
	at := h.tick()
	f := &store.Finish{ID: id, Owner: "owner", Run: run, At: at, State: state,
		Attempt: store.Attempt{Run: run, Start: at.Add(-time.Second), End: at, Outcome: string(state)}}
	for _, m := range mods {
		m(f)
	}
	return h.apply(f)[0]
}

func (h *harness) events(after int64) []store.Event {
	h.t.Helper()
	evs, err := h.st.EventsAfter(h.ctx, after, 10000)
	require.NoError(h.t, err)
	return evs
}

func types(evs []store.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+":"+e.WorkID)
	}
	return out
}

func chain(h *harness, n int) []*store.Unit {
	var units []*store.Unit
	for i := range n {
		u := h.unit("a")
		if i > 0 {
			u.DependsOn = []string{units[i-1].ID}
		}
		units = append(units, u)
	}
	h.insert(units...)
	return units
}

// requests is a Claim's Log of one request to each service.
func requests(services ...string) []store.LogEntry {
	out := make([]store.LogEntry, len(services))
	for i, s := range services {
		out[i] = store.LogEntry{Service: s, Meter: store.MeterRequests, Amount: 1}
	}
	return out
}
