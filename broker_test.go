package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store/sqlite"
)

// sim runs handlers on the fake clock: each run registers the fake time at
// which it returns and an outcome; drive advances the clock from event to
// event once every launched handler has registered.
type sim struct {
	mu      sync.Mutex
	clk     interface{ Now() time.Time }
	rnd     *rand.Rand
	waiting map[*simRun]struct{}
	// registered gets a signal whenever a handler registers its run.
	registered chan struct{}
	// decide returns a run's latency and outcome; called under mu.
	decide func(w *runcue.Work, rnd *rand.Rand) (time.Duration, error)
	// starts holds every run's Work.Started, by task and by target: the
	// instants rate windows promise about.
	starts map[string][]time.Time
}

type simRun struct {
	at   time.Time
	err  error
	done chan struct{}
}

func newSim(e *env, seed uint64, decide func(*runcue.Work, *rand.Rand) (time.Duration, error)) *sim {
	return &sim{clk: e.clk, rnd: rand.New(rand.NewPCG(seed, seed)), waiting: map[*simRun]struct{}{}, decide: decide,
		starts: map[string][]time.Time{}, registered: make(chan struct{}, 1)}
}

func (s *sim) handler(ctx context.Context, w *runcue.Work) (any, error) {
	s.mu.Lock()
	s.starts["task:"+w.Task] = append(s.starts["task:"+w.Task], w.Started)
	s.starts["target:"+w.Target] = append(s.starts["target:"+w.Target], w.Started)
	lat, err := s.decide(w, s.rnd)
	r := &simRun{at: s.clk.Now().Add(lat), err: err, done: make(chan struct{})}
	s.waiting[r] = struct{}{}
	s.mu.Unlock()
	select {
	case s.registered <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return nil, r.err
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiting, r)
		s.mu.Unlock()
		return nil, context.Cause(ctx)
	}
}

// step releases the runs due at now and returns how many, and the time of
// the next one.
func (s *sim) step(now time.Time) (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var next time.Time
	for r := range s.waiting {
		if !r.at.After(now) {
			delete(s.waiting, r)
			close(r.done)
			n++
		} else if next.IsZero() || r.at.Before(next) {
			next = r.at
		}
	}
	return n, next
}

func (s *sim) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// drive runs the simulation until done reports true. Before each advance
// of the clock it calls observe.
func (s *sim) drive(t *testing.T, e *env, c *runcue.Cue, done func() bool, observe func(now time.Time)) {
	t.Helper()
	steps := 0
	defer func() { t.Logf("simulation: %d steps", steps) }()
	for ; !done(); steps++ {
		// Wait until no claim is in flight and every live handler has
		// registered its return time: only then has the present instant
		// nothing more to do. Woken by the dispatcher's iterations and the
		// handlers' registrations, never by a sleep.
		iterated := runcue.WatchIterations(c)
		deadline := time.After(wait)
		for {
			require.NoError(t, runcue.Settle(e.ctx, c))
			st, err := runcue.Inspect(e.ctx, c)
			require.NoError(t, err)
			if st.Claims == 0 && s.pending() == st.Live {
				// A handler sends msgStarted before it registers, and the
				// dispatcher may dispatch more on handling it: settle once
				// more after the registrations, and look again.
				require.NoError(t, runcue.Settle(e.ctx, c))
				again, err := runcue.Inspect(e.ctx, c)
				require.NoError(t, err)
				if again == st && s.pending() == again.Live {
					break
				}
				continue
			}
			select {
			case <-iterated:
			case <-s.registered:
			case <-deadline:
				t.Fatalf("handlers never registered (%d of %d)", s.pending(), st.Live)
			}
		}
		now := e.clk.Now()
		if n, _ := s.step(now); n > 0 {
			continue
		}
		if done() {
			return
		}
		_, next := s.step(now)
		if d, ok := e.clk.NextDeadline(); ok && (next.IsZero() || d.Before(next)) {
			next = d
		}
		require.False(t, next.IsZero(), "nothing left to happen, but not done: a deadlock")
		if observe != nil {
			observe(now)
		}
		e.clk.Set(next)
	}
}

// counter counts units that reached a final state, from the event stream.
type counter struct {
	final atomic.Int64
	done  chan struct{}
}

func countFinal(t *testing.T, c *runcue.Cue) *counter {
	ctx, cancel := context.WithCancel(context.Background())
	k := &counter{done: make(chan struct{})}
	ch := c.Events(ctx)
	go func() {
		defer close(k.done)
		for ev := range ch {
			switch ev.Type {
			case runcue.EventWorkCompleted, runcue.EventWorkCancelled:
				k.final.Add(1)
			case runcue.EventWorkFailed:
				if !ev.WillRetry {
					k.final.Add(1)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-k.done })
	return k
}

// logBook collects service_log entries as the simulation goes, before
// pruning can remove them.
type logBook struct {
	st    *sqlite.Store
	seen  time.Time
	times map[string][]time.Time
}

func newLogBook(t *testing.T, path string) *logBook {
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return &logBook{st: st, times: map[string][]time.Time{}}
}

func (b *logBook) observe(t *testing.T, services []string, now time.Time) {
	// Pruning removes only entries older than a window (at least 200ms
	// here), once a fake minute: reading every 100ms misses none.
	if !b.seen.IsZero() && now.Sub(b.seen) < 100*time.Millisecond {
		return
	}
	b.flush(t, services, now)
}

func (b *logBook) flush(t *testing.T, services []string, now time.Time) {
	st := b.st
	for _, svc := range services {
		since := b.seen.Add(time.Nanosecond)
		if b.seen.IsZero() {
			since = time.Time{}
		}
		log, err := st.ServiceLog(context.Background(), svc, since)
		require.NoError(t, err)
		for _, l := range log {
			if !l.At.After(now) {
				b.times[svc] = append(b.times[svc], l.At)
			}
		}
	}
	b.seen = now
}

// checkWindows asserts that no interval of length window holds more than
// limit starts.
func checkWindows(t *testing.T, name string, times []time.Time, limit int, window time.Duration) {
	t.Helper()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for i := limit; i < len(times); i++ {
		if d := times[i].Sub(times[i-limit]); d < window {
			t.Fatalf("%s: %d starts within %v (limit %d per %v), from %v", name, limit+1, d, limit, window, times[i-limit])
		}
	}
}

// simServices keep every rate window saturated for most of the run (each is
// the bottleneck of some task) over about a minute of fake time.
var simServices = map[string]runcue.Service{
	"api":    {MaxConcurrent: 10, RateLimit: 90, RateWindow: time.Second},
	"llm":    {MaxConcurrent: 6, RateLimit: 25, RateWindow: 500 * time.Millisecond, CircuitThreshold: 4, CircuitTimeout: 2 * time.Second},
	"s3":     {MaxConcurrent: 8},
	"ssh":    {MaxConcurrent: 2, RateLimit: 6, RateWindow: 200 * time.Millisecond},
	"budget": {RateLimit: 300, RateWindow: 10 * time.Second},
}

var simTasks = map[string][]string{
	"fetch":   {"api"},
	"ask":     {"llm"},
	"store":   {"s3"},
	"enrich":  {"api", "llm"},
	"archive": {"api", "s3", "budget"},
	"deploy":  {"ssh", "s3"},
	"local":   nil,
}

func setupSim(t *testing.T, c *runcue.Cue, s *sim, violations *[]error, mu *sync.Mutex) {
	for _, name := range sortedKeys(simServices) {
		require.NoError(t, c.Service(name, simServices[name]))
	}
	for _, name := range sortedKeys(simTasks) {
		require.NoError(t, c.Task(name, runcue.Task{Services: simTasks[name], Handler: s.handler,
			Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: 100 * time.Millisecond, Jitter: runcue.JitterNone}}))
	}
	runcue.CheckInvariants(c, func(err error) {
		mu.Lock()
		*violations = append(*violations, err)
		mu.Unlock()
	})
}

func sortedKeys[V any](m map[string]V) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// simDecide draws a latency, quantized to 25ms so that many runs end at the
// same instant (fewer steps), and an outcome.
func simDecide(w *runcue.Work, rnd *rand.Rand) (time.Duration, error) {
	lat := time.Duration(1+rnd.IntN(12)) * 25 * time.Millisecond
	switch p := rnd.Float64(); {
	case p < 0.08:
		return lat, errors.New("transient")
	case p < 0.1:
		return lat, runcue.Permanent(errors.New("bad input"))
	case w.Task == "ask" && p < 0.25:
		return lat, errors.New("model overloaded") // enough to open llm's circuit now and then
	}
	return lat, nil
}

func submitSim(t *testing.T, e *env, c *runcue.Cue, n int, rnd *rand.Rand) {
	tasks := sortedKeys(simTasks)
	subs := make([]runcue.Submission, 0, n)
	for range n {
		subs = append(subs, runcue.Submission{Task: tasks[rnd.IntN(len(tasks))]})
	}
	for len(subs) > 0 {
		k := min(len(subs), 1000)
		_, err := c.SubmitBatch(e.ctx, subs[:k])
		require.NoError(t, err)
		subs = subs[k:]
	}
}

// TestBrokerProperty: 10,000 units over several services, with random
// latencies and failures on the fake clock. No rate window is ever exceeded
// (checked against service_log) and the broker's counts are right at every
// step (checked inside the dispatcher).
func TestBrokerProperty(t *testing.T) {
	// On the fake clock, its own file: it computes beside the kill
	// tests, which mostly wait (scripts/test).
	t.Parallel()
	forSeeds(t, func(t *testing.T, seed uint64, n int) { runBrokerProperty(t, seed, n, false) })
}

// TestBrokerPropertyRestart is the same with a new owner halfway.
func TestBrokerPropertyRestart(t *testing.T) {
	// On the fake clock, its own file: it computes beside the kill
	// tests, which mostly wait (scripts/test).
	t.Parallel()
	forSeeds(t, func(t *testing.T, seed uint64, n int) { runBrokerProperty(t, seed, n, true) })
}

// pinnedSeeds are simulation seeds every run repeats, so that a regression
// a seed once found stays found; the random seed explores further.
var pinnedSeeds = []uint64{1, 20261122}

// forSeeds runs f for each pinned seed (on 1,000 units) and for one random
// seed (on 10,000 units; fewer under -race or -short). RUNCUE_SIM_SEED
// replaces the random seed, to repeat a logged failure.
func forSeeds(t *testing.T, f func(t *testing.T, seed uint64, n int)) {
	for _, seed := range pinnedSeeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { f(t, seed, 1000) })
	}
	seed := testSeed(t, "RUNCUE_SIM_SEED")
	n := 10000
	if testing.Short() || raceEnabled {
		n = 2500
	}
	t.Run("random", func(t *testing.T) { f(t, seed, n) })
}

func runBrokerProperty(t *testing.T, seed uint64, n int, restart bool) {
	e := newEnv(t, simConfig(20))
	e.ctx = longContext(t)
	s := newSim(e, seed, simDecide)
	var mu sync.Mutex
	var violations []error
	setupSim(t, e.c, s, &violations, &mu)
	k := countFinal(t, e.c)
	rnd := rand.New(rand.NewPCG(seed, 1))
	submitSim(t, e, e.c, n, rnd)
	book := newLogBook(t, e.path)
	var rated []string
	for _, name := range sortedKeys(simServices) {
		if simServices[name].RateLimit > 0 {
			rated = append(rated, name)
		}
	}
	observe := func(now time.Time) { book.observe(t, rated, now) }
	e.start()
	c := e.c
	if restart {
		s.drive(t, e, c, func() bool { return k.final.Load() >= int64(n/2) }, observe)
		st, err := c.ServiceStatus(e.ctx, "llm")
		require.NoError(t, err)
		before, openUntil := st.Circuit, st.CircuitOpenUntil
		require.NoError(t, c.Close()) // interrupted runs are requeued
		c = e.open(simConfig(20))
		setupSim(t, c, s, &violations, &mu)
		k2 := countFinal(t, c)
		require.NoError(t, c.Start(e.ctx))
		st, err = c.ServiceStatus(e.ctx, "llm")
		require.NoError(t, err)
		if before == runcue.CircuitOpen || before == runcue.CircuitHalfOpen {
			// Restored open; one whose open time is over (a half-open one
			// always) turns half-open at the new owner's first dispatch,
			// which may come before this read: never closed, and at most
			// its one probe running.
			assert.NotEqual(t, runcue.CircuitClosed, st.Circuit, "an open circuit is not closed by a restart")
			if before == runcue.CircuitOpen && openUntil.After(e.clk.Now()) {
				assert.Equal(t, runcue.CircuitOpen, st.Circuit, "an open circuit whose time is not over stays open")
			}
			if st.Circuit == runcue.CircuitHalfOpen {
				assert.LessOrEqual(t, st.Active, 1, "half-open after the restart: its probe alone")
			}
		}
		base := k.final.Load()
		k = &counter{}
		k.final.Store(base)
		s.drive(t, e, c, func() bool { return base+k2.final.Load() >= int64(n) }, observe)
	} else {
		s.drive(t, e, c, func() bool { return k.final.Load() >= int64(n) }, observe)
	}
	book.flush(t, rated, e.clk.Now())
	require.NoError(t, c.Drain(e.ctx))
	mu.Lock()
	require.Empty(t, violations, "broker invariants")
	mu.Unlock()
	total := 0
	for _, name := range rated {
		svc := simServices[name]
		checkWindows(t, name, book.times[name], svc.RateLimit, svc.RateWindow)
		total += len(book.times[name])
		// The promise is about handler starts (Work.Started).
		var starts []time.Time
		s.mu.Lock()
		for task, svcs := range simTasks {
			if slices.Contains(svcs, name) {
				starts = append(starts, s.starts["task:"+task]...)
			}
		}
		s.mu.Unlock()
		checkWindows(t, name+" (starts)", starts, svc.RateLimit, svc.RateWindow)
	}
	t.Logf("%d units, %d rate-limited dispatches checked, %v of fake time", n, total, e.clk.Now().Sub(epoch))
	page, err := c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued, runcue.StateRunning}})
	require.NoError(t, err)
	assert.Empty(t, page.Units, "every unit ends terminal")
}

// TestCircuitProbe: 100 units wait on an open circuit; at half-open exactly
// one probe goes; a probe that hangs is failed at its timeout and the
// circuit reopens; a probe that succeeds closes it and the rest run.
func TestCircuitProbe(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mode atomic.Int32 // 0 fail, 1 hang, 2 succeed
	var starts atomic.Int32
	hung := make(chan struct{}, 10)
	hang := make(chan struct{})
	defer close(hang)
	require.NoError(t, e.c.Service("api", runcue.Service{CircuitThreshold: 1, CircuitTimeout: 10 * time.Second}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"}, Timeout: 5 * time.Second,
		Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			starts.Add(1)
			switch mode.Load() {
			case 0:
				return nil, errors.New("503")
			case 1:
				hung <- struct{}{}
				<-hang // ignores its context
				return nil, nil
			}
			return "ok", nil
		}}))
	rec := record(t, e.c)
	e.start()
	first := e.submit("call")
	e.wait(first)
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	require.Equal(t, runcue.CircuitOpen, st.Circuit)
	assert.True(t, st.CircuitOpenUntil.Equal(epoch.Add(10*time.Second)))
	statusEvs := rec.waitFor(t, 1, func(ev runcue.Event) bool {
		return ev.Type == runcue.EventServiceStatus && ev.Service.Circuit == runcue.CircuitOpen
	})
	assert.Equal(t, "api", statusEvs[0].Service.Name)

	mode.Store(1)
	subs := batchOf("call", 100)
	_, err = e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.settle()
	assert.Empty(t, e.running(), "open: nothing dispatched")
	e.clk.Advance(10 * time.Second)
	e.settle()
	require.Len(t, e.running(), 1, "half-open: exactly one probe")
	<-hung // the probe's handler runs (and hangs)
	st, _ = e.c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, runcue.CircuitHalfOpen, st.Circuit)

	e.clk.Advance(5 * time.Second) // the probe's timeout
	e.settle()
	st, _ = e.c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, runcue.CircuitOpen, st.Circuit, "a hung probe fails at its timeout and reopens the circuit")
	assert.True(t, st.CircuitOpenUntil.Equal(epoch.Add(25*time.Second)), "with a fresh timeout")
	assert.Empty(t, e.running())

	mode.Store(2)
	e.clk.Advance(10 * time.Second)
	e.settle()
	// The second probe's handler returns on a goroutine of its own, which
	// neither settle waits for (the hung probe's handler never returns):
	// its success is awaited as its unit's completion (the first one:
	// every run before failed or hangs), published after the verdict.
	rec.waitFor(t, 1, func(ev runcue.Event) bool { return ev.Type == runcue.EventWorkCompleted })
	st, _ = e.c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, runcue.CircuitClosed, st.Circuit, "another unit's successful probe closed the circuit")
	// The hung probe's unit spent no retry budget (MaxAttempts 1): it
	// came back behind the other 99, once its run's lease ended (its
	// handler never returned: it may still be calling the service). The
	// 99 complete first: a jump of the clock past their timeout while a
	// loaded machine had not yet run their handlers would fail them and
	// open the circuit again.
	rec.waitFor(t, 99, func(ev runcue.Event) bool { return ev.Type == runcue.EventWorkCompleted })
	e.clk.Advance(time.Minute) // LeaseBuffer's default
	require.NoError(t, e.c.Drain(e.ctx))
	st, _ = e.c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, runcue.CircuitClosed, st.Circuit, "a successful probe closes the circuit")
	assert.Equal(t, int32(1+1+99+1), starts.Load(), "the first unit, the hung probe (failed), the other 99, the hung probe's unit again")
}

// TestContention: 16 task types with random overlapping service sets, under
// load, all finish; at every step each running unit holds all of its
// services and no waiting unit holds any.
func TestContention(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	e := newEnv(t, simConfig(12))
	e.ctx = longContext(t)
	s := newSim(e, seed, func(w *runcue.Work, rnd *rand.Rand) (time.Duration, error) {
		return time.Duration(1+rnd.IntN(10)) * 5 * time.Millisecond, nil
	})
	svcs := []string{"a", "b", "c", "d", "e", "f"}
	for i, name := range svcs {
		require.NoError(t, e.c.Service(name, runcue.Service{MaxConcurrent: 1 + i%3}))
	}
	var tasks []string
	for i := range 16 {
		var use []string
		for _, name := range svcs {
			if rnd.IntN(3) == 0 {
				use = append(use, name)
			}
		}
		if len(use) == 0 {
			use = []string{svcs[i%len(svcs)]}
		}
		name := fmt.Sprintf("t%02d", i)
		tasks = append(tasks, name)
		require.NoError(t, e.c.Task(name, runcue.Task{Services: use, Handler: s.handler}))
	}
	var mu sync.Mutex
	var violations []error
	runcue.CheckInvariants(e.c, func(err error) { mu.Lock(); violations = append(violations, err); mu.Unlock() })
	k := countFinal(t, e.c)
	const n = 2000
	subs := make([]runcue.Submission, n)
	for i := range subs {
		subs[i] = runcue.Submission{Task: tasks[rnd.IntN(len(tasks))]}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	s.drive(t, e, e.c, func() bool { return k.final.Load() >= n }, nil)
	require.NoError(t, e.c.Drain(e.ctx))
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations)
}

// TestKeyedServicesEvicted: 10,000 keys used once each leave memory bounded:
// idle keyed instances are evicted once their windows empty.
func TestKeyedServicesEvicted(t *testing.T) {
	e := newEnv(t, simConfig(100))
	e.ctx = longContext(t)
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1, RateLimit: 2, RateWindow: time.Second}))
	require.NoError(t, e.c.Task("get", runcue.Task{Handler: noop,
		ServiceKeys: func(w *runcue.Work) []string { return []string{"host:" + w.Target} }}))
	var mu sync.Mutex
	var violations []error
	runcue.CheckInvariants(e.c, func(err error) { mu.Lock(); violations = append(violations, err); mu.Unlock() })
	n := 10000
	if raceEnabled {
		n = 2000
	}
	subs := make([]runcue.Submission, 0, n)
	for i := range n {
		subs = append(subs, runcue.Submission{Task: "get", Target: fmt.Sprintf("site%05d.example", i)})
	}
	for len(subs) > 0 {
		m := min(len(subs), 1000)
		_, err := e.c.SubmitBatch(e.ctx, subs[:m])
		require.NoError(t, err)
		subs = subs[m:]
	}
	e.start()
	require.NoError(t, e.c.Drain(e.ctx))
	st, err := runcue.Inspect(e.ctx, e.c)
	require.NoError(t, err)
	status, err := e.c.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	t.Logf("all done, windows still full: %d keyed instances, %d lanes; status: %d keys, %d in windows", st.Keyed, st.Lanes, status.Keys, status.InWindow)
	assert.Equal(t, status.Keys, st.Keyed, "status aggregates the class's keys")
	e.clk.Advance(time.Second + runcue.DefaultMargin) // every window empties
	e.settle()
	st, err = runcue.Inspect(e.ctx, e.c)
	require.NoError(t, err)
	assert.Zero(t, st.Keyed, "idle keys are evicted")
	assert.Equal(t, 1, st.Lanes, "only the task's own lane is left")
	status, err = e.c.ServiceStatus(e.ctx, "host")
	require.NoError(t, err)
	assert.Zero(t, status.Keys)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations)
}

// TestKeyedServiceLimits: each key has the class's limits of its own.
func TestKeyedServiceLimits(t *testing.T) {
	e := newEnv(t, simConfig(50))
	s := newSim(e, 1, func(w *runcue.Work, rnd *rand.Rand) (time.Duration, error) {
		return time.Duration(1+rnd.IntN(4)) * 50 * time.Millisecond, nil
	})
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1, RateLimit: 2, RateWindow: time.Second}))
	require.NoError(t, e.c.Service("tenant", runcue.Service{MaxConcurrent: 3}))
	require.NoError(t, e.c.Task("get", runcue.Task{Handler: s.handler,
		ServiceKeys: func(w *runcue.Work) []string {
			var p struct{ Tenant string }
			_ = w.Bind(&p)
			return []string{"host:" + w.Target, "tenant:" + p.Tenant}
		}}))
	var mu sync.Mutex
	var violations []error
	runcue.CheckInvariants(e.c, func(err error) { mu.Lock(); violations = append(violations, err); mu.Unlock() })
	k := countFinal(t, e.c)
	var subs []runcue.Submission
	hosts := []string{"busy.example", "a.example", "b.example", "c.example"}
	for i := range 40 {
		host := hosts[0]
		if i%2 == 1 {
			host = hosts[1+i%3]
		}
		subs = append(subs, runcue.Submission{Task: "get", Target: host, Params: map[string]string{"Tenant": fmt.Sprint("t", i%2)}})
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	book := newLogBook(t, e.path)
	var names []string
	for _, h := range hosts {
		names = append(names, "host:"+h)
	}
	s.drive(t, e, e.c, func() bool { return k.final.Load() >= 40 }, func(now time.Time) { book.observe(t, names, now) })
	book.flush(t, names, e.clk.Now())
	total := 0
	for _, name := range names {
		checkWindows(t, name, book.times[name], 2, time.Second)
		total += len(book.times[name])
		s.mu.Lock()
		starts := slices.Clone(s.starts["target:"+strings.TrimPrefix(name, "host:")])
		s.mu.Unlock()
		checkWindows(t, name+" (starts)", starts, 2, time.Second)
	}
	assert.Equal(t, 40, total)
	assert.Len(t, book.times["host:busy.example"], 20)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations, "per-key concurrency (1 per host, 3 per tenant) held at every step")
}

func TestKeyedServiceErrors(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1}))
	var ran atomic.Int32
	require.NoError(t, e.c.Task("get", runcue.Task{
		Handler: func(context.Context, *runcue.Work) (any, error) { ran.Add(1); return nil, nil },
		ServiceKeys: func(w *runcue.Work) []string {
			switch w.Target {
			case "panic":
				panic("bad target")
			case "unknown":
				return []string{"tenant:acme"}
			case "malformed":
				return []string{"no-colon"}
			}
			return []string{"host:" + w.Target}
		}}))
	assert.ErrorIs(t, e.c.Service("host:x", runcue.Service{}), runcue.ErrInvalid, "':' is reserved for keys")
	e.start()
	for _, target := range []string{"panic", "unknown", "malformed"} {
		wi := e.wait(e.submit("get", func(s *runcue.Submission) { s.Target = target }))
		assert.Equal(t, runcue.StateFailed, wi.State, target)
		assert.Contains(t, wi.Error, "service keys", target)
		assert.Equal(t, 1, wi.Runs, "permanent: not retried")
	}
	assert.Zero(t, ran.Load(), "the handler never ran")
	assert.Equal(t, runcue.StateCompleted, e.wait(e.submit("get", func(s *runcue.Submission) { s.Target = "ok.example" })).State)
}

// TestRetryAfter: RetryAfter(2s) holds its service for 2s, spends no retry
// budget and does not move the circuit.
func TestRetryAfter(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var calls atomic.Int32
	require.NoError(t, e.c.Service("api", runcue.Service{CircuitThreshold: 1, CircuitTimeout: time.Minute}))
	require.NoError(t, e.c.Service("other", runcue.Service{}))
	require.NoError(t, e.c.Task("call", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if calls.Add(1) == 1 {
				return nil, runcue.RetryAfter(2*time.Second, errors.New("429 Too Many Requests"))
			}
			return "ok", nil
		}}))
	require.NoError(t, e.c.Task("elsewhere", runcue.Task{Services: []string{"other"}, Handler: noop}))
	rec := record(t, e.c)
	e.start()
	first := e.submit("call")
	ev := rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, first))[0]
	assert.Equal(t, "retry_after", ev.Reason)
	assert.True(t, ev.NextAttempt.Equal(epoch.Add(2*time.Second)))
	second := e.submit("call")
	other := e.submit("elsewhere")
	assert.Equal(t, runcue.StateCompleted, e.wait(other).State, "other services are not held")
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(second).State, "the service is held")
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.BlockedUntil.Equal(epoch.Add(2*time.Second)))
	assert.Equal(t, runcue.CircuitClosed, st.Circuit, "a Retry-After never counts toward the circuit")
	e.clk.Advance(1999 * time.Millisecond)
	e.settle()
	assert.Equal(t, int32(1), calls.Load(), "not before 2s")
	e.clk.Advance(time.Millisecond)
	wi := e.wait(first)
	assert.Equal(t, runcue.StateCompleted, wi.State, "MaxAttempts 1, yet it ran again: no budget spent")
	assert.Zero(t, wi.Failures)
	assert.Equal(t, "deferred", wi.Attempts[0].Outcome)
	assert.Equal(t, runcue.StateCompleted, e.wait(second).State)

	// An error exposing a delay works the same.
	require.NoError(t, e.c.Task("http", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			if w.Attempt == 1 {
				return nil, throttled{5 * time.Second}
			}
			return "ok", nil
		}}))
	h := e.submit("http")
	ev = rec.waitFor(t, 1, ofType(runcue.EventWorkRetrying, h))[0]
	assert.Equal(t, 5*time.Second, ev.NextAttempt.Sub(e.clk.Now()))
	e.clk.Advance(5 * time.Second)
	assert.Equal(t, runcue.StateCompleted, e.wait(h).State)
}

type throttled struct{ d time.Duration }

func (e throttled) Error() string             { return "503 Service Unavailable" }
func (e throttled) RetryAfter() time.Duration { return e.d }

func TestRetryAfterCap(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{MaxDeferrals: 2, Retry: runcue.RetryPolicy{MaxAttempts: 1},
		Handler: func(context.Context, *runcue.Work) (any, error) {
			return nil, runcue.RetryAfter(time.Second, errors.New("429"))
		}}))
	rec := record(t, e.c)
	e.start()
	id := e.submit("t")
	for i := 1; i <= 2; i++ {
		rec.waitFor(t, i, ofType(runcue.EventWorkRetrying, id))
		e.clk.Advance(time.Second)
	}
	wi := e.wait(id)
	assert.Equal(t, runcue.StateFailed, wi.State, "past MaxDeferrals a Retry-After spends budget")
	assert.Equal(t, 3, wi.Runs)
	assert.Equal(t, 1, wi.Failures)
}

func TestServiceOverridePause(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: g.handler}))
	rec := record(t, e.c)
	e.start()
	for range 6 {
		e.submit("t")
	}
	e.settle()
	assert.Len(t, e.running(), 1)
	require.NoError(t, e.c.SetService(e.ctx, "api", runcue.Service{MaxConcurrent: 3}))
	e.settle()
	assert.Len(t, e.running(), 3, "an override applies at once")
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.Overridden)
	assert.Equal(t, 3, st.Limits.MaxConcurrent)
	assert.Equal(t, 3, st.Active)
	assert.ErrorIs(t, e.c.SetService(e.ctx, "api", runcue.Service{MaxConcurrent: -1}), runcue.ErrInvalid)
	assert.ErrorIs(t, e.c.SetService(e.ctx, "nope", runcue.Service{}), runcue.ErrUnknownService)

	require.NoError(t, e.c.PauseService(e.ctx, "api"))
	for range 3 {
		g.release <- nil
	}
	rec.waitFor(t, 3, ofType(runcue.EventWorkCompleted, ""))
	e.settle()
	assert.Empty(t, e.running(), "a paused service gets no new dispatch")
	st, _ = e.c.ServiceStatus(e.ctx, "api")
	assert.True(t, st.Paused)
	changed := rec.waitFor(t, 2, ofType(runcue.EventServiceChanged, ""))
	assert.Equal(t, "api", changed[1].Service.Name)
	assert.Equal(t, "paused", changed[1].Reason)

	// A restart keeps the override and the pause.
	require.NoError(t, e.c.Close())
	c := e.open(runcue.Config{})
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: g.handler}))
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, c))
	st, err = c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.True(t, st.Paused, "the pause outlives a restart")
	assert.Equal(t, 3, st.Limits.MaxConcurrent, "the override outlives a restart")
	require.NoError(t, c.ResumeService(e.ctx, "api"))
	require.NoError(t, runcue.Settle(e.ctx, c))
	st, _ = c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, 3, st.Active)
	require.NoError(t, c.ResetService(e.ctx, "api"))
	st, _ = c.ServiceStatus(e.ctx, "api")
	assert.False(t, st.Overridden)
	assert.Equal(t, 1, st.Limits.MaxConcurrent, "reset: the registered limits apply")
	close(g.release)
	require.NoError(t, c.Drain(e.ctx))
}

func TestServiceChangedFromAnotherProcess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: g.handler}))
	e.start()
	for range 4 {
		e.submit("t")
	}
	e.settle()
	other := e.open(runcue.Config{}) // registers nothing
	require.NoError(t, other.SetService(e.ctx, "api", runcue.Service{MaxConcurrent: 4}))
	st, err := other.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 4, st.Limits.MaxConcurrent)
	assert.Equal(t, 1, st.Active, "read from the database")
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	e.settle()
	assert.Len(t, e.running(), 4, "the owner applied the override at its poll")
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
}

// TestRateWindowRebuiltAfterRestart: a new owner sees the previous owner's
// dispatches and does not exceed the window.
// A new owner counts each logged start as late as it can have been:
// MaxStartDelay after its logged decision.
func TestRateWindowRebuiltAfterRestart(t *testing.T) {
	const lag = 500 * time.Millisecond
	e := newEnv(t, runcue.Config{MaxStartDelay: lag})
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 3, RateWindow: time.Minute}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: noop}))
	e.start()
	var ids []string
	for range 5 {
		ids = append(ids, e.submit("t"))
	}
	for _, id := range ids[:3] {
		e.wait(id)
	}
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(ids[3]).State)
	require.NoError(t, e.c.Close())
	e.clk.Advance(30 * time.Second)
	c := e.open(runcue.Config{MaxStartDelay: lag})
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 3, RateWindow: time.Minute}))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: noop}))
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, c))
	st, err := c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 3, st.InWindow, "the window is rebuilt from the log")
	// A start holds its place for the window and the margin.
	hold := time.Minute + runcue.DefaultMargin
	assert.True(t, st.NextCapacity.Equal(epoch.Add(hold+lag)), "next capacity %v", st.NextCapacity)
	wi, _ := c.Get(e.ctx, ids[3])
	assert.Equal(t, runcue.StateQueued, wi.State, "no dispatch past the limit after a restart")
	e.clk.Set(epoch.Add(hold + lag - time.Millisecond))
	require.NoError(t, runcue.Settle(e.ctx, c))
	wi, _ = c.Get(e.ctx, ids[3])
	assert.Equal(t, runcue.StateQueued, wi.State, "the old starts may have come up to MaxStartDelay late")
	e.clk.Set(epoch.Add(hold + lag))
	wi, err = c.Wait(e.ctx, ids[4])
	require.NoError(t, err)
	assert.True(t, wi.StartedAt.Equal(epoch.Add(hold+lag)), "dispatched the instant the window had room")
}

// simConfig is the Config of a simulation: no polling for other processes
// (there are none), so the clock moves from one event to the next.
func simConfig(maxConcurrent int) runcue.Config {
	return runcue.Config{MaxConcurrent: maxConcurrent, Logger: quietLogger, PollInterval: 24 * time.Hour}
}

// longContext bounds a long simulation (a guard against hangs only).
func longContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestServiceStatusEvents: a service flapping at saturation reports at most
// one service_status a second; pauses are reported at once.
func TestServiceStatusEvents(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: noop}))
	rec := record(t, e.c)
	e.start()
	subs := batchOf("t", 200)
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	require.NoError(t, e.c.Drain(e.ctx)) // 200 saturate/free flips at one instant
	e.settle()
	status := func() []runcue.Event {
		var out []runcue.Event
		for _, ev := range rec.all() {
			if ev.Type == runcue.EventServiceStatus {
				out = append(out, ev)
			}
		}
		return out
	}
	first := status()
	assert.LessOrEqual(t, len(first), 1, "coalesced: %d events", len(first))
	e.clk.Advance(time.Second)
	e.settle()
	after := status()
	assert.LessOrEqual(t, len(after), 2, "one more at most, with the latest state")
	if len(after) == 2 {
		assert.Equal(t, 0, after[1].Service.Active, "the latest state: idle")
	}
	require.NoError(t, e.c.PauseService(e.ctx, "api"))
	evs := rec.waitFor(t, 1, func(ev runcue.Event) bool { return ev.Type == runcue.EventServiceStatus && ev.Service.Paused })
	assert.Zero(t, evs[0].Seq, "service_status is not durable")
	assert.Equal(t, "api", evs[0].Service.Name)
}

// TestDailyBudget: a 24h window is a daily budget.
func TestDailyBudget(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Service("translate", runcue.Service{RateLimit: 3, RateWindow: 24 * time.Hour}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"translate"}, Handler: noop}))
	e.start()
	var ids []string
	for i := range 5 {
		ids = append(ids, e.submit("t"))
		if i < 3 {
			e.wait(ids[i])
			e.clk.Advance(time.Hour)
		}
	}
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(ids[3]).State, "the day's budget is spent")
	st, err := e.c.ServiceStatus(e.ctx, "translate")
	require.NoError(t, err)
	assert.Equal(t, 3, st.InWindow)
	day := 24*time.Hour + runcue.DefaultMargin // the window and the margin
	assert.True(t, st.NextCapacity.Equal(epoch.Add(day)), "the first dispatch leaves the window after a day")
	e.clk.Set(epoch.Add(day - time.Millisecond))
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(ids[3]).State)
	e.clk.Set(epoch.Add(day))
	wi := e.wait(ids[3])
	assert.True(t, wi.StartedAt.Equal(epoch.Add(day)))
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(ids[4]).State, "the next slot frees an hour later")
	e.clk.Set(epoch.Add(day + time.Hour))
	assert.Equal(t, runcue.StateCompleted, e.wait(ids[4]).State)
}

// TestCircuitSurvivesRestart: an open circuit is still open after a restart,
// and admits its probe when its time comes.
func TestCircuitSurvivesRestart(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	fail := func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("502") }
	register := func(c *runcue.Cue, h runcue.Handler) {
		require.NoError(t, c.Service("api", runcue.Service{CircuitThreshold: 2, CircuitTimeout: time.Minute}))
		require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: h}))
	}
	register(e.c, fail)
	e.start()
	e.wait(e.submit("t"))
	e.wait(e.submit("t"))
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	require.Equal(t, runcue.CircuitOpen, st.Circuit)
	waiting := e.submit("t")
	require.NoError(t, e.c.Close())

	e.clk.Advance(30 * time.Second)
	c := e.open(runcue.Config{})
	register(c, noop)
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, c))
	st, err = c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitOpen, st.Circuit, "still open after the restart")
	assert.True(t, st.CircuitOpenUntil.Equal(epoch.Add(time.Minute)))
	wi, _ := c.Get(e.ctx, waiting)
	assert.Equal(t, runcue.StateQueued, wi.State)
	e.clk.Set(epoch.Add(time.Minute))
	wi, err = c.Wait(e.ctx, waiting)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State, "the probe ran at the circuit's time")
	st, _ = c.ServiceStatus(e.ctx, "api")
	assert.Equal(t, runcue.CircuitClosed, st.Circuit)
}

// TestCircuitFailureCountSurvivesRestart: a closed circuit's consecutive
// failures are persisted, so a new owner opens it after the same number
// of failures; a success clears the count.
func TestCircuitFailureCountSurvivesRestart(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	fail := func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("502") }
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Service("api", runcue.Service{CircuitThreshold: 2, CircuitTimeout: time.Minute}))
		require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: fail}))
		require.NoError(t, c.Task("ok", runcue.Task{Services: []string{"api"}, Handler: noop}))
	}
	register(e.c)
	e.start()
	e.wait(e.submit("t"))
	require.NoError(t, e.c.Close())
	c := e.open(runcue.Config{})
	register(c)
	require.NoError(t, c.Start(e.ctx))
	first, err := c.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	_, err = c.Wait(e.ctx, first.ID)
	require.NoError(t, err)
	st, err := c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitOpen, st.Circuit, "the failure before the restart counted")

	// After the probe's success, the count is clear again across a restart.
	e.clk.Advance(time.Minute)
	probe, err := c.Submit(e.ctx, runcue.Submission{Task: "ok"})
	require.NoError(t, err)
	_, err = c.Wait(e.ctx, probe.ID)
	require.NoError(t, err)
	one, err := c.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	_, err = c.Wait(e.ctx, one.ID)
	require.NoError(t, err)
	ok, err := c.Submit(e.ctx, runcue.Submission{Task: "ok"})
	require.NoError(t, err)
	_, err = c.Wait(e.ctx, ok.ID)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	c = e.open(runcue.Config{})
	register(c)
	require.NoError(t, c.Start(e.ctx))
	two, err := c.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	_, err = c.Wait(e.ctx, two.ID)
	require.NoError(t, err)
	require.NoError(t, runcue.Settle(e.ctx, c))
	st, err = c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, runcue.CircuitClosed, st.Circuit, "one failure since the success")
}

// TestFailedProbeSpendsNoBudget: the Hardening issue's outage: a host down
// for 15 s, 50 units queued, three attempts each. A failed probe is the
// service's failure: its unit comes back without spending its retry
// budget, and the next probe is another unit. Before, the first unit was
// the probe three times and ended failed ("3 runs: 503") while the other
// 49 waited and completed. A unit that fails as the probe MaxFreeProbes
// times in a row spends a run on its next failure, so a unit that fails
// for its own reasons cannot hold the circuit open.
func TestFailedProbeSpendsNoBudget(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	outageEnd := epoch.Add(15 * time.Second)
	var mu sync.Mutex
	var starts []string // unit IDs, in start order
	require.NoError(t, e.c.Service("host", runcue.Service{MaxConcurrent: 1, CircuitThreshold: 1, CircuitTimeout: time.Second}))
	require.NoError(t, e.c.Task("fetch", runcue.Task{Services: []string{"host"},
		Retry: runcue.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, Jitter: runcue.JitterNone},
		Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			mu.Lock()
			starts = append(starts, w.ID)
			mu.Unlock()
			if w.Target == "poison" || w.Started.Before(outageEnd) {
				return nil, errors.New("503 unavailable")
			}
			return nil, nil
		}}))
	e.start()
	var subs []runcue.Submission
	for i := range 50 {
		subs = append(subs, runcue.Submission{Task: "fetch", ID: fmt.Sprintf("u%02d", i)})
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	for e.clk.Now().Before(outageEnd.Add(time.Minute)) {
		e.quiesce(e.c)
		e.clk.Advance(100 * time.Millisecond)
	}
	require.NoError(t, e.c.Drain(e.ctx))
	for _, s := range subs {
		wi := e.get(s.ID)
		assert.Equal(t, runcue.StateCompleted, wi.State, "%s: %d runs, %s", s.ID, wi.Runs, wi.Error)
		assert.LessOrEqual(t, wi.Failures, 1, "%s: only the run that opened the circuit spent budget", s.ID)
	}
	// The probes during the outage: one a second, each another unit.
	mu.Lock()
	probes := slices.Clone(starts[1:16])
	mu.Unlock()
	for i := 1; i < len(probes); i++ {
		assert.NotEqual(t, probes[i-1], probes[i], "probe %d was the unit of probe %d again", i, i-1)
	}

	// A unit that fails for its own reasons: its free probes end, its
	// failures spend runs, and it fails for good; the others complete.
	poison := e.submit("fetch", func(s *runcue.Submission) { s.Target = "poison" })
	var more []string
	for range 5 {
		more = append(more, e.submit("fetch"))
	}
	for range 600 {
		if e.get(poison).State == runcue.StateFailed {
			break
		}
		e.quiesce(e.c)
		e.clk.Advance(100 * time.Millisecond)
	}
	wi := e.get(poison)
	assert.Equal(t, runcue.StateFailed, wi.State, "poison: %d runs", wi.Runs)
	assert.Equal(t, 3, wi.Failures)
	assert.LessOrEqual(t, wi.Runs, 3+runcue.MaxFreeProbes*3, "its probes free at most MaxFreeProbes in a row")
	for range 100 {
		e.quiesce(e.c)
		e.clk.Advance(100 * time.Millisecond)
	}
	for _, id := range more {
		assert.Equal(t, runcue.StateCompleted, e.get(id).State)
	}
}

// TestPacedService: Service.Pace spaces a backlog's starts RateWindow /
// RateLimit apart instead of starting a window's worth at once; unpaced,
// the same backlog starts four at the first instant.
func TestPacedService(t *testing.T) {
	for _, pace := range []bool{true, false} {
		e := newEnv(t, runcue.Config{})
		var rec startRecorder
		require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 4, RateWindow: time.Second, Pace: pace}))
		require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: rec.handler}))
		e.start()
		_, err := e.c.SubmitBatch(e.ctx, batchOf("t", 8))
		require.NoError(t, err)
		for range 40 {
			e.quiesce(e.c)
			e.clk.Advance(50 * time.Millisecond)
		}
		starts := rec.all()[:8]
		require.Len(t, rec.all(), 8, "pace %v", pace)
		checkWindows(t, "api", starts, 4, time.Second)
		if pace {
			// Once the window is empty, one unit starts at once and the
			// next waits for its turn, and Explain says so.
			e.clk.Advance(2 * time.Second)
			e.submit("t")
			last := e.submit("t")
			e.quiesce(e.c)
			ex, err := e.c.Explain(e.ctx, last)
			require.NoError(t, err)
			require.NotEmpty(t, ex.Reasons)
			assert.Equal(t, runcue.ReasonRateLimited, ex.Reasons[0].Kind)
			assert.Contains(t, ex.Reasons[0].Detail, "api is paced: one start every 250ms")
			for i := 1; i < len(starts); i++ {
				assert.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), 250*time.Millisecond, "start %d", i)
			}
		} else {
			assert.True(t, starts[3].Equal(starts[0]), "unpaced, a window's worth starts at once")
		}
	}
}
