package hoststest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
)

// Options sizes a run.
type Options struct {
	// Env is what a child needs to reach the database (its path, its URL).
	Env []string
	// Units is how many units run; ExecutorKills and SchedulerKills how
	// many SIGKILLs of each happen while they do (at least).
	Units, ExecutorKills, SchedulerKills int
	// Skew is the clock offset of one executor.
	Skew time.Duration
	// Seed fixes the units, their dependencies and their order.
	Seed uint64
}

// Run runs the test (see the package's doc) on the store open opens, and
// checks, from the mock's counts and the store: no window of the service
// saw more than Limit arrivals or Tokens tokens; the pool and each key
// never held more than their caps (from the starts and ends the handlers
// reported, a killed executor's open runs ended at its kill); every unit
// completed exactly once; no dependent arrived before its dependency
// completed. It reports the takeover times (a scheduler's kill to the next
// owner), not asserting them.
func Run(t *testing.T, open Opener, o Options) {
	ctx := context.Background()
	st, c, deps := submitUnits(t, open, o.Units, o.Seed, 2)

	m := newMock()
	srv := httptest.NewServer(m)
	defer srv.Close()
	env := append(slices.Clone(o.Env), envMock+"="+srv.URL)
	schedulers := map[int]*exec.Cmd{}
	addScheduler := func() {
		cmd := startChild(t, env, "scheduler")
		schedulers[cmd.Process.Pid] = cmd
	}
	addScheduler()
	addScheduler()
	executors := make([]*exec.Cmd, 3)
	startExecutor := func(i int) {
		skew := time.Duration(0)
		if i == 2 {
			skew = o.Skew
		}
		executors[i] = startChild(t, env, "executor", envID+"=ex-"+strconv.Itoa(i), envSkew+"="+strconv.FormatInt(int64(skew), 10))
	}
	for i := range executors {
		startExecutor(i)
	}

	prober, _ := st.(store.OwnerProber)
	var takeovers []time.Duration
	execKills, schedKills := 0, 0
	completed := func() int {
		s, err := c.Stats(ctx)
		require.NoError(t, err)
		return s.States[runcue.StateCompleted]
	}
	// The kills are spread over the first three fifths of the run: one of
	// an executor every Units*3/5/(ExecutorKills+1) completions, of the
	// scheduler every Units*3/5/(SchedulerKills+1), so that a kill that
	// must wait (no run at the service to cut) still finds units left.
	execEvery, schedEvery := max(o.Units*3/5/(o.ExecutorKills+1), 1), max(o.Units*3/5/(o.SchedulerKills+1), 1)
	deadline := time.Now().Add(5 * time.Minute)
	execDue := func(done int) bool { return execKills < o.ExecutorKills && done >= (execKills+1)*execEvery }
	schedDue := func(done int) bool {
		return prober != nil && schedKills < o.SchedulerKills && done >= (schedKills+1)*schedEvery
	}
	defer m.release()
	for done := 0; done < o.Units; done = completed() {
		require.True(t, time.Now().Before(deadline), "timed out: %d of %d units completed", done, o.Units)
		// A kill that is due holds the runs that arrive at the service
		// there until it is done: there is a run at the service to cut,
		// and the units cannot all complete before every kill (on a slow
		// machine they could, and the kills would not all happen). Each
		// kind is tried on its own.
		if execDue(done) || schedDue(done) {
			m.hold()
		}
		if execDue(done) {
			// Killed while one of its runs is at the service: that run's
			// outcome is lost, and it runs again.
			if i := slices.IndexFunc(executors, func(cmd *exec.Cmd) bool { return m.busy(cmd.Process.Pid) }); i >= 0 {
				pid := executors[i].Process.Pid
				kill(executors[i])
				m.killed(pid)
				execKills++
				startExecutor(i)
			}
		}
		if schedDue(done) {
			h, ok, err := prober.Owner(ctx)
			require.NoError(t, err)
			// Killed only while runs it assigned are at the service.
			if ok && schedulers[h.PID] != nil && m.anyOpen() {
				killed := time.Now()
				kill(schedulers[h.PID])
				delete(schedulers, h.PID)
				schedKills++
				addScheduler()
				for {
					n, ok, err := prober.Owner(ctx)
					require.NoError(t, err)
					if ok && n.PID != h.PID {
						takeovers = append(takeovers, time.Since(killed))
						break
					}
					require.True(t, time.Now().Before(deadline), "no scheduler took over")
					time.Sleep(2 * time.Millisecond)
				}
			}
		}
		if !execDue(done) && !schedDue(done) {
			m.release()
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, cmd := range executors {
		kill(cmd)
	}
	for _, cmd := range schedulers {
		kill(cmd)
	}
	assert.GreaterOrEqual(t, execKills, o.ExecutorKills, "executors killed while units ran")
	assert.GreaterOrEqual(t, schedKills, o.SchedulerKills, "schedulers killed while units ran")
	m.check(t, deps, c)
	var ms []string
	for _, d := range takeovers {
		ms = append(ms, d.Round(time.Millisecond).String())
	}
	t.Logf("%d units, %d executor and %d scheduler kills; %s; takeovers (kill to the next owner): %v", o.Units, execKills, schedKills, m.summary(), ms)
}

// submitUnits opens the test's own view of the store (closed at the
// test's end), registers the test's services and task, and submits n units
// of "call" (up to two dependencies each, on earlier units; keyed hosts;
// token costs) in a shuffled order, fixed by seed and stream. It returns
// the store, the Cue and each unit's dependencies.
func submitUnits(t *testing.T, open Opener, n int, seed, stream uint64) (store.Store, *runcue.Cue, map[string][]string) {
	t.Helper()
	ctx := context.Background()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, stream))
	st, err := open(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, Register(c))
	deps := map[string][]string{}
	var subs []runcue.Submission
	for i := range n {
		id := fmt.Sprintf("u%04d", i)
		s := runcue.Submission{Task: "call", ID: id, Target: strconv.Itoa(rnd.IntN(Keys)), Cost: runcue.Costs{"tokens": TokenCost(id)}}
		for range 2 {
			if i > 0 && rnd.IntN(3) == 0 {
				if d := fmt.Sprintf("u%04d", rnd.IntN(i)); !slices.Contains(s.DependsOn, d) {
					s.DependsOn = append(s.DependsOn, d)
				}
			}
		}
		deps[id] = s.DependsOn
		subs = append(subs, s)
	}
	rnd.Shuffle(len(subs), func(i, j int) { subs[i], subs[j] = subs[j], subs[i] })
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	return st, c, deps
}

// startChild starts the test binary as a child of the given mode.
func startChild(t *testing.T, env []string, mode string, more ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(append(os.Environ(), env...), envChild+"="+mode), more...)
	last := &lastWords{}
	cmd.Stderr = io.MultiWriter(os.Stderr, last, &stallWatch{})
	require.NoError(t, cmd.Start())
	said.Store(cmd, last)
	t.Cleanup(func() { said.Delete(cmd) })
	t.Cleanup(func() { kill(cmd) })
	return cmd
}

// said holds each child's lastWords, by its *exec.Cmd.
var said sync.Map

// lastWords keeps the end of what a child wrote to its standard error:
// why it exited, when it did.
type lastWords struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lastWords) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if len(l.buf) > 4096 {
		l.buf = append(l.buf[:0], l.buf[len(l.buf)-2048:]...)
	}
	return len(p), nil
}

// saidLast returns the end of what cmd, a child, wrote to its standard
// error.
func saidLast(cmd *exec.Cmd) string {
	v, ok := said.Load(cmd)
	if !ok {
		return ""
	}
	l := v.(*lastWords)
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// kill sends SIGKILL and reaps the process (once).
func kill(cmd *exec.Cmd) {
	if cmd.ProcessState == nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// mock is the service: it counts arrivals (a run's start, after the wire)
// and the runs open at once, in the pool and per key.
type mock struct {
	mu       sync.Mutex
	arrivals []arrival
	open     map[run]string // open runs, by key
	byKey    map[string]int
	pool     int
	maxPool  int
	maxKey   int
	overs    []string
	outcomes map[string]int // the runs' outcomes, from the store
	// held, while not nil, holds the calls that arrive at the service
	// until it is closed (release) or their connection ends.
	held chan struct{}
}

type run struct {
	id      string
	attempt int
	pid     int
}

type arrival struct {
	at      time.Time
	id      string
	attempt int
	pid     int
	tokens  int64
}

func newMock() *mock { return &mock{open: map[run]string{}, byKey: map[string]int{}} }

func (m *mock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	q := r.URL.Query()
	if ns, err := strconv.ParseInt(q.Get("arrive"), 10, 64); err == nil {
		at = time.Unix(0, ns) // the start plus the wire's seeded delay (see call)
	}
	attempt, _ := strconv.Atoi(q.Get("attempt"))
	pid, _ := strconv.Atoi(q.Get("pid"))
	tokens, _ := strconv.ParseInt(q.Get("tokens"), 10, 64)
	k := run{q.Get("id"), attempt, pid}
	key := q.Get("key")
	m.mu.Lock()
	defer m.mu.Unlock()
	switch r.URL.Path {
	case "/start":
		m.arrivals = append(m.arrivals, arrival{at, k.id, attempt, pid, tokens})
		m.open[k] = key
		m.pool++
		m.byKey[key]++
		m.maxPool, m.maxKey = max(m.maxPool, m.pool), max(m.maxKey, m.byKey[key])
		if m.pool > Pool || m.byKey[key] > 1 {
			m.overs = append(m.overs, fmt.Sprintf("%v: %s run %d makes %d in the pool, %d on host:%s", at.Format(time.StampMicro), k.id, attempt, m.pool, m.byKey[key], key))
		}
		if held := m.held; held != nil {
			m.mu.Unlock()
			select {
			case <-held:
				m.mu.Lock()
			case <-r.Context().Done():
				m.mu.Lock()
				m.end(k) // the caller is gone: the call is over
			}
		}
	case "/end":
		m.end(k)
	}
}

// hold holds the calls that arrive from now on at the service, until
// release.
func (m *mock) hold() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held == nil {
		m.held = make(chan struct{})
	}
}

// release lets the held calls go on, and the next ones through.
func (m *mock) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held != nil {
		close(m.held)
		m.held = nil
	}
}

// end closes run k, if open. m.mu is held.
func (m *mock) end(k run) {
	key, ok := m.open[k]
	if !ok {
		return
	}
	delete(m.open, k)
	m.pool--
	m.byKey[key]--
}

// busy reports whether process pid has a run open at the service.
func (m *mock) busy(pid int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.open {
		if k.pid == pid {
			return true
		}
	}
	return false
}

// anyOpen reports whether a run is open at the service.
func (m *mock) anyOpen() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.open) > 0
}

// killed ends the open runs of a killed process.
func (m *mock) killed(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.open {
		if k.pid == pid {
			m.end(k)
		}
	}
}

// check asserts the service's counts and the store's record.
func (m *mock) check(t *testing.T, deps map[string][]string, c *runcue.Cue) {
	ctx := context.Background()
	m.mu.Lock()
	defer m.mu.Unlock()
	assert.Empty(t, m.overs, "caps exceeded")
	a := slices.Clone(m.arrivals)
	slices.SortFunc(a, func(x, y arrival) int { return x.at.Compare(y.at) })
	m.arrivals = a
	require.NotEmpty(t, a)
	if _, _, over := busiest(a); over != "" {
		t.Error(over)
	}
	first := map[string]time.Time{}
	for _, x := range a {
		if _, ok := first[x.id]; !ok {
			first[x.id] = x.at
		}
	}
	finished := map[string]time.Time{}
	m.outcomes = map[string]int{}
	for id := range deps {
		wi, err := c.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State, id)
		completions := 0
		for _, at := range wi.Attempts {
			m.outcomes[at.Outcome]++
			if at.Outcome == "completed" {
				completions++
			}
		}
		assert.Equal(t, 1, completions, "completions of %s", id)
		finished[id] = wi.FinishedAt
		assert.Contains(t, first, id, "%s arrived at the service", id)
	}
	for id, ds := range deps {
		for _, d := range ds {
			assert.False(t, first[id].Before(finished[d]), "%s arrived at %v, before its dependency %s completed at %v", id, first[id], d, finished[d])
		}
	}
}

// busiest returns the most arrivals and tokens (a sorted by when) in any
// Window, and the first window over a limit, described ("" if none).
func busiest(a []arrival) (most int, tokens int64, over string) {
	for i := range a {
		k, sum := 0, int64(0)
		for j := i; j < len(a) && a[j].at.Sub(a[i].at) < Window; j++ {
			k++
			sum += a[j].tokens
		}
		most, tokens = max(most, k), max(tokens, sum)
		if (k > Limit || sum > Tokens) && over == "" {
			over = fmt.Sprintf("the window from %v saw %d arrivals (limit %d) and %d tokens (limit %d):", a[i].at.Format(time.StampMicro), k, Limit, sum, Tokens)
			for _, x := range a[max(i-3, 0):min(i+k+3, len(a))] {
				over += fmt.Sprintf("\n\t+%v %s run %d pid %d, %d tokens (cost %d)", x.at.Sub(a[i].at), x.id, x.attempt, x.pid, x.tokens, TokenCost(x.id))
			}
		}
	}
	return most, tokens, over
}

// summary describes what the service saw.
func (m *mock) summary() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.arrivals
	most, tokens, _ := busiest(a)
	return fmt.Sprintf("%d arrivals, at most %d (limit %d) and %d tokens (limit %d) in any %v, at most %d in the pool (cap %d) and %d on a key (cap 1); runs by outcome %v",
		len(a), most, Limit, tokens, Tokens, Window, m.maxPool, Pool, m.maxKey, m.outcomes)
}

// StartBench starts n benchmark executors ("bench": no-op handlers of the
// tasks "noop" and "capped") of the given capacity each; stop kills them.
func StartBench(t testing.TB, env []string, n, capacity int) (stop func()) {
	var cmds []*exec.Cmd
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmd.Env = append(append(os.Environ(), env...), envChild+"=bench", envID+"=bench-"+strconv.Itoa(i), envCap+"="+strconv.Itoa(capacity))
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
	}
	stop = func() {
		for _, cmd := range cmds {
			kill(cmd)
		}
	}
	t.Cleanup(stop)
	return stop
}
