package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Conformance: reads (unit states, List, LoadActive, concurrent readers).

func testUnitStates(t *testing.T, h *harness) {
	q, r, c := h.unit("a"), h.unit("a"), h.unit("a")
	h.insert(q, r, c)
	h.claim(r.ID, 1)
	h.claim(c.ID, 1)
	h.finish(c.ID, 1, store.Completed)
	ids := []string{q.ID, r.ID, c.ID, "ghost"}
	for i := range 1200 { // more than one query's worth of IDs
		ids = append(ids, fmt.Sprintf("missing-%d", i))
	}
	states, err := h.st.UnitStates(h.ctx, ids)
	require.NoError(t, err)
	assert.Equal(t, map[string]store.State{q.ID: store.Queued, r.ID: store.Running, c.ID: store.Completed}, states)
	states, err = h.st.UnitStates(h.ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, states)
}

func testList(t *testing.T, h *harness) {
	var ids []string
	for i := range 10 {
		task := "a"
		if i%2 == 1 {
			task = "b"
		}
		u := h.unit(task)
		h.insert(u)
		ids = append(ids, u.ID)
	}
	h.claim(ids[0], 1)
	h.finish(ids[0], 1, store.Failed)
	h.claim(ids[2], 1)
	list := func(f store.ListFilter) []string {
		units, err := h.st.ListUnits(h.ctx, f)
		require.NoError(t, err)
		var out []string
		for _, u := range units {
			out = append(out, u.ID)
		}
		return out
	}
	assert.Equal(t, ids, list(store.ListFilter{}))
	assert.Equal(t, []string{ids[9], ids[8]}, list(store.ListFilter{Desc: true, Limit: 2}))
	assert.Equal(t, []string{ids[0]}, list(store.ListFilter{States: []store.State{store.Failed}}))
	assert.Equal(t, []string{ids[0], ids[2]}, list(store.ListFilter{States: []store.State{store.Failed, store.Running}}))
	assert.Equal(t, []string{ids[1], ids[3], ids[5], ids[7], ids[9]}, list(store.ListFilter{Tasks: []string{"b"}}))
	assert.Equal(t, []string{ids[4], ids[6], ids[8]}, list(store.ListFilter{Tasks: []string{"a"}, States: []store.State{store.Queued}}))
	seq := h.get(ids[4]).Seq
	assert.Equal(t, ids[5:7], list(store.ListFilter{AfterSeq: seq, Limit: 2}))
	assert.Equal(t, []string{ids[3], ids[2]}, list(store.ListFilter{BeforeSeq: seq, Desc: true, Limit: 2}))
	units, _ := h.st.ListUnits(h.ctx, store.ListFilter{Limit: 1})
	assert.Equal(t, "failed", units[0].Attempts[0].Outcome, "listed units are whole")
	assert.Equal(t, []string{ids[1], ids[4], ids[6]}, list(store.ListFilter{IDs: []string{ids[6], "missing", ids[1], ids[4]}}), "by ID, in Seq order")
	assert.Equal(t, []string{ids[4]}, list(store.ListFilter{IDs: []string{ids[2], ids[4]}, States: []store.State{store.Queued}}))

	// Many IDs: more than a backend may bind in one query.
	var many []string
	for range 1200 {
		u := h.unit("c")
		h.insert(u)
		many = append(many, u.ID)
	}
	shuffled := slices.Clone(many)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	assert.Equal(t, many, list(store.ListFilter{IDs: shuffled, Limit: len(many)}))
	assert.Equal(t, many[:3], list(store.ListFilter{IDs: shuffled, Limit: 3}))
	want := slices.Clone(many[len(many)-3:])
	slices.Reverse(want)
	assert.Equal(t, want, list(store.ListFilter{IDs: shuffled, Desc: true, Limit: 3}))
}

func testLoadActiveCount(t *testing.T, h *harness) {
	var want []string
	deps := map[string][]string{} // every unit's, in the order given
	for i := range 2500 {         // more than one page
		u := h.unit([]string{"a", "b"}[i%2])
		if i%3 == 0 {
			u.Params = []byte(`{"big":true}`)
		}
		if i%7 == 5 && i > 10 { // queued and running units with dependencies, on every page
			u.DependsOn = []string{want[i-3], want[i-9], want[i-5]}
			deps[u.ID] = u.DependsOn
		}
		if i == 6 {
			u.Costs = map[string]int64{"tokens": 7}
		}
		h.insert(u)
		want = append(want, u.ID)
	}
	h.claim(want[0], 1)
	h.claim(want[1], 1)
	h.finish(want[1], 1, store.Completed)
	withDep := h.unit("a", func(u *store.Unit) { u.DependsOn = []string{want[2]} })
	h.insert(withDep)
	deps[withDep.ID] = withDep.DependsOn
	h.claim(want[4], 1)
	h.finish(want[4], 1, store.Queued, func(f *store.Finish) {
		f.RunAt, f.Error, f.ErrorKind, f.Deferral = h.now.Add(time.Minute), "429", "retry_after", true
	})
	// More than a page of each active state, interleaved in Seq order.
	running := map[string]bool{want[0]: true}
	for i := 6; i < len(want); i += 2 {
		h.claim(want[i], 1)
		running[want[i]] = true
	}
	var got []string
	var seqs []int64
	err := h.st.LoadActive(h.ctx, 0, func(u *store.Unit) error {
		assert.Equal(t, running[u.ID], u.State == store.Running, u.ID)
		got = append(got, u.ID)
		seqs = append(seqs, u.Seq)
		assert.Equal(t, deps[u.ID], u.DependsOn, "LoadActive includes DependsOn, in order: %s", u.ID)
		if u.ID == want[4] {
			assert.Equal(t, "retry_after", u.ErrorKind, "LoadActive includes ErrorKind")
			assert.False(t, u.StartedAt.IsZero(), "and StartedAt")
		}
		if u.ID == want[0] {
			assert.Equal(t, store.Running, u.State)
		}
		if u.ID == withDep.ID {
			assert.Equal(t, []string{want[2]}, u.DependsOn)
		}
		if u.ID == want[6] {
			assert.Equal(t, map[string]int64{"tokens": 7}, u.Costs, "LoadActive includes Costs")
		}
		if u.ID == want[0] || u.ID == want[3] {
			assert.JSONEq(t, `{"big":true}`, string(u.Params), "LoadActive includes Params")
		}
		return nil
	})
	require.NoError(t, err)
	expect := append([]string{want[0]}, want[2:]...)
	expect = append(expect, withDep.ID)
	assert.Equal(t, expect, got)
	assert.True(t, slices.IsSorted(seqs))
	stop := errors.New("stop")
	assert.ErrorIs(t, h.st.LoadActive(h.ctx, 0, func(*store.Unit) error { return stop }), stop)
	// From a cursor: the units after it, the same as the tail of the whole.
	mid := seqs[len(seqs)/2]
	var tail []string
	require.NoError(t, h.st.LoadActive(h.ctx, mid, func(u *store.Unit) error {
		tail = append(tail, u.ID)
		return nil
	}))
	assert.Equal(t, got[len(seqs)/2+1:], tail)

	counts, err := h.st.CountActive(h.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"a": 1251, "b": 1249}, counts, "want[1] completed; withDep added")
}

func testConcurrentReads(t *testing.T, h *harness) {
	var units []*store.Unit
	for range 50 {
		units = append(units, h.unit("a"))
	}
	h.insert(units...)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := h.st.GetUnit(ctx, units[0].ID); err != nil && ctx.Err() == nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
				if _, err := h.st.ListUnits(ctx, store.ListFilter{Limit: 10}); err != nil && ctx.Err() == nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		})
	}
	for i, u := range units {
		h.claim(u.ID, 1)
		if i%2 == 0 {
			h.finish(u.ID, 1, store.Completed)
		}
	}
	cancel()
	wg.Wait()
	assert.Empty(t, failures, "reads never fail while the writer works")
}
