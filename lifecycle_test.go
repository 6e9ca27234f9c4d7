package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
)

func TestBackoffDelays(t *testing.T) {
	const s = time.Second
	cases := []struct {
		name   string
		policy runcue.RetryPolicy
		want   []time.Duration // exact delays after failures 1..n, without jitter
	}{
		{"exponential default", runcue.RetryPolicy{}, []time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s, 128 * s, 256 * s, 300 * s, 300 * s}},
		{"fixed", runcue.RetryPolicy{Backoff: runcue.BackoffFixed, BaseDelay: 3 * s}, []time.Duration{3 * s, 3 * s, 3 * s, 3 * s}},
		{"linear", runcue.RetryPolicy{Backoff: runcue.BackoffLinear, BaseDelay: 2 * s, MaxDelay: 7 * s}, []time.Duration{2 * s, 4 * s, 6 * s, 7 * s, 7 * s}},
		{"exponential capped", runcue.RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, s, s}},
		{"huge failure count", runcue.RetryPolicy{}, nil},
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.want {
				n := i + 1
				p := tc.policy
				p.Jitter = runcue.JitterNone
				assert.Equal(t, want, p.Delay(n, rnd.Float64()), "failure %d without jitter", n)
				maxDelay := p.MaxDelay
				if maxDelay == 0 {
					maxDelay = runcue.DefaultMaxDelay
				}
				for range 200 {
					p.Jitter = runcue.JitterEqual
					d := p.Delay(n, rnd.Float64())
					assert.GreaterOrEqual(t, d, want/2, "equal jitter keeps at least half")
					assert.LessOrEqual(t, d, want)
					p.Jitter = runcue.JitterFull
					d = p.Delay(n, rnd.Float64())
					assert.GreaterOrEqual(t, d, time.Duration(0))
					assert.LessOrEqual(t, d, want)
					assert.LessOrEqual(t, d, maxDelay, "never above MaxDelay")
				}
				// The bounds of the draw.
				p.Jitter = runcue.JitterEqual
				assert.Equal(t, want/2, p.Delay(n, 0))
				assert.LessOrEqual(t, p.Delay(n, 1), want)
			}
			for _, n := range []int{63, 64, 1000, 1 << 30} {
				assert.Equal(t, runcue.DefaultMaxDelay, runcue.RetryPolicy{Jitter: runcue.JitterNone}.Delay(n, 0), "no overflow at %d", n)
			}
		})
	}
}

// TestBackoffOnTheClock checks that a retry becomes eligible exactly at the
// time its work_retrying event announced, for each shape, with and without
// jitter.
func TestBackoffOnTheClock(t *testing.T) {
	for _, b := range []runcue.Backoff{runcue.BackoffExponential, runcue.BackoffFixed, runcue.BackoffLinear} {
		for _, j := range []runcue.Jitter{runcue.JitterNone, runcue.JitterEqual, runcue.JitterFull} {
			t.Run(fmt.Sprint(b, "/", j), func(t *testing.T) {
				e := newEnv(t, runcue.Config{})
				policy := runcue.RetryPolicy{MaxAttempts: 4, Backoff: b, BaseDelay: 10 * time.Second, MaxDelay: 25 * time.Second, Jitter: j}
				var runs atomic.Int32
				require.NoError(t, e.c.Task("t", runcue.Task{Retry: policy, Handler: func(context.Context, *runcue.Work) (any, error) {
					if runs.Add(1) < 4 {
						return nil, errors.New("transient")
					}
					return "ok", nil
				}}))
				rec := record(t, e.c)
				e.start()
				id := e.submit("t")
				for failure := 1; failure <= 3; failure++ {
					ev := rec.waitFor(t, failure, ofType(runcue.EventWorkRetrying, id))[failure-1]
					now := e.clk.Now()
					delay := ev.NextAttempt.Sub(now)
					full := policy.Delay(failure, 0.999999999)
					if j == runcue.JitterNone {
						assert.Equal(t, full, delay)
					}
					assert.LessOrEqual(t, delay, full)
					assert.LessOrEqual(t, delay, policy.MaxDelay)
					if j == runcue.JitterEqual {
						assert.GreaterOrEqual(t, delay, full/2)
					}
					wi := e.get(id)
					assert.True(t, wi.RunAt.Equal(ev.NextAttempt), "the next attempt time is stored")
					assert.Equal(t, failure, wi.Failures)
					if delay > time.Millisecond {
						e.clk.Set(ev.NextAttempt.Add(-time.Millisecond))
						e.settle()
						assert.Equal(t, runcue.StateQueued, e.get(id).State, "not before its time")
						assert.Equal(t, int32(failure), runs.Load())
					}
					e.clk.Set(ev.NextAttempt)
					rec.waitFor(t, failure+1, ofType(runcue.EventWorkStarted, id))
				}
				wi := e.wait(id)
				assert.Equal(t, runcue.StateCompleted, wi.State)
				assert.Equal(t, 4, wi.Runs)
			})
		}
	}
}

func TestRetryThenSuccess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var runs atomic.Int32
	require.NoError(t, e.c.Task("flaky", runcue.Task{Retry: runcue.RetryPolicy{Jitter: runcue.JitterNone},
		Handler: func(context.Context, *runcue.Work) (any, error) {
			if runs.Add(1) <= 2 {
				return nil, errors.New("connection reset")
			}
			return "third time lucky", nil
		}}))
	require.NoError(t, e.c.Task("bad-input", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, runcue.Permanent(errors.New("unparseable"))
	}}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("flaky")
	perm := e.submit("bad-input")
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, id))
	e.clk.Advance(time.Second)
	rec.waitFor(t, 2, ofType(runcue.EventWorkRetrying, id))
	e.clk.Advance(2 * time.Second)
	wi := e.wait(id)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, 3, wi.Runs)
	assert.Equal(t, 2, wi.Failures)
	require.Len(t, wi.Attempts, 3)
	for i, want := range []string{"failed", "failed", "completed"} {
		a := wi.Attempts[i]
		assert.Equal(t, i+1, a.Run)
		assert.Equal(t, want, a.Outcome)
		assert.False(t, a.Start.IsZero())
		assert.GreaterOrEqual(t, a.Duration(), time.Duration(0))
	}
	assert.Equal(t, "connection reset", wi.Attempts[0].Error)
	assert.True(t, wi.Attempts[1].Start.Equal(epoch.Add(time.Second)), "the second run started when the backoff ended")

	p := e.wait(perm)
	assert.Equal(t, runcue.StateFailed, p.State)
	assert.Equal(t, 1, p.Runs, "a permanent error is never retried")
	assert.Equal(t, "unparseable", p.Error)
	fails := rec.waitFor(t, 1, ofType(runcue.EventWorkFailed, perm))
	assert.False(t, fails[0].WillRetry)
	retryFails := rec.waitFor(t, 2, ofType(runcue.EventWorkFailed, id))
	assert.True(t, retryFails[0].WillRetry)
}

func TestRetryOnAndSubmissionPolicy(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	errAuth := errors.New("401 unauthorized")
	require.NoError(t, e.c.Task("t", runcue.Task{
		Retry: runcue.RetryPolicy{MaxAttempts: 5, RetryOn: func(err error) bool { return !errors.Is(err, errAuth) }},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if w.Target == "auth" {
				return nil, errAuth
			}
			return nil, errors.New("flaky")
		}}))
	e.start()
	auth := e.submit("t", func(s *runcue.Submission) { s.Target = "auth" })
	assert.Equal(t, 1, e.wait(auth).Runs, "RetryOn refused the retry")
	// A submission's own policy: one attempt only.
	once := e.submit("t", func(s *runcue.Submission) { s.Retry = &runcue.RetryPolicy{MaxAttempts: 1} })
	wi := e.wait(once)
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, 1, wi.Runs)
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", Retry: &runcue.RetryPolicy{MaxAttempts: -2}})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}

// TestRestartDuringBackoff: a retry survives a restart, neither lost nor
// hurried.
func TestRestartDuringBackoff(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	policy := runcue.RetryPolicy{BaseDelay: time.Minute, Jitter: runcue.JitterNone}
	fail := func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("503") }
	require.NoError(t, e.c.Task("t", runcue.Task{Retry: policy, Handler: fail}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("t")
	next := rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, id))[0].NextAttempt
	assert.True(t, next.Equal(epoch.Add(time.Minute)))
	require.NoError(t, e.c.Close())

	e.clk.Advance(30 * time.Second)
	var started atomic.Int32
	c := e.open(runcue.Config{})
	require.NoError(t, c.Task("t", runcue.Task{Retry: policy, Handler: func(context.Context, *runcue.Work) (any, error) {
		started.Add(1)
		return "ok", nil
	}}))
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, c))
	wi, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateQueued, wi.State)
	assert.True(t, wi.RunAt.Equal(next))
	e.clk.Set(next.Add(-time.Millisecond))
	require.NoError(t, runcue.Settle(e.ctx, c))
	assert.Zero(t, started.Load(), "not hurried by the restart")
	e.clk.Set(next)
	wi, err = c.Wait(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State, "not lost by the restart")
	assert.Equal(t, 2, wi.Runs)
	assert.True(t, wi.StartedAt.Equal(next))
}

// ctxProbe is a handler that reports its context and returns only when told,
// ignoring cancellation unless told otherwise.
type ctxProbe struct {
	ctxs    chan context.Context
	release chan error
	honour  bool
}

func newProbe(honour bool) *ctxProbe {
	return &ctxProbe{ctxs: make(chan context.Context, 100), release: make(chan error, 100), honour: honour}
}

func (p *ctxProbe) handler(ctx context.Context, w *runcue.Work) (any, error) {
	p.ctxs <- ctx
	if p.honour {
		select {
		case err := <-p.release:
			return "done", err
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	err := <-p.release
	return "late result", err
}

func (p *ctxProbe) next(t *testing.T) context.Context {
	t.Helper()
	select {
	case ctx := <-p.ctxs:
		return ctx
	case <-time.After(wait):
		t.Fatal("no run started")
		return nil
	}
}

func TestTimeoutReleasesSlot(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			e := newEnv(t, runcue.Config{})
			p := newProbe(false) // ignores its context
			require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 1}))
			require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Timeout: time.Minute, HoldSlotsUntilReturn: hold,
				Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: p.handler}))
			var violations atomic.Int64
			runcue.CheckInvariants(e.c, func(err error) { violations.Add(1); t.Error(err) })
			rec := record(t, e.c)
			e.start()
			first := e.submit("t")
			second := e.submit("t")
			ctx := p.next(t)
			e.settle()
			assert.Equal(t, []string{first}, e.running())
			dl, ok := ctx.Deadline()
			assert.False(t, ok, "no wall-clock deadline under a fake clock: %v", dl)

			e.clk.Advance(time.Minute)
			evs := rec.waitFor(t, 1, ofType(runcue.EventWorkFailed, first))
			assert.Equal(t, "timeout", evs[0].ErrorKind)
			assert.ErrorIs(t, context.Cause(ctx), runcue.ErrTimeout)
			select {
			case <-ctx.Done():
			default:
				t.Fatal("the handler's context is not done at its deadline")
			}
			wi := e.get(first)
			assert.Equal(t, runcue.StateFailed, wi.State, "failed at the deadline though the handler ignores its context")
			assert.Equal(t, "timeout", wi.Attempts[0].Outcome)
			e.settle()
			if hold {
				assert.Equal(t, runcue.StateQueued, e.get(second).State, "the slot is held until the handler returns")
				p.release <- nil
				p.next(t)
			} else {
				p.next(t) // the slot was free at the deadline
				p.release <- nil
			}
			p.release <- nil
			assert.Equal(t, runcue.StateCompleted, e.wait(second).State)
			wi = e.get(first)
			assert.Equal(t, runcue.StateFailed, wi.State, "a late result is discarded")
			assert.Empty(t, wi.Result)
			e.settle()
			assert.Zero(t, violations.Load())
		})
	}
}

func TestSubmissionTimeout(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	p := newProbe(true)
	require.NoError(t, e.c.Task("t", runcue.Task{Timeout: time.Hour, Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: p.handler}))
	e.start()
	id := e.submit("t", func(s *runcue.Submission) { s.Timeout = 5 * time.Second })
	p.next(t)
	e.clk.Advance(5 * time.Second)
	wi := e.wait(id)
	assert.Equal(t, "timeout", wi.ErrorKind)
	assert.Equal(t, 5*time.Second, wi.Attempts[0].Duration())
}

func TestCancel(t *testing.T) {
	e := newEnv(t, runcue.Config{CancelGrace: 10 * time.Second})
	p := newProbe(true)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: p.handler}))
	rec := record(t, e.c)
	e.start()

	// Queued: cancelled at once.
	q := e.submit("t", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
	require.NoError(t, e.c.Cancel(e.ctx, q, runcue.CancelOptions{Reason: "user changed their mind"}))
	wi := e.get(q)
	assert.Equal(t, runcue.StateCancelled, wi.State)
	assert.Equal(t, "user changed their mind", wi.Error)
	rec.waitFor(t, 1, ofType(runcue.EventWorkCancelled, q))
	e.clk.Advance(2 * time.Hour)
	e.settle()
	assert.Equal(t, runcue.StateCancelled, e.get(q).State, "never dispatched")

	// Running, handler honours its context: cancelled, no budget spent.
	r1 := e.submit("t")
	ctx := p.next(t)
	require.NoError(t, e.c.Cancel(e.ctx, r1, runcue.CancelOptions{}))
	select {
	case <-ctx.Done():
	default:
		t.Fatal("the handler's context is not done when Cancel returns")
	}
	assert.ErrorIs(t, context.Cause(ctx), runcue.ErrCancelled)
	wi = e.wait(r1)
	assert.Equal(t, runcue.StateCancelled, wi.State)
	assert.Zero(t, wi.Failures, "cancellation spends no retry budget")
	assert.Equal(t, "cancelled", wi.Attempts[0].Outcome)

	// Running, handler succeeds anyway: completed.
	ok := newProbe(false)
	require.NoError(t, e.c.Task("stubborn", runcue.Task{Handler: ok.handler}))
	r2 := e.submit("stubborn")
	ctx = ok.next(t)
	require.NoError(t, e.c.Cancel(e.ctx, r2, runcue.CancelOptions{}))
	assert.ErrorIs(t, context.Cause(ctx), runcue.ErrCancelled)
	ok.release <- nil
	wi = e.wait(r2)
	assert.Equal(t, runcue.StateCompleted, wi.State, "success after cancellation is recorded")

	// Running, handler ignores cancellation: cancelled when the grace ends.
	r3 := e.submit("stubborn")
	ok.next(t)
	require.NoError(t, e.c.Cancel(e.ctx, r3, runcue.CancelOptions{}))
	e.settle()
	assert.Equal(t, runcue.StateRunning, e.get(r3).State, "within the grace")
	e.clk.Advance(10 * time.Second)
	wi = e.wait(r3)
	assert.Equal(t, runcue.StateCancelled, wi.State)
	ok.release <- nil // its late result is discarded
	e.settle()
	assert.Equal(t, runcue.StateCancelled, e.get(r3).State)

	// Finished: unchanged, and said so.
	err := e.c.Cancel(e.ctx, r2, runcue.CancelOptions{})
	assert.ErrorIs(t, err, runcue.ErrFinished)
	assert.Equal(t, runcue.StateCompleted, e.get(r2).State)
	assert.ErrorIs(t, e.c.Cancel(e.ctx, "no-such-unit", runcue.CancelOptions{}), runcue.ErrNotFound)
	cancels := rec.waitFor(t, 3, ofType(runcue.EventWorkCancelled, ""))
	assert.Len(t, cancels, 3)
}

func TestCancelFromAnotherProcess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	p := newProbe(true)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: p.handler}))
	e.start()
	other := e.open(runcue.Config{})
	queued := e.submit("t", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
	running := e.submit("t")
	ctx := p.next(t)

	require.NoError(t, other.Cancel(e.ctx, queued, runcue.CancelOptions{}))
	wi, err := other.Get(e.ctx, queued)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCancelled, wi.State)

	require.NoError(t, other.Cancel(e.ctx, running, runcue.CancelOptions{}), "a request is recorded")
	require.NoError(t, runcue.PollNow(e.ctx, e.c)) // the owner's next poll
	<-ctx.Done()
	assert.ErrorIs(t, context.Cause(ctx), runcue.ErrCancelled)
	assert.Equal(t, runcue.StateCancelled, e.wait(running).State)
	e.clk.Advance(2 * time.Hour)
	e.settle()
	assert.Equal(t, runcue.StateCancelled, e.get(queued).State, "the owner never runs it")
	assert.ErrorIs(t, other.Cancel(e.ctx, running, runcue.CancelOptions{}), runcue.ErrFinished)
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("upload", runcue.Task{Handler: noop}))
	other := e.open(runcue.Config{}) // another "process" on the same file
	const n = 100
	var wg sync.WaitGroup
	results := make([]runcue.Submitted, n)
	errs := make([]error, n)
	for i := range n {
		c := e.c
		if i%2 == 1 {
			c = other
		}
		wg.Go(func() {
			results[i], errs[i] = c.Submit(e.ctx, runcue.Submission{Task: "upload", Target: "photo.jpg", IdempotencyKey: "upload:photo.jpg"})
		})
	}
	wg.Wait()
	ids := map[string]bool{}
	dups := 0
	for i := range n {
		require.NoError(t, errs[i])
		ids[results[i].ID] = true
		if results[i].Duplicate {
			dups++
		}
	}
	assert.Len(t, ids, 1, "exactly one unit")
	assert.Equal(t, n-1, dups)
	page, err := e.c.List(e.ctx, runcue.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, page.Units, 1)
}

func TestIdempotencyFailedPolicy(t *testing.T) {
	for _, policy := range []runcue.FailedDuplicatePolicy{runcue.RejectFailedDuplicates, runcue.ResubmitFailedDuplicates} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			e := newEnv(t, runcue.Config{FailedDuplicates: policy})
			// The first unit fails; later ones run until released, so that
			// the resubmitted unit still holds the key when it is tested.
			release := make(chan struct{})
			require.NoError(t, e.c.Task("t", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
				Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
					if w.Target == "fail" {
						return nil, errors.New("no")
					}
					select {
					case <-release:
						return "ok", nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}}))
			e.start()
			first := e.submit("t", func(s *runcue.Submission) { s.IdempotencyKey = "k"; s.Target = "fail" })
			require.Equal(t, runcue.StateFailed, e.wait(first).State)
			out, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", IdempotencyKey: "k"})
			if policy == runcue.RejectFailedDuplicates {
				assert.ErrorIs(t, err, runcue.ErrDuplicate)
				return
			}
			require.NoError(t, err)
			assert.False(t, out.Duplicate)
			assert.NotEqual(t, first, out.ID)
			// The new unit holds the key now.
			dup, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", IdempotencyKey: "k"})
			require.NoError(t, err)
			assert.True(t, dup.Duplicate)
			assert.Equal(t, out.ID, dup.ID)
			close(release)
			assert.Equal(t, runcue.StateCompleted, e.wait(out.ID).State)
		})
	}
}

func TestRetryFailedAndPrune(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var fixed atomic.Bool
	handler := func(context.Context, *runcue.Work) (any, error) {
		if fixed.Load() {
			return "ok", nil
		}
		return nil, errors.New("down")
	}
	require.NoError(t, e.c.Task("a", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: handler}))
	require.NoError(t, e.c.Task("b", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: handler}))
	require.NoError(t, e.c.Task("ok", runcue.Task{Handler: noop}))
	e.start()
	a1, a2, b1 := e.submit("a"), e.submit("a"), e.submit("b")
	done := e.submit("ok")
	for _, id := range []string{a1, a2, b1} {
		require.Equal(t, runcue.StateFailed, e.wait(id).State, "failed units stay for inspection")
	}
	e.wait(done)
	page, err := e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateFailed}})
	require.NoError(t, err)
	assert.Len(t, page.Units, 3, "the dead-letter queue is a List away")

	fixed.Store(true)
	require.NoError(t, e.c.Retry(e.ctx, a1))
	wi := e.wait(a1)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, 2, wi.Runs)
	assert.ErrorIs(t, e.c.Retry(e.ctx, a1), runcue.ErrNotFailed)
	assert.ErrorIs(t, e.c.Retry(e.ctx, "ghost"), runcue.ErrNotFound)

	n, err := e.c.RetryFailed(e.ctx, runcue.RetryFilter{Tasks: []string{"b"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only failed units of the filter")
	assert.Equal(t, runcue.StateCompleted, e.wait(b1).State)
	assert.Equal(t, runcue.StateFailed, e.get(a2).State)

	// Prune only finished units older than the cutoff.
	e.clk.Advance(48 * time.Hour)
	recent := e.submit("ok")
	e.wait(recent)
	queued := e.submit("ok", func(s *runcue.Submission) { s.RunAt = epoch.Add(1000 * time.Hour) })
	pruned, err := e.c.Prune(e.ctx, 24*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 4, pruned, "a1, a2, b1 and done finished two days ago")
	for _, id := range []string{a1, a2, b1, done} {
		_, err := e.c.Get(e.ctx, id)
		assert.ErrorIs(t, err, runcue.ErrNotFound)
	}
	assert.Equal(t, runcue.StateCompleted, e.get(recent).State)
	assert.Equal(t, runcue.StateQueued, e.get(queued).State)
}

func TestRetention(t *testing.T) {
	e := newEnv(t, runcue.Config{Retention: 24 * time.Hour})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	old := e.submit("t")
	e.wait(old)
	e.clk.Advance(23 * time.Hour)
	e.settle() // the pass this advance made due, committed: the next is due an interval after it
	fresh := e.submit("t")
	e.wait(fresh)
	e.clk.Advance(2 * time.Hour) // passes the prune interval too
	e.settle()                   // the pass the clock made due, committed
	_, err := e.c.Get(e.ctx, old)
	assert.ErrorIs(t, err, runcue.ErrNotFound, "the owner prunes in the background")
	assert.Equal(t, runcue.StateCompleted, e.get(fresh).State)
}

// TestLongWork: a run far longer than its lease buffer is never reclaimed
// while its owner is alive, and is recovered at once when the owner dies.
func TestLongWork(t *testing.T) {
	e := newEnv(t, runcue.Config{LeaseBuffer: time.Minute, ShutdownTimeout: 20 * time.Millisecond})
	var starts atomic.Int32
	beat := make(chan *runcue.Work, 1)
	stop := make(chan struct{})
	defer close(stop)
	require.NoError(t, e.c.Task("long", runcue.Task{Timeout: 24 * time.Hour, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		starts.Add(1)
		beat <- w
		<-stop // an external wait that ignores cancellation
		return nil, nil
	}}))
	e.start()
	id := e.submit("long")
	w := <-beat
	e.settle() // the claim is written behind the handler's start
	lease0 := e.get(id).LeaseExpiresAt
	assert.True(t, lease0.Equal(epoch.Add(24*time.Hour+time.Minute)), "lease = deadline + buffer")
	other := e.open(runcue.Config{})
	for hour := 1; hour <= 6; hour++ {
		e.clk.Advance(time.Hour)
		w.Heartbeat()
		e.settle()
		wi := e.get(id)
		assert.Equal(t, runcue.StateRunning, wi.State, "hour %d", hour)
		assert.Equal(t, 1, wi.Runs)
		assert.ErrorIs(t, other.Start(e.ctx), runcue.ErrLocked, "the owner holds the database")
	}
	assert.Equal(t, int32(1), starts.Load(), "never reclaimed while its owner runs")
	// The owner "dies": Close abandons the handler, which ignores its
	// context; the unit stays running in the database.
	require.Error(t, e.c.Close())
	require.NoError(t, other.Task("long", runcue.Task{Handler: noop}))
	rec := record(t, other)
	require.NoError(t, other.Start(e.ctx))
	rec.waitFor(t, 1, ofType(runcue.EventWorkRecovered, id))
	wi, err := other.Wait(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State, "requeued at start by the next owner")
	assert.Equal(t, 2, wi.Runs)
}

func TestHeartbeatExtendsLease(t *testing.T) {
	e := newEnv(t, runcue.Config{LeaseBuffer: time.Minute})
	beats := make(chan *runcue.Work, 1)
	release := make(chan struct{})
	require.NoError(t, e.c.Task("t", runcue.Task{Timeout: time.Minute, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		beats <- w
		<-release
		return nil, nil
	}}))
	e.start()
	id := e.submit("t")
	w := <-beats
	e.settle()
	assert.True(t, e.get(id).LeaseExpiresAt.Equal(epoch.Add(2*time.Minute)))
	e.clk.Advance(50 * time.Second)
	w.Heartbeat()
	e.settle()
	wi := e.get(id)
	assert.True(t, wi.HeartbeatAt.Equal(epoch.Add(50*time.Second)))
	assert.True(t, wi.LeaseExpiresAt.Equal(epoch.Add(2*time.Minute)), "now + buffer is less than deadline + buffer: kept")
	e.clk.Advance(500 * time.Millisecond)
	w.Heartbeat() // throttled: at most one write a second
	e.settle()
	assert.True(t, e.get(id).HeartbeatAt.Equal(epoch.Add(50*time.Second)))
	close(release)
	wi = e.wait(id)
	assert.Empty(t, wi.LeasedBy)
}

// Under the real clock a handler's context shows the run's deadline and, once
// the dispatcher's timer heap has passed it, reports it as a context with that
// deadline would: Err is context.DeadlineExceeded, Cause is ErrTimeout, and a
// context derived after it is done inherits both.
func TestHandlerContextAtItsDeadline(t *testing.T) {
	e := newEnv(t, runcue.Config{Clock: clock.Real()})
	type seen struct {
		deadline           time.Time
		shown              bool
		err, cause, derErr error
		derCause           error
	}
	got := make(chan seen, 1)
	const timeout = 200 * time.Millisecond
	before := time.Now()
	require.NoError(t, e.c.Task("t", runcue.Task{Timeout: timeout, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			var s seen
			s.deadline, s.shown = ctx.Deadline()
			<-ctx.Done()
			s.err, s.cause = ctx.Err(), context.Cause(ctx)
			der, cancel := context.WithCancel(ctx)
			defer cancel()
			s.derErr, s.derCause = der.Err(), context.Cause(der)
			got <- s
			return nil, ctx.Err()
		}}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("t")
	var s seen
	select {
	case s = <-got:
	case <-e.ctx.Done():
		t.Fatal("the handler's context was never done")
	}
	after := time.Now()
	require.True(t, s.shown, "the deadline is shown under the real clock")
	assert.False(t, s.deadline.Before(before.Add(timeout)), "deadline %v before submit+timeout", s.deadline)
	assert.False(t, s.deadline.After(after), "deadline %v after the handler saw its context done", s.deadline)
	assert.Equal(t, context.DeadlineExceeded, s.err)
	assert.ErrorIs(t, s.cause, runcue.ErrTimeout)
	assert.Equal(t, context.DeadlineExceeded, s.derErr)
	assert.ErrorIs(t, s.derCause, runcue.ErrTimeout)
	evs := rec.waitFor(t, 1, ofType(runcue.EventWorkFailed, id))
	assert.Equal(t, "timeout", evs[0].ErrorKind)
}
