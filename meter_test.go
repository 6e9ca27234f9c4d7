package runcue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store/sqlite"
)

// call is a request as the metered service sees it: when it arrived
// (start plus a wire delay) and what the service charged for it.
type call struct {
	at     time.Time
	amount int64
	id     string
}

// busiestWindowOf returns the largest sum of amounts arriving within any
// interval of length window (arrivals sorted here).
func busiestWindowOf(arrivals []call, window time.Duration) (int64, time.Time) {
	slices.SortFunc(arrivals, func(a, b call) int { return a.at.Compare(b.at) })
	var best int64
	var at time.Time
	for i := range arrivals {
		var sum int64
		for j := i; j < len(arrivals) && arrivals[j].at.Sub(arrivals[i].at) < window; j++ {
			sum += arrivals[j].amount
		}
		if sum > best {
			best, at = sum, arrivals[i].at
		}
	}
	return best, at
}

// llmParams are a chat request's: its input and the most it may write.
type llmParams struct {
	Input     int64 `json:"input"`
	MaxTokens int64 `json:"max_tokens"`
}

// TestTokenMeterLiteLLM is litellm#18730's case: requests whose output is
// unknown at their start, five at a time, against a meter of 100 tokens a
// minute. Each reserves its input plus max_tokens (the task's Estimate,
// stored at submit) and reports what it used when it returns
// (ChargeActual), which frees the rest of its reservation at once. At the
// service, where each call arrives 0-5 ms after its start (seeded) and is
// charged what it used, no minute holds more than 100 tokens; and the
// reconciled reservations let more calls through than max_tokens alone
// would.
func TestTokenMeterLiteLLM(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 18730))
	e := newEnv(t, runcue.Config{MaxConcurrent: 5})
	var mu sync.Mutex
	var arrivals []call
	used := map[string]int64{}
	require.NoError(t, e.c.Service("llm", runcue.Service{MaxConcurrent: 5,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 100, Window: time.Minute}}}))
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"},
		Estimate: func(s runcue.Submission) runcue.Costs {
			p := s.Params.(llmParams)
			return runcue.Costs{"tokens": p.Input + p.MaxTokens}
		},
		Handler: runcue.Handle(func(ctx context.Context, w *runcue.Work, p llmParams) (any, error) {
			mu.Lock()
			n := used[w.ID]
			arrivals = append(arrivals, call{arrival(seed, w.ID, w.Attempt, w.Started), n, w.ID})
			mu.Unlock()
			tm := e.clk.NewTimer(2 * time.Second) // the response streams
			defer tm.Stop()
			<-tm.C()
			w.Used(runcue.Costs{"tokens": n})
			return n, nil
		})}))
	e.start()
	subs := make([]runcue.Submission, 40)
	for i := range subs {
		p := llmParams{Input: 5 + rnd.Int64N(10), MaxTokens: 25}
		subs[i] = runcue.Submission{ID: fmt.Sprintf("c%02d", i), Task: "chat", Params: p}
		used[subs[i].ID] = p.Input + 1 + rnd.Int64N(p.MaxTokens/3) // unknown to runcue until the end
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	info, err := e.c.Get(e.ctx, "c00")
	require.NoError(t, err)
	p0 := subs[0].Params.(llmParams)
	assert.Equal(t, runcue.Costs{"tokens": p0.Input + p0.MaxTokens}, info.Cost, "the estimate is stored with the unit")

	e.settle()
	var detail string
	for _, sub := range subs { // the first unit held back says why
		ex, err := e.c.Explain(e.ctx, sub.ID)
		require.NoError(t, err)
		for _, r := range ex.Reasons {
			if r.Service == "llm" && detail == "" {
				detail = r.Detail
			}
		}
	}
	assert.Contains(t, detail, "blocked on tokens:", "Explain names the meter")
	assert.Contains(t, detail, "of 100 in the last 1m0s")
	st, err := e.c.ServiceStatus(e.ctx, "llm")
	require.NoError(t, err)
	require.Len(t, st.Meters, 1)
	assert.Equal(t, int64(100), st.Meters[0].Limit)
	assert.Greater(t, st.Meters[0].Used, int64(50), "the first calls' reservations count")

	for steps := 0; ; steps++ {
		require.Less(t, steps, 100_000, "the calls did not finish") // the writer's poll steps the clock by 100 ms
		running, err := e.c.Settle(e.ctx)
		require.NoError(t, err)
		mu.Lock()
		done := len(arrivals) == len(subs)
		mu.Unlock()
		if done && running == 0 {
			break
		}
		if next, ok := e.clk.NextDeadline(); ok {
			e.clk.Set(next)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	busiest, at := busiestWindowOf(arrivals, time.Minute)
	t.Logf("%d calls in %v of virtual time; busiest minute %d tokens from %v", len(arrivals), e.clk.Now().Sub(epoch), busiest, at.Sub(epoch))
	assert.LessOrEqual(t, busiest, int64(100), "tokens arriving in a minute")
	first := 0
	for _, a := range arrivals {
		if a.at.Before(arrivals[0].at.Add(time.Minute)) {
			first++
		}
	}
	assert.Greater(t, first, 3, "reconciled charges free room: more than 100/(input+max_tokens) calls in the first minute")

	// The service log holds what each call used, for the next owner.
	st2, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st2.Close()
	logged, err := st2.ServiceLog(e.ctx, "llm", epoch)
	require.NoError(t, err)
	require.NotEmpty(t, logged, "the last minute's calls are logged (retention dropped the older ones)")
	left := map[int64]int{}
	for _, n := range used {
		left[n]++
	}
	for _, l := range logged {
		assert.Positive(t, left[l.Amount], "logged %d, which no call used: an estimate not reconciled", l.Amount)
		assert.True(t, l.Reconciled)
		left[l.Amount]--
	}
}

// TestTokenMeterAcrossOwners: a meter of 1,000 tokens per 10 s with costs
// of 10-150 (the estimates), each call using 50-100% of its estimate and
// reporting it; four owners, each stopped mid-run (its running handlers
// interrupted, their starts logged) and followed by a new one that rebuilds
// the meter from the service log, reconciled charges included. At the
// service (arrival 0-5 ms after the start), no 10 s interval holds more
// than 1,000 tokens; every unit completes. Logged seed.
func TestTokenMeterAcrossOwners(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 7))
	const (
		units  = 150
		limit  = 1000
		window = 10 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	path := filepath.Join(t.TempDir(), "runcue.db")
	clk := clock.NewFake(epoch)
	est := map[string]int64{}
	act := map[string]int64{}
	dur := map[string]time.Duration{}
	subs := make([]runcue.Submission, units)
	for i := range subs {
		id := fmt.Sprintf("u%03d", i)
		est[id] = 10 + rnd.Int64N(141)
		act[id] = est[id]/2 + rnd.Int64N(est[id]/2+1)
		dur[id] = time.Duration(100+rnd.IntN(3000)) * time.Millisecond
		subs[i] = runcue.Submission{ID: id, Task: "gen", Cost: runcue.Costs{"tokens": est[id]}}
	}
	var mu sync.Mutex
	var arrivals []call
	open := func() *runcue.Cue {
		c, err := runcue.Open(path, runcue.Config{Clock: clk, Logger: quietLogger, MaxConcurrent: 16})
		require.NoError(t, err)
		runcue.CheckInvariants(c, func(err error) { t.Error(err) })
		require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: limit, Window: window}}}))
		require.NoError(t, c.Task("gen", runcue.Task{Services: []string{"llm"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			// The service charges what the call uses, however it ends: an
			// interrupted call charged its whole estimate.
			arrivals = append(arrivals, call{arrival(seed, w.ID, w.Attempt, w.Started), est[w.ID], w.ID})
			i := len(arrivals) - 1
			mu.Unlock()
			tm := clk.NewTimer(dur[w.ID])
			defer tm.Stop()
			select {
			case <-tm.C():
				mu.Lock()
				arrivals[i].amount = act[w.ID]
				mu.Unlock()
				w.Used(runcue.Costs{"tokens": act[w.ID]})
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}))
		require.NoError(t, c.Start(ctx))
		return c
	}
	c := open()
	_, err := c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	step := func(c *runcue.Cue) {
		_, err := c.Settle(ctx)
		require.NoError(t, err)
		clk.Advance(time.Duration(10+rnd.IntN(190)) * time.Millisecond)
	}
	c = succeedOwners(t, ctx, c, open, step, func() int { return 40 + rnd.IntN(80) }, units, func(owner int) {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("owner %d stops after %d starts", owner, len(arrivals))
	})
	defer c.Close()
	mu.Lock()
	defer mu.Unlock()
	busiest, at := busiestWindowOf(arrivals, window)
	t.Logf("%d calls (%d interrupted), busiest %v: %d tokens from %v", len(arrivals), len(arrivals)-units, window, busiest, at.Sub(epoch))
	assert.LessOrEqual(t, busiest, int64(limit))
}

// succeedOwners steps c (on a fake clock, with step) through four owners,
// each stopped mid-run (StopAndCancel: its running handlers interrupted)
// after steps() steps, reported to stopped, and followed by open()'s,
// which rebuilds its meters from the service log; then it steps the last
// until units have completed, and returns it for the caller to close.
func succeedOwners(t *testing.T, ctx context.Context, c *runcue.Cue, open func() *runcue.Cue, step func(*runcue.Cue),
	steps func() int, units int, stopped func(owner int)) *runcue.Cue {
	t.Helper()
	for owner := range 4 {
		for range steps() {
			step(c)
		}
		stopped(owner)
		require.NoError(t, c.StopAndCancel(ctx))
		require.NoError(t, c.Close())
		c = open()
	}
	for n := 0; ; n++ {
		require.Less(t, n, 50_000, "the units did not finish")
		if n%20 == 0 {
			stats, err := c.Stats(ctx)
			require.NoError(t, err)
			if stats.States[runcue.StateCompleted] == units {
				return c
			}
		}
		step(c)
	}
}

// TestCostRefusedAtSubmit: a cost above a meter's limit (or a requests
// cost above RateLimit) can never run and is refused at submit, nothing of
// its batch stored; a unit lacking a cost of a metered amount is invalid.
// The same holds from a process that has registered neither the task nor
// its services: it reads them from the database, override included.
func TestCostRefusedAtSubmit(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{RateLimit: 10, RateWindow: time.Second,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: time.Minute, Charge: runcue.ChargeEstimate}}}))
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"}, Handler: noop}))
	ok := runcue.Submission{Task: "chat", Cost: runcue.Costs{"tokens": 1000}}
	tooBig := runcue.Submission{Task: "chat", Cost: runcue.Costs{"tokens": 1001}}
	tooMany := runcue.Submission{Task: "chat", Cost: runcue.Costs{"tokens": 5, "requests": 11}}
	none := runcue.Submission{Task: "chat"}
	negative := runcue.Submission{Task: "chat", Cost: runcue.Costs{"tokens": -1}}

	other := e.open(runcue.Config{}) // no task, no service registered here
	for _, c := range []*runcue.Cue{e.c, other} {
		_, err := c.SubmitBatch(e.ctx, []runcue.Submission{ok, tooBig})
		assert.ErrorIs(t, err, runcue.ErrCostTooLarge)
		assert.Contains(t, err.Error(), "submission 1")
		_, err = c.Submit(e.ctx, tooMany)
		assert.ErrorIs(t, err, runcue.ErrCostTooLarge)
		_, err = c.Submit(e.ctx, none)
		assert.ErrorIs(t, err, runcue.ErrInvalid)
		assert.Contains(t, err.Error(), "no cost of it")
		_, err = c.Submit(e.ctx, negative)
		assert.ErrorIs(t, err, runcue.ErrInvalid)
	}
	page, err := e.c.List(e.ctx, runcue.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, page.Units, "nothing of a refused batch is stored")

	// An override lowers the limit: the submitter reads it.
	require.NoError(t, other.SetService(e.ctx, "llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 500, Window: time.Minute}}}))
	_, err = other.Submit(e.ctx, ok)
	assert.ErrorIs(t, err, runcue.ErrCostTooLarge, "1000 tokens against the override's 500")
	fit := runcue.Submission{Task: "chat", Cost: runcue.Costs{"tokens": 500}}
	s, err := other.Submit(e.ctx, fit)
	require.NoError(t, err)
	e.start()
	info, err := e.c.Wait(e.ctx, s.ID)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, info.State)
	assert.Equal(t, runcue.Costs{"tokens": 500}, info.Cost)
}

// TestCostAboveKeyedLimitFails: a keyed instance's limits are known only
// at dispatch; a unit whose cost is above one fails there (ErrorKind
// cost_too_large) instead of holding its lane back forever, and the unit
// behind it runs.
func TestCostAboveKeyedLimitFails(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("tenant", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 100, Window: time.Minute}}}))
	require.NoError(t, e.c.Task("t", runcue.Task{ServiceKeys: func(w *runcue.Work) []string { return []string{"tenant:" + w.Target} },
		Handler: noop}))
	e.start()
	big := e.submit("t", func(s *runcue.Submission) { s.Target, s.Cost = "a", runcue.Costs{"tokens": 101} })
	small := e.submit("t", func(s *runcue.Submission) { s.Target, s.Cost = "a", runcue.Costs{"tokens": 100} })
	info, err := e.c.Wait(e.ctx, big)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateFailed, info.State)
	assert.Equal(t, "cost_too_large", info.ErrorKind)
	assert.Contains(t, info.Error, "tenant:a")
	info, err = e.c.Wait(e.ctx, small)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, info.State)
}

// TestMeterJSON: a service's meters round-trip through its JSON, and a
// meter status writes its window in milliseconds.
func TestMeterJSON(t *testing.T) {
	s := runcue.Service{Meters: []runcue.Meter{{Name: "output_tokens", Limit: 8000, Window: time.Minute, Charge: runcue.ChargeLarger}}}
	b, err := json.Marshal(s)
	require.NoError(t, err)
	assert.JSONEq(t, `{"meters":[{"name":"output_tokens","limit":8000,"window_ms":60000,"charge":"larger"}]}`, string(b))
	var back runcue.Service
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, s, back)
	ms := runcue.MeterStatus{Name: "tokens", Used: 7900, Limit: 8000, Window: time.Minute}
	b, err = json.Marshal(ms)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"tokens","used":7900,"limit":8000,"window_ms":60000}`, string(b))
	var msBack runcue.MeterStatus
	require.NoError(t, json.Unmarshal(b, &msBack))
	assert.Equal(t, ms, msBack)
	for _, bad := range []runcue.Meter{{Name: "requests", Limit: 1, Window: time.Second}, {Name: "tokens", Window: time.Second},
		{Name: "tokens", Limit: 1}, {Name: "to kens", Limit: 1, Window: time.Second}} {
		e := newEnv(t, runcue.Config{})
		err := e.c.Service("x", runcue.Service{Meters: []runcue.Meter{bad}})
		assert.ErrorIs(t, err, runcue.ErrInvalid, "%+v", bad)
	}
	e := newEnv(t, runcue.Config{})
	err = e.c.Service("x", runcue.Service{Meters: []runcue.Meter{{Name: "t", Limit: 1, Window: time.Second}, {Name: "t", Limit: 2, Window: time.Second}}})
	assert.ErrorIs(t, err, runcue.ErrInvalid, "two meters of one amount")
	assert.True(t, strings.HasPrefix(runcue.ChargeEstimate.String(), "estimate"))
}

// TestLargeCostNotStarved: a unit costing 900 of a 1,000-token meter,
// submitted behind a flood of 20-token units of another task (its own
// lane, whose oldest unit is always older), is not kept waiting by them:
// once the meter refuses it, the meter holds its room and admits the small
// ones only beside it, so it starts within the window, its margin and
// MaxStartDelay of its first refusal. The small ones wait no longer than
// that for it, and the meter is never exceeded at the starts.
func TestLargeCostNotStarved(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 100})
	var mu sync.Mutex
	var calls []call
	const window = 10 * time.Second
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: window}}}))
	handler := func(ctx context.Context, w *runcue.Work) (any, error) {
		var p llmParams
		require.NoError(t, w.Bind(&p))
		mu.Lock()
		calls = append(calls, call{w.Started, p.MaxTokens, w.ID})
		mu.Unlock()
		return nil, nil
	}
	estimate := func(s runcue.Submission) runcue.Costs {
		return runcue.Costs{"tokens": s.Params.(llmParams).MaxTokens}
	}
	require.NoError(t, e.c.Task("small", runcue.Task{Services: []string{"llm"}, Estimate: estimate, Handler: handler}))
	require.NoError(t, e.c.Task("big", runcue.Task{Services: []string{"llm"}, Estimate: estimate, Handler: handler}))
	e.start()
	smalls := make([]runcue.Submission, 400)
	for i := range smalls {
		smalls[i] = runcue.Submission{ID: fmt.Sprintf("s%03d", i), Task: "small", Params: llmParams{MaxTokens: 20}}
	}
	_, err := e.c.SubmitBatch(e.ctx, smalls)
	require.NoError(t, err)
	e.settle()
	e.clk.Advance(time.Second)
	submitted := e.clk.Now()
	_, err = e.c.Submit(e.ctx, runcue.Submission{ID: "big", Task: "big", Params: llmParams{MaxTokens: 900}})
	require.NoError(t, err)
	for steps := 0; ; steps++ {
		require.Less(t, steps, 100_000, "the units did not finish")
		_, err := e.c.Settle(e.ctx)
		require.NoError(t, err)
		mu.Lock()
		n := len(calls)
		mu.Unlock()
		if n == len(smalls)+1 {
			break
		}
		if next, ok := e.clk.NextDeadline(); ok {
			e.clk.Set(next)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var bigAt time.Time
	for _, c := range calls {
		if c.id == "big" {
			bigAt = c.at
		}
	}
	bound := window + runcue.DefaultMargin + 2*time.Second // MaxStartDelay's default
	t.Logf("big started %v after its submission (bound %v)", bigAt.Sub(submitted), bound)
	assert.LessOrEqual(t, bigAt.Sub(submitted), bound, "the large unit waited longer than its hold")
	busiest, at := busiestWindowOf(calls, window+runcue.DefaultMargin)
	assert.LessOrEqual(t, busiest, int64(1000), "tokens started in a window from %v", at)
}

// TestBucketMeter: a bucket of 600 tokens refilling 600 a minute lets a
// burst start at once and then the refill rate, twice what a window of 600
// a minute lets through in the first minute; at the service (arrival 0-5
// ms after the start) no interval holds more than the bucket allows,
// across an owner's stop mid-run (the next one takes the bucket to have
// been empty a window before it took over). Its status and Explain say
// so.
func TestBucketMeter(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	e := newEnv(t, runcue.Config{MaxConcurrent: 50})
	var mu sync.Mutex
	var calls []call
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 600, Window: time.Minute, Bucket: true}}}))
		require.NoError(t, c.Task("chat", runcue.Task{Services: []string{"llm"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			calls = append(calls, call{arrival(seed, w.ID, w.Attempt, w.Started), 100, w.ID})
			mu.Unlock()
			return nil, nil
		}}))
	}
	register(e.c)
	e.start()
	subs := make([]runcue.Submission, 40)
	for i := range subs {
		subs[i] = runcue.Submission{ID: fmt.Sprintf("b%02d", i), Task: "chat", Cost: runcue.Costs{"tokens": 100}}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	run := func(c *runcue.Cue, until time.Time) {
		for e.clk.Now().Before(until) {
			_, err := c.Settle(e.ctx)
			require.NoError(t, err)
			next, ok := e.clk.NextDeadline()
			if !ok || next.After(until) {
				next = until
			}
			e.clk.Set(next)
		}
	}
	run(e.c, epoch.Add(time.Minute))
	mu.Lock()
	first := len(calls)
	mu.Unlock()
	assert.Greater(t, first, 6, "more than a window of 600 would let start in a minute")
	ex, err := e.c.Explain(e.ctx, "b39")
	require.NoError(t, err)
	var said bool
	for _, r := range ex.Reasons {
		said = said || strings.Contains(r.Detail, "of its bucket of 600 taken, refilling 600 per 1m0s")
	}
	assert.True(t, said, "Explain: %+v", ex.Reasons)
	run(e.c, epoch.Add(90*time.Second))
	require.NoError(t, e.c.Stop(e.ctx))
	require.NoError(t, e.c.Close())
	c := e.open(runcue.Config{MaxConcurrent: 50})
	register(c)
	require.NoError(t, c.Start(e.ctx))
	run(c, epoch.Add(10*time.Minute))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, len(subs), "every unit ran")
	slices.SortFunc(calls, func(a, b call) int { return a.at.Compare(b.at) })
	rate := 600.0 / float64(time.Minute)
	for i := range calls {
		var sum int64
		for j := i; j < len(calls); j++ {
			sum += calls[j].amount
			allowed := 600 + rate*float64(calls[j].at.Sub(calls[i].at))
			if !assert.LessOrEqual(t, float64(sum), allowed, "arrived from %v to %v", calls[i].at.Sub(epoch), calls[j].at.Sub(epoch)) {
				return
			}
		}
	}
	t.Logf("%d calls in the first minute, %d in all by %v", first, len(calls), calls[len(calls)-1].at.Sub(epoch))
}

// TestExplainMeterFull: a unit held by a token meter is explained as
// meter_full, naming the meter, not as a full rate window.
func TestExplainMeterFull(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{RateLimit: 100, RateWindow: time.Minute,
		Meters: []runcue.Meter{{Name: "tokens", Limit: 100, Window: time.Minute}}}))
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"}, Handler: noop}))
	e.start()
	e.wait(e.submit("chat", func(s *runcue.Submission) { s.Cost = runcue.Costs{"tokens": 80} }))
	held := e.submit("chat", func(s *runcue.Submission) { s.Cost = runcue.Costs{"tokens": 80} })
	e.settle()
	ex, err := e.c.Explain(e.ctx, held)
	require.NoError(t, err)
	require.Len(t, ex.Reasons, 1, "%+v", ex.Reasons)
	r := ex.Reasons[0]
	assert.Equal(t, runcue.ReasonMeterFull, r.Kind)
	assert.Equal(t, "llm", r.Service)
	assert.Equal(t, "tokens", r.Meter)
	assert.Contains(t, r.Detail, "tokens")
	e.clk.Advance(time.Minute + runcue.DefaultMargin)
	e.wait(held)
}

// TestUsageKeptPerAttempt: a unit's cost (the estimate, stored at
// submit) and each run's reported usage are stored with the unit and
// shown in WorkInfo, in this process and another, and in its JSON.
func TestUsageKeptPerAttempt(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 10_000, Window: time.Minute}}}))
	require.NoError(t, e.c.Task("chat", runcue.Task{Services: []string{"llm"}, Retry: runcue.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond},
		Estimate: func(runcue.Submission) runcue.Costs { return runcue.Costs{"tokens": 500} },
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Attempt == 1 {
				w.Used(runcue.Costs{"tokens": 40})
				return nil, errors.New("the answer was cut off")
			}
			w.Used(runcue.Costs{"tokens": 321})
			return "ok", nil
		}}))
	e.start()
	id := e.submit("chat")
	for e.get(id).Runs < 1 || e.get(id).State == runcue.StateRunning {
		_, err := e.c.Settle(e.ctx)
		require.NoError(t, err)
	}
	e.clk.Advance(time.Second) // the retry's backoff
	wi := e.wait(id)
	require.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, runcue.Costs{"tokens": 500}, wi.Cost)
	require.Len(t, wi.Attempts, 2)
	assert.Equal(t, runcue.Costs{"tokens": 40}, wi.Attempts[0].Used)
	assert.Equal(t, runcue.Costs{"tokens": 321}, wi.Attempts[1].Used)
	other := e.open(runcue.Config{})
	got, err := other.Get(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, wi.Attempts, got.Attempts)
	b, err := json.Marshal(got)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"cost":{"tokens":500}`)
	assert.Contains(t, string(b), `"used":{"tokens":321}`)
}
