package runcue_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// virtualRun drives a Cue on a fake clock with Settle: handlers park until
// the driver releases them, one at a time, at their virtual finish time
// (ties by target), and the clock jumps to the next deadline only once the
// Cue has settled. It returns the trace of handler starts and outcomes.
func virtualRun(t *testing.T, seed uint64, units int) []string {
	t.Helper()
	clk := clock.NewFake(epoch)
	c, err := runcue.Open(filepath.Join(t.TempDir(), "v.db"), runcue.Config{Clock: clk, Rand: rand.NewPCG(seed, 7), Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	type parked struct {
		at      time.Time
		key     string
		release chan struct{}
	}
	var (
		mu    sync.Mutex
		queue []parked
		trace []string
		ended int // units whose last run has returned
		moved = make(chan struct{}, 1)
	)
	draw := func(target string, attempt int) uint64 {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%d", seed, target, attempt)
		return h.Sum64()
	}
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 3, RateLimit: 5, RateWindow: time.Second}))
	require.NoError(t, c.Task("call", runcue.Task{Services: []string{"api"}, Timeout: time.Minute,
		Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, Jitter: runcue.JitterFull},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			r := draw(w.Target, w.Attempt)
			p := parked{at: w.Started.Add(time.Duration(50+r%450) * time.Millisecond), key: w.Target, release: make(chan struct{})}
			mu.Lock()
			trace = append(trace, fmt.Sprintf("start %s #%d at %v", w.Target, w.Attempt, w.Started.Sub(epoch)))
			queue = append(queue, p)
			mu.Unlock()
			select {
			case moved <- struct{}{}:
			default:
			}
			<-p.release
			mu.Lock()
			if r%5 != 0 || w.Attempt == 3 {
				ended++
			}
			mu.Unlock()
			if r%5 == 0 {
				return nil, fmt.Errorf("flaky %s", w.Target)
			}
			return nil, nil
		}}))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, c.Start(ctx))
	subs := make([]runcue.Submission, units)
	for i := range subs {
		subs[i] = runcue.Submission{Task: "call", Target: fmt.Sprintf("u%03d", i)}
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	rec := record(t, c)
	for {
		running, err := c.Settle(ctx)
		require.NoError(t, err)
		mu.Lock()
		n, over := len(queue), ended == units
		mu.Unlock()
		if over && running == 0 {
			break
		}
		if n < running {
			// A handler is on its way to park, or a released one to return
			// (Settle counts it until runcue has seen it return).
			select {
			case <-moved:
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("handlers never parked: %d running, %d parked", running, n)
			}
			continue
		}
		require.Equal(t, running, n, "every running handler is parked")
		next, ok := clk.NextDeadline()
		if n > 0 {
			mu.Lock()
			slices.SortFunc(queue, func(a, b parked) int {
				if c := a.at.Compare(b.at); c != 0 {
					return c
				}
				return compareStrings(a.key, b.key)
			})
			first := queue[0]
			if !ok || !next.Before(first.at) {
				queue = queue[1:]
				mu.Unlock()
				clk.Set(first.at)
				close(first.release)
				continue
			}
			mu.Unlock()
		}
		require.True(t, ok, "nothing parked, no timer, and %d units not ended", units-ended)
		clk.Set(next)
	}
	// Handlers dispatched together start concurrently: their starts are
	// compared as a set.
	slices.Sort(trace)
	// Each unit ends once, completed or failed for good: waiting for
	// exactly that many ends gets them all, however late the recorder is
	// (failures that retry are left out: counting them would stop at
	// whatever had arrived).
	for _, e := range rec.waitFor(t, units, func(e runcue.Event) bool {
		return e.Type == runcue.EventWorkCompleted || (e.Type == runcue.EventWorkFailed && !e.WillRetry)
	}) {
		trace = append(trace, fmt.Sprintf("%s %s #%d at %v", e.Type, e.Target, e.Attempt, e.Time.Sub(epoch)))
	}
	return trace
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Settle makes a Cue on a fake clock replayable: two virtual runs with the
// same seed start the same handlers at the same virtual instants and end
// the same way; another seed does not. The rate window holds at every
// start.
func TestSettleMakesVirtualRunsReplayable(t *testing.T) {
	const units = 60
	a := virtualRun(t, 1, units)
	b := virtualRun(t, 1, units)
	require.Equal(t, a, b, "same seed, same run")
	assert.NotEqual(t, a, virtualRun(t, 2, units), "another seed, another run")
	var starts []time.Duration
	for _, line := range a {
		if rest, ok := strings.CutPrefix(line, "start "); ok {
			_, at, _ := strings.Cut(rest, " at ")
			d, err := time.ParseDuration(at)
			require.NoError(t, err)
			starts = append(starts, d)
		}
	}
	require.GreaterOrEqual(t, len(starts), units)
	slices.Sort(starts)
	for i := 5; i < len(starts); i++ {
		assert.GreaterOrEqual(t, starts[i]-starts[i-5], time.Second, "6 starts within a second at %v", starts[i])
	}
}

// cpuLoad keeps n goroutines spinning until the test ends: a loaded
// machine, as when a test suite runs beside other work.
func cpuLoad(t *testing.T, n int) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := range 10_000 {
					x += i
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// TestSettleArmsTheClock: once Settle returns, the fake clock's next
// deadline is the dispatcher's earliest timer (here a run's timeout),
// whatever the load: a simulation that advances to it fires it at its
// instant, and the run ends then.
func TestSettleArmsTheClock(t *testing.T) {
	cpuLoad(t, 2*runtime.GOMAXPROCS(0))
	e := newEnv(t, runcue.Config{PollInterval: 24 * time.Hour, QueueStatusInterval: -1})
	require.NoError(t, e.c.Task("hang", runcue.Task{Timeout: 5 * time.Second, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, _ *runcue.Work) (any, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}}))
	e.start()
	e.settle()
	for i := range 50 {
		// The last round's handler returns after its unit failed at the
		// deadline (the unit does not wait for it): wait for it first, or
		// it is still counted running.
		for {
			running, err := e.c.Settle(e.ctx)
			require.NoError(t, err)
			if running == 0 {
				break
			}
		}
		id := e.submit("hang")
		running, err := e.c.Settle(e.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, running)
		next, ok := e.clk.NextDeadline()
		require.True(t, ok, "round %d: no timer armed", i)
		require.True(t, e.get(id).StartedAt.Add(5*time.Second).Equal(next), "round %d: the clock's next deadline %v is the run's timeout", i, next)
		e.clk.Set(next)
		wi := e.wait(id)
		require.Equal(t, runcue.StateFailed, wi.State)
		require.True(t, next.Equal(wi.FinishedAt), "round %d: the timeout fired at its instant, not %v", i, wi.FinishedAt)
	}
}
