package runcue_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/hoststest"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// TestExecutorInProcess: a remote task's units run in an executor (here in
// this process, on its own handle of the database), and none is
// dispatched before an executor that runs the task lives.
func TestExecutorInProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	c, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("echo", runcue.Task{Remote: true}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	var subs []runcue.Submission
	for i := range 40 {
		subs = append(subs, runcue.Submission{ID: fmt.Sprintf("u%02d", i), Task: "echo", Target: fmt.Sprint(i)})
	}
	_, err = c.SubmitBatch(ctx, subs)
	require.NoError(t, err)
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	// An executor whose poll is not well inside MaxStartDelay (2 s) is
	// never assigned a run (NewExecutor refuses to make one: this one is
	// registered by hand, as another version might).
	_, err = st.Apply(ctx, []store.Op{&store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "slow", Tasks: []string{"echo"},
		Capacity: 4, Poll: time.Second, TTL: time.Hour}}})
	require.NoError(t, err)
	_, err = runcue.NewExecutor(st, runcue.ExecutorConfig{PollInterval: time.Second}, map[string]runcue.Handler{"echo": noop})
	require.ErrorIs(t, err, runcue.ErrInvalid)
	time.Sleep(200 * time.Millisecond) // a few of the scheduler's reads
	ex, err := c.Explain(ctx, "u00")
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonNoExecutor, ex.Reasons[0].Kind, "%+v", ex)

	var ran atomic.Int32
	x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{Capacity: 3, PollInterval: 10 * time.Millisecond, Logger: quietLogger},
		map[string]runcue.Handler{"echo": func(ctx context.Context, w *runcue.Work) (any, error) {
			ran.Add(1)
			return "echo " + w.Target, nil
		}})
	require.NoError(t, err)
	xctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(xctx) }()
	for _, s := range subs {
		wctx, cancel := context.WithTimeout(ctx, wait)
		info, err := c.Wait(wctx, s.ID)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, info.State)
		assert.JSONEq(t, fmt.Sprintf("%q", "echo "+s.Target), string(info.Result))
	}
	assert.EqualValues(t, 40, ran.Load())
	stop()
	require.NoError(t, <-done)
}

// openHostsDB opens the database of TestExecutorsAcrossProcesses (in its
// child processes too).
func openHostsDB(context.Context) (store.Store, error) {
	return sqlite.Open(os.Getenv("RUNCUE_HOSTS_DB"), sqlite.Options{})
}

// TestExecutorsAcrossProcesses: the executors' protocol on SQLite, with a
// scheduler, a standby and three executors in processes of their own (one
// executor's clock 250 ms off), at least 10 SIGKILLs of executors and 3 of
// the scheduler while the units run (see internal/hoststest).
func TestExecutorsAcrossProcesses(t *testing.T) {
	seed := testSeed(t, "RUNCUE_HOSTS_SEED")
	path := filepath.Join(t.TempDir(), "hosts.db")
	t.Setenv("RUNCUE_HOSTS_DB", path)
	hoststest.Run(t, openHostsDB, hoststest.Options{Env: []string{"RUNCUE_HOSTS_DB=" + path}, Units: 200,
		ExecutorKills: 10, SchedulerKills: 3, Skew: 250 * time.Millisecond, Seed: seed})
}

// TestExecutorNoRoom: two remote tasks share an executor of capacity one,
// so a run of one may find no room; it waits for it only until its
// handler's start deadline (MaxStartDelay after its dispatch), and then
// ends as a late start (nothing ran, no budget spent) and runs later.
func TestExecutorNoRoom(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	c, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, MaxStartDelay: 200 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 100, RateWindow: time.Second}))
	require.NoError(t, c.Task("a", runcue.Task{Remote: true, Services: []string{"api"}}))
	require.NoError(t, c.Task("b", runcue.Task{Remote: true, Services: []string{"api"}}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	release := make(chan struct{})
	started := make(chan string, 2)
	hold := func(ctx context.Context, w *runcue.Work) (any, error) {
		started <- w.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}
	x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{Capacity: 1, PollInterval: 10 * time.Millisecond, MaxStartDelay: 200 * time.Millisecond,
		Logger: quietLogger}, map[string]runcue.Handler{"a": hold, "b": hold})
	require.NoError(t, err)
	xctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(xctx) }()
	_, err = c.SubmitBatch(ctx, []runcue.Submission{{ID: "a1", Task: "a"}, {ID: "b1", Task: "b"}})
	require.NoError(t, err)
	var first string
	select {
	case first = <-started:
	case <-time.After(wait):
		t.Fatal("no handler started")
	}
	other := map[string]string{"a1": "b1", "b1": "a1"}[first]
	// The other run waits for room past its start deadline: a late start.
	for deadline := time.Now().Add(wait); ; {
		require.True(t, time.Now().Before(deadline), "%s never ended its wait for room", other)
		wi, err := c.Get(ctx, other)
		require.NoError(t, err)
		if len(wi.Attempts) > 0 {
			assert.Equal(t, "late_start", wi.Attempts[0].Outcome)
			assert.Zero(t, wi.Failures, "no budget spent")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	for _, id := range []string{"a1", "b1"} {
		wctx, cancel := context.WithTimeout(ctx, wait)
		wi, err := c.Wait(wctx, id)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State, id)
	}
	stop()
	require.NoError(t, <-done)
}

// TestExecutorRestartReportsFound: a process that takes an executor's name
// reports lost, without running them, the runs its first read finds: an
// earlier process of that name may have started one before its start
// report committed (it was killed in between), and running it again would
// reach the service twice under one run's count.
func TestExecutorRestartReportsFound(t *testing.T) {
	st, own := claimedUnit(t)
	// The earlier process of the name died: its heartbeat is stale (a TTL
	// of a millisecond), so the new process may take the name.
	applyAll(t, st,
		&store.RegisterExecutor{Executor: store.ExecutorRecord{ID: "ex", Tasks: []string{"call"}, Capacity: 4, Poll: 10 * time.Millisecond, TTL: time.Millisecond}},
		&store.Assign{Epoch: own.Epoch(), ID: "u1", Owner: "sched", Run: 1, Executor: "ex", StartBy: time.Now().Add(time.Hour), Timeout: time.Minute})
	var ran atomic.Int32
	x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{ID: "ex", PollInterval: 10 * time.Millisecond, Logger: quietLogger},
		map[string]runcue.Handler{"call": func(context.Context, *runcue.Work) (any, error) { ran.Add(1); return nil, nil }})
	require.NoError(t, err)
	stop := runExecutor(t, x)
	ending := endReported(t, st)
	stop()
	assert.Zero(t, ran.Load(), "the run found at the first read is not run again")
	assert.Contains(t, ending, `"lost":true`)
}

// claimedUnit opens a database, takes its ownership as "sched", and
// inserts and claims unit u1 of task "call" (run 1) there.
func claimedUnit(t *testing.T) (*sqlite.Store, store.Ownership) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	own, err := st.Acquire(t.Context(), store.Holder{Owner: "sched"})
	require.NoError(t, err)
	t.Cleanup(func() { own.Release() })
	at := time.Now()
	applyAll(t, st, &store.Insert{Units: []*store.Unit{{ID: "u1", Task: "call", State: store.Queued, CreatedAt: at}}, At: at},
		&store.Claim{Epoch: own.Epoch(), ID: "u1", Task: "call", Owner: "sched", Run: 1, At: at, LeaseExpires: at.Add(time.Hour)})
	return st, own
}

// applyAll applies ops in one batch, each of which must apply.
func applyAll(t *testing.T, st store.Store, ops ...store.Op) {
	b, err := st.Apply(t.Context(), ops)
	require.NoError(t, err)
	for i, r := range b.Results {
		require.True(t, r.Applied, "op %d", i)
	}
}

// runExecutor runs x until the returned stop, which waits for it.
func runExecutor(t *testing.T, x *runcue.Executor) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}

// endReported waits for the one assignment's end report and returns it.
func endReported(t *testing.T, st store.ExecutorStore) string {
	var rep []store.Assignment
	require.Eventually(t, func() bool {
		var err error
		rep, err = st.Reported(t.Context(), nil)
		require.NoError(t, err)
		return len(rep) == 1 && rep[0].State == store.AssignEnded
	}, wait, 5*time.Millisecond)
	return string(rep[0].Ending)
}

// TestExecutorStartGate: the start deadline is checked at the instant the
// handler would start, not only when the run was read and launched: here
// the start's reading is past the deadline (as a goroutine delayed on a
// loaded host, or a clock that jumped, would find it), and the run is reported a late start,
// its handler never called. Started, it would have been reported past its
// StartBy, and the scheduler counts such a start at StartBy: earlier than
// it happened, outside the windows it must count in.
func TestExecutorStartGate(t *testing.T) {
	ctx := t.Context()
	st, own := claimedUnit(t)
	var ran atomic.Int32
	x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{ID: "ex", PollInterval: 10 * time.Millisecond, Logger: quietLogger},
		map[string]runcue.Handler{"call": func(context.Context, *runcue.Work) (any, error) { ran.Add(1); return nil, nil }})
	require.NoError(t, err)
	var gates atomic.Int32
	runcue.StartReading(x, func(at time.Time) time.Time {
		gates.Add(1)
		return at.Add(2 * time.Second) // past the deadline
	})
	stop := runExecutor(t, x)
	// Assigned once the executor lives (an assignment made before would be
	// one of an earlier process of its name: see
	// TestExecutorRestartReportsFound).
	require.Eventually(t, func() bool {
		execs, _, err := st.Executors(ctx)
		require.NoError(t, err)
		return len(execs) == 1
	}, wait, 5*time.Millisecond)
	applyAll(t, st, &store.Assign{Epoch: own.Epoch(), ID: "u1", Task: "call", Owner: "sched", Run: 1, Executor: "ex",
		StartBy: time.Now().Add(time.Second), Timeout: time.Minute})
	ending := endReported(t, st)
	stop()
	assert.EqualValues(t, 1, gates.Load(), "launched once")
	assert.Zero(t, ran.Load(), "no handler starts past its deadline")
	assert.Contains(t, ending, `"late":true`)
	assert.Contains(t, ending, `"not_started":true`)
}

// TestExecutorLateStartFreesWindow: a run its executor reports a late
// start (nothing ran) gives its place in the rate window back, and its unit
// runs again at once; it is not counted as a start (at its StartBy: this
// service's window of one an hour would then hold the unit back an hour).
func TestExecutorLateStartFreesWindow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	c, err := runcue.Open(path, runcue.Config{PollInterval: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 1, RateWindow: time.Hour}))
	require.NoError(t, c.Task("call", runcue.Task{Remote: true, Services: []string{"api"}}))
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	var ran atomic.Int32
	x, err := runcue.NewExecutor(st, runcue.ExecutorConfig{PollInterval: 10 * time.Millisecond, Logger: quietLogger},
		map[string]runcue.Handler{"call": func(context.Context, *runcue.Work) (any, error) { ran.Add(1); return nil, nil }})
	require.NoError(t, err)
	var gates atomic.Int32
	runcue.StartReading(x, func(at time.Time) time.Time {
		if gates.Add(1) == 1 {
			return at.Add(time.Minute) // the first start's reading: past its deadline
		}
		return at
	})
	stop := runExecutor(t, x)
	defer stop()
	_, err = c.Submit(ctx, runcue.Submission{ID: "u1", Task: "call"})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	wi, err := c.Wait(wctx, "u1")
	require.NoError(t, err, "the unit waits for the window its late start did not use")
	assert.Equal(t, runcue.StateCompleted, wi.State)
	require.Len(t, wi.Attempts, 2)
	assert.Equal(t, "late_start", wi.Attempts[0].Outcome)
	assert.EqualValues(t, 1, ran.Load())
}
