package engine

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store"
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
	p          *Run
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

func (r *remoteRunner) Launch(p *Run) {
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
				p.Done(Ending{Err: ErrLateStart, Class: ClassLateStart, NotStarted: true, At: r.clk.Now()})
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
	r.after(time.Duration(r.rnd.Int64N(int64(300*time.Millisecond))), func() { p.Done(Ending{At: r.clk.Now()}) })
}

func (r *remoteRunner) Cancel(p *Run, cause error) {
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

// expRetry waits base, then twice as long after each failure, up to most.
type expRetry struct {
	attempts   int
	base, most time.Duration
}

func (e expRetry) Attempts() int { return e.attempts }
func (e expRetry) Delay(failures int, _ float64) time.Duration {
	return min(e.base<<min(failures-1, 20), e.most)
}

// TestRunnerProperty runs units through remoteRunner: starts reported up
// to MaxStartDelay late, ends reported out of order, some runs lost
// entirely. Checked against the Runner's own record of what happened: no
// rate window holds more than its limit of actual starts (lost runs'
// included), no more runs are launched ahead of the committed Finishes
// than MaxConcurrent + MaxUncommitted, each unit completes exactly once,
// and no unit has two runs going at once (a run whose end was not
// reported goes on, for the engine, until its lease ends: the lease rule).
// (Moved from the root, where it plugged the Runner in through a back
// door.)
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
	fc := &finishCounter{}
	w := newWorldOn(t, func(st store.Store) store.Store { fc.Store = st; return fc })
	defer w.close()
	t0 := w.clk.Now()
	rr := &remoteRunner{rnd: rand.New(rand.NewPCG(seed, 99)), clk: w.clk, lease: lease, msd: msd, bound: maxConc + maxUnc,
		uses: map[string][]string{"t1": {"api"}, "t2": {"api", "db"}, "t3": {"db"}, "t4": nil}, finish: &fc.n}
	w.settings = func(s *Settings) {
		s.MaxConcurrent, s.MaxUncommitted, s.MaxStartDelay, s.LeaseBuffer = maxConc, maxUnc, msd, lease
	}
	w.do(fmt.Sprintf("service api rate=%d/%v", limit, window))
	w.do("service db max=3")
	for task, svcs := range rr.uses {
		w.do(fmt.Sprintf("task %s services=%s timeout=%v", task, strings.Join(svcs, ","), timeout))
		spec := w.reg.Tasks[task]
		spec.Runner, spec.Retry = rr, expRetry{attempts: 100, base: 50 * time.Millisecond, most: time.Second}
	}
	w.do("start")
	subs := make([]*store.Unit, units)
	for i := range subs {
		subs[i] = &store.Unit{ID: fmt.Sprintf("u%03d", i), Task: []string{"t1", "t2", "t3", "t4", "t4"}[i%5]}
	}
	w.insert(subs...)

	const step = 50 * time.Millisecond
	for steps := 0; steps%50 != 0 || !w.finished(); steps++ {
		if steps >= 100_000 {
			t.Fatal("the units did not finish")
		}
		rr.fire()
		w.settle()
		to := w.clk.Now().Add(step)
		if n := rr.next(); !n.IsZero() && n.Before(to) {
			to = n
		}
		w.clk.Advance(max(to.Sub(w.clk.Now()), time.Millisecond))
		rr.fire()
	}

	rr.mu.Lock()
	defer rr.mu.Unlock()
	if len(rr.overrun) > 0 {
		t.Errorf("MaxUncommitted: %v", rr.overrun)
	}
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
		len(starts), rr.maxAhead, w.clk.Now().Sub(t0))
	if lost == 0 {
		t.Fatal("no run was lost")
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i := range starts {
		j := i
		for j < len(starts) && starts[j].Sub(starts[i]) < window {
			j++
		}
		if j-i > limit {
			t.Fatalf("%d api starts in [%v, +%v), at most %d", j-i, starts[i].Sub(t0), window, limit)
		}
	}
	// One completion per unit.
	completed := map[string]int{}
	var after int64
	for {
		evs, err := w.st.EventsAfter(w.ctx, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
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
		if completed[s.ID] != 1 {
			t.Errorf("%s completed %d times", s.ID, completed[s.ID])
		}
		u, err := w.st.GetUnit(w.ctx, s.ID)
		if err != nil || u.State != store.Completed {
			t.Errorf("%s: %v %v, want completed", s.ID, u.State, err)
		}
	}
	// The lease rule: a unit's runs never overlap on the workers.
	for id, runs := range byUnit {
		slices.SortFunc(runs, func(a, b *remoteRun) int { return cmp.Compare(a.p.Attempt, b.p.Attempt) })
		for i := 1; i < len(runs); i++ {
			prev, cur := runs[i-1], runs[i]
			if !prev.ended {
				t.Fatalf("%s run %d never ended", id, prev.p.Attempt)
			}
			if cur.start.Before(prev.end) {
				t.Errorf("%s: run %d started at %v, before run %d ended at %v (lost %v)",
					id, cur.p.Attempt, cur.start.Sub(t0), prev.p.Attempt, prev.end.Sub(t0), prev.lost)
			}
		}
	}
}
