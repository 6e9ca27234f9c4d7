package store_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// memTx is a second implementation of store.Tx, in memory, small enough to
// check by eye: the shared rules must give it the same outcomes the
// conformance suite checks on SQLite.
type memTx struct {
	units      map[string]*memUnit
	order      []string    // by Seq
	deps       [][2]string // (unit, depends on), in insertion order
	events     []store.Event
	subs       map[string]int64
	pruneBelow int64
	debounces  map[string]memDebounce
}

type memDebounce struct {
	id    string
	since time.Time
}

type memUnit struct {
	u         store.Unit
	requested bool
}

func newMemTx() *memTx { return &memTx{units: map[string]*memUnit{}} }

func (m *memTx) UnitState(id string) (store.State, bool, error) {
	if x := m.units[id]; x != nil {
		return x.u.State, true, nil
	}
	return "", false, nil
}

func (m *memTx) UnitByKey(key string) (string, store.State, int64, bool, error) {
	for _, id := range m.order {
		if x := m.units[id]; x.u.IdempotencyKey == key {
			return id, x.u.State, x.u.Seq, true, nil
		}
	}
	return "", "", 0, false, nil
}

func (m *memTx) ReleaseKey(id string) error { m.units[id].u.IdempotencyKey = ""; return nil }

func (m *memTx) SkipDebounced(key, by string, at time.Time) (store.UnitRef, time.Time, bool, error) {
	d, ok := m.debounces[key]
	if !ok {
		return store.UnitRef{}, time.Time{}, false, nil
	}
	x := m.units[d.id]
	if x == nil || x.u.State != store.Queued || x.u.Runs > 0 {
		return store.UnitRef{}, time.Time{}, false, nil
	}
	x.u.State, x.u.FinishedAt, x.u.Error, x.u.ErrorKind = store.Skipped, at, "replaced by "+by, store.DebounceKind
	return store.UnitRef{ID: x.u.ID, Task: x.u.Task, Target: x.u.Target}, d.since, true, nil
}

func (m *memTx) HoldDebounce(key, id string, since time.Time) error {
	if m.debounces == nil {
		m.debounces = map[string]memDebounce{}
	}
	m.debounces[key] = memDebounce{id, since}
	return nil
}

func (m *memTx) InsertUnit(u *store.Unit, finished time.Time, kind string) (int64, error) {
	if m.units[u.ID] != nil {
		return 0, &store.OpError{Err: store.ErrDuplicateID}
	}
	c := *u
	c.Seq, c.FinishedAt, c.ErrorKind = int64(len(m.order)+1), finished, kind
	m.units[u.ID] = &memUnit{u: c}
	m.order = append(m.order, u.ID)
	for _, d := range u.DependsOn {
		m.deps = append(m.deps, [2]string{u.ID, d})
	}
	return c.Seq, nil
}

func (m *memTx) EndQueued(id string, st store.State, at time.Time, msg, kind string) (bool, error) {
	x := m.units[id]
	if x == nil || x.u.State != store.Queued {
		return false, nil
	}
	x.u.State, x.u.FinishedAt, x.u.Error, x.u.ErrorKind = st, at, msg, kind
	return true, nil
}

func (m *memTx) dependents(id string, keep func(*memUnit) bool) []store.UnitRef {
	var out []store.UnitRef
	for _, e := range m.deps {
		if x := m.units[e[0]]; e[1] == id && keep(x) {
			out = append(out, store.UnitRef{ID: e[0], Task: x.u.Task, Target: x.u.Target})
		}
	}
	return out
}

func (m *memTx) QueuedDependents(id string) ([]store.UnitRef, error) {
	return m.dependents(id, func(x *memUnit) bool { return x.u.State == store.Queued }), nil
}

func (m *memTx) QueuedCount() (int, error) {
	n := 0
	for _, x := range m.units {
		if x.u.State == store.Queued {
			n++
		}
	}
	return n, nil
}

func (m *memTx) OldestQueued(n int) ([]store.UnitRef, error) {
	var out []store.UnitRef
	for _, id := range m.order {
		if x := m.units[id]; x.u.State == store.Queued && len(out) < n {
			out = append(out, store.UnitRef{ID: id, Task: x.u.Task, Target: x.u.Target})
		}
	}
	return out, nil
}

func (m *memTx) CancelTarget(id string) (store.State, store.UnitRef, bool, bool, error) {
	x := m.units[id]
	if x == nil {
		return "", store.UnitRef{}, false, false, nil
	}
	return x.u.State, store.UnitRef{ID: id, Task: x.u.Task, Target: x.u.Target}, x.requested, true, nil
}

func (m *memTx) RequestCancel(id string, cascade bool) error {
	m.units[id].requested = true
	return nil
}

func (m *memTx) FailedUnits(tasks []string, before time.Time) ([]string, error) {
	var out []string
	for _, id := range m.order {
		x := m.units[id]
		if x.u.State == store.Failed && (len(tasks) == 0 || slices.Contains(tasks, x.u.Task)) &&
			(before.IsZero() || x.u.FinishedAt.Before(before)) {
			out = append(out, id)
		}
	}
	return out, nil
}

func (m *memTx) RequeueFailed(id string) (store.UnitRef, bool, error) {
	x := m.units[id]
	if x == nil || x.u.State != store.Failed {
		return store.UnitRef{}, false, nil
	}
	x.u.State, x.u.Error, x.u.ErrorKind, x.u.FinishedAt = store.Queued, "", "", time.Time{}
	return store.UnitRef{ID: id, Task: x.u.Task, Target: x.u.Target}, true, nil
}

func (m *memTx) FailedByPrerequisite(id string) ([]string, error) {
	var out []string
	for _, r := range m.dependents(id, func(x *memUnit) bool {
		return x.u.State == store.Failed && (x.u.ErrorKind == "prerequisite_failed" || x.u.ErrorKind == "prerequisite_cancelled")
	}) {
		out = append(out, r.ID)
	}
	return out, nil
}

func (m *memTx) DeadDependencies(id string) (int, error) {
	n := 0
	for _, e := range m.deps {
		if st := m.units[e[1]].u.State; e[0] == id && (st == store.Failed || st == store.Cancelled) {
			n++
		}
	}
	return n, nil
}

func (m *memTx) AppendEvent(ev *store.Event, at time.Time) error {
	if ev.Time.IsZero() {
		ev.Time = at
	}
	ev.Seq = int64(len(m.events) + 1)
	m.events = append(m.events, *ev)
	return nil
}

func (m *memTx) state(id string) store.State { return m.units[id].u.State }

func (m *memTx) insert(t *testing.T, op *store.Insert) store.Result {
	t.Helper()
	var r store.Result
	require.NoError(t, store.ApplyInsert(m, op, &r))
	return r
}

// A chain listed dependents first goes in whole; failing its root fails
// every queued unit below it with the kinds the contract names; requeueing
// the root brings the chain back; cancelling with Cascade cancels it.
func TestSharedRulesOnAnotherTx(t *testing.T) {
	at := time.Unix(1700000000, 0)
	m := newMemTx()
	m.insert(t, &store.Insert{At: at, Units: []*store.Unit{
		{ID: "c", Task: "t", DependsOn: []string{"b"}},
		{ID: "b", Task: "t", DependsOn: []string{"a"}},
		{ID: "a", Task: "t"},
	}})
	assert.Equal(t, []string{"a", "b", "c"}, m.order, "inserted in topological order")

	var r store.Result
	require.NoError(t, store.ApplyFailQueued(m, &store.FailQueued{ID: "a", At: at, Error: "x", ErrorKind: "deadline"}, &r))
	assert.True(t, r.Applied)
	assert.Equal(t, store.Failed, m.state("b"))
	assert.Equal(t, "prerequisite_failed", m.units["c"].u.ErrorKind)
	assert.Len(t, r.Events, 2, "one event per dependent failed")

	// A unit inserted on a dead dependency is stored failed at once.
	r = m.insert(t, &store.Insert{At: at, Units: []*store.Unit{{ID: "d", Task: "t", DependsOn: []string{"c"}}}})
	assert.Equal(t, store.Failed, r.Units[0].State)

	r = store.Result{}
	require.NoError(t, store.ApplyRequeue(m, &store.Requeue{IDs: []string{"a"}, At: at}, &r))
	assert.Equal(t, []string{"a", "b", "c", "d"}, r.IDs, "the chain comes back with its root")

	r = store.Result{}
	require.NoError(t, store.ApplyCancel(m, &store.Cancel{ID: "a", At: at, Cascade: true}, &r))
	for _, id := range []string{"a", "b", "c", "d"} {
		assert.Equal(t, store.Cancelled, m.state(id), id)
	}
	err := store.ApplyCancel(m, &store.Cancel{ID: "nope", At: at}, &r)
	var oe *store.OpError
	require.ErrorAs(t, err, &oe)
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// The queue bound: without DropOldest the op is refused; with it the
// oldest queued units are cancelled ("dropped") and their dependents
// failed, never a unit of the batch itself.
func TestSharedRulesQueueBound(t *testing.T) {
	at := time.Unix(1700000000, 0)
	m := newMemTx()
	m.insert(t, &store.Insert{At: at, Units: []*store.Unit{
		{ID: "old", Task: "t"}, {ID: "kid", Task: "t", DependsOn: []string{"old"}}, {ID: "mid", Task: "t"},
	}})
	var r store.Result
	err := store.ApplyInsert(m, &store.Insert{At: at, MaxQueued: 3, Units: []*store.Unit{{ID: "new", Task: "t"}}}, &r)
	assert.True(t, errors.Is(err, store.ErrBackpressure))

	m = newMemTx()
	m.insert(t, &store.Insert{At: at, Units: []*store.Unit{
		{ID: "old", Task: "t"}, {ID: "mid", Task: "t"}, {ID: "kid", Task: "t", DependsOn: []string{"old"}},
	}})
	r = m.insert(t, &store.Insert{At: at, MaxQueued: 2, DropOldest: true, Units: []*store.Unit{{ID: "new", Task: "t"}}})
	assert.Equal(t, store.Cancelled, m.state("old"))
	assert.Equal(t, "dropped", m.units["old"].u.ErrorKind)
	assert.Equal(t, "prerequisite_cancelled", m.units["kid"].u.ErrorKind)
	assert.Equal(t, store.Queued, m.state("mid"))
	assert.Equal(t, store.Queued, m.state("new"))
}

func (m *memTx) RunningUnits(ids []string) ([]store.RunningRef, error) {
	var out []store.RunningRef
	for _, id := range m.order {
		x := m.units[id]
		if x.u.State != store.Running || (len(ids) > 0 && !slices.Contains(ids, id)) {
			continue
		}
		out = append(out, store.RunningRef{UnitRef: store.UnitRef{ID: id, Task: x.u.Task, Target: x.u.Target}, Runs: x.u.Runs,
			Started: x.u.StartedAt, Epoch: x.u.Epoch, LeaseExpires: x.u.LeaseExpiresAt, CancelRequested: x.requested})
	}
	return out, nil
}

func (m *memTx) EndRunning(id string, runs int, st store.State, at time.Time, a store.Attempt, msg, kind string) (bool, error) {
	x := m.units[id]
	if x == nil || x.u.State != store.Running || x.u.Runs != runs {
		return false, nil
	}
	x.u.State, x.u.LeasedBy, x.u.LeaseExpiresAt, x.requested = st, "", time.Time{}, false
	if st.Terminal() {
		x.u.FinishedAt, x.u.Error, x.u.ErrorKind = at, msg, kind
	}
	x.u.Attempts = append(x.u.Attempts, a)
	return true, nil
}

func (m *memTx) PruneFinished(before time.Time, limit int) (int, error) { return 0, nil }
func (m *memTx) FirstEventAt(t time.Time) (int64, error) {
	for _, e := range m.events {
		if !e.Time.Before(t) {
			return e.Seq, nil
		}
	}
	return int64(len(m.events) + 1), nil
}
func (m *memTx) SubscriptionPositions() (map[string]int64, error) { return m.subs, nil }
func (m *memTx) PruneEvents(below int64, limit int) (bool, error) {
	m.pruneBelow = below
	return false, nil
}
func (m *memTx) PruneActivity(before time.Time) error { return nil }
func (m *memTx) PruneLog(service string, before time.Time, limit int) (bool, error) {
	return false, nil
}

// A new owner (epoch 3) requeues the runs of a dead owner at once, and
// those of an owner not proven dead only once their leases have expired;
// a run whose cancellation was requested is cancelled with its dependents
// instead; its own runs are not touched.
func TestRecoverRule(t *testing.T) {
	at := time.Unix(1700000000, 0)
	run := func(m *memTx, id string, epoch int64, lease time.Time, cancel bool) {
		m.insert(t, &store.Insert{At: at, Units: []*store.Unit{{ID: id, Task: "t"}}})
		x := m.units[id]
		x.u.State, x.u.Runs, x.u.Epoch, x.u.LeaseExpiresAt, x.u.StartedAt, x.requested = store.Running, 1, epoch, lease, at, cancel
	}
	setup := func() *memTx {
		m := newMemTx()
		run(m, "leased", 2, at.Add(time.Minute), false)
		run(m, "expired", 2, at.Add(-time.Second), false)
		run(m, "cancel", 1, at.Add(-time.Second), true)
		run(m, "mine", 3, at.Add(time.Minute), false)
		m.insert(t, &store.Insert{At: at, Units: []*store.Unit{{ID: "dep", Task: "t", DependsOn: []string{"cancel"}}}})
		return m
	}
	m := setup()
	var r store.Result
	require.NoError(t, store.ApplyRecover(m, &store.Recover{Epoch: 3, At: at}, &r))
	assert.Equal(t, []string{"expired"}, r.IDs)
	assert.Equal(t, []string{"leased"}, r.Held, "its lease holds: its owner may be alive")
	assert.Equal(t, store.Queued, m.state("expired"))
	assert.Equal(t, "abandoned", m.units["expired"].u.Attempts[0].Outcome)
	assert.Equal(t, store.Cancelled, m.state("cancel"))
	assert.Equal(t, store.Failed, m.state("dep"), "the cancelled run's dependent fails with it")
	assert.Equal(t, store.Running, m.state("leased"))
	assert.Equal(t, store.Running, m.state("mine"))

	m = setup()
	r = store.Result{}
	require.NoError(t, store.ApplyRecover(m, &store.Recover{Epoch: 3, At: at, PreviousDead: true}, &r))
	assert.Equal(t, []string{"leased", "expired"}, r.IDs, "a dead owner's runs go back at once")
	assert.Empty(t, r.Held)

	m = setup()
	r = store.Result{}
	require.NoError(t, store.ApplyRecover(m, &store.Recover{Epoch: 3, At: at.Add(2 * time.Minute), Only: []string{"leased"}}, &r))
	assert.Equal(t, []string{"leased"}, r.IDs, "Only names the runs looked at")
	assert.Equal(t, store.Running, m.state("expired"))
}

// The retention cut: events before EventsBefore, but not past a named
// subscription's position (its acknowledgement or what Passed allows)
// unless older than EventsHardBefore.
func TestPruneCut(t *testing.T) {
	at := time.Unix(1700000000, 0)
	m := newMemTx()
	for i := range 10 {
		require.NoError(t, m.AppendEvent(&store.Event{Type: "x", Time: at.Add(time.Duration(i) * time.Minute)}, at))
	}
	var r store.Result
	require.NoError(t, store.ApplyPrune(m, &store.Prune{EventsBefore: at.Add(8 * time.Minute)}, &r))
	assert.Equal(t, int64(9), m.pruneBelow, "events 1-8 are before the cut")
	m.subs = map[string]int64{"slow": 3, "fast": 9}
	require.NoError(t, store.ApplyPrune(m, &store.Prune{EventsBefore: at.Add(8 * time.Minute), EventsHardBefore: at.Add(2 * time.Minute)}, &r))
	assert.Equal(t, int64(4), m.pruneBelow, "slow still needs event 4")
	require.NoError(t, store.ApplyPrune(m, &store.Prune{EventsBefore: at.Add(8 * time.Minute), EventsHardBefore: at.Add(6 * time.Minute)}, &r))
	assert.Equal(t, int64(7), m.pruneBelow, "older than EventsHardBefore goes anyway")
	require.NoError(t, store.ApplyPrune(m, &store.Prune{EventsBefore: at.Add(8 * time.Minute), EventsHardBefore: at.Add(2 * time.Minute),
		Passed: map[string]int64{"slow": 6}}, &r))
	assert.Equal(t, int64(7), m.pruneBelow, "slow may pass up to 6")
	assert.Equal(t, int64(1<<62), store.SubscriptionFloor(nil, nil))
}

// ActivityOf reads the typed detail, never the JSON.
func TestActivityOf(t *testing.T) {
	for _, tc := range []struct {
		ev      store.Event
		kind    string
		classes []string
		ok      bool
	}{
		{store.Event{Type: store.TypeWorkCompleted}, store.TypeWorkCompleted, nil, true},
		{store.Event{Type: store.TypeWorkFailed, Detail: &store.EventData{WillRetry: true}}, "work_failed_retry", nil, true},
		{store.Event{Type: store.TypeWorkFailed, Data: []byte(`{"will_retry":true}`)}, store.TypeWorkFailed, nil, true},
		{store.Event{Type: store.TypeWorkRetrying, Detail: &store.EventData{NextAttempt: 5}}, "", nil, false},
		{store.Event{Type: store.TypeWorkRetrying, Detail: &store.EventData{Reason: "retry_after",
			Services: []string{"host:a", "api", "host:b"}}}, "work_deferred", []string{"host", "api"}, true},
		{store.Event{Type: store.TypeQueueStatus}, "", nil, false},
	} {
		kind, classes, ok := store.ActivityOf(&tc.ev)
		assert.Equal(t, tc.kind, kind, tc.ev.Type)
		assert.Equal(t, tc.classes, classes, tc.ev.Type)
		assert.Equal(t, tc.ok, ok, tc.ev.Type)
	}
	a := store.Attempt{Run: 2, Start: time.Unix(1, 0), End: time.Unix(2, 0), Outcome: "failed", Error: "a \"quote\""}
	assert.Equal(t, `{"run":2,"start":1000000000,"end":2000000000,"outcome":"failed","error":"a \"quote\""}`, store.AttemptJSON(a))
}

// Unassign implements store.Tx: memTx keeps no assignments.
func (m *memTx) Unassign(string, int) error { return nil }
