package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// depProp is the shared state of TestDependencyOrderProperty: what each
// unit depends on, which units are planned to fail or to skip, which are of
// the strict task (FailOnSkippedDependency), which dependencies
// DependencySatisfied has said yes to, and every violation seen.
type depProp struct {
	st        *sqlite.Store
	mu        sync.Mutex
	deps      map[string][]string
	fail      map[string]bool
	skip      map[string]bool
	strict    map[string]bool
	satisfied map[string]bool
	asked     map[string]int
	rnd       *rand.Rand
	checking  bool // the current owner has DependencySatisfied
	started   int
	violation []string
}

// satisfiedFunc is Config.DependencySatisfied: yes only for a dependency
// the store has completed (or skipped), and, the first time it is asked
// about one in four of them, no anyway (so that rechecks happen).
func (p *depProp) satisfiedFunc(ctx context.Context, dep runcue.Dependency) (bool, error) {
	id := dep.ID
	u, err := p.st.GetUnit(ctx, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || (u.State != store.Completed && u.State != store.Skipped) {
		p.violation = append(p.violation, fmt.Sprintf("DependencySatisfied asked about %s, which is not completed or skipped", id))
		return false, nil
	}
	if dep.Task != u.Task || dep.Target != u.Target {
		p.violation = append(p.violation, fmt.Sprintf("DependencySatisfied got %+v for %s (task %q, target %q)", dep, id, u.Task, u.Target))
	}
	p.asked[id]++
	if p.asked[id] == 1 && p.rnd.IntN(4) == 0 {
		return false, nil
	}
	p.satisfied[id] = true
	return true, nil
}

// handler verifies, at the start of every run, that each dependency of its
// unit is completed in the store (or skipped, for a unit of the lenient
// task) and that DependencySatisfied said so.
func (p *depProp) handler(ctx context.Context, w *runcue.Work) (any, error) {
	p.mu.Lock()
	deps, fail, skip, strict := p.deps[w.ID], p.fail[w.ID], p.skip[w.ID], p.strict[w.ID]
	p.started++
	var unsatisfied []string
	for _, dep := range deps {
		if p.checking && !p.satisfied[dep] {
			unsatisfied = append(unsatisfied, dep)
		}
	}
	p.mu.Unlock()
	var early []string
	for _, dep := range deps {
		u, err := p.st.GetUnit(context.Background(), dep)
		if err != nil {
			early = append(early, fmt.Sprintf("%s started; reading its dependency %s: %v", w.ID, dep, err))
		} else if u.State != store.Completed && (strict || u.State != store.Skipped) {
			early = append(early, fmt.Sprintf("%s (strict %v) started with %s %s", w.ID, strict, dep, u.State))
		}
	}
	p.mu.Lock()
	p.violation = append(p.violation, early...)
	for _, dep := range unsatisfied {
		p.violation = append(p.violation, fmt.Sprintf("%s started before DependencySatisfied said yes to %s", w.ID, dep))
	}
	p.mu.Unlock()
	if fail {
		return nil, runcue.Permanent(errors.New("planned failure"))
	}
	if skip {
		return nil, runcue.Skip("planned skip")
	}
	return nil, nil
}

// TestDependentListedFirst: a batch that lists a dependent before its
// dependency runs the dependency first (the dependent once started at once,
// beside it).
func TestDependentListedFirst(t *testing.T) {
	for _, started := range []bool{true, false} {
		t.Run(fmt.Sprintf("started=%v", started), func(t *testing.T) {
			e := newEnv(t, runcue.Config{})
			release, parentStarted := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var order []string
			require.NoError(t, e.c.Task("step", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
				mu.Lock()
				order = append(order, w.ID)
				mu.Unlock()
				if w.ID == "parent" {
					close(parentStarted)
					<-release
				}
				return nil, nil
			}}))
			if started {
				e.start()
			}
			_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{
				{Task: "step", ID: "child", DependsOn: []string{"parent"}},
				{Task: "step", ID: "parent"},
			})
			require.NoError(t, err)
			if !started {
				e.start()
			}
			select {
			case <-parentStarted:
			case <-e.ctx.Done():
				t.Fatal("the parent never started")
			}
			e.settle()
			mu.Lock()
			assert.Equal(t, []string{"parent"}, order, "the child waits for its parent")
			mu.Unlock()
			assert.Equal(t, runcue.StateQueued, e.get("child").State)
			close(release)
			assert.Equal(t, runcue.StateCompleted, e.wait("child").State)
			mu.Lock()
			assert.Equal(t, []string{"parent", "child"}, order)
			mu.Unlock()
		})
	}
}

// TestDependencyOrderProperty: random DAGs, their units submitted in random
// orders (dependents before their dependencies too) and random batch splits,
// from the owner and from a second Cue on the same file that does not own
// it, with dependencies on units of earlier DAGs (queued, running, finished,
// skipped or failed), while the owner is closed and replaced now and then:
// no handler starts before each of its dependencies completed (or was
// skipped, unless its task sets FailOnSkippedDependency) and
// DependencySatisfied said yes; a strict unit with a skipped dependency
// fails as prerequisite_skipped. RUNCUE_DEP_SEED repeats a logged seed.
func TestDependencyOrderProperty(t *testing.T) {
	// Its own file, and it checks order, not time: it computes beside
	// the kill tests, which mostly wait (scripts/test).
	t.Parallel()
	seed := testSeed(t, "RUNCUE_DEP_SEED")
	rnd := rand.New(rand.NewPCG(seed, 7))
	dags := 1000
	if raceEnabled {
		dags = 600 // the suite's time: 44 s under the race detector at 1000
	}
	path := filepath.Join(t.TempDir(), "runcue.db")
	ctx := longContext(t)
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	p := &depProp{st: st, deps: map[string][]string{}, fail: map[string]bool{}, skip: map[string]bool{}, strict: map[string]bool{},
		satisfied: map[string]bool{},
		asked:     map[string]int{}, rnd: rand.New(rand.NewPCG(seed, 8))}

	open := func(owner bool) *runcue.Cue {
		cfg := runcue.Config{Logger: quietLogger, MaxConcurrent: 8, PollInterval: 5 * time.Millisecond}
		// Half the owners ask DependencySatisfied: without it, completion
		// alone must hold a dependent back.
		p.mu.Lock()
		p.checking = owner && rnd.IntN(2) == 0
		check := p.checking
		p.mu.Unlock()
		if check {
			cfg.DependencySatisfied = p.satisfiedFunc
			cfg.DependencyRecheck = 2 * time.Millisecond
			cfg.CallbackTimeout = 5 * time.Second
		}
		c, err := runcue.Open(path, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Task("step", runcue.Task{Handler: p.handler, Retry: runcue.RetryPolicy{MaxAttempts: 1}}))
		require.NoError(t, c.Task("strict", runcue.Task{Handler: p.handler, Retry: runcue.RetryPolicy{MaxAttempts: 1},
			FailOnSkippedDependency: true}))
		return c
	}
	other, owner := open(false), open(true)
	require.NoError(t, owner.Start(ctx))
	var all []string
	restarts, units := 0, 0
	for dag := range dags {
		// A DAG of 1-7 nodes: node j may depend on any node i < j, and on
		// units of earlier DAGs.
		n := 1 + rnd.IntN(7)
		ids := make([]string, n)
		deps := make([][]string, n)
		for j := range n {
			ids[j] = fmt.Sprintf("d%04d-%d", dag, j)
			for i := range j {
				if rnd.IntN(3) == 0 {
					deps[j] = append(deps[j], ids[i])
				}
			}
			if len(all) > 0 && rnd.IntN(5) == 0 {
				deps[j] = append(deps[j], all[len(all)-1-rnd.IntN(min(len(all), 50))])
			}
		}
		p.mu.Lock()
		for j, id := range ids {
			p.deps[id] = deps[j]
			switch rnd.IntN(25) {
			case 0:
				p.fail[id] = true
			case 1, 2:
				p.skip[id] = true
			}
			p.strict[id] = rnd.IntN(3) == 0
		}
		p.mu.Unlock()
		// Cut the nodes, in their topological order, into batches; each
		// batch is submitted in a random order, by either Cue.
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		for len(order) > 0 {
			k := 1 + rnd.IntN(len(order))
			batch := slices.Clone(order[:k])
			order = order[k:]
			rnd.Shuffle(len(batch), func(a, b int) { batch[a], batch[b] = batch[b], batch[a] })
			subs := make([]runcue.Submission, len(batch))
			p.mu.Lock()
			for i, j := range batch {
				task := "step"
				if p.strict[ids[j]] {
					task = "strict"
				}
				subs[i] = runcue.Submission{Task: task, ID: ids[j], DependsOn: deps[j]}
			}
			p.mu.Unlock()
			by := owner
			if rnd.IntN(2) == 0 {
				by = other
			}
			_, err := by.SubmitBatch(ctx, subs)
			require.NoError(t, err)
		}
		all = append(all, ids...)
		units += n
		if rnd.IntN(100) == 0 {
			// A new owner: runs are interrupted and requeued, queued units
			// reloaded from the store.
			require.NoError(t, owner.Close())
			if rnd.IntN(2) == 0 {
				time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond)
			}
			owner = open(true)
			require.NoError(t, owner.Start(ctx))
			restarts++
		}
	}
	require.NoError(t, owner.Drain(ctx))
	require.NoError(t, runcue.PollNow(ctx, owner))
	require.NoError(t, owner.Drain(ctx))
	counts := map[runcue.State]int{}
	final := map[string]runcue.WorkInfo{}
	for _, id := range all {
		wi, err := owner.Get(ctx, id)
		require.NoError(t, err)
		require.True(t, wi.State.Terminal(), "%s ends terminal, is %s", id, wi.State)
		counts[wi.State]++
		final[id] = wi
	}
	for _, id := range all {
		wi := final[id]
		skippedDep, badDep := false, false
		for _, dep := range p.deps[id] {
			switch final[dep].State {
			case runcue.StateSkipped:
				skippedDep = true
			case runcue.StateFailed, runcue.StateCancelled:
				badDep = true
			}
		}
		switch {
		case wi.State == runcue.StateFailed && !p.fail[id]:
			assert.Contains(t, []string{"prerequisite_failed", "prerequisite_skipped"}, wi.ErrorKind, id)
			if wi.ErrorKind == "prerequisite_skipped" {
				assert.True(t, p.strict[id] && skippedDep, "%s failed prerequisite_skipped: strict %v", id, p.strict[id])
			}
		case wi.State == runcue.StateSkipped:
			assert.True(t, p.skip[id], "%s skipped unplanned", id)
		case wi.State == runcue.StateCompleted:
			assert.False(t, p.fail[id] || p.skip[id], id)
			assert.False(t, badDep, "%s completed with a failed dependency", id)
			assert.False(t, p.strict[id] && skippedDep, "%s is strict and completed with a skipped dependency", id)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("%d DAGs, %d units, %d handler starts, %d owner restarts: %v", dags, units, p.started, restarts, counts)
	assert.Empty(t, p.violation, "no early start")
	assert.Positive(t, counts[runcue.StateCompleted])
	assert.Positive(t, counts[runcue.StateSkipped])
}

// TestRetryDependentOfFailedUnit: a dependent retried on its own while its
// dependency stays failed cannot run; it fails again, as prerequisite_failed.
func TestRetryDependentOfFailedUnit(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var ran sync.Map
	require.NoError(t, e.c.Task("step", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			ran.Store(w.ID, true)
			if w.ID == "parent" {
				return nil, runcue.Permanent(errors.New("no"))
			}
			return nil, nil
		}}))
	e.start()
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{
		{Task: "step", ID: "parent"},
		{Task: "step", ID: "child", DependsOn: []string{"parent"}},
	})
	require.NoError(t, err)
	assert.Equal(t, "prerequisite_failed", e.wait("child").ErrorKind)
	require.NoError(t, e.c.Retry(e.ctx, "child"))
	wi := e.wait("child")
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, "prerequisite_failed", wi.ErrorKind)
	assert.Contains(t, wi.Error, "dependency parent is failed")
	_, childRan := ran.Load("child")
	assert.False(t, childRan, "the child never runs while its parent is failed")
}
