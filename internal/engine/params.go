package engine

import (
	"fmt"

	"github.com/runcue/runcue/store"
)

// Params of queued units: kept in memory within a budget (maxParamBytes),
// and read from the store in batches, ahead of the runs that need them,
// beyond it. Owned by the dispatcher goroutine but for paramBatch, which
// its goroutine fills before closing done.

// maxParamBytes bounds the memory the params kept for queued units take
// (their bytes and their slice headers); beyond it, a unit's params are
// read from the store when it is about to run.
const maxParamBytes = 16 << 20

// paramOverhead is what keeping a unit's params costs besides their
// bytes: the slice header.
const paramOverhead = 24

// paramBatchSize is how many units' params one read fetches: the unit about
// to run, and the next units indexed without params.
const paramBatchSize = 512

// paramBudget is maxParamBytes, or the tests' budget.
func (x *unitIndex) paramBudget() int {
	if x.hooks.ParamBudget > 0 {
		return x.hooks.ParamBudget
	}
	return maxParamBytes
}

// paramCost is what keeping params p costs against maxParamBytes.
func paramCost(p []byte) int { return len(p) + paramOverhead }

// paramBatch is one read of params: params is filled, then done is closed;
// both are read-only from then on. err says why the read failed.
type paramBatch struct {
	done   chan struct{}
	params map[string][]byte
	err    error
}

// paramsOf returns the paramBatch that will hold u's params, starting a
// read of u's and of up to paramBatchSize-1 more units indexed without
// params (the oldest first: the next to run without a priority function).
func (d *Engine) paramsOf(u *unit) *paramBatch {
	if u.pbatch != nil {
		return u.pbatch
	}
	b := &paramBatch{done: make(chan struct{})}
	units := []*unit{u}
	u.pbatch = b
	for len(units) < paramBatchSize && d.noParams.len() > 0 {
		o := d.noParams.pop()
		if d.units[o.id] != o || o.hasParams || o.pbatch != nil || o.state == uRunning {
			continue
		}
		o.pbatch = b
		units = append(units, o)
	}
	ids := make([]string, len(units))
	for i, o := range units {
		ids[i] = o.id
	}
	if d.hooks.ParamRead != nil {
		d.hooks.ParamRead(len(ids))
	}
	d.helperStart()
	d.aux.Go(func() {
		defer close(b.done)
		sus, err := d.st.ListUnits(d.auxCtx, store.ListFilter{IDs: ids, Limit: len(ids)})
		if err != nil {
			b.err = fmt.Errorf("runcue: load params: %w", err)
		}
		b.params = make(map[string][]byte, len(sus))
		for _, su := range sus {
			b.params[su.ID] = su.Params
		}
		d.in.Push(msgParams{batch: b, units: units})
		d.helperDone()
	})
	return b
}

// paramsRead keeps the params a batch read for the units still queued
// without them (they are about to run; the budget may be passed by at
// most one batch).
func (d *Engine) paramsRead(m msgParams) {
	for _, u := range m.units {
		if u.pbatch != m.batch {
			continue
		}
		u.pbatch = nil
		p, ok := m.batch.params[u.id]
		if !ok || u.hasParams || d.units[u.id] != u || u.state == uRunning {
			continue
		}
		u.params, u.hasParams = p, true
		d.paramBytes += paramCost(p)
		d.withoutParams--
	}
}

// dropParamless notes that a unit without params left the index, and
// compacts noParams once it is mostly units that left: the list must not
// keep them reachable.
func (x *unitIndex) dropParamless() {
	x.withoutParams--
	if n := x.noParams.len(); n > 64 && n > 2*x.withoutParams {
		var live fifo[*unit]
		for x.noParams.len() > 0 {
			if u := x.noParams.pop(); x.units[u.id] == u && !u.hasParams {
				live.push(u)
			}
		}
		x.noParams = live
	}
}

// paramsFrom returns unit id's params from a batch, waiting for it.
func paramsFrom(b *paramBatch, id string) ([]byte, error) {
	<-b.done
	if b.err != nil {
		return nil, b.err
	}
	p, ok := b.params[id]
	if !ok {
		return nil, fmt.Errorf("runcue: load params: unit %s: %w", id, store.ErrNotFound)
	}
	return p, nil
}
