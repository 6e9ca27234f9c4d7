package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// shareRun is what TestFairShares measures: the cost each tenant was
// given while both had work queued, and in how many dispatches.
type shareRun struct {
	cost       map[string]int64
	dispatches int
}

// runShares runs two tenants, a with ten times b's backlog of nb units, through one
// token meter of 100,000 a minute that every unit uses (service llm),
// their keys (tenant:a, tenant:b) sharing it by tokens; b's units cost
// twice a's on average, so equal shares in cost are not equal shares in
// requests. weights give a key its override's Weight (none: the
// class's). It returns what each got until b's queue emptied.
func runShares(t *testing.T, seed uint64, nb int, weights map[string]float64, class runcue.Service, prio runcue.PriorityFunc) shareRun {
	e := newEnv(t, runcue.Config{MaxConcurrent: 1000, Priority: prio})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 100_000, Window: time.Minute}}}))
	require.NoError(t, e.c.Service("tenant", class))
	for key, w := range weights {
		require.NoError(t, e.c.SetService(e.ctx, "tenant:"+key, runcue.Service{Weight: w}))
	}
	var mu sync.Mutex
	type start struct {
		tenant string
		cost   int64
	}
	var starts []start
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"},
		ServiceKeys: func(w *runcue.Work) []string {
			var p struct{ Tenant string }
			_ = w.Bind(&p)
			return []string{"tenant:" + p.Tenant}
		},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			var p struct {
				Tenant string
				Cost   int64
			}
			if err := w.Bind(&p); err != nil {
				return nil, err
			}
			mu.Lock()
			starts = append(starts, start{p.Tenant, p.Cost})
			mu.Unlock()
			return nil, nil
		}}))
	rnd := rand.New(rand.NewPCG(seed, 7))
	var subs []runcue.Submission
	add := func(tenant string, n int, lo, hi int64) {
		for i := range n {
			c := lo + rnd.Int64N(hi-lo+1)
			subs = append(subs, runcue.Submission{ID: fmt.Sprintf("%s%05d", tenant, i), Task: "chat",
				Params: map[string]any{"Tenant": tenant, "Cost": c}, Cost: runcue.Costs{"tokens": c}})
		}
	}
	add("a", 10*nb, 50, 150) // the long backlog, submitted first
	add("b", nb, 100, 300)
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	cost := map[string]int64{}
	for _, sub := range subs {
		cost[sub.ID] = sub.Cost["tokens"]
	}
	bRan := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range starts {
			if s.tenant == "b" {
				n++
			}
		}
		return n
	}
	for step := 0; bRan() < nb && step < 600; step++ {
		e.settle()
		for {
			running, err := e.c.Settle(e.ctx)
			require.NoError(t, err)
			if running == 0 {
				break
			}
		}
		e.clk.Advance(time.Second)
	}
	// The starts in the order dispatched: their events' (claims are
	// stored in that order; handlers record theirs in any order).
	out := shareRun{cost: map[string]int64{}}
	events, _, err := e.c.Subscribe(e.ctx, runcue.SubscribeOptions{Types: []runcue.EventType{runcue.EventWorkStarted}})
	require.NoError(t, err)
	bLeft := nb
	for bLeft > 0 {
		ev := <-events
		tenant := ev.WorkID[:1]
		out.cost[tenant] += cost[ev.WorkID]
		out.dispatches++
		if tenant == "b" {
			bLeft--
		}
	}
	require.Zero(t, bLeft, "b's backlog ran")
	return out
}

// TestFairShares: two tenants with a 10:1 backlog sharing one token meter
// get equal shares in tokens (within 10%) over more than 1,000
// dispatches while both have work queued (b's 400 units and a's about
// 800); with weights 2:1 (b's 550 and a's about 550), shares within 10%
// of 2:1. Without Share, the longer backlog, submitted
// first, takes nearly everything.
func TestFairShares(t *testing.T) {
	seed := testSeed(t, "RUNCUE_SHARES_SEED")
	equal := runShares(t, seed, 400, nil, runcue.Service{Share: "tokens"}, nil)
	ratio := float64(equal.cost["a"]) / float64(equal.cost["b"])
	t.Logf("equal weights: %d dispatches, tokens a %d, b %d (a/b %.3f)", equal.dispatches, equal.cost["a"], equal.cost["b"], ratio)
	assert.GreaterOrEqual(t, equal.dispatches, 1000)
	assert.InDelta(t, 1.0, ratio, 0.1)

	weighted := runShares(t, seed, 550, map[string]float64{"b": 2}, runcue.Service{Share: "tokens"}, nil)
	ratio = float64(weighted.cost["b"]) / float64(weighted.cost["a"])
	t.Logf("weights 1:2: %d dispatches, tokens a %d, b %d (b/a %.3f)", weighted.dispatches, weighted.cost["a"], weighted.cost["b"], ratio)
	assert.GreaterOrEqual(t, weighted.dispatches, 1000)
	assert.InDelta(t, 2.0, ratio, 0.2)

	unfair := runShares(t, seed, 60, nil, runcue.Service{}, nil)
	t.Logf("without Share: %d dispatches, tokens a %d, b %d", unfair.dispatches, unfair.cost["a"], unfair.cost["b"])
	assert.Greater(t, unfair.cost["a"], 4*unfair.cost["b"], "submission order: the longer backlog first")
}

// TestShareMinimum: a key below its MinConcurrent goes before every other
// key, whatever its weight; MaxConcurrent on a key's override caps it
// (its burst maximum).
//
// Six slots of api shared by requests among a (30 units, first), b and c
// (10 each).
func TestShareMinimum(t *testing.T) {
	running := func(class runcue.Service, overrides map[string]runcue.Service) map[string]int {
		e := newEnv(t, runcue.Config{})
		require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 6}))
		require.NoError(t, e.c.Service("tenant", class))
		for key, s := range overrides {
			require.NoError(t, e.c.SetService(e.ctx, "tenant:"+key, s))
		}
		release := make(chan struct{})
		started := make(chan struct{}, 64) // room for every unit: the ones after the six never block
		var mu sync.Mutex
		now := map[string]int{}
		require.NoError(t, e.c.Task("job", runcue.Task{Services: []string{"api"},
			ServiceKeys: func(w *runcue.Work) []string { return []string{"tenant:" + w.ID[:1]} },
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				mu.Lock()
				now[w.ID[:1]]++
				mu.Unlock()
				started <- struct{}{}
				<-release
				return nil, nil
			}}))
		var subs []runcue.Submission
		for i := range 30 {
			subs = append(subs, runcue.Submission{ID: fmt.Sprintf("a%02d", i), Task: "job"})
		}
		for i := range 10 {
			subs = append(subs, runcue.Submission{ID: fmt.Sprintf("b%02d", i), Task: "job"}, runcue.Submission{ID: fmt.Sprintf("c%02d", i), Task: "job"})
		}
		_, err := e.c.SubmitBatch(e.ctx, subs)
		require.NoError(t, err)
		e.start()
		for range 6 { // api's six slots
			select {
			case <-started:
			case <-e.ctx.Done():
				t.Fatal("six handlers did not start")
			}
		}
		e.settle()
		mu.Lock()
		out := map[string]int{"a": now["a"], "b": now["b"], "c": now["c"]}
		mu.Unlock()
		close(release)
		return out
	}
	got := running(runcue.Service{Share: "requests"}, map[string]runcue.Service{"b": {Weight: 0.01}})
	// A key's first unit starts at the class's virtual time, whatever its
	// weight; then it waits for the others' shares.
	assert.Equal(t, 1, got["b"], "a tiny weight: b's one unit, then the others': %v", got)
	got = running(runcue.Service{Share: "requests"}, map[string]runcue.Service{"b": {Weight: 0.01, MinConcurrent: 2}})
	assert.Equal(t, 2, got["b"], "b's guaranteed minimum: %v", got)
	got = running(runcue.Service{Share: "requests"}, map[string]runcue.Service{"a": {MaxConcurrent: 1}})
	assert.Equal(t, 1, got["a"], "a's burst maximum: %v", got)
	assert.Equal(t, 5, got["b"]+got["c"], "the rest to b and c: %v", got)
}
