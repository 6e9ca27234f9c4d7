package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// depChecker is a handler that, when it runs, verifies in the database that
// every dependency of its unit is completed.
type depChecker struct {
	st        *sqlite.Store
	deps      map[string][]string
	mu        sync.Mutex
	order     []string
	violation []string
	fail      map[string]bool
}

func newDepChecker(t *testing.T, path string) *depChecker {
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return &depChecker{st: st, deps: map[string][]string{}, fail: map[string]bool{}}
}

func (c *depChecker) handler(ctx context.Context, w *runcue.Work) (any, error) {
	c.mu.Lock()
	deps, fail := c.deps[w.ID], c.fail[w.ID]
	c.order = append(c.order, w.ID)
	c.mu.Unlock()
	for _, dep := range deps {
		u, err := c.st.GetUnit(ctx, dep)
		if err != nil || u.State != runcue.StateCompleted {
			c.mu.Lock()
			c.violation = append(c.violation, fmt.Sprintf("%s started before %s completed", w.ID, dep))
			c.mu.Unlock()
		}
	}
	if fail {
		return nil, runcue.Permanent(errors.New("planned failure"))
	}
	return w.ID, nil
}

func (c *depChecker) add(id string, deps ...string) runcue.Submission {
	c.deps[id] = deps
	return runcue.Submission{Task: "step", ID: id, DependsOn: deps}
}

func TestDependencyPatterns(t *testing.T) {
	patterns := map[string]func(c *depChecker) []runcue.Submission{
		"none": func(c *depChecker) []runcue.Submission {
			return []runcue.Submission{c.add("a"), c.add("b"), c.add("c")}
		},
		"single": func(c *depChecker) []runcue.Submission {
			return []runcue.Submission{c.add("b", "a"), c.add("a")}
		},
		"chain": func(c *depChecker) []runcue.Submission {
			return []runcue.Submission{c.add("a"), c.add("b", "a"), c.add("c", "b"), c.add("d", "c")}
		},
		"fan_out": func(c *depChecker) []runcue.Submission {
			subs := []runcue.Submission{c.add("root")}
			for i := range 5 {
				subs = append(subs, c.add(fmt.Sprint("leaf", i), "root"))
			}
			return subs
		},
		"fan_in": func(c *depChecker) []runcue.Submission {
			var subs []runcue.Submission
			var parts []string
			for i := range 5 {
				id := fmt.Sprint("part", i)
				parts = append(parts, id)
				subs = append(subs, c.add(id))
			}
			return append(subs, c.add("join", parts...))
		},
		"diamond": func(c *depChecker) []runcue.Submission {
			return []runcue.Submission{c.add("a"), c.add("b", "a"), c.add("c", "a"), c.add("d", "b", "c")}
		},
	}
	for name, build := range patterns {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, runcue.Config{})
			c := newDepChecker(t, e.path)
			require.NoError(t, e.c.Task("step", runcue.Task{Handler: c.handler}))
			subs := build(c)
			_, err := e.c.SubmitBatch(e.ctx, subs)
			require.NoError(t, err)
			e.start()
			require.NoError(t, e.c.Drain(e.ctx))
			for _, s := range subs {
				assert.Equal(t, runcue.StateCompleted, e.get(s.ID).State, s.ID)
			}
			assert.Empty(t, c.violation)
			assert.Len(t, c.order, len(subs))
		})
	}
}

// TestRandomDAGs: random graphs, some units failing; no unit starts before
// its dependencies completed, every unit ends terminal, nothing deadlocks.
func TestRandomDAGs(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	for round := range 5 {
		e := newEnv(t, runcue.Config{MaxConcurrent: 8})
		c := newDepChecker(t, e.path)
		require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 3}))
		require.NoError(t, e.c.Task("step", runcue.Task{Services: []string{"api"}, Handler: c.handler}))
		e.start()
		var ids []string
		total := 0
		// Several batches; later batches depend on earlier ones too, which
		// may have finished already.
		for batch := range 4 {
			var subs []runcue.Submission
			for i := range 40 {
				id := fmt.Sprintf("r%d-b%d-%d", round, batch, i)
				var deps []string
				for k := 0; k < rnd.IntN(4) && len(ids) > 0; k++ {
					deps = append(deps, ids[rnd.IntN(len(ids))])
				}
				slices.Sort(deps)
				deps = slices.Compact(deps)
				c.mu.Lock()
				if rnd.IntN(15) == 0 {
					c.fail[id] = true
				}
				s := c.add(id, deps...)
				c.mu.Unlock()
				subs = append(subs, s)
				ids = append(ids, id)
			}
			_, err := e.c.SubmitBatch(e.ctx, subs)
			require.NoError(t, err)
			total += len(subs)
		}
		require.NoError(t, e.c.Drain(e.ctx), "nothing deadlocks")
		counts := map[runcue.State]int{}
		for _, id := range ids {
			wi := e.get(id)
			require.True(t, wi.State.Terminal(), "%s ends terminal, is %s", id, wi.State)
			counts[wi.State]++
			if wi.State == runcue.StateFailed && !c.fail[id] {
				assert.Equal(t, "prerequisite_failed", wi.ErrorKind, id)
			}
		}
		c.mu.Lock()
		assert.Empty(t, c.violation)
		c.mu.Unlock()
		t.Logf("round %d: %d units: %v", round, total, counts)
	}
}

func TestGraphSubmission(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("step", runcue.Task{Handler: noop}))
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{
		{Task: "step", ID: "ok"},
		{Task: "step", ID: "x", DependsOn: []string{"z"}},
		{Task: "step", ID: "y", DependsOn: []string{"x"}},
		{Task: "step", ID: "z", DependsOn: []string{"y"}},
	})
	require.ErrorIs(t, err, runcue.ErrCycle)
	var ce *runcue.CycleError
	require.ErrorAs(t, err, &ce)
	assert.ElementsMatch(t, []string{"x", "y", "z"}, ce.Members)
	page, err := e.c.List(e.ctx, runcue.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, page.Units, "nothing of a cyclic batch is stored")
	_, err = e.c.Submit(e.ctx, runcue.Submission{Task: "step", DependsOn: []string{"ghost"}})
	assert.ErrorIs(t, err, runcue.ErrUnknownDependency)
}

// TestPropagation: failure and cancellation propagate through a chain of 4
// in one transaction; retrying the failed head requeues the chain.
// TestDependentOfFinishingUnit: a unit whose dependency has ended badly
// but whose end is not yet committed must not start. The dependent's insert
// commits first; the dependency's failure (a failing run) or cancellation
// (of a queued unit) is held in the writer when the dispatcher learns of the
// dependent.
func TestDependentOfFinishingUnit(t *testing.T) {
	isInsert := testutil.HasOp(func(op store.Op) bool { _, ok := op.(*store.Insert); return ok })
	for _, tc := range []struct {
		name    string
		running bool   // a runs (else it waits for its RunAt)
		kind    string // the dependent's ErrorKind
		// end starts ending the dependency a and returns the hold on the
		// commit that ends it, once the dispatcher has sent that commit.
		end func(e *env, hs *testutil.HoldStore, g *gate, a string) *testutil.Hold
	}{
		{"failed run", true, "prerequisite_failed", func(e *env, hs *testutil.HoldStore, g *gate, a string) *testutil.Hold {
			fin := hs.Hold(finishOf(a))
			g.release <- runcue.Permanent(errors.New("broken"))
			for e.inspect().Inflight > 0 {
			}
			return fin
		}},
		{"cancelled while queued", false, "prerequisite_cancelled", func(e *env, hs *testutil.HoldStore, g *gate, a string) *testutil.Hold {
			cancel := hs.Hold(testutil.HasOp(func(op store.Op) bool { c, ok := op.(*store.Cancel); return ok && c.ID == a }))
			go func() { assert.NoError(t, e.c.Cancel(e.ctx, a, runcue.CancelOptions{})) }()
			for e.inspect().Units > 0 {
			}
			return cancel
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, hs := newHeldEnv(t, runcue.Config{})
			g := newGate()
			require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
			e.start()
			var a string
			if tc.running {
				a = e.submit("t")
				require.Equal(t, a, g.next(t))
			} else {
				a = e.submit("t", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
			}

			insert := hs.Hold(isInsert)
			b := make(chan string, 1)
			go func() {
				s, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", DependsOn: []string{a}})
				assert.NoError(t, err)
				b <- s.ID
			}()
			<-insert.Entered // the dependent's insert is in the writer
			end := tc.end(e, hs, g, a)
			insert.Release()
			<-end.Entered // the dependent is committed; a's end is not
			id := <-b
			st := e.inspect()
			assert.Zero(t, st.Inflight, "the dependent was dispatched before its dependency's end committed")
			assert.Zero(t, st.Live)
			end.Release()
			wi := e.wait(id)
			assert.Equal(t, runcue.StateFailed, wi.State)
			assert.Equal(t, tc.kind, wi.ErrorKind)
			assert.Equal(t, 0, wi.Runs)
			g.none(t)
		})
	}
}

func TestPropagation(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var fixed atomic.Bool
	require.NoError(t, e.c.Task("step", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if w.Target == "head" && !fixed.Load() {
				return nil, errors.New("broken")
			}
			return "ok", nil
		}}))
	rec := record(t, e.c)
	chain := []runcue.Submission{
		{Task: "step", ID: "c1", Target: "head"},
		{Task: "step", ID: "c2", DependsOn: []string{"c1"}},
		{Task: "step", ID: "c3", DependsOn: []string{"c2"}},
		{Task: "step", ID: "c4", DependsOn: []string{"c3"}},
	}
	_, err := e.c.SubmitBatch(e.ctx, chain)
	require.NoError(t, err)
	e.start()
	e.wait("c4")
	fails := rec.waitFor(t, 4, ofType(runcue.EventWorkFailed, ""))
	for i, id := range []string{"c1", "c2", "c3", "c4"} {
		assert.Equal(t, id, fails[i].WorkID)
		if i > 0 {
			assert.Equal(t, "prerequisite_failed", fails[i].ErrorKind)
			assert.Equal(t, fails[i-1].Seq+1, fails[i].Seq, "one transaction: consecutive sequence numbers")
			assert.True(t, fails[i].Time.Equal(fails[0].Time))
		}
	}
	// Retrying the failed head requeues the chain.
	fixed.Store(true)
	require.NoError(t, e.c.Retry(e.ctx, "c1"))
	require.NoError(t, e.c.Drain(e.ctx))
	for _, id := range []string{"c1", "c2", "c3", "c4"} {
		assert.Equal(t, runcue.StateCompleted, e.get(id).State, id)
	}

	// Cancellation: plain, then cascading.
	p := newProbe(true)
	require.NoError(t, e.c.Task("slow", runcue.Task{Handler: p.handler}))
	for _, cascade := range []bool{false, true} {
		pre := fmt.Sprint("k", cascade)
		subs := []runcue.Submission{{Task: "slow", ID: pre + "1"}}
		for i := 2; i <= 4; i++ {
			subs = append(subs, runcue.Submission{Task: "step", ID: fmt.Sprint(pre, i), DependsOn: []string{fmt.Sprint(pre, i-1)}})
		}
		_, err := e.c.SubmitBatch(e.ctx, subs)
		require.NoError(t, err)
		p.next(t)
		require.NoError(t, e.c.Cancel(e.ctx, pre+"1", runcue.CancelOptions{Cascade: cascade}))
		e.wait(pre + "4")
		e.settle()
		if cascade {
			for i := 2; i <= 4; i++ {
				assert.Equal(t, runcue.StateCancelled, e.get(fmt.Sprint(pre, i)).State)
			}
		} else {
			assert.Equal(t, "prerequisite_cancelled", e.get(pre+"2").ErrorKind)
			assert.Equal(t, "prerequisite_failed", e.get(pre+"3").ErrorKind)
			assert.Equal(t, "prerequisite_failed", e.get(pre+"4").ErrorKind)
		}
	}
	// A unit submitted with a dead dependency is stored and fails at once.
	out, err := e.c.Submit(e.ctx, runcue.Submission{Task: "step", DependsOn: []string{"kfalse1"}})
	require.NoError(t, err)
	wi := e.get(out.ID)
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, "prerequisite_cancelled", wi.ErrorKind)
}

func TestDependencyTimeout(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	p := newProbe(true)
	require.NoError(t, e.c.Task("slow", runcue.Task{Handler: p.handler}))
	require.NoError(t, e.c.Task("step", runcue.Task{Handler: noop}))
	e.start()
	dep := e.submit("slow")
	p.next(t)
	waiter := e.submit("step", func(s *runcue.Submission) { s.DependsOn = []string{dep}; s.DependencyTimeout = time.Minute })
	after := e.submit("step", func(s *runcue.Submission) { s.DependsOn = []string{waiter} })
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(waiter).State)
	e.clk.Advance(time.Minute)
	wi := e.wait(waiter)
	assert.Equal(t, "dependency_timeout", wi.ErrorKind)
	assert.Equal(t, "prerequisite_failed", e.wait(after).ErrorKind)
	p.release <- nil
	assert.Equal(t, runcue.StateCompleted, e.wait(dep).State)
	e.settle()
	assert.Zero(t, e.inspect().Units, "the dispatcher still holds units the store has failed")
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestDependencySatisfiedCallback(t *testing.T) {
	var ready atomic.Bool
	var calls atomic.Int32
	hang := make(chan struct{})
	defer close(hang)
	e := newEnv(t, runcue.Config{DependencyRecheck: 5 * time.Second, CallbackTimeout: 20 * time.Millisecond,
		DependencySatisfied: func(ctx context.Context, dep runcue.Dependency) (bool, error) {
			calls.Add(1)
			assert.Equal(t, "step", dep.Task, "the callback sees the dependency's task")
			switch dep.ID {
			case "panics":
				panic("artifact store down")
			case "hangs":
				<-hang
			}
			return ready.Load(), nil
		}})
	require.NoError(t, e.c.Task("step", runcue.Task{Handler: noop}))
	checks := runcue.WatchChecks(e.c)
	e.start()
	e.submit("step", func(s *runcue.Submission) { s.ID = "a" })
	e.submit("step", func(s *runcue.Submission) { s.ID = "panics" })
	e.submit("step", func(s *runcue.Submission) { s.ID = "hangs" })
	for _, id := range []string{"a", "panics", "hangs"} {
		e.wait(id)
	}
	b := e.submit("step", func(s *runcue.Submission) { s.DependsOn = []string{"a"} })
	bad := e.submit("step", func(s *runcue.Submission) { s.DependsOn = []string{"panics"} })
	slow := e.submit("step", func(s *runcue.Submission) { s.DependsOn = []string{"hangs"} })
	for range 3 { // answered: satisfied or not, a panic, a timeout
		select {
		case <-checks:
		case <-e.ctx.Done():
			t.Fatal("the dependency checks never finished")
		}
	}
	e.settle()
	for _, id := range []string{b, bad, slow} {
		assert.Equal(t, runcue.StateQueued, e.get(id).State, "not satisfied yet")
	}
	ex, err := e.c.Explain(e.ctx, b)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonDependencyCheck, ex.Reasons[0].Kind)
	ready.Store(true)
	e.clk.Advance(5 * time.Second) // the recheck cadence
	assert.Equal(t, runcue.StateCompleted, e.wait(b).State, "re-checked and satisfied")
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(bad).State, "a panic counts as not satisfied")
	assert.Equal(t, runcue.StateQueued, e.get(slow).State, "a timeout counts as not satisfied")
	_, _, cbErrs := runcue.Counters(e.c)
	assert.GreaterOrEqual(t, cbErrs, int64(2), "timeouts and panics are counted")
	assert.Contains(t, e.logs.String(), "a dependency callback failed")
}

func TestPriorityOrder(t *testing.T) {
	// A generous CallbackTimeout: this test is about order, and scoring 1,000
	// units under the race detector can take longer than the default.
	// TestPriorityCallbackNeverStalls covers what an overrun does.
	e := newEnv(t, runcue.Config{MaxConcurrent: 3, CallbackTimeout: 20 * time.Second, Priority: func(pc runcue.PriorityContext) float64 {
		var p struct{ Score float64 }
		_ = pc.Work.Bind(&p)
		return p.Score
	}})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	rnd := rand.New(rand.NewPCG(9, 9))
	subs := make([]runcue.Submission, 1000)
	scores := map[string]float64{}
	for i := range subs {
		id := fmt.Sprint("u", i)
		sc := rnd.Float64()
		scores[id] = sc
		subs[i] = runcue.Submission{Task: "t", ID: id, Params: map[string]float64{"Score": sc}}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	var first []string
	for range 3 {
		first = append(first, g.next(t))
	}
	ranked := slices.SortedFunc(func(yield func(string) bool) {
		for id := range scores {
			if !yield(id) {
				return
			}
		}
	}, func(a, b string) int {
		if scores[a] > scores[b] {
			return -1
		} else if scores[a] < scores[b] {
			return 1
		}
		return 0
	})
	assert.ElementsMatch(t, ranked[:3], first, "the three highest run first")
	calls, dispatches, _ := runcue.Counters(e.c)
	t.Logf("%d priority calls for %d dispatches", calls, dispatches)
	assert.LessOrEqual(t, calls, int64(2000), "each eligible unit scored about once, not per slot")
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestPriorityTiesAreFIFO(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 1, Priority: runcue.PriorityConstant(0.5)})
	var mu sync.Mutex
	var order []string
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		order = append(order, w.ID)
		mu.Unlock()
		return nil, nil
	}}))
	var ids []string
	for i := range 20 {
		ids = append(ids, e.submit("t", func(s *runcue.Submission) { s.ID = fmt.Sprintf("u%02d", i) }))
	}
	e.start()
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Equal(t, ids, order)
}

// TestPriorityNoStarvation: a low-priority unit under a continuous stream of
// high-priority work still runs, thanks to PriorityByWaitTime.
func TestPriorityNoStarvation(t *testing.T) {
	byWait := runcue.PriorityByWaitTime(time.Hour)
	e := newEnv(t, runcue.Config{MaxConcurrent: 1, PriorityTTL: time.Nanosecond, Priority: func(pc runcue.PriorityContext) float64 {
		base := 0.1
		if pc.Work.Target == "urgent" {
			base = 0.9
		}
		return max(base, byWait(pc))
	}})
	var lowRan atomic.Bool
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		if w.Target == "background" {
			lowRan.Store(true)
		}
		return nil, nil
	}}))
	e.start()
	e.submit("t", func(s *runcue.Submission) { s.Target = "background" })
	// Keep two urgent units queued at all times, for two simulated hours.
	e.submit("t", func(s *runcue.Submission) { s.Target = "urgent"; s.RunAt = epoch })
	for minute := 0; minute < 120 && !lowRan.Load(); minute++ {
		for range 2 {
			e.submit("t", func(s *runcue.Submission) { s.Target = "urgent" })
		}
		e.settle()
		e.clk.Advance(time.Minute)
	}
	assert.True(t, lowRan.Load(), "the background unit ran despite the urgent stream")
	require.NoError(t, e.c.Drain(e.ctx))
}

// TestPriorityAgingUnderSaturation: a saturated service parks its lane
// between runs; scores held while it is parked are re-scored before it
// dispatches again, so a unit whose score grows with its wait overtakes
// the stream of work that keeps the service full.
func TestPriorityAgingUnderSaturation(t *testing.T) {
	byWait := runcue.PriorityByWaitTime(10 * time.Minute)
	e := newEnv(t, runcue.Config{PriorityTTL: time.Second, Priority: func(pc runcue.PriorityContext) float64 {
		if pc.Work.Target == "urgent" {
			return 1
		}
		return byWait(pc)
	}})
	require.NoError(t, e.c.Service("gpu", runcue.Service{MaxConcurrent: 1}))
	release := make(chan struct{})
	started := make(chan struct{}, 64)
	var lowAt atomic.Int64
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"gpu"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		if w.Target == "background" {
			lowAt.Store(int64(w.Started.Sub(epoch)))
		}
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}}))
	nextStart := func() {
		t.Helper()
		select {
		case <-started:
		case <-e.ctx.Done():
			t.Fatal("no next dispatch")
		}
	}
	e.start()
	e.submit("t", func(s *runcue.Submission) { s.Target = "urgent" })
	nextStart()
	e.submit("t", func(s *runcue.Submission) { s.Target = "background" })
	for range 30 {
		e.submit("t", func(s *runcue.Submission) { s.Target = "urgent" })
	}
	// Every minute one run ends: the service is always full, and urgent
	// work always waits. Nothing new arrives while the lane is parked, so
	// only the re-scoring on waking brings the waiting unit's score up to
	// date. Each run ends, and the next starts, before the clock moves on
	// (a run released but not yet returned would otherwise end a minute
	// late).
	for minute := 0; minute < 30 && lowAt.Load() == 0; minute++ {
		e.settle()
		e.clk.Advance(time.Minute)
		e.settle()
		release <- struct{}{}
		nextStart()
		e.settle()
	}
	require.NotZero(t, lowAt.Load(), "the background unit never ran under the urgent stream")
	// Its score reaches the urgent work's at 10 minutes, and ties go to
	// the older unit: the dispatch at 10 minutes, on a score taken then,
	// is its.
	assert.Equal(t, 10*time.Minute, time.Duration(lowAt.Load()), "it ran at the first dispatch after its score reached the urgent work's")
	close(release)
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestPriorityCallbackNeverStalls(t *testing.T) {
	block := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(block) }) }
	defer release()
	e := newEnv(t, runcue.Config{CallbackTimeout: 10 * time.Millisecond, Priority: func(pc runcue.PriorityContext) float64 {
		<-block // a callback that never returns in time
		return 1
	}})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	var ids []string
	for range 10 {
		ids = append(ids, e.submit("t"))
	}
	for _, id := range ids {
		assert.Equal(t, runcue.StateCompleted, e.wait(id).State, "dispatched with default scores")
	}
	assert.Contains(t, e.logs.String(), "reason=timeout detail=\"a scoring pass of")
	_, _, cbErrs := runcue.Counters(e.c)
	assert.Positive(t, cbErrs)
	release()
}

func TestPriorityPanicAndClamp(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 1, Priority: func(pc runcue.PriorityContext) float64 {
		switch pc.Work.Target {
		case "panic":
			panic("bug")
		case "huge":
			return 42 // clamped to 1
		case "negative":
			return -3 // clamped to 0
		}
		return 0.5
	}})
	var mu sync.Mutex
	var order []string
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		order = append(order, w.Target)
		mu.Unlock()
		return nil, nil
	}}))
	for _, target := range []string{"negative", "panic", "mid", "huge"} {
		e.submit("t", func(s *runcue.Submission) { s.Target = target })
	}
	e.start()
	require.NoError(t, e.c.Drain(e.ctx))
	assert.Equal(t, []string{"huge", "panic", "mid", "negative"}, order, "panic scores 0.5 and keeps its submission order")
}

func TestBackpressureReject(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxQueued: 10})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	rec := record(t, e.c)
	for range 10 {
		e.submit("t")
	}
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t"})
	assert.ErrorIs(t, err, runcue.ErrBackpressure)
	big := batchOf("t", 11)
	_, err = e.c.SubmitBatch(e.ctx, big)
	assert.ErrorIs(t, err, runcue.ErrBackpressure, "a batch larger than the bound")
	e.start()
	rec.waitFor(t, 1, ofType(runcue.EventBackpressureActive, ""))
	require.NoError(t, e.c.Drain(e.ctx))
	rec.waitFor(t, 1, ofType(runcue.EventBackpressureCleared, ""))
	e.submit("t") // room again
}

func TestBackpressureDropOldest(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxQueued: 3, Overflow: runcue.OverflowDropOldest})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	rec := record(t, e.c)
	var ids []string
	for range 5 {
		ids = append(ids, e.submit("t"))
	}
	for _, id := range ids[:2] {
		wi := e.get(id)
		assert.Equal(t, runcue.StateCancelled, wi.State)
		assert.Equal(t, "dropped", wi.ErrorKind)
	}
	evs := rec.waitFor(t, 2, ofType(runcue.EventWorkCancelled, ""))
	assert.Equal(t, "dropped", evs[0].Reason)
	e.start()
	require.NoError(t, e.c.Drain(e.ctx))
	for _, id := range ids[2:] {
		assert.Equal(t, runcue.StateCompleted, e.get(id).State)
	}
}

func TestBackpressureBlock(t *testing.T) {
	calls := make(chan bool, 100)
	e := newEnv(t, runcue.Config{MaxQueued: 2, Overflow: runcue.OverflowBlock, OnBackpressure: func(active bool, queued int) {
		calls <- active
	}})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{MaxConcurrent: 1, Handler: g.handler}))
	e.submit("t")
	e.submit("t")
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", ID: "third"})
		done <- err
	}()
	e.settle()
	select {
	case err := <-done:
		t.Fatalf("Submit returned %v with the queue full", err)
	default:
	}
	// Released by a start (the queue shrinks when a unit starts running):
	// then one runs and two are queued, the queue is full again.
	e.start()
	require.NoError(t, <-done)
	g.next(t)
	// Released by its context. The deadline leaves Submit time to reach
	// the full queue and wait there (ci: with 30 ms, on a loaded machine,
	// it ended before Submit reached the queue, so it was not the wait
	// that ended).
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	_, err := e.c.Submit(ctx, runcue.Submission{Task: "t"})
	cancel()
	assert.ErrorIs(t, err, runcue.ErrBackpressure)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
	for _, want := range []bool{true, false} {
		select {
		case got := <-calls:
			assert.Equal(t, want, got, "OnBackpressure saw active, then cleared")
		case <-e.ctx.Done():
			t.Fatal("OnBackpressure was not called")
		}
	}
}

func TestFeeder(t *testing.T) {
	var batches atomic.Int32
	var done atomic.Int32
	e := newEnv(t, runcue.Config{FeedLowWater: 5, Feed: func(ctx context.Context, want int) ([]runcue.Submission, error) {
		n := batches.Add(1)
		if n > 10 {
			return nil, runcue.ErrFeedExhausted
		}
		subs := batchOf("t", 7)
		return subs, nil
	}})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		defer done.Add(1)
		return g.handler(ctx, w)
	}}))
	e.start()
	drained := make(chan error, 1)
	go func() { drained <- e.c.Drain(e.ctx) }()
	for i := range 70 {
		g.next(t)
		if i < 69 {
			select {
			case err := <-drained:
				t.Fatalf("Drain returned %v before the last unit (%d done)", err, done.Load())
			default:
			}
		}
		g.release <- nil
	}
	require.NoError(t, <-drained)
	assert.Equal(t, int32(70), done.Load())
	assert.Equal(t, int32(11), batches.Load(), "10 batches, then exhausted")
}

func TestExplain(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 10})
	g := newGate()
	svcs := map[string]runcue.Service{
		"busy":    {MaxConcurrent: 1},
		"limited": {RateLimit: 1, RateWindow: time.Minute},
		"flaky":   {CircuitThreshold: 1, CircuitTimeout: time.Minute},
		"paused":  {},
		"polite":  {},
	}
	for _, name := range sortedKeys(svcs) {
		require.NoError(t, e.c.Service(name, svcs[name]))
		require.NoError(t, e.c.Task(name, runcue.Task{Services: []string{name}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
			Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				switch w.Target {
				case "fail":
					return nil, errors.New("down")
				case "429":
					return nil, runcue.RetryAfter(time.Hour, errors.New("429"))
				case "block":
					return g.handler(ctx, w)
				}
				return nil, nil
			}}))
	}
	require.NoError(t, e.c.Task("capped", runcue.Task{MaxConcurrent: 1, Handler: g.handler}))
	require.NoError(t, e.c.Task("plain", runcue.Task{Handler: g.handler}))
	require.NoError(t, e.c.Task("flakyRetry", runcue.Task{Retry: runcue.RetryPolicy{BaseDelay: time.Minute, Jitter: runcue.JitterNone},
		Handler: func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("transient") }}))
	rec := record(t, e.c)
	e.start()

	// Set the stage.
	e.submit("busy", func(s *runcue.Submission) { s.Target = "block" })
	finished := e.submit("limited")
	e.wait(finished)
	e.wait(e.submit("flaky", func(s *runcue.Submission) { s.Target = "fail" }))
	require.NoError(t, e.c.PauseService(e.ctx, "paused"))
	politeFirst := e.submit("polite", func(s *runcue.Submission) { s.Target = "429" })
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, politeFirst))
	e.submit("capped")
	running := e.submit("plain")
	retrying := e.submit("flakyRetry")
	rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, retrying))
	for range 3 { // busy, capped, plain
		g.next(t)
	}
	e.settle()

	cases := []struct {
		name    string
		id      string
		kind    runcue.ReasonKind
		service string
		until   time.Time
	}{
		{"service at capacity", e.submit("busy"), runcue.ReasonServiceBusy, "busy", time.Time{}},
		{"rate window full", e.submit("limited"), runcue.ReasonRateLimited, "limited", epoch.Add(time.Minute + runcue.DefaultMargin)},
		{"circuit open", e.submit("flaky"), runcue.ReasonCircuitOpen, "flaky", epoch.Add(time.Minute)},
		{"paused", e.submit("paused"), runcue.ReasonPaused, "paused", time.Time{}},
		{"retry-after on the service", e.submit("polite"), runcue.ReasonServiceRetryAfter, "polite", epoch.Add(time.Hour)},
		{"unit deferred by retry-after", politeFirst, runcue.ReasonRetryAfter, "", epoch.Add(time.Hour)},
		{"task cap", e.submit("capped"), runcue.ReasonTaskCap, "", time.Time{}},
		{"backoff", retrying, runcue.ReasonBackoff, "", epoch.Add(time.Minute)},
		{"run at", e.submit("plain", func(s *runcue.Submission) { s.RunAt = epoch.Add(3 * time.Hour) }), runcue.ReasonRunAt, "", epoch.Add(3 * time.Hour)},
		{"dependencies", e.submit("plain", func(s *runcue.Submission) { s.DependsOn = []string{running} }), runcue.ReasonDependencies, "", time.Time{}},
		{"running", running, runcue.ReasonRunning, "", time.Time{}},
	}
	for _, tc := range cases {
		e.settle()
		ex, err := e.c.Explain(e.ctx, tc.id)
		require.NoError(t, err, tc.name)
		require.NotEmpty(t, ex.Reasons, tc.name)
		r := ex.Reasons[0]
		assert.Equal(t, tc.kind, r.Kind, "%s: %+v", tc.name, ex.Reasons)
		assert.Equal(t, tc.service, r.Service, tc.name)
		assert.True(t, r.Until.Equal(tc.until), "%s: until %v, want %v", tc.name, r.Until, tc.until)
		assert.NotEmpty(t, r.Detail, tc.name)
	}
	dep := cases[9]
	ex, _ := e.c.Explain(e.ctx, dep.id)
	assert.Equal(t, []string{running}, ex.Reasons[0].Dependencies)

	// The global cap.
	g2 := newGate()
	require.NoError(t, e.c.Task("filler", runcue.Task{Handler: g2.handler}))
	for range 10 {
		e.submit("filler")
	}
	e.settle()
	global := e.submit("filler")
	e.settle()
	ex, err := e.c.Explain(e.ctx, global)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonGlobalCap, ex.Reasons[0].Kind)

	// Finished, and unknown.
	ex, err = e.c.Explain(e.ctx, finished)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonFinished, ex.Reasons[0].Kind)
	_, err = e.c.Explain(e.ctx, "ghost")
	assert.ErrorIs(t, err, runcue.ErrNotFound)
	close(g.release)
	close(g2.release)
}

func TestExplainOrphanAndNotOwned(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("ghost", runcue.Task{Handler: noop}))
	id := e.submit("ghost")
	ex, err := e.c.Explain(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonNotOwned, ex.Reasons[0].Kind, "nobody dispatches before Start")
	require.NoError(t, e.c.Close())
	c := e.open(runcue.Config{})
	require.NoError(t, c.Start(e.ctx))
	ex, err = c.Explain(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonTaskNotRegistered, ex.Reasons[0].Kind)
}
