package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// batch is the Task.Batch of a task type under Workload.Batch b: its
// handler makes one call of the mocks per batch (callBatch) and fails
// the units its answer rejects on their own.
func (e *engine) batch(task string, b *BatchConfig) *runcue.Batch {
	ms := e.taskMocks(task)
	out := &runcue.Batch{Max: b.Max, Wait: b.Wait.D(), Handler: func(ctx context.Context, ws []*runcue.Work) ([]runcue.Outcome, error) {
		v, bad, cut := e.callBatch(ctx, ms, ws, b)
		if cut {
			return nil, context.Cause(ctx)
		}
		lead := ws[0]
		for _, m := range ms {
			if m.cfg.Tokens == nil {
				continue
			}
			for _, w := range ws {
				use, _ := m.tokens(w.ID)
				if v == answerTooMany {
					use = 0 // a refused call uses nothing
				}
				w.Used(runcue.Costs{"tokens": use}) // a batch's uses add up
			}
			status := http.StatusOK
			if v == answerTooMany {
				status = http.StatusTooManyRequests
			}
			if m.cfg.Tokens.Headers != "none" {
				now := e.clk.Now()
				arrival := lead.Started.Add(m.wire(lead.ID, lead.Attempt))
				_ = httplimit.Report(lead, m.tokenHeaders(arrival, now), status, now)
			}
		}
		if err := answerErr(v, bad); err != nil {
			return nil, err
		}
		outs := make([]runcue.Outcome, len(ws))
		for i, w := range ws {
			if e.itemFails(w.ID, w.Attempt, b) {
				outs[i].Err = fmt.Errorf("%s: item rejected", ms[0].name)
			}
		}
		return outs, nil
	}}
	if b.MaxTokens > 0 {
		out.MaxCost = runcue.Costs{"tokens": b.MaxTokens}
	}
	if e.cfg.Workload.Keys > 0 {
		out.Key = func(target string) string { return target }
	}
	return out
}

// itemFails draws whether a batch's answer rejects unit id's attempt on
// its own (BatchConfig.ItemErrorRate), from the run's seed.
func (e *engine) itemFails(id string, attempt int, b *BatchConfig) bool {
	if b.ItemErrorRate <= 0 {
		return false
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "item/%s/%d", id, attempt)
	return rand.New(rand.NewPCG(e.cfg.Seed, h.Sum64())).Float64() < b.ItemErrorRate
}

// callBatch makes a batch's one call to the mocks ms: as call does, the
// call being its first unit's attempt, its tokens its units'; every unit
// of the batch is recorded as running from the batch's start to its end
// (an item the answer rejects, answered "error").
func (e *engine) callBatch(ctx context.Context, ms []*mock, ws []*runcue.Work, b *BatchConfig) (verdict, *mock, bool) {
	lead := ws[0]
	ids := make([]string, len(ws))
	for i, w := range ws {
		ids[i] = w.ID
	}
	lat, v, bad, idx := e.callMocks(ms, lead.ID, lead.Attempt, lead.Started, ids...)
	for _, w := range ws {
		e.rec.runStarted(w.ID, w.Attempt, lead.Started)
	}
	e.batches.note(ms, ids)
	end, cut := e.wait(ctx, lead.ID, lead.Attempt, lead.Started, lat, v == answerTimeout)
	answer := v.String()
	if cut && v != answerTimeout {
		answer = "cut"
	}
	for i, m := range ms {
		m.leave(idx[i], end, v, m.cfg.Behavior.RetryAfter.D())
	}
	for _, w := range ws {
		a := answer
		if v == answerOK && !cut && e.itemFails(w.ID, w.Attempt, b) {
			a = answerError.String()
		}
		e.rec.runEnded(w.ID, w.Attempt, end, a)
	}
	return v, bad, cut
}

// batchLog counts the batches the mocks received: their number, their
// units, the largest, and the most tokens one held.
type batchLog struct {
	mu        sync.Mutex
	calls     int
	units     int
	largest   int
	maxTokens int64
}

func (l *batchLog) note(ms []*mock, ids []string) {
	var tokens int64
	for _, m := range ms {
		if m.cfg.Tokens != nil {
			for _, id := range ids {
				_, est := m.tokens(id)
				tokens += est
			}
			break
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.units += len(ids)
	l.largest = max(l.largest, len(ids))
	l.maxTokens = max(l.maxTokens, tokens)
}
