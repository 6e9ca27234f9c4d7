//go:build unix

package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/postgres"
)

// The failover tests run schedulers in child processes (this test binary,
// with RUNCUE_PG_CHILD set: see TestMain), each a Cue with Config.Standby
// on the same schema, calling a mock service that counts arrivals.

const (
	failoverTTL    = time.Second // the children's LeaseTTL
	failoverLimit  = 10          // the service's RateLimit per failoverWindow
	failoverWindow = 500 * time.Millisecond
	failoverTokens = 400 // the service's token meter per failoverWindow
)

// failoverService is the service every process of a failover test
// registers: requests and tokens per failoverWindow.
var failoverService = runcue.Service{RateLimit: failoverLimit, RateWindow: failoverWindow,
	Meters: []runcue.Meter{{Name: "tokens", Limit: failoverTokens, Window: failoverWindow}}}

// tokenCost is a unit's cost in tokens, stated at submit; tokenUse what
// its call uses of it (the executors' test's: internal/hoststest).
var tokenCost, tokenUse = hoststest.TokenCost, hoststest.TokenUse

// costed gives each submission its token cost.
func costed(subs []runcue.Submission) []runcue.Submission {
	for i := range subs {
		subs[i].Cost = runcue.Costs{"tokens": tokenCost(subs[i].ID)}
	}
	return subs
}

// A failover test's scheduler process runs childMain instead of the tests.
func init() {
	if os.Getenv("RUNCUE_PG_CHILD") == "scheduler" {
		childMain() // never returns
	}
}

// childMain is a scheduler: a standby Cue whose handler waits a seeded 0-5
// ms (the wire), tells the mock it arrived, and waits 20-60 ms more (the
// reply). It journals every
// Apply that carries owner ops to stdout ("apply <start> <end> <epoch>
// <applied owner ops>"), and runs until killed or sent SIGTERM.
func childMain() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("RUNCUE_PG_URL"), postgres.Options{LeaseTTL: failoverTTL})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	j := &journal{Store: st, out: bufio.NewWriter(os.Stdout)}
	// Short run leases: a killed scheduler's runs are recovered (and run
	// again) 1.5 s after they started.
	c, err := runcue.New(j, runcue.Config{Standby: true, PollInterval: 20 * time.Millisecond, DefaultTimeout: time.Second,
		LeaseBuffer: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: new:", err)
		os.Exit(2)
	}
	mock := os.Getenv("RUNCUE_PG_MOCK")
	seed, _ := strconv.ParseUint(os.Getenv("RUNCUE_PG_SEED"), 10, 64)
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, uint64(os.Getpid())))
	if err := c.Service("api", failoverService); err != nil {
		fmt.Fprintln(os.Stderr, "child: service:", err)
		os.Exit(2)
	}
	if err := c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		wire := time.Duration(rnd.Int64N(int64(5 * time.Millisecond)))
		work := 20*time.Millisecond + time.Duration(rnd.Int64N(int64(40*time.Millisecond)))
		mu.Unlock()
		time.Sleep(wire)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, mock+"?id="+w.ID+"&pid="+strconv.Itoa(os.Getpid())+
			"&started="+strconv.FormatInt(w.Started.UnixNano(), 10)+"&arrive="+strconv.FormatInt(w.Started.Add(wire).UnixNano(), 10)+
			"&tokens="+strconv.FormatInt(tokenUse(w.ID), 10), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		time.Sleep(work) // the service's reply: a kill now loses the run's outcome
		w.Used(runcue.Costs{"tokens": tokenUse(w.ID)})
		return nil, nil
	}}); err != nil {
		fmt.Fprintln(os.Stderr, "child: task:", err)
		os.Exit(2)
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child: start:", err)
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	c.Close()
	st.Close()
	os.Exit(0)
}

// journal records the Applies that carry owner ops.
type journal struct {
	store.Store
	mu  sync.Mutex
	out *bufio.Writer
}

func (j *journal) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	start := time.Now()
	b, err := j.Store.Apply(ctx, ops)
	end := time.Now()
	var epoch int64
	owner, applied := 0, 0
	for i, op := range ops {
		o, ok := op.(store.OwnerOp)
		if !ok || o.OwnerEpoch() == 0 {
			continue
		}
		owner++
		epoch = o.OwnerEpoch()
		if err == nil && b.Results[i].Err == nil {
			applied++
		}
	}
	if owner > 0 {
		j.mu.Lock()
		fmt.Fprintf(j.out, "apply %d %d %d %d\n", start.UnixNano(), end.UnixNano(), epoch, applied)
		j.out.Flush()
		j.mu.Unlock()
	}
	return b, err
}

// arrival is a request the mock service received: when, for which unit,
// from which process, and when that run's handler started (Work.Started).
type arrival struct {
	// at is when the service counts it: the handler's start plus its
	// seeded wire delay (the arrival the service's Margin covers);
	// received when the mock received the call, later by the local HTTP
	// call's own latency, which on a loaded machine can exceed the Margin
	// (not asserted on, reported).
	at, received time.Time
	id           string
	pid          int
	started      time.Time
	tokens       int64
}

// mockService counts arrivals.
type mockService struct {
	mu       sync.Mutex
	arrivals []arrival
}

func (m *mockService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	pid, _ := strconv.Atoi(r.URL.Query().Get("pid"))
	started, _ := strconv.ParseInt(r.URL.Query().Get("started"), 10, 64)
	arrive, _ := strconv.ParseInt(r.URL.Query().Get("arrive"), 10, 64)
	tokens, _ := strconv.ParseInt(r.URL.Query().Get("tokens"), 10, 64)
	m.mu.Lock()
	m.arrivals = append(m.arrivals, arrival{time.Unix(0, arrive), received, r.URL.Query().Get("id"), pid, time.Unix(0, started), tokens})
	m.mu.Unlock()
}

func (m *mockService) snapshot() []arrival {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.arrivals)
}

// busiestWindow returns the most arrivals (sorted by when) whose instants
// fall in one failoverWindow, and the first window that holds more than
// failoverLimit (its index and count), or the busiest one's when none does.
func busiestWindow(arrivals []arrival, when func(arrival) time.Time) (most, first, count int) {
	for i := range arrivals {
		k := 0
		for j := i; j < len(arrivals) && when(arrivals[j]).Sub(when(arrivals[i])) < failoverWindow; j++ {
			k++
		}
		if k > most {
			most, first, count = k, i, k
		}
		if k > failoverLimit {
			return most, i, k
		}
	}
	return most, first, count
}

// busiestTokens returns the most tokens whose instants fall in one
// failoverWindow, and where that window begins.
func busiestTokens(arrivals []arrival, when func(arrival) time.Time) (most int64, first int) {
	for i := range arrivals {
		var sum int64
		for j := i; j < len(arrivals) && when(arrivals[j]).Sub(when(arrivals[i])) < failoverWindow; j++ {
			sum += arrivals[j].tokens
		}
		if sum > most {
			most, first = sum, i
		}
	}
	return most, first
}

// scheduler is a child process.
type scheduler struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	applies []applyLine
	done    chan struct{}
}

type applyLine struct {
	start, end time.Time
	epoch      int64
	applied    int
}

func startScheduler(t *testing.T, url, mock string, seed uint64) *scheduler {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RUNCUE_PG_CHILD=scheduler", "RUNCUE_PG_URL="+url, "RUNCUE_PG_MOCK="+mock,
		"RUNCUE_PG_SEED="+strconv.FormatUint(seed, 10))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &scheduler{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var a, b, e int64
			var n int
			if _, err := fmt.Sscanf(sc.Text(), "apply %d %d %d %d", &a, &b, &e, &n); err == nil {
				s.mu.Lock()
				s.applies = append(s.applies, applyLine{time.Unix(0, a), time.Unix(0, b), e, n})
				s.mu.Unlock()
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return s
}

func (s *scheduler) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	<-s.done
}

// ownerPID returns the PID of the live lease's holder, 0 if none.
func ownerPID(t *testing.T, st *postgres.Store) int {
	h, ok, err := st.Owner(context.Background())
	require.NoError(t, err)
	if !ok {
		return 0
	}
	return h.PID
}

// waitFor polls cond every 10 ms until it holds or a generous deadline
// passes (a liveness wait, not a measurement).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFailover: a scheduler and a standby in separate processes run units
// of a rate-limited service, with dependencies submitted in a random order
// (dependents before their dependencies); the scheduler is killed with
// SIGKILL five times, a new standby started each time. The mock service
// (counting an arrival at the handler's start plus its seeded 0-5 ms wire,
// as the Postgres and Hosts issues define it; the HTTP call's own latency
// is reported, not counted) never sees more than the limit arrive in any
// window (the runs each kill
// cut short arrive again, from the next owner), every unit is completed
// exactly once, and no dependent arrives before its dependency completed. Takeover times (from the kill to the next arrival from
// another process) are reported, not asserted.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the failover test kills schedulers for about 20 s")
	}
	ctx := context.Background()
	seed := rand.Uint64()
	if s := os.Getenv("RUNCUE_FAILOVER_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (RUNCUE_FAILOVER_SEED repeats it)", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	url := schemaURL(t)
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()

	// The submitter knows the task (as the schedulers register it); it
	// never starts, so it runs nothing.
	require.NoError(t, c.Service("api", failoverService))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, nil
	}}))
	const n = 240
	deps := map[string][]string{}
	var subs []runcue.Submission
	for i := range n {
		id := fmt.Sprintf("u%03d", i)
		s := runcue.Submission{Task: "t", ID: id}
		for range 2 {
			if i > 0 && rnd.IntN(3) == 0 {
				d := fmt.Sprintf("u%03d", rnd.IntN(i))
				if !slices.Contains(s.DependsOn, d) {
					s.DependsOn = append(s.DependsOn, d)
				}
			}
		}
		deps[id] = s.DependsOn
		subs = append(subs, s)
	}
	rnd.Shuffle(len(subs), func(i, j int) { subs[i], subs[j] = subs[j], subs[i] })
	_, err = c.SubmitBatch(ctx, costed(subs))
	require.NoError(t, err)

	mock := &mockService{}
	srv := httptest.NewServer(mock)
	defer srv.Close()
	schedulers := map[int]*scheduler{}
	add := func() {
		s := startScheduler(t, url, srv.URL, rnd.Uint64())
		schedulers[s.cmd.Process.Pid] = s
	}
	add()
	add()
	var takeovers []time.Duration
	for kill := range 5 {
		var owner int
		waitFor(t, "an owner that runs units", func() bool {
			owner = ownerPID(t, st)
			if owner == 0 || schedulers[owner] == nil {
				return false
			}
			for _, a := range mock.snapshot() {
				if a.pid == owner {
					return true
				}
			}
			return false
		})
		// Killed right after one of its runs arrived at the service, while
		// the run waits for the reply: its outcome is lost, and the next
		// owner runs it again once its lease has ended.
		time.Sleep(time.Duration(200+rnd.IntN(600)) * time.Millisecond)
		since := time.Now()
		waitFor(t, "an arrival of the owner's", func() bool {
			for _, a := range mock.snapshot() {
				if a.pid == owner && a.at.After(since) {
					return true
				}
			}
			return false
		})
		killed := time.Now()
		schedulers[owner].kill()
		delete(schedulers, owner)
		add()
		waitFor(t, "an arrival from another scheduler", func() bool {
			for _, a := range mock.snapshot() {
				if a.at.After(killed) && a.pid != owner {
					takeovers = append(takeovers, a.at.Sub(killed))
					return true
				}
			}
			return false
		})
		t.Logf("kill %d of pid %d; next arrival from another scheduler %v later", kill+1, owner, takeovers[len(takeovers)-1].Round(time.Millisecond))
	}
	waitFor(t, "every unit completed", func() bool {
		s, err := c.Stats(ctx)
		require.NoError(t, err)
		return s.States[runcue.StateCompleted] == n
	})
	for _, s := range schedulers {
		s.kill()
	}

	arrivals := mock.snapshot()
	slices.SortFunc(arrivals, func(a, b arrival) int { return a.at.Compare(b.at) })
	// The window, counted at arrival.
	require.NotEmpty(t, arrivals)
	most, at, k := busiestWindow(arrivals, func(a arrival) time.Time { return a.at })
	assert.LessOrEqual(t, k, failoverLimit, "arrivals in the window from %v", arrivals[at].at)
	tokens, tat := busiestTokens(arrivals, func(a arrival) time.Time { return a.at })
	assert.LessOrEqual(t, tokens, int64(failoverTokens), "tokens arriving in the window from %v", arrivals[tat].at)
	first := map[string]time.Time{}
	for _, a := range arrivals {
		if _, ok := first[a.id]; !ok {
			first[a.id] = a.at
		}
	}
	completedAt := map[string]time.Time{}
	outcomes := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("u%03d", i)
		wi, err := c.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State, id)
		completions := 0
		for _, a := range wi.Attempts {
			outcomes[a.Outcome]++
			if a.Outcome == "completed" {
				completions++
			}
		}
		assert.Equal(t, 1, completions, "completions of %s", id)
		completedAt[id] = wi.FinishedAt
		assert.Contains(t, first, id, "%s arrived at the service", id)
	}
	for id, ds := range deps {
		for _, d := range ds {
			assert.False(t, first[id].Before(completedAt[d]), "%s arrived at %v, before its dependency %s completed at %v", id, first[id], d, completedAt[d])
		}
	}
	var ms []string
	for _, d := range takeovers {
		ms = append(ms, d.Round(time.Millisecond).String())
	}
	byReceipt := slices.Clone(arrivals)
	slices.SortFunc(byReceipt, func(a, b arrival) int { return a.received.Compare(b.received) })
	rmost, _, _ := busiestWindow(byReceipt, func(a arrival) time.Time { return a.received })
	rtokens, _ := busiestTokens(byReceipt, func(a arrival) time.Time { return a.received })
	t.Logf("%d units, %d arrivals, at most %d in any %v (limit %d) and %d tokens (limit %d); as the mock received them, %d and %d; runs by outcome %v; takeovers (kill to next arrival): %s",
		n, len(arrivals), most, failoverWindow, failoverLimit, tokens, failoverTokens, rmost, rtokens, outcomes, strings.Join(ms, ", "))
}

// TestFencedAfterStop: a scheduler stopped with SIGSTOP past its lease's
// TTL is replaced by the standby; resumed, it stores no owner write: every
// Apply of its owner ops that starts after it resumed is refused
// (ErrNotOwner), and it starts no handler (its lease is not trusted). The
// service's window holds at the handlers' starts across the stop, and
// every unit completes once.
func TestFencedAfterStop(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the fencing test stops a scheduler for seconds")
	}
	ctx := context.Background()
	url := schemaURL(t)
	st, err := postgres.Open(ctx, url, postgres.Options{})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", failoverService))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, nil
	}}))
	const n = 120
	_, err = c.SubmitBatch(ctx, costed(batchOf("t", n)))
	require.NoError(t, err)
	mock := &mockService{}
	srv := httptest.NewServer(mock)
	defer srv.Close()
	a := startScheduler(t, url, srv.URL, 1)
	waitFor(t, "the first scheduler to own", func() bool { return ownerPID(t, st) == a.cmd.Process.Pid })
	b := startScheduler(t, url, srv.URL, 2)
	waitFor(t, "an arrival from the owner", func() bool {
		for _, x := range mock.snapshot() {
			if x.pid == a.cmd.Process.Pid {
				return true
			}
		}
		return false
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	waitFor(t, "the standby to take over", func() bool { return ownerPID(t, st) == b.cmd.Process.Pid })
	tookOver := time.Now()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	resumed := time.Now()
	waitFor(t, "every unit completed", func() bool {
		s, err := c.Stats(ctx)
		require.NoError(t, err)
		return s.States[runcue.StateCompleted] == n
	})
	time.Sleep(time.Second) // the resumed scheduler's last attempts
	assert.Equal(t, b.cmd.Process.Pid, ownerPID(t, st), "the standby still owns")
	a.kill()
	b.kill()

	a.mu.Lock()
	fenced := 0
	for _, l := range a.applies {
		if l.start.After(resumed) {
			assert.Zero(t, l.applied, "an owner write of the stopped scheduler (epoch %d) stored after it resumed", l.epoch)
			fenced++
		}
	}
	a.mu.Unlock()
	// The window is checked at the handlers' starts (the instant the
	// rate promise is about): a handler the freeze caught between its
	// start and its request reaches the service when the process resumes,
	// late by the freeze, which no scheduler can bound. The resumed
	// scheduler starts nothing: its lease is no longer trusted.
	arrivals := mock.snapshot()
	slices.SortFunc(arrivals, func(x, y arrival) int { return x.started.Compare(y.started) })
	require.NotEmpty(t, arrivals)
	if _, i, k := busiestWindow(arrivals, func(a arrival) time.Time { return a.started }); !assert.LessOrEqual(t, k, failoverLimit,
		"starts in the window from %v", arrivals[i].started) {
		for j := max(0, i-12); j < min(len(arrivals), i+k+2); j++ {
			x := arrivals[j]
			who := "standby"
			if x.pid == a.cmd.Process.Pid {
				who = "stopped"
			}
			t.Logf("start of %s by the %s scheduler at stop%+v, arrival at stop%+v (took over at stop%+v, resumed at stop%+v)", x.id, who,
				x.started.Sub(stopped), x.at.Sub(stopped), tookOver.Sub(stopped), resumed.Sub(stopped))
		}
	}
	tokens, ti := busiestTokens(arrivals, func(a arrival) time.Time { return a.started })
	assert.LessOrEqual(t, tokens, int64(failoverTokens), "tokens started in the window from %v", arrivals[ti].started)
	late := 0
	for _, x := range arrivals {
		if x.pid == a.cmd.Process.Pid && x.at.After(resumed) {
			late++
		}
		assert.False(t, x.pid == a.cmd.Process.Pid && x.started.After(tookOver), "the stopped scheduler started %s after the takeover", x.id)
	}
	s, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, s.States[runcue.StateCompleted])
	t.Logf("stopped %v until the standby owned, resumed %v after that; the resumed scheduler's owner Applies after resuming: %d, all refused; its arrivals after resuming (handlers started before the stop): %d",
		tookOver.Sub(stopped).Round(time.Millisecond), resumed.Sub(tookOver).Round(time.Millisecond), fenced, late)
}

func batchOf(task string, n int) []runcue.Submission {
	subs := make([]runcue.Submission, n)
	for i := range subs {
		subs[i] = runcue.Submission{Task: task, ID: fmt.Sprintf("%s%04d", task, i)}
	}
	return subs
}
