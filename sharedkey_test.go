package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/httplimit"
)

// sharedAPI is an LLM API's token limit shared by runcue and another
// program: a sliding window counted at each request's arrival, refusing
// (429) a request whose tokens do not fit, its answers stating what
// remains.
type sharedAPI struct {
	mu      sync.Mutex
	limit   int64
	window  time.Duration
	arrived []sharedCall
}

type sharedCall struct {
	at      time.Time
	tokens  int64
	ours    bool
	refused bool
}

// arrive counts a request of tokens arriving now; it returns whether it
// was served and what then remained.
func (a *sharedAPI) arrive(tokens int64, ours bool) (bool, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	var used int64
	for i := len(a.arrived) - 1; i >= 0 && a.arrived[i].at.After(now.Add(-a.window)); i-- {
		if !a.arrived[i].refused {
			used += a.arrived[i].tokens
		}
	}
	c := sharedCall{at: now, tokens: tokens, ours: ours, refused: used+tokens > a.limit}
	a.arrived = append(a.arrived, c)
	if c.refused {
		return false, a.limit - used
	}
	return true, a.limit - used - tokens
}

// TestSharedKeyWithExecutors: runcue's handlers, run by two executors (and,
// to compare, by the scheduler itself), call an API whose token limit another program steadily uses 40% of;
// runcue, told the whole limit and backlogged, learns of the other only
// from the answers' headers. runcue's work arrives at 1.5 times the rate the
// whole limit would take, so that a backlog grows from the start; the
// other program was running before. After the first window, few of
// runcue's requests are refused, the other program is refused about as
// rarely as alone (never), and runcue uses most of what the other leaves.
// Real time: about 11 s.
func TestSharedKeyWithExecutors(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := map[bool]string{false: "local", true: "executors"}[remote]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sharedKey(t, remote)
		})
	}
}

func sharedKey(t *testing.T, remote bool) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const limit, window = 6000, time.Second
	api := &sharedAPI{limit: limit, window: window}
	path := filepath.Join(t.TempDir(), "runcue.db")
	ctx := t.Context()
	var handler, localHandler runcue.Handler
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("llm", runcue.Service{MaxConcurrent: 20, Margin: 50 * time.Millisecond,
			Meters: []runcue.Meter{{Name: "tokens", Limit: limit, Window: window}}}))
		require.NoError(t, c.Task("ask", runcue.Task{Remote: remote, Handler: localHandler, Services: []string{"llm"}, Retry: runcue.RetryPolicy{MaxAttempts: 5}}))
	}
	if !remote {
		localHandler = func(ctx context.Context, w *runcue.Work) (any, error) { return handler(ctx, w) }
	}
	sched, err := runcue.Open(path, runcue.Config{PollInterval: 10 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer sched.Close()
	register(sched)
	require.NoError(t, sched.Start(ctx))

	// Each unit's call: a seeded 0-5 ms wire, input tokens in its params,
	// output drawn at the answer (the estimate counts max_tokens: 150).
	handler = func(ctx context.Context, w *runcue.Work) (any, error) {
		var input int64
		if err := w.Bind(&input); err != nil {
			return nil, err
		}
		r := rand.New(rand.NewPCG(seed, uint64(len(w.ID))*31+uint64(w.Attempt)+uint64(input)))
		time.Sleep(time.Duration(r.Int64N(int64(5*time.Millisecond) + 1)))
		use := input + 50 + r.Int64N(101)
		served, remaining := api.arrive(use, true)
		time.Sleep(20*time.Millisecond + time.Duration(r.Int64N(int64(60*time.Millisecond))))
		status := http.StatusOK
		if !served {
			status, use = http.StatusTooManyRequests, 0
		}
		w.Used(runcue.Costs{"tokens": use})
		h := http.Header{"X-Ratelimit-Limit-Tokens": {strconv.Itoa(limit)}, "X-Ratelimit-Remaining-Tokens": {strconv.FormatInt(remaining, 10)},
			"Retry-After": {"1"}}
		return nil, httplimit.Report(w, h, status, time.Now())
	}
	stops := make([]func(), 0, 2)
	for i := range 2 {
		if localHandler != nil {
			break
		}
		c, err := runcue.Open(path, runcue.Config{Logger: quietLogger})
		require.NoError(t, err)
		defer c.Close()
		register(c)
		x, err := c.Executor(runcue.ExecutorConfig{ID: fmt.Sprintf("x%d", i), Capacity: 10, PollInterval: 5 * time.Millisecond}, map[string]runcue.Handler{"ask": handler})
		require.NoError(t, err)
		xctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- x.Run(xctx) }()
		stops = append(stops, func() { stop(); require.NoError(t, <-done) })
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()

	// The other program: 120 tokens every 50 ms, 40% of the limit.
	otherDone := make(chan struct{})
	octx, stopOther := context.WithCancel(ctx)
	go func() {
		defer close(otherDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-octx.Done():
				return
			case <-tick.C:
				api.arrive(120, false)
			}
		}
	}()
	time.Sleep(window) // the other program was running before runcue's work came
	start := time.Now()
	// runcue's work arrives at 30 units a second, 1.5 times what the
	// whole limit would take: a backlog grows from the start.
	rnd := rand.New(rand.NewPCG(seed, 7))
	tick := time.NewTicker(time.Second / 30)
	for range 300 {
		<-tick.C
		input := 100 + rnd.Int64N(201)
		_, err := sched.Submit(ctx, runcue.Submission{Task: "ask", Params: input, Cost: runcue.Costs{"tokens": input + 150}})
		require.NoError(t, err)
	}
	tick.Stop()
	stopOther()
	<-otherDone
	end := time.Now()

	api.mu.Lock()
	defer api.mu.Unlock()
	from := start.Add(window)
	var ours, oursRefused, others, othersRefused int
	var oursUsed, othersUsed int64
	for _, c := range api.arrived {
		if c.at.Before(from) || c.at.After(end) {
			continue
		}
		switch {
		case c.ours:
			ours++
			if c.refused {
				oursRefused++
			} else {
				oursUsed += c.tokens
			}
		default:
			others++
			if c.refused {
				othersRefused++
			} else {
				othersUsed += c.tokens
			}
		}
	}
	left := float64(limit)*end.Sub(from).Seconds()/window.Seconds() - float64(othersUsed)
	t.Logf("after the first window: runcue %d requests, %d refused; the other %d, %d refused; runcue used %.1f%% of what the other left",
		ours, oursRefused, others, othersRefused, 100*float64(oursUsed)/left)
	require.Positive(t, ours)
	assert.LessOrEqual(t, float64(oursRefused), 0.02*float64(ours)+1, "runcue's requests refused")
	assert.LessOrEqual(t, float64(othersRefused), 0.05*float64(others), "the other's requests refused (none alone)")
	// Its share of what the other left is a figure of real time: 80-87%
	// on an idle machine, 66% beside the other tests on a loaded one. The
	// acceptance's 80% is measured on the virtual clock (runcue-sim's
	// shared_key and shared_bucket); here runcue must only take the room
	// back, not hold it for the other.
	assert.Greater(t, float64(oursUsed), 0.5*left, "runcue used most of what the other left")
}
