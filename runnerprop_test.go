package runcue_test

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/engine"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// remoteRunner is a Runner that behaves like workers on other hosts seen
// through a bad network: a run starts up to 1.3 MaxStartDelay after its
// dispatch (past StartBy it does not start, and says so), its start is
// reported up to MaxStartDelay late and by a bound up to 20 ms after it
// (the latest instant it can have been), its end after a random delay (so ends
// arrive out of order), and some runs are lost: nothing about them is
// ever reported. Its workers behave: a cancelled run stops within 50 ms,
// and a run never goes on past its lease (a lost one stops there). It
// keeps its own record of what actually happened: every start (lost runs'
// included) and every end. Its actions happen on a virtual timeline that
// the test advances (next, fire).
type remoteRunner struct {
	t      *testing.T
	rnd    *rand.Rand
	clk    *clock.Fake
	lease  time.Duration // LeaseBuffer
	msd    time.Duration // MaxStartDelay
	bound  int           // MaxConcurrent + MaxUncommitted
	uses   map[string][]string
	finish *atomic.Int64 // the Finishes committed (finishCounter)

	mu       sync.Mutex
	actions  actionHeap
	n        int
	launched int
	runs     []*remoteRun
	overrun  []string
	maxAhead int
}

// remoteRun is one run as the remote side saw it.
type remoteRun struct {
	p          *engine.Run
	services   []string
	lost       bool
	started    bool
	start, end time.Time // actual, on the engine's timeline
	ended      bool
	stopAt     time.Time // its planned end
}

type action struct {
	at  time.Time
	seq int
	f   func()
}

type actionHeap []action

func (h actionHeap) Len() int { return len(h) }
func (h actionHeap) Less(i, j int) bool {
	return h[i].at.Before(h[j].at) || (h[i].at.Equal(h[j].at) && h[i].seq < h[j].seq)
}
func (h actionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *actionHeap) Push(x any)   { *h = append(*h, x.(action)) }
func (h *actionHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// after schedules f at d from now (the caller holds mu).
func (r *remoteRunner) after(d time.Duration, f func()) {
	r.n++
	heap.Push(&r.actions, action{at: r.clk.Now().Add(d), seq: r.n, f: f})
}

func (r *remoteRunner) Launch(p *engine.Run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.launched++
	ahead := r.launched - int(r.finish.Load())
	r.maxAhead = max(r.maxAhead, ahead)
	if ahead > r.bound {
		r.overrun = append(r.overrun, fmt.Sprintf("%d runs launched ahead of the Finishes committed (at most %d)", ahead, r.bound))
	}
	run := &remoteRun{p: p, services: r.uses[p.Task], lost: r.rnd.IntN(10) == 0}
	p.Handle = run
	r.runs = append(r.runs, run)
	delay := time.Duration(r.rnd.Int64N(int64(r.msd) * 13 / 10))
	r.after(delay, func() { r.begin(run) })
}

// begin is a run's start on its worker.
func (r *remoteRunner) begin(run *remoteRun) {
	p := run.p
	now := p.Now()
	if !p.StartBy.IsZero() && now.After(p.StartBy) {
		if !run.lost {
			r.after(time.Duration(r.rnd.Int64N(int64(r.msd))), func() {
				p.Done(engine.Ending{Err: engine.ErrLateStart, Class: engine.ClassLateStart, NotStarted: true, At: r.clk.Now()})
			})
		}
		return
	}
	run.started, run.start = true, now
	if !run.lost {
		// Reported as the latest instant it can have been (a remote
		// host's clock, converted with its uncertainty): up to 20 ms
		// later, possibly past StartBy; half the reports come at once,
		// their bound still ahead of the engine's present.
		at := now.Add(time.Duration(r.rnd.Int64N(int64(20 * time.Millisecond))))
		delay := time.Duration(r.rnd.Int64N(int64(r.msd)))
		if r.rnd.IntN(2) == 0 {
			delay = 0 // at once: its bound is still to come
		}
		r.after(delay, func() { p.Started(at) })
	}
	d := time.Duration(10+r.rnd.IntN(600)) * time.Millisecond
	if r.rnd.IntN(20) == 0 {
		d = 5 * time.Second // past its deadline
	}
	run.stopAt = now.Add(d)
	if lease := p.Deadline.Add(r.lease); run.lost && lease.Before(r.clk.Now().Add(d)) {
		d = lease.Sub(r.clk.Now()) // a worker stops trusting its run at its lease's end
	}
	r.after(d, func() { r.stop(run) })
}

// stop ends a run on its worker, and reports it (after a delay) unless it
// is lost.
func (r *remoteRunner) stop(run *remoteRun) {
	if run.ended {
		return
	}
	run.ended, run.end = true, run.p.Now()
	if run.lost {
		return
	}
	p := run.p
	r.after(time.Duration(r.rnd.Int64N(int64(300*time.Millisecond))), func() { p.Done(engine.Ending{At: r.clk.Now()}) })
}

func (r *remoteRunner) Cancel(p *engine.Run, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run := p.Handle.(*remoteRun)
	if run.lost {
		return // it never hears of it
	}
	if !run.started {
		return // it will find out at its start (StartBy) or run, and end in time
	}
	r.after(time.Duration(r.rnd.Int64N(int64(50*time.Millisecond))), func() { r.stop(run) })
}

// next returns when the next action is due (zero: none).
func (r *remoteRunner) next() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.actions) == 0 {
		return time.Time{}
	}
	return r.actions[0].at
}

// fire runs the actions due by now, in order.
func (r *remoteRunner) fire() {
	for {
		r.mu.Lock()
		if len(r.actions) == 0 || r.actions[0].at.After(r.clk.Now()) {
			r.mu.Unlock()
			return
		}
		a := heap.Pop(&r.actions).(action)
		a.f()
		r.mu.Unlock()
	}
}

// finishCounter counts the Finishes committed, right after their commit
// (before the engine hears of it). A batch with a Finish takes 2 ms more
// (real time), so that runs end while earlier ends wait for their commit.
type finishCounter struct {
	store.Store
	n atomic.Int64
}

func (f *finishCounter) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	if slices.ContainsFunc(ops, func(op store.Op) bool { _, ok := op.(*store.Finish); return ok }) {
		time.Sleep(2 * time.Millisecond)
	}
	b, err := f.Store.Apply(ctx, ops)
	if err == nil {
		for i, op := range ops {
			if _, ok := op.(*store.Finish); ok && b.Results[i].Applied {
				f.n.Add(1)
			}
		}
	}
	return b, err
}

// TestRunnerProperty runs units through remoteRunner: starts reported up
// to MaxStartDelay late, ends reported out of order, some runs lost
// entirely. Checked against the Runner's own record of what happened: no
// rate window holds more than its limit of actual starts (lost runs'
// included), no more runs are launched ahead of the committed Finishes
// than MaxConcurrent + MaxUncommitted, each unit completes exactly once,
// and no unit has two runs going at once (a run whose end was not
// reported goes on, for the engine, until its lease ends: the lease rule).
func TestRunnerProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	for i := range uint64(5) {
		t.Run(fmt.Sprint(seed+i), func(t *testing.T) { runnerProperty(t, seed+i) })
	}
}

func runnerProperty(t *testing.T, seed uint64) {
	t.Logf("seed %d", seed)
	const (
		units   = 150
		limit   = 5
		window  = time.Second
		msd     = 200 * time.Millisecond
		lease   = 500 * time.Millisecond
		timeout = 2 * time.Second
		maxConc = 8
		maxUnc  = 2
	)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	fc := &finishCounter{Store: st}
	c, err := runcue.New(fc, runcue.Config{Clock: clk, Logger: slog.New(slog.DiscardHandler), MaxConcurrent: maxConc, MaxUncommitted: maxUnc,
		MaxStartDelay: msd, LeaseBuffer: lease, DefaultTimeout: timeout, PollInterval: time.Hour})
	require.NoError(t, err)
	defer c.Close()
	runcue.CheckInvariants(c, func(err error) { t.Error(err) })
	rr := &remoteRunner{t: t, rnd: rand.New(rand.NewPCG(seed, 99)), clk: clk, lease: lease, msd: msd, bound: maxConc + maxUnc,
		uses: map[string][]string{"t1": {"api"}, "t2": {"api", "db"}, "t3": {"db"}, "t4": nil}, finish: &fc.n}
	runcue.UseRunner(c, func(string, engine.Runner) engine.Runner { return rr })
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: limit, RateWindow: window}))
	require.NoError(t, c.Service("db", runcue.Service{MaxConcurrent: 3}))
	retry := runcue.RetryPolicy{MaxAttempts: 100, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second}
	for task, svcs := range rr.uses {
		require.NoError(t, c.Task(task, runcue.Task{Services: svcs, Retry: retry, Handler: noop}))
	}
	require.NoError(t, c.Start(ctx))
	subs := make([]runcue.Submission, units)
	for i := range subs {
		subs[i] = runcue.Submission{ID: fmt.Sprintf("u%03d", i), Task: []string{"t1", "t2", "t3", "t4", "t4"}[i%5]}
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)

	done := func() bool {
		n, err := st.QueuedCount(ctx)
		require.NoError(t, err)
		counts, err := st.CountActive(ctx)
		require.NoError(t, err)
		active := 0
		for _, k := range counts {
			active += k
		}
		return n == 0 && active == 0
	}
	const step = 50 * time.Millisecond
	for steps := 0; steps%50 != 0 || !done(); steps++ {
		require.Less(t, steps, 100_000, "the units did not finish")
		rr.fire()
		_, err = c.Settle(ctx)
		require.NoError(t, err)
		to := clk.Now().Add(step)
		if n := rr.next(); !n.IsZero() && n.Before(to) {
			to = n
		}
		clk.Advance(max(to.Sub(clk.Now()), time.Millisecond))
		rr.fire()
	}

	rr.mu.Lock()
	defer rr.mu.Unlock()
	assert.Empty(t, rr.overrun, "MaxUncommitted")
	// The windows, counted at the actual starts.
	var starts []time.Time
	lost := 0
	byUnit := map[string][]*remoteRun{}
	for _, run := range rr.runs {
		if run.lost {
			lost++
		}
		if !run.started {
			continue
		}
		byUnit[run.p.ID] = append(byUnit[run.p.ID], run)
		if slices.Contains(run.services, "api") {
			starts = append(starts, run.start)
		}
	}
	t.Logf("%d runs, %d lost, %d api starts, at most %d launched ahead of the Finishes committed, virtual time %v", len(rr.runs), lost,
		len(starts), rr.maxAhead, clk.Now().Sub(t0))
	require.NotZero(t, lost, "some runs were lost")
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i := range starts {
		j := i
		for j < len(starts) && starts[j].Sub(starts[i]) < window {
			j++
		}
		if !assert.LessOrEqual(t, j-i, limit, "api starts in [%v, +%v)", starts[i].Sub(t0), window) {
			break
		}
	}
	// One completion per unit.
	completed := map[string]int{}
	var after int64
	for {
		evs, err := st.EventsAfter(ctx, after, 1000)
		require.NoError(t, err)
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.Type == store.TypeWorkCompleted {
				completed[ev.WorkID]++
			}
		}
		after = evs[len(evs)-1].Seq
	}
	for _, s := range subs {
		assert.Equal(t, 1, completed[s.ID], s.ID)
		u, err := st.GetUnit(ctx, s.ID)
		require.NoError(t, err)
		assert.Equal(t, store.Completed, u.State, s.ID)
	}
	// The lease rule: a unit's runs never overlap on the workers.
	for id, runs := range byUnit {
		slices.SortFunc(runs, func(a, b *remoteRun) int { return cmp.Compare(a.p.Attempt, b.p.Attempt) })
		for i := 1; i < len(runs); i++ {
			prev, cur := runs[i-1], runs[i]
			require.True(t, prev.ended, "%s run %d never ended", id, prev.p.Attempt)
			assert.False(t, cur.start.Before(prev.end), "%s: run %d started at %v, before run %d ended at %v (lost %v)",
				id, cur.p.Attempt, cur.start.Sub(t0), prev.p.Attempt, prev.end.Sub(t0), prev.lost)
		}
	}
}
