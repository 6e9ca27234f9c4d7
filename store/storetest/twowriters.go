package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue/store"
)

// Conformance: every shared rule with two writers at once (two handles on
// one database, each its own connections), as two processes would run
// them. A backend that runs the rules at READ COMMITTED passes only with
// the locks store.Tx documents:
//
//   - the same idempotency key from both writers: UnitByKey's key lock;
//   - a dependent inserted while its dependency ends (failed, cancelled,
//     requeued): the share lock of UnitState and DeadDependencies against
//     the update lock of the methods that end or requeue a unit, so that
//     the end's QueuedDependents sees the dependent, or the insert sees
//     the end;
//   - inserts under one MaxQueued: QueuedCount's lock of the count;
//   - a cancellation racing a claim and a finish: CancelTarget's row lock
//     against the claim's and the finish's conditional updates;
//   - a recovery racing an owner's finish: RunningUnits' row locks, and
//     the epoch check against Acquire's move of the epoch;
//   - events from both writers, and a reader following the log: the log's
//     append lock (events visible in Seq order).
//
// Each case runs rounds of two goroutines, one per writer, and checks the
// rule's promise after; the harness checks the kept counts after every
// test.

// writers runs f(0) on h.st and f(1) on a second handle, at once, and
// waits for both.
func (h *harness) writers(f func(w int, st store.Store)) {
	h.t.Helper()
	other := h.again()
	defer other.Close()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w, st := range []store.Store{h.st, other} {
		wg.Go(func() {
			<-start
			f(w, st)
		})
	}
	close(start)
	wg.Wait()
}

// apply applies ops through st, failing the test on a batch error.
func (h *harness) applyOn(st store.Store, ops ...store.Op) []store.Result {
	b, err := st.Apply(h.ctx, ops)
	if !assert.NoError(h.t, err) {
		return make([]store.Result, len(ops))
	}
	return b.Results
}

func testTwoWritersSameKey(t *testing.T, h *harness) {
	const keys = 40
	results := make([][]store.InsertedUnit, 2)
	at := h.tick()
	h.writers(func(w int, st store.Store) {
		for k := range keys {
			u := &store.Unit{ID: fmt.Sprintf("w%d-k%d", w, k), Task: "a", IdempotencyKey: fmt.Sprintf("key-%d", k)}
			r := h.applyOn(st, &store.Insert{Units: []*store.Unit{u}, At: at})[0]
			if assert.NoError(t, r.Err) && assert.Len(t, r.Units, 1) {
				results[w] = append(results[w], r.Units[0])
			}
		}
	})
	for k := range keys {
		a, b := results[0][k], results[1][k]
		assert.Equal(t, a.ID, b.ID, "key-%d: both writers name one unit", k)
		assert.NotEqual(t, a.Duplicate, b.Duplicate, "key-%d: exactly one stored it", k)
	}
	all, err := h.st.ListUnits(h.ctx, store.ListFilter{Limit: 1000})
	require.NoError(t, err)
	assert.Len(t, all, keys, "one unit per key")
}

func testTwoWritersDependentVsEnd(t *testing.T, h *harness) {
	const rounds = 40
	var parents []*store.Unit
	for i := range rounds {
		p := &store.Unit{ID: fmt.Sprintf("p%d", i), Task: "a"}
		parents = append(parents, p)
	}
	h.insert(parents...)
	at := h.tick()
	h.writers(func(w int, st store.Store) {
		for i, p := range parents {
			if w == 0 {
				d := &store.Unit{ID: fmt.Sprintf("d%d", i), Task: "a", DependsOn: []string{p.ID}}
				r := h.applyOn(st, &store.Insert{Units: []*store.Unit{d}, At: at})[0]
				assert.NoError(t, r.Err)
				continue
			}
			switch i % 2 {
			case 0:
				h.applyOn(st, &store.FailQueued{ID: p.ID, At: at, Error: "x", ErrorKind: "deadline"})
			case 1:
				h.applyOn(st, &store.Cancel{ID: p.ID, At: at})
			}
		}
	})
	for i := range parents {
		d := h.get(fmt.Sprintf("d%d", i))
		assert.NotEqual(t, store.Queued, d.State, "d%d waits on a dead dependency", i)
	}
	// And requeueing the failed parents brings back what failed with them,
	// while new dependents arrive.
	at = h.tick()
	h.writers(func(w int, st store.Store) {
		for i, p := range parents {
			if i%2 != 0 {
				continue
			}
			if w == 0 {
				h.applyOn(st, &store.Requeue{IDs: []string{p.ID}, At: at})
				continue
			}
			d := &store.Unit{ID: fmt.Sprintf("e%d", i), Task: "a", DependsOn: []string{p.ID}}
			assert.NoError(t, h.applyOn(st, &store.Insert{Units: []*store.Unit{d}, At: at})[0].Err)
		}
	})
	for i := range parents {
		if i%2 != 0 {
			continue
		}
		assert.Equal(t, store.Queued, h.get(fmt.Sprintf("p%d", i)).State)
		assert.Equal(t, store.Queued, h.get(fmt.Sprintf("d%d", i)).State, "d%d failed with p%d and came back with it", i, i)
		e := h.get(fmt.Sprintf("e%d", i))
		assert.True(t, e.State == store.Queued || e.ErrorKind == "prerequisite_failed", "e%d", i)
		if e.State == store.Failed {
			// Inserted while p was failed: it may be requeued with it.
			h.apply(&store.Requeue{IDs: []string{e.ID}, At: h.tick()})
		}
	}
}

func testTwoWritersQueueBound(t *testing.T, h *harness) {
	const bound = 25
	at := h.tick()
	stored := make([]int, 2)
	h.writers(func(w int, st store.Store) {
		for i := range 40 {
			u := &store.Unit{ID: fmt.Sprintf("w%d-%d", w, i), Task: "a"}
			r := h.applyOn(st, &store.Insert{Units: []*store.Unit{u}, At: at, MaxQueued: bound})[0]
			if r.Err == nil {
				stored[w]++
			} else {
				assert.ErrorIs(t, r.Err, store.ErrBackpressure)
			}
		}
	})
	n, err := h.st.QueuedCount(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, bound, n, "the bound holds across writers")
	assert.Equal(t, bound, stored[0]+stored[1])
	// Drop-oldest from both writers keeps it too.
	h.writers(func(w int, st store.Store) {
		for i := range 30 {
			u := &store.Unit{ID: fmt.Sprintf("x%d-%d", w, i), Task: "a"}
			assert.NoError(t, h.applyOn(st, &store.Insert{Units: []*store.Unit{u}, At: at, MaxQueued: bound, DropOldest: true})[0].Err)
		}
	})
	n, err = h.st.QueuedCount(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, bound, n)
}

func testTwoWritersCancelVsRun(t *testing.T, h *harness) {
	const units = 40
	var us []*store.Unit
	for i := range units {
		us = append(us, &store.Unit{ID: fmt.Sprintf("c%d", i), Task: "a"})
	}
	h.insert(us...)
	at := h.tick()
	claimed := make([]bool, units)
	h.writers(func(w int, st store.Store) {
		for i, u := range us {
			if w == 1 {
				h.applyOn(st, &store.Cancel{ID: u.ID, At: at, Reason: "race"})
				continue
			}
			r := h.applyOn(st, &store.Claim{ID: u.ID, Owner: "o", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})[0]
			claimed[i] = r.Applied
			if r.Applied {
				h.applyOn(st, &store.Finish{ID: u.ID, Owner: "o", Run: 1, At: at, State: store.Completed,
					Attempt: store.Attempt{Run: 1, Start: at, End: at, Outcome: "completed"}})
			}
		}
	})
	for i, u := range us {
		got := h.get(u.ID)
		if claimed[i] {
			assert.Equal(t, store.Completed, got.State, "%s: claimed first, it ran", u.ID)
		} else {
			assert.Equal(t, store.Cancelled, got.State, "%s: cancelled first, its claim failed", u.ID)
		}
	}
}

func testTwoWritersRecoverVsFinish(t *testing.T, h *harness) {
	own, err := h.st.Acquire(h.ctx, store.Holder{Owner: "old"})
	require.NoError(t, err)
	old := own.Epoch()
	require.NoError(t, own.Release())
	const units = 40
	var us []*store.Unit
	for i := range units {
		us = append(us, &store.Unit{ID: fmt.Sprintf("r%d", i), Task: "a"})
	}
	h.insert(us...)
	at := h.tick()
	for _, u := range us {
		require.True(t, h.apply(&store.Claim{Epoch: old, ID: u.ID, Owner: "old", Run: 1, At: at, LeaseExpires: at.Add(time.Minute)})[0].Applied)
	}
	finished := make([]bool, units)
	var epoch int64
	h.writers(func(w int, st store.Store) {
		if w == 1 {
			own, err := st.Acquire(h.ctx, store.Holder{Owner: "new"})
			if !assert.NoError(t, err) {
				return
			}
			defer own.Release()
			epoch = own.Epoch()
			for _, u := range us {
				h.applyOn(st, &store.Recover{Epoch: own.Epoch(), At: at, PreviousDead: true, Only: []string{u.ID}})
			}
			return
		}
		for i, u := range us {
			r := h.applyOn(st, &store.Finish{Epoch: old, ID: u.ID, Owner: "old", Run: 1, At: at, State: store.Completed,
				Attempt: store.Attempt{Run: 1, Start: at, End: at, Outcome: "completed"}})[0]
			finished[i] = r.Applied
		}
	})
	assert.Greater(t, epoch, old)
	for i, u := range us {
		got := h.get(u.ID)
		if finished[i] {
			assert.Equal(t, store.Completed, got.State, u.ID)
			assert.Len(t, got.Attempts, 1)
		} else {
			assert.Equal(t, store.Queued, got.State, "%s: recovered once, its late finish refused", u.ID)
			require.Len(t, got.Attempts, 1)
			assert.Equal(t, "abandoned", got.Attempts[0].Outcome)
		}
	}
}

// testTwoWritersReader: a reader follows the log with EventsAfter while
// both writers append, each in transactions of several events: it sees
// every event committed, in Seq order, none skipped. (A backend whose
// transactions take sequence numbers before they commit, where a higher
// number can commit first, passes only if events become visible in Seq
// order.)
func testTwoWritersReader(t *testing.T, h *harness) {
	const batches = 60
	done := make(chan struct{})
	var seen []int64
	var readErr error
	var rd sync.WaitGroup
	rd.Go(func() {
		var cursor int64
		for {
			select {
			case <-done:
				// A last look: everything is committed now.
				for {
					evs, err := h.st.EventsAfter(h.ctx, cursor, 1000)
					if err != nil || len(evs) == 0 {
						readErr = err
						return
					}
					for _, e := range evs {
						seen = append(seen, e.Seq)
					}
					cursor = evs[len(evs)-1].Seq
				}
			default:
			}
			evs, err := h.st.EventsAfter(h.ctx, cursor, 1000)
			if err != nil {
				readErr = err
				return
			}
			for _, e := range evs {
				seen = append(seen, e.Seq)
			}
			if len(evs) > 0 {
				cursor = evs[len(evs)-1].Seq
			}
		}
	})
	at := h.tick()
	h.writers(func(w int, st store.Store) {
		for i := range batches {
			var ops []store.Op
			for j := range 1 + i%4 {
				ops = append(ops, &store.AppendEvent{Event: store.Event{Type: fmt.Sprintf("w%d", w), Time: at, Attempt: j}})
			}
			h.applyOn(st, ops...)
		}
	})
	close(done)
	rd.Wait()
	require.NoError(t, readErr)
	var all []int64
	for _, e := range h.events(0) {
		all = append(all, e.Seq)
	}
	assert.True(t, slices.IsSorted(seen), "the reader saw the log in order")
	assert.Equal(t, all, seen, "the reader missed nothing")
	assert.Len(t, all, 2*(batches/4)*(1+2+3+4))
}
