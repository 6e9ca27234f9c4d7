package runcue_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// The faults a faultEnv's store injects, and their classes.
var (
	errTransient = errors.New("connection refused (injected)")
	errFlaky     = errors.New("disk I/O error (injected, flaky)")
	errFatal     = errors.New("database or disk is full (injected, fatal)")
)

// faultEnv is a Cue on a SQLite store wrapped in a FaultStore, on the real
// clock (the writer's retries pause on it).
type faultEnv struct {
	t  *testing.T
	fs *testutil.FaultStore
	c  *runcue.Cue

	mu     sync.Mutex
	events []runcue.Event
}

func newFaultEnv(t *testing.T) *faultEnv {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	fs := &testutil.FaultStore{Store: st, Class: func(err error) (store.Fault, bool) {
		switch {
		case errors.Is(err, errTransient):
			return store.Transient, true
		case errors.Is(err, errFlaky):
			return store.Flaky, true
		case errors.Is(err, errFatal):
			return store.Fatal, true
		}
		return 0, false
	}}
	c, err := runcue.New(fs, runcue.Config{Clock: clock.Real(), PollInterval: 10 * time.Millisecond, ShutdownTimeout: 200 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	e := &faultEnv{t: t, fs: fs, c: c}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	evs := c.Events(ctx)
	go func() {
		for ev := range evs {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		}
	}()
	return e
}

func (e *faultEnv) saw(typ runcue.EventType) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.events {
		if ev.Type == typ {
			return true
		}
	}
	return false
}

func (e *faultEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	require.Eventually(e.t, cond, wait, 5*time.Millisecond, what)
}

// TestTransientOutageRidden: while every write fails with a transient
// error, the owner keeps running: the handlers that started finish, their
// outcomes and the submissions made meanwhile wait in the writer, the
// Status says since when the store is unavailable, and once it answers
// everything is stored once and the Cue is ready again.
func TestTransientOutageRidden(t *testing.T) {
	e := newFaultEnv(t)
	ctx := boundedCtx(t)
	var mu sync.Mutex
	runs := map[string]int{}
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		runs[w.ID]++
		mu.Unlock()
		return w.ID, nil
	}}))
	_, err := e.c.SubmitBatch(ctx, batchOf("t", 50))
	require.NoError(t, err)
	require.NoError(t, e.c.Start(ctx))
	e.fs.Down(errTransient)
	submitted := make(chan error, 1)
	go func() {
		_, err := e.c.SubmitBatch(ctx, batchOf("t", 50)) // waits for the store
		submitted <- err
	}()
	e.eventually("the outage seen", func() bool { return !e.c.Status().StoreUnavailableSince.IsZero() })
	h := e.c.HealthHandler()
	probe := func(url string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
		return rec.Code
	}
	assert.Equal(t, http.StatusOK, probe("/healthz"), "an outage is live")
	assert.Equal(t, http.StatusServiceUnavailable, probe("/readyz?ready"), "not ready while the store fails")
	time.Sleep(200 * time.Millisecond) // retries meanwhile
	e.fs.Up()
	require.NoError(t, <-submitted)
	require.NoError(t, e.c.Drain(ctx))
	stats, err := e.c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 100, stats.States[runcue.StateCompleted])
	mu.Lock()
	for id, n := range runs {
		assert.Equal(t, 1, n, "%s ran once", id)
	}
	mu.Unlock()
	e.eventually("the outage's end seen", func() bool { return e.saw(runcue.EventStoreRecovered) })
	assert.True(t, e.saw(runcue.EventStoreUnavailable))
	s := e.c.Status()
	assert.Equal(t, runcue.RoleOwner, s.Role)
	assert.True(t, s.StoreUnavailableSince.IsZero())
	assert.Contains(t, s.LastError, "connection refused")
	assert.Equal(t, http.StatusOK, probe("/readyz?ready"))
	var body runcue.Status
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	assert.Equal(t, runcue.RoleOwner, body.Role)
}

// TestSubmitGivenUpDuringOutage: a Submit whose context ends during an
// outage returns ErrStoreUnavailable (and the context's error), and its
// unit is never stored, also once the store answers again; the same
// submission made again is stored once.
func TestSubmitGivenUpDuringOutage(t *testing.T) {
	e := newFaultEnv(t)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.fs.Down(errTransient)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := e.c.Submit(ctx, runcue.Submission{Task: "t", ID: "u"})
	require.ErrorIs(t, err, runcue.ErrStoreUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, runcue.ErrStoreFailed, "unavailable for now, not failed")
	err = e.c.Cancel(ctx, "u", runcue.CancelOptions{})
	assert.Error(t, err)
	e.fs.Up()
	require.NoError(t, runcue.SyncWriter(boundedCtx(t), e.c))
	_, err = e.c.Get(boundedCtx(t), "u")
	require.ErrorIs(t, err, runcue.ErrNotFound, "the withdrawn submission was not stored")
	sub, err := e.c.Submit(boundedCtx(t), runcue.Submission{Task: "t", ID: "u"})
	require.NoError(t, err)
	assert.False(t, sub.Duplicate)
}

// TestFlakyThenFatal: a flaky error (SQLITE_IOERR) is retried a bounded
// number of times, then the store is taken as failed: the owner stops
// dispatching, gives ownership up, and says why by the error's name.
func TestFlakyThenFatal(t *testing.T) {
	e := newFaultEnv(t)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Start(boundedCtx(t)))
	e.fs.Down(errFlaky)
	_, err := e.c.Submit(boundedCtx(t), runcue.Submission{Task: "t"})
	require.ErrorIs(t, err, runcue.ErrStoreFailed)
	assert.ErrorContains(t, err, "disk I/O error")
	e.eventually("the failure seen", func() bool { return e.c.Status().Role == runcue.RoleFailed })
	assert.Contains(t, e.c.Status().LastError, "disk I/O error")
	assert.GreaterOrEqual(t, e.fs.Applies(), 6, "tried 1 + MaxFlaky times")
	e.eventually("store_failed", func() bool { return e.saw(runcue.EventStoreFailed) })
	rec := httptest.NewRecorder()
	e.c.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "a failed store is not live")
	e.eventually("ownership given up", func() bool { return e.c.Owner() == "" })
	other, err := runcue.New(e.fs.Store, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Start(boundedCtx(t)), "another Cue takes the ownership the failed one gave up")
}

// TestFatalStops: a fatal error is not retried: the Cue stops with its name.
func TestFatalStops(t *testing.T) {
	e := newFaultEnv(t)
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Start(boundedCtx(t)))
	e.fs.Inject(testutil.Fault{Err: errFatal})
	applies := e.fs.Applies()
	_, err := e.c.Submit(boundedCtx(t), runcue.Submission{Task: "t"})
	require.ErrorIs(t, err, errFatal)
	assert.Equal(t, applies+1, e.fs.Applies(), "not retried")
	e.eventually("the failure seen", func() bool { return e.c.Status().Role == runcue.RoleFailed })
	assert.Contains(t, e.c.Status().LastError, "disk is full")
}

// TestSQLiteErrorsClassified: SQLite's own errors, made for real, are
// classified as the documented table says.
func TestSQLiteErrorsClassified(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	defer st.Close()
	// SQLITE_BUSY: another connection holds the write lock past the busy
	// timeout.
	holder, release := holdWriteLock(t, path)
	defer holder.Close()
	_, err = st.Apply(boundedCtx(t), []store.Op{&store.Insert{Units: []*store.Unit{{ID: "a", Task: "t"}}, At: time.Now()}})
	require.Error(t, err)
	assert.Equal(t, store.Transient, store.FaultOf(st, err), "%v", err)
	release()
	// A file that is not a database: fatal.
	bad := filepath.Join(dir, "bad.db")
	require.NoError(t, writeFile(bad, "this is not a database, and it is long enough to have a header of its own..........."))
	_, err = sqlite.Open(bad, sqlite.Options{})
	require.Error(t, err)
	assert.Equal(t, store.Fatal, store.FaultOf(st, err), "%v", err)
	assert.Equal(t, store.Transient, store.FaultOf(st, syscall.ECONNRESET))
	assert.Equal(t, store.Fatal, store.FaultOf(st, store.ErrSchemaTooNew))
	assert.Equal(t, store.Fatal, store.FaultOf(st, store.ErrRewound))
}

// TestUsedBounded: an amount reported above MaxCost counts as MaxCost, so
// that no report overflows a meter (math.MaxInt64 once turned a meter's
// count negative, after which it admitted everything).
func TestUsedBounded(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	started := 0
	require.NoError(t, e.c.Service("llm", runcue.Service{Meters: []runcue.Meter{{Name: "tokens", Limit: 1000, Window: time.Second}}}))
	require.NoError(t, e.c.Task("liar", runcue.Task{Services: []string{"llm"}, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		w.Used(runcue.Costs{"tokens": math.MaxInt64})
		return nil, nil
	}}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"llm"}, Handler: func(context.Context, *runcue.Work) (any, error) {
		mu.Lock()
		started++
		mu.Unlock()
		return nil, nil
	}}))
	e.start()
	id := e.submit("liar", func(s *runcue.Submission) { s.Cost = runcue.Costs{"tokens": 100} })
	e.wait(id)
	subs := batchOf("t", 20)
	for i := range subs {
		subs[i].Cost = runcue.Costs{"tokens": 100}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.settle()
	mu.Lock()
	assert.Zero(t, started, "the window holds what the liar reported")
	mu.Unlock()
	e.clk.Advance(1100 * time.Millisecond)
	e.settle()
	mu.Lock()
	assert.LessOrEqual(t, started, 10, "a window's 1000 tokens admit 10 units of 100")
	mu.Unlock()
}

// TestEstimatePanics: a task's Estimate that panics fails the submission
// with ErrInvalid; it does not panic through Submit or SubmitBatch.
func TestEstimatePanics(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop, Estimate: func(runcue.Submission) runcue.Costs { panic("bad estimate") }}))
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.ErrorIs(t, err, runcue.ErrInvalid)
	assert.ErrorContains(t, err, "bad estimate")
	_, err = e.c.SubmitBatch(e.ctx, batchOf("t", 3))
	require.ErrorIs(t, err, runcue.ErrInvalid)
}

// TestWriteLockHeldElsewhere: another process holds SQLite's write lock
// for 30 s (a long transaction, a backup tool, a shell): the owner's
// writes wait past the busy timeout and are retried (SQLITE_BUSY is
// transient); when the lock is released, everything submitted and run
// meanwhile is stored, each unit completed once.
func TestWriteLockHeldElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the lock is held for 30 s")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{BusyTimeout: time.Second})
	require.NoError(t, err)
	defer st.Close()
	c, err := runcue.New(st, runcue.Config{Clock: clock.Real(), Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	var mu sync.Mutex
	runs := map[string]int{}
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		runs[w.ID]++
		mu.Unlock()
		return nil, nil
	}}))
	ctx := boundedCtx(t)
	_, err = c.SubmitBatch(ctx, batchOf("t", 20))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Drain(ctx))
	_, release := holdWriteLock(t, path)
	submitted := make(chan error, 1)
	go func() {
		_, err := c.SubmitBatch(ctx, batchOf("t", 20)) // waits for the lock
		submitted <- err
	}()
	require.Eventually(t, func() bool { return !c.Status().StoreUnavailableSince.IsZero() }, wait, 10*time.Millisecond,
		"the owner's writes wait for the lock")
	time.Sleep(30 * time.Second)
	assert.Equal(t, runcue.RoleOwner, c.Status().Role, "still the owner")
	release()
	require.NoError(t, <-submitted)
	require.NoError(t, c.Drain(ctx))
	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 40, stats.States[runcue.StateCompleted])
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, runs, 40)
	for id, n := range runs {
		assert.Equal(t, 1, n, "%s ran once", id)
	}
}

// TestClaimRetriedPastStartDelay: a rate-limited start whose claim could
// not be stored (transient failures, retried, each attempt under the epoch
// it was decided in) until after MaxStartDelay becomes a late start: its
// handler never runs for that decision, the unit is requeued without
// spending budget, and it runs once. The window counts the starts the
// service sees: the late one, which it never saw, leaves no entry (as
// TestLateStartRequeued), so the unit's next run takes the place at once.
func TestClaimRetriedPastStartDelay(t *testing.T) {
	const lag = 500 * time.Millisecond
	clk := clock.NewFake(epoch)
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	fs := &testutil.FaultStore{Store: st}
	c, err := runcue.New(fs, runcue.Config{Clock: clk, MaxStartDelay: lag, PollInterval: 24 * time.Hour, Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	var mu sync.Mutex
	var starts []time.Time
	require.NoError(t, c.Service("api", runcue.Service{RateLimit: 1, RateWindow: time.Minute}))
	require.NoError(t, c.Task("t", runcue.Task{Services: []string{"api"}, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		starts = append(starts, w.Started)
		mu.Unlock()
		return nil, nil
	}}))
	claim := testutil.HasOp(func(op store.Op) bool { _, ok := op.(*store.Claim); return ok })
	for range 3 {
		fs.Inject(testutil.Fault{Err: syscall.ECONNRESET, Match: claim})
	}
	ctx := boundedCtx(t)
	require.NoError(t, c.Start(ctx))
	_, err = c.Submit(ctx, runcue.Submission{Task: "t", ID: "u"})
	require.NoError(t, err)
	// The writer pauses between attempts on the Cue's clock: move it on
	// until the claim is stored and the run ends as a late start.
	var wi runcue.WorkInfo
	require.Eventually(t, func() bool {
		clk.Advance(time.Second) // each attempt later than MaxStartDelay after the decision
		wi, err = c.Get(ctx, "u")
		require.NoError(t, err)
		return len(wi.Attempts) > 0
	}, wait, time.Millisecond, "the claim stored")
	require.NoError(t, runcue.Settle(ctx, c))
	assert.Equal(t, 3, fs.Consumed(), "the claim failed three times first")
	assert.Equal(t, "late_start", wi.Attempts[0].Outcome, "the first run, requeued")
	late := wi.Attempts[0]
	wi, err = c.Wait(ctx, "u")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Zero(t, wi.Failures, "no budget spent")
	mu.Lock()
	require.Len(t, starts, 1, "one start, the second run's")
	assert.False(t, starts[0].Before(late.End), "the handler never started for the late claim")
	mu.Unlock()
	ss, err := c.ServiceStatus(ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 1, ss.InWindow, "the window holds the start the service saw")
}

// boundedCtx is a context for a test's calls that ends well before the
// package's timeout: a call that would wait for ever fails its test,
// naming it, instead of hanging the package.
func boundedCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestCloseDuringOutage: Close of an owner whose store is down returns:
// its engine's wait for the writer ends when Close abandons it (after
// ShutdownTimeout), and the writer gives up what it could not store after
// its grace. What was not stored stays undone: the unit is queued (its
// claim, written behind the start, was lost) or running (recovered by the
// next owner), never completed.
func TestCloseDuringOutage(t *testing.T) {
	t.Parallel() // it waits for the writer's 10 s grace
	e := newFaultEnv(t)
	started := make(chan struct{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, _ *runcue.Work) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}}))
	require.NoError(t, e.c.Start(boundedCtx(t)))
	_, err := e.c.Submit(boundedCtx(t), runcue.Submission{Task: "t", ID: "u"})
	require.NoError(t, err)
	<-started
	e.fs.Down(errTransient) // its Finish, and anything after, waits
	closed := make(chan error, 1)
	go func() { closed <- e.c.Close() }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return while the store was down")
	}
	e.fs.Up()
	u, err := e.fs.Store.GetUnit(boundedCtx(t), "u")
	require.NoError(t, err)
	assert.Contains(t, []store.State{store.Queued, store.Running}, u.State, "its end was not stored")
	assert.Empty(t, u.Attempts, "no attempt recorded")
}
