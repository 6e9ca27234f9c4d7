package runcue_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store/sqlite"
)

func (e *env) running() []string {
	e.t.Helper()
	page, err := e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateRunning}, Limit: 1000})
	require.NoError(e.t, err)
	var ids []string
	for _, u := range page.Units {
		ids = append(ids, u.ID)
	}
	return ids
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Stop(e.ctx), "Stop before Start")
	require.NoError(t, e.c.StopAndCancel(e.ctx), "StopAndCancel before Start")
	e.start()
	owner := e.c.Owner()
	require.NotEmpty(t, owner)
	require.NoError(t, e.c.Start(e.ctx), "Start twice")
	assert.Equal(t, owner, e.c.Owner(), "the second Start changed nothing")
	id := e.submit("t")
	assert.Equal(t, runcue.StateCompleted, e.wait(id).State)
	require.NoError(t, e.c.Stop(e.ctx))
	require.NoError(t, e.c.Stop(e.ctx), "Stop twice")
	assert.Empty(t, e.c.Owner())

	// A stopped Cue can start again, and ownership was released.
	id = e.submit("t")
	assert.Equal(t, runcue.StateQueued, e.get(id).State)
	e.start()
	assert.Equal(t, runcue.StateCompleted, e.wait(id).State)
	assert.Equal(t, 1, e.get(id).Runs, "nothing runs twice")

	require.NoError(t, e.c.Close())
	require.NoError(t, e.c.Close(), "Close twice")
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t"})
	assert.ErrorIs(t, err, runcue.ErrClosed)
	_, err = e.c.Get(e.ctx, id)
	assert.ErrorIs(t, err, runcue.ErrClosed)
	assert.ErrorIs(t, e.c.Start(e.ctx), runcue.ErrClosed)
	assert.ErrorIs(t, e.c.Task("u", runcue.Task{Handler: noop}), runcue.ErrClosed)
}

func TestRegistration(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	require.NoError(t, c.Service("api", runcue.Service{MaxConcurrent: 5, RateLimit: 60, RateWindow: time.Minute}))
	assert.ErrorIs(t, c.Service("api", runcue.Service{}), runcue.ErrInvalid, "duplicate service")
	assert.ErrorIs(t, c.Service("", runcue.Service{}), runcue.ErrInvalid)
	for _, bad := range []runcue.Service{
		{MaxConcurrent: -1},
		{RateLimit: 10},
		{RateWindow: time.Second},
		{RateLimit: 1, RateWindow: time.Microsecond},
		{RateLimit: 1, RateWindow: 30 * 24 * time.Hour},
		{CircuitThreshold: 3},
		{CircuitTimeout: time.Second},
	} {
		assert.ErrorIs(t, c.Service("bad", bad), runcue.ErrInvalid, "%+v", bad)
	}
	require.NoError(t, c.Task("fetch", runcue.Task{Services: []string{"api"}, Handler: noop}))
	assert.ErrorIs(t, c.Task("fetch", runcue.Task{Handler: noop}), runcue.ErrInvalid, "duplicate task")
	assert.ErrorIs(t, c.Task("", runcue.Task{Handler: noop}), runcue.ErrInvalid, "empty name")
	assert.ErrorIs(t, c.Task("x", runcue.Task{}), runcue.ErrInvalid, "no handler")
	assert.ErrorIs(t, c.Task("x", runcue.Task{Services: []string{"nope"}, Handler: noop}), runcue.ErrUnknownService)
	assert.ErrorIs(t, c.Task("x", runcue.Task{Services: []string{"api", "api"}, Handler: noop}), runcue.ErrInvalid)
	assert.ErrorIs(t, c.Task("x", runcue.Task{Handler: noop, Retry: runcue.RetryPolicy{MaxAttempts: -1}}), runcue.ErrInvalid)

	// Definitions are stored: another process can submit without handlers.
	st, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	tasks, err := st.Tasks(e.ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"services":["api"]}`, string(tasks["fetch"]))
	svcs, err := st.Services(e.ctx)
	require.NoError(t, err)
	require.Len(t, svcs, 1)
	assert.JSONEq(t, fmt.Sprintf(`{"max_concurrent":5,"rate_limit":60,"rate_window":%d}`, time.Minute), string(svcs[0].Def))

	other := e.open(runcue.Config{})
	_, err = other.Submit(e.ctx, runcue.Submission{Task: "fetch"})
	require.NoError(t, err, "a task registered by another Cue is known")
	_, err = other.Submit(e.ctx, runcue.Submission{Task: "never-registered"})
	assert.ErrorIs(t, err, runcue.ErrUnknownTask)
}

func TestSubmitBeforeStart(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(_ context.Context, w *runcue.Work) (any, error) {
		var p struct{ N int }
		if err := w.Bind(&p); err != nil {
			return nil, err
		}
		return map[string]any{"double": p.N * 2, "target": w.Target, "attempt": w.Attempt}, nil
	}}))
	var ids []string
	for i := range 3 {
		ids = append(ids, e.submit("t", func(s *runcue.Submission) { s.Target = fmt.Sprint("doc-", i); s.Params = map[string]int{"N": i} }))
	}
	for _, id := range ids {
		wi := e.get(id)
		assert.Equal(t, runcue.StateQueued, wi.State)
		assert.Equal(t, "t", wi.Task)
		assert.True(t, wi.CreatedAt.Equal(epoch))
	}
	page, err := e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}})
	require.NoError(t, err)
	assert.Len(t, page.Units, 3)
	short, cancel := context.WithTimeout(e.ctx, 20*time.Millisecond)
	_, err = e.c.Wait(short, ids[0])
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "nothing runs before Start")

	e.start()
	for i, id := range ids {
		wi := e.wait(id)
		assert.Equal(t, runcue.StateCompleted, wi.State)
		assert.JSONEq(t, fmt.Sprintf(`{"double":%d,"target":"doc-%d","attempt":1}`, i*2, i), string(wi.Result))
		assert.Equal(t, 1, wi.Runs)
		require.Len(t, wi.Attempts, 1)
		assert.Equal(t, "completed", wi.Attempts[0].Outcome)
		assert.Empty(t, wi.LeasedBy, "the lease is released")
	}
}

func TestIDs(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	var prev string
	for range 50 {
		id := e.submit("t")
		assert.Len(t, id, 26)
		assert.Greater(t, id, prev, "generated IDs are time-ordered")
		prev = id
	}
	id := e.submit("t", func(s *runcue.Submission) { s.ID = "invoice-42" })
	assert.Equal(t, "invoice-42", id)
	_, err := e.c.Submit(e.ctx, runcue.Submission{Task: "t", ID: "invoice-42"})
	assert.ErrorIs(t, err, runcue.ErrDuplicateID)
	_, err = e.c.Submit(e.ctx, runcue.Submission{Task: "t", ID: strings.Repeat("x", 256)})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}

func TestSubmitValidation(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	for name, s := range map[string]runcue.Submission{
		"no task":          {},
		"unencodable":      {Task: "t", Params: make(chan int)},
		"negative timeout": {Task: "t", Timeout: -time.Second},
		"bad raw JSON":     {Task: "t", Params: json.RawMessage(`{"a":`)},
	} {
		_, err := e.c.Submit(e.ctx, s)
		assert.ErrorIs(t, err, runcue.ErrInvalid, name)
	}
	raw := e.submit("t", func(s *runcue.Submission) { s.Params = json.RawMessage(`{"kept":"as is"}`) })
	assert.JSONEq(t, `{"kept":"as is"}`, string(e.get(raw).Params))
}

func TestSubmitBatchAllOrNone(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.submit("t", func(s *runcue.Submission) { s.ID = "taken" })
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "t", ID: "fresh-1"}, {Task: "t", ID: "taken"}, {Task: "t", ID: "fresh-2"}})
	require.ErrorIs(t, err, runcue.ErrDuplicateID)
	for _, id := range []string{"fresh-1", "fresh-2"} {
		_, err := e.c.Get(e.ctx, id)
		assert.ErrorIs(t, err, runcue.ErrNotFound, id)
	}
	out, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "t"}, {Task: "t", ID: "b"}})
	require.NoError(t, err)
	require.Len(t, out, 2)
	assert.Equal(t, "b", out[1].ID)
	_, err = e.c.SubmitBatch(e.ctx, []runcue.Submission{{Task: "t"}, {Task: "missing"}})
	assert.ErrorIs(t, err, runcue.ErrUnknownTask)
	_, err = e.c.Get(e.ctx, "nope")
	assert.ErrorIs(t, err, runcue.ErrNotFound)
	_, err = e.c.Wait(e.ctx, "nope")
	assert.ErrorIs(t, err, runcue.ErrNotFound)
}

func TestRunAt(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	later := e.submit("t", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
	now := e.submit("t")
	assert.Equal(t, runcue.StateCompleted, e.wait(now).State)
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(later).State)

	short, cancel := context.WithTimeout(e.ctx, 20*time.Millisecond)
	assert.ErrorIs(t, e.c.Drain(short), context.DeadlineExceeded, "a unit waiting for its RunAt holds Drain")
	cancel()

	e.clk.Advance(59 * time.Minute)
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(later).State, "not before RunAt")
	e.clk.Advance(time.Minute)
	wi := e.wait(later)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.True(t, wi.StartedAt.Equal(epoch.Add(time.Hour)))
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestEvents(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("ok", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		return map[string]string{"answer": "42"}, nil
	}}))
	require.NoError(t, e.c.Task("bad", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		return nil, runcue.Permanent(errors.New("invalid input"))
	}}))
	rec := record(t, e.c)
	e.start()
	ok := e.submit("ok")
	bad := e.submit("bad")
	e.wait(ok)
	e.wait(bad)
	evs := rec.waitFor(t, 6, func(runcue.Event) bool { return true })
	var last int64
	got := map[string][]runcue.EventType{}
	for _, ev := range evs {
		assert.Greater(t, ev.Seq, last, "sequence numbers increase")
		last = ev.Seq
		assert.True(t, ev.Time.Equal(epoch), "event time is the Cue's clock")
		got[ev.WorkID] = append(got[ev.WorkID], ev.Type)
		switch ev.Type {
		case runcue.EventWorkQueued:
			assert.Zero(t, ev.Attempt)
		case runcue.EventWorkStarted:
			assert.Equal(t, 1, ev.Attempt)
		case runcue.EventWorkCompleted:
			assert.Equal(t, "ok", ev.Task)
			assert.JSONEq(t, `{"answer":"42"}`, string(ev.Result))
		case runcue.EventWorkFailed:
			assert.Equal(t, "bad", ev.Task)
			assert.Equal(t, "invalid input", ev.Error)
			assert.Equal(t, "error", ev.ErrorKind)
			assert.False(t, ev.WillRetry)
			assert.Equal(t, 1, ev.Attempt)
		}
	}
	want := []runcue.EventType{runcue.EventWorkQueued, runcue.EventWorkStarted}
	assert.Equal(t, append(want, runcue.EventWorkCompleted), got[ok])
	assert.Equal(t, append(want, runcue.EventWorkFailed), got[bad])
	assert.Equal(t, "work_queued", string(runcue.EventWorkQueued), "event names are stable strings")
	assert.Equal(t, "completed", string(runcue.StateCompleted), "state names are stable strings")
}

func TestEventsChannelCloses(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	ctx, cancel := context.WithCancel(e.ctx)
	ch := e.c.Events(ctx)
	cancel()
	for range ch {
	}
	ch = e.c.Events(e.ctx)
	require.NoError(t, e.c.Close())
	for range ch {
	}
	_, open := <-e.c.Events(e.ctx)
	assert.False(t, open, "a closed Cue's event channel is closed")
}

func TestHandlerPanic(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("boom", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: func(context.Context, *runcue.Work) (any, error) {
		var m map[string]int
		//lint:ignore SA5000 the handler panics on purpose
		m["x"] = 1 // nil map write
		return nil, nil
	}}))
	require.NoError(t, e.c.Task("fine", runcue.Task{Handler: noop}))
	e.start()
	bad := e.submit("boom")
	wi := e.wait(bad)
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, "panic", wi.ErrorKind)
	assert.Contains(t, wi.Error, "assignment to entry in nil map")
	assert.Contains(t, wi.Error, "goroutine", "the stack is recorded")
	assert.Equal(t, "panic", wi.Attempts[0].Outcome)
	good := e.submit("fine")
	assert.Equal(t, runcue.StateCompleted, e.wait(good).State, "the Cue keeps running")

	// A result that cannot be encoded fails the run permanently.
	require.NoError(t, e.c.Task("unencodable", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		return make(chan int), nil
	}}))
	u := e.wait(e.submit("unencodable"))
	assert.Equal(t, runcue.StateFailed, u.State)
	assert.Equal(t, 1, u.Runs, "never retried")
	assert.Contains(t, u.Error, "encode result")
}

// TestHandlerGoexit: a handler that calls runtime.Goexit (as t.FailNow in a
// shared test helper does) is recorded as failed at once, not at its
// deadline, and Stop returns.
func TestHandlerGoexit(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("exits", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 1}, Handler: func(context.Context, *runcue.Work) (any, error) {
		runtime.Goexit()
		return nil, nil
	}}))
	e.start()
	wi := e.wait(e.submit("exits")) // the fake clock never reaches the deadline
	assert.Equal(t, runcue.StateFailed, wi.State)
	assert.Equal(t, "panic", wi.ErrorKind)
	assert.Contains(t, wi.Error, "runtime.Goexit")
	require.NoError(t, e.c.Stop(e.ctx))
}

func TestUnknownTaskInStore(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	// A process that knows the "ghost" task submits work, then goes away.
	require.NoError(t, e.c.Task("ghost", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Task("known", runcue.Task{Handler: noop}))
	g1 := e.submit("ghost")
	g2 := e.submit("ghost")
	k := e.submit("known")
	require.NoError(t, e.c.Close())

	c := e.open(runcue.Config{})
	require.NoError(t, c.Task("known", runcue.Task{Handler: noop}))
	require.NoError(t, c.Start(e.ctx))
	_, err := c.Wait(e.ctx, k)
	require.NoError(t, err)
	require.NoError(t, c.Drain(e.ctx), "units this Cue cannot run do not hold Drain")
	for _, id := range []string{g1, g2} {
		wi, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateQueued, wi.State, "left queued, never failed")
	}
	assert.Contains(t, e.logs.String(), "task_type=ghost")
	// Registering the task later makes its units runnable.
	require.NoError(t, c.Task("ghost", runcue.Task{Handler: noop}))
	for _, id := range []string{g1, g2} {
		wi, err := c.Wait(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "photo.jpg")
	require.NoError(t, os.WriteFile(notDB, []byte(strings.Repeat("\xff\xd8\xff not sqlite ", 300)), 0o644))
	_, err := runcue.Open(notDB, runcue.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), notDB)

	newer := filepath.Join(dir, "newer.db")
	c, err := runcue.Open(newer, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	db, err := sql.Open("sqlite", newer)
	require.NoError(t, err)
	_, err = db.Exec(fmt.Sprintf("PRAGMA user_version = %d", sqlite.SchemaVersion+1))
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = runcue.Open(newer, runcue.Config{})
	assert.ErrorIs(t, err, runcue.ErrSchemaTooNew)
}

func TestStoreFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	fs := &testutil.FailStore{Store: st}
	logs := &syncBuffer{}
	e := &env{t: t, path: path, ctx: context.Background(), logs: logs}
	c, err := runcue.New(fs, runcue.Config{Logger: slogTo(logs)})
	require.NoError(t, err)
	e.c = c
	g := newGate()
	require.NoError(t, c.Task("t", runcue.Task{Handler: g.handler}))
	done := e.submit("t")
	rec := record(t, c)
	e.start()
	g.next(t)
	g.release <- nil
	e.wait(done)
	stuck := e.submit("t")
	g.next(t)
	queued := e.submit("t", func(s *runcue.Submission) { s.RunAt = time.Now().Add(time.Hour) })

	fs.Fail()
	g.release <- nil // its completion cannot be stored
	evs := rec.waitFor(t, 1, ofType(runcue.EventStoreFailed, ""))
	assert.Contains(t, evs[0].Error, "injected")
	assert.Zero(t, evs[0].Seq, "not durable")
	_, err = c.Submit(e.ctx, runcue.Submission{Task: "t"})
	assert.ErrorIs(t, err, runcue.ErrStoreFailed)
	assert.ErrorIs(t, err, testutil.ErrInjected)
	applies := fs.Applies()
	_, err = c.Submit(e.ctx, runcue.Submission{Task: "t"})
	assert.ErrorIs(t, err, runcue.ErrStoreFailed)
	assert.Equal(t, applies, fs.Applies(), "after a failure, writes fail fast")
	assert.Contains(t, logs.String(), "store failed")
	require.NoError(t, c.Stop(e.ctx))
	require.NoError(t, c.Close())
	require.NoError(t, st.Close())

	// Nothing committed is lost; a new owner finishes the work.
	c2, err := runcue.Open(path, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.Task("t", runcue.Task{Handler: noop}))
	wi, err := c2.Get(e.ctx, done)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	wi, err = c2.Get(e.ctx, stuck)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateRunning, wi.State, "its completion was not stored")
	require.NoError(t, c2.Start(e.ctx))
	wi, err = c2.Wait(e.ctx, stuck)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, 2, wi.Runs)
	wi, err = c2.Get(e.ctx, queued)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateQueued, wi.State)
}

func TestTwoCues(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	a := e.c
	var runs atomic.Int64
	require.NoError(t, a.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) {
		runs.Add(1)
		return nil, nil
	}}))
	b := e.open(runcue.Config{})
	rec := record(t, a)
	require.NoError(t, a.Start(e.ctx))
	err := b.Start(e.ctx)
	require.ErrorIs(t, err, runcue.ErrLocked)
	var le *runcue.LockedError
	require.ErrorAs(t, err, &le)
	host, _ := os.Hostname()
	assert.Equal(t, os.Getpid(), le.Holder.PID)
	assert.Equal(t, host, le.Holder.Host)
	assert.True(t, le.Holder.Since.Equal(epoch))
	assert.Equal(t, a.Owner(), le.Holder.Owner)

	// Both submit and read; the owner runs everything exactly once.
	var ids []string
	for i := range 40 {
		c := a
		if i%2 == 1 {
			c = b
		}
		out, err := c.Submit(e.ctx, runcue.Submission{Task: "t"})
		require.NoError(t, err)
		ids = append(ids, out.ID)
	}
	require.NoError(t, runcue.PollNow(e.ctx, a)) // or wait PollInterval
	for _, id := range ids {
		wi, err := a.Wait(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, 1, wi.Runs)
	}
	// b learns of completions by polling.
	e.clk.Advance(time.Second)
	for _, id := range ids {
		wi, err := b.Wait(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State)
	}
	assert.Equal(t, int64(40), runs.Load(), "no unit dispatched twice")
	starts := rec.waitFor(t, 40, ofType(runcue.EventWorkStarted, ""))
	seen := map[string]bool{}
	for _, ev := range starts {
		assert.False(t, seen[ev.WorkID], "one start per unit")
		seen[ev.WorkID] = true
	}
	// The owner's event stream includes what the other Cue committed, in order.
	queued := rec.waitFor(t, 40, ofType(runcue.EventWorkQueued, ""))
	assert.Len(t, queued, 40)
	evs := rec.all()
	for i := 1; i < len(evs); i++ {
		assert.Equal(t, evs[i-1].Seq+1, evs[i].Seq, "no gap in the owner's stream")
	}
}

func TestPollPicksUpExternalWork(t *testing.T) {
	e := newEnv(t, runcue.Config{PollInterval: 250 * time.Millisecond})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	e.start()
	other := e.open(runcue.Config{})
	out, err := other.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(out.ID).State, "not seen before the poll")
	e.clk.Advance(250 * time.Millisecond)
	assert.Equal(t, runcue.StateCompleted, e.wait(out.ID).State, "picked up at the poll")
}

func TestConcurrencyCaps(t *testing.T) {
	e := newEnv(t, runcue.Config{MaxConcurrent: 4})
	g := newGate()
	require.NoError(t, e.c.Service("s", runcue.Service{MaxConcurrent: 2}))
	require.NoError(t, e.c.Task("a", runcue.Task{Services: []string{"s"}, Handler: g.handler}))
	require.NoError(t, e.c.Task("b", runcue.Task{Services: []string{"s"}, Handler: g.handler}))
	require.NoError(t, e.c.Task("capped", runcue.Task{MaxConcurrent: 1, Handler: g.handler}))
	require.NoError(t, e.c.Task("free", runcue.Task{Handler: g.handler}))
	for range 5 {
		e.submit("a")
		e.submit("b")
		e.submit("capped")
	}
	e.start()
	e.settle()
	count := func() map[string]int {
		m := map[string]int{}
		for _, id := range e.running() {
			m[e.get(id).Task]++
		}
		return m
	}
	c := count()
	assert.Equal(t, 2, c["a"]+c["b"], "service cap")
	assert.Equal(t, 1, c["capped"], "task cap")
	assert.Len(t, e.running(), 3)
	// A free task fills the global cap, and no more.
	e.submit("free")
	e.submit("free")
	e.settle()
	assert.Len(t, e.running(), 4, "global cap")
	assert.Equal(t, 1, count()["free"])
	// After each completion the freed capacity is refilled at once: while
	// units of a group wait, the group's cap is full.
	rec := record(t, e.c)
	queuedOf := func(task string) int {
		page, err := e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateQueued}, Tasks: []string{task}})
		require.NoError(t, err)
		return len(page.Units)
	}
	for done := 1; done <= 17; done++ {
		g.release <- nil
		rec.waitFor(t, done, ofType(runcue.EventWorkCompleted, ""))
		e.settle()
		c := count()
		total := c["a"] + c["b"] + c["capped"] + c["free"]
		assert.LessOrEqual(t, total, 4)
		assert.LessOrEqual(t, c["a"]+c["b"], 2)
		assert.LessOrEqual(t, c["capped"], 1)
		if queuedOf("a")+queuedOf("b") > 0 {
			assert.Equal(t, 2, c["a"]+c["b"], "service slots refilled after completion %d", done)
		}
		if queuedOf("capped") > 0 {
			assert.Equal(t, 1, c["capped"], "task slot refilled after completion %d", done)
		}
	}
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestNoHeadOfLineBlocking(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("slow", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("blocked", runcue.Task{Services: []string{"slow"}, Handler: g.handler}))
	require.NoError(t, e.c.Task("other", runcue.Task{Handler: noop}))
	for range 10 {
		e.submit("blocked")
	}
	later := e.submit("other")
	e.start()
	assert.Equal(t, runcue.StateCompleted, e.wait(later).State, "a full service does not hold up other work")
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
}

func TestStopWaitsForHandlers(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	id := e.submit("t")
	queued := e.submit("t", func(s *runcue.Submission) { s.RunAt = epoch.Add(time.Hour) })
	e.start()
	g.next(t)
	short, cancel := context.WithTimeout(e.ctx, 30*time.Millisecond)
	assert.ErrorIs(t, e.c.Stop(short), context.DeadlineExceeded, "Stop waits for the running handler")
	cancel()
	assert.ErrorIs(t, e.c.Start(e.ctx), runcue.ErrStopping)
	g.release <- nil
	require.NoError(t, e.c.Stop(e.ctx))
	assert.Equal(t, runcue.StateCompleted, e.get(id).State, "its outcome is stored before Stop returns")
	assert.Equal(t, runcue.StateQueued, e.get(queued).State)
	e.clk.Advance(2 * time.Hour)
	e.settle()
	assert.Equal(t, runcue.StateQueued, e.get(queued).State, "nothing is dispatched after Stop")
}

func TestStopAndCancel(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	var succeed atomic.Bool
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		if succeed.Load() {
			return "done", nil
		}
		return g.handler(ctx, w)
	}}))
	rec := record(t, e.c)
	ids := []string{e.submit("t"), e.submit("t"), e.submit("t")}
	e.start()
	for range 3 {
		g.next(t)
	}
	require.NoError(t, e.c.StopAndCancel(e.ctx))
	for _, id := range ids {
		wi := e.get(id)
		assert.Equal(t, runcue.StateQueued, wi.State)
		assert.Equal(t, 1, wi.Runs)
		assert.Zero(t, wi.Failures, "no retry budget spent")
		require.Len(t, wi.Attempts, 1)
		assert.Equal(t, "interrupted", wi.Attempts[0].Outcome)
		assert.Contains(t, wi.Attempts[0].Error, "shutting down")
	}
	evs := rec.waitFor(t, 3, ofType(runcue.EventWorkRequeued, ""))
	assert.Equal(t, "shutdown", evs[0].Reason)
	succeed.Store(true)
	e.start()
	for _, id := range ids {
		wi := e.wait(id)
		assert.Equal(t, runcue.StateCompleted, wi.State)
		assert.Equal(t, 2, wi.Runs)
	}
}

func TestStopAndCancelKeepsSuccess(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	started := make(chan struct{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		close(started)
		<-ctx.Done()
		assert.ErrorIs(t, context.Cause(ctx), runcue.ErrShutdown)
		return "finished anyway", nil
	}}))
	id := e.submit("t")
	e.start()
	<-started
	require.NoError(t, e.c.StopAndCancel(e.ctx))
	wi := e.get(id)
	assert.Equal(t, runcue.StateCompleted, wi.State, "a handler that succeeds after cancellation is completed")
	assert.JSONEq(t, `"finished anyway"`, string(wi.Result))
}

func TestStartContextCancel(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	id := e.submit("t")
	ctx, cancel := context.WithCancel(e.ctx)
	require.NoError(t, e.c.Start(ctx))
	g.next(t)
	cancel()
	require.NoError(t, e.c.Stop(e.ctx)) // waits for the stop that cancel began
	assert.Empty(t, e.c.Owner())
	wi := e.get(id)
	assert.Equal(t, runcue.StateQueued, wi.State, "cancelling Start's context is StopAndCancel")
	assert.Equal(t, "interrupted", wi.Attempts[0].Outcome)
}

func TestCloseAbandonsStuckHandlers(t *testing.T) {
	e := newEnv(t, runcue.Config{ShutdownTimeout: 50 * time.Millisecond})
	stuck := make(chan struct{})
	started := make(chan struct{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
		close(started)
		<-stuck // ignores its context
		return nil, nil
	}}))
	id := e.submit("t")
	e.start()
	<-started
	err := e.c.Close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "did not stop")
	close(stuck)
	// The unit is left running for the next owner to recover.
	c := e.open(runcue.Config{})
	require.NoError(t, c.Task("t", runcue.Task{Handler: noop}))
	wi, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateRunning, wi.State)
	rec := record(t, c)
	require.NoError(t, c.Start(e.ctx))
	wi, err = c.Wait(e.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, "abandoned", wi.Attempts[0].Outcome)
	rec.waitFor(t, 1, ofType(runcue.EventWorkRecovered, id))
}

// TestDrainWaitsForCommit: Drain returns only once the last completion is
// committed, so that what it reports is what the database holds.
func TestDrainWaitsForCommit(t *testing.T) {
	e, hs := newHeldEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	e.start()
	id := e.submit("t")
	require.Equal(t, id, g.next(t))
	fin := hs.Hold(finishOf(id))
	drained := make(chan error, 1)
	go func() { drained <- e.c.Drain(e.ctx) }()
	for e.inspect().Drains == 0 {
	} // Drain is waiting
	g.release <- nil
	<-fin.Entered // the handler returned; its completion is not committed
	assert.Equal(t, 1, e.inspect().Drains, "Drain returned before the completion was committed")
	fin.Release()
	require.NoError(t, <-drained)
	assert.Equal(t, runcue.StateCompleted, e.get(id).State)
}

func TestDrain(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	e.start()
	require.NoError(t, e.c.Drain(e.ctx), "nothing to do")
	id := e.submit("t")
	g.next(t)
	drained := make(chan error, 1)
	go func() { drained <- e.c.Drain(e.ctx) }()
	e.settle()
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v while a unit runs", err)
	default:
	}
	g.release <- nil
	require.NoError(t, <-drained)
	assert.Equal(t, runcue.StateCompleted, e.get(id).State, "Drain returns after the outcome is stored")

	// A Cue that does not own the database drains by watching it.
	other := e.open(runcue.Config{})
	require.NoError(t, other.Task("t", runcue.Task{Handler: noop}))
	id2, err := other.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)
	go func() { drained <- other.Drain(e.ctx) }()
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	g.next(t)
	g.release <- nil
	e.wait(id2.ID)
	e.clk.Advance(time.Second) // other's poll sees the completion
	require.NoError(t, <-drained)
}

func TestList(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("a", runcue.Task{Handler: noop}))
	require.NoError(t, e.c.Task("b", runcue.Task{Handler: noop}))
	var ids []string
	for i := range 25 {
		ids = append(ids, e.submit([]string{"a", "b"}[i%2]))
	}
	var got []string
	cursor := ""
	pages := 0
	for {
		page, err := e.c.List(e.ctx, runcue.ListOptions{Limit: 10, Cursor: cursor})
		require.NoError(t, err)
		pages++
		for _, u := range page.Units {
			got = append(got, u.ID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	assert.Equal(t, 3, pages)
	assert.Equal(t, ids, got)
	page, err := e.c.List(e.ctx, runcue.ListOptions{Newest: true, Limit: 3, Tasks: []string{"b"}})
	require.NoError(t, err)
	require.Len(t, page.Units, 3)
	assert.Equal(t, []string{ids[23], ids[21], ids[19]}, []string{page.Units[0].ID, page.Units[1].ID, page.Units[2].ID})
	page, err = e.c.List(e.ctx, runcue.ListOptions{Newest: true, Limit: 3, Tasks: []string{"b"}, Cursor: page.Next})
	require.NoError(t, err)
	assert.Equal(t, ids[17], page.Units[0].ID)
	_, err = e.c.List(e.ctx, runcue.ListOptions{Cursor: "!!"})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
	page, err = e.c.List(e.ctx, runcue.ListOptions{States: []runcue.State{runcue.StateCompleted}})
	require.NoError(t, err)
	assert.Empty(t, page.Units)
}

func TestSlowSubscriberDoesNotBlock(t *testing.T) {
	e := newEnv(t, runcue.Config{EventBuffer: 64})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	stalled := e.c.Events(ctx) // never read until the end
	e.start()
	const n = 2000
	subs := batchOf("t", n)
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	require.NoError(t, e.c.Drain(e.ctx), "work finishes while a subscriber reads nothing")
	var last int64
	counts := map[runcue.EventType]int{}
	for ev := range stalled {
		require.Equal(t, last+1, ev.Seq, "in order, no gap, no duplicate")
		last = ev.Seq
		counts[ev.Type]++
		if counts[runcue.EventWorkCompleted] == n {
			break
		}
	}
	assert.Equal(t, n, counts[runcue.EventWorkQueued])
	assert.Equal(t, n, counts[runcue.EventWorkStarted])
	assert.Equal(t, n, counts[runcue.EventWorkCompleted])
}

func TestNoGoroutinesAfterClose(t *testing.T) {
	before := goleak.IgnoreCurrent()
	path := filepath.Join(t.TempDir(), "runcue.db")
	c, err := runcue.Open(path, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, c.Task("t", runcue.Task{Handler: noop}))
	ctx := t.Context()
	_ = c.Events(ctx)
	require.NoError(t, c.Start(ctx))
	for range 20 {
		_, err := c.Submit(ctx, runcue.Submission{Task: "t"})
		require.NoError(t, err)
	}
	require.NoError(t, c.Drain(ctx))
	require.NoError(t, c.Stop(ctx))
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, before)
}

func slogTo(w *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}
