package runcue_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
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

// takeOver is a store whose Acquire takes ownership from a live holder
// (sqlite's TakeOver): the test hook on the lock that deposes an owner.
type takeOver struct{ *sqlite.Store }

func (s takeOver) Acquire(ctx context.Context, h store.Holder) (store.Ownership, error) {
	return s.TakeOver(ctx, h)
}

// opRecorder records the outcome of every op applied through it.
type opRecorder struct {
	store.Store
	mu   sync.Mutex
	outs map[string][]error // by op type
}

func (r *opRecorder) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	b, err := r.Store.Apply(ctx, ops)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, op := range ops {
		name := fmt.Sprintf("%T", op)
		if err != nil {
			r.outs[name] = append(r.outs[name], err)
		} else {
			r.outs[name] = append(r.outs[name], b.Results[i].Err)
		}
	}
	return b, err
}

// since returns the outcomes recorded after mark (a count per type).
func (r *opRecorder) since(mark map[string]int) map[string][]error {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]error{}
	for name, errs := range r.outs {
		if len(errs) > mark[name] {
			out[name] = slices.Clone(errs[mark[name]:])
		}
	}
	return out
}

func (r *opRecorder) mark() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]int{}
	for name, errs := range r.outs {
		m[name] = len(errs)
	}
	return m
}

// TestFencedOwner takes ownership from a live owner twice: c0 owns, c1
// takes over (c0's running unit is held until its lease ends), c2 takes
// over from c1. Then c1 goes on as if it still owned the database: a unit
// submitted through it is dispatched (a claim, a service-log entry, a run
// event), and, while that claim's commit is held, its clock passes c0's
// lease (a recovery) and its retention time (a retention pass). Each of
// those writes fails with ErrNotOwner and none is stored; c1 stops
// dispatching, cancels its running handler (cause ErrNotOwner, whose
// finish is not stored either), says so on its event stream, and exits;
// client writes through it (Submit, Cancel, SetService, Ack) still go
// through.
func TestFencedOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runcue.db")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	causes := make(chan error, 4)
	started := make(chan string, 8)
	rec := &opRecorder{outs: map[string][]error{}}
	var held *testutil.HoldStore
	open := func(clk *clock.Fake, take bool, timeout time.Duration) *runcue.Cue {
		cfg := runcue.Config{Clock: clk, Logger: slog.New(slog.DiscardHandler), DefaultTimeout: timeout, Retention: time.Minute,
			PollInterval: time.Hour, LeaseBuffer: time.Minute}
		var c *runcue.Cue
		var err error
		if take {
			st, err2 := sqlite.Open(path, sqlite.Options{})
			require.NoError(t, err2)
			t.Cleanup(func() { st.Close() })
			var wrapped store.Store = takeOver{st}
			if held == nil { // c1's: held, and recorded
				held = &testutil.HoldStore{Store: wrapped}
				rec.Store = held
				wrapped = rec
			}
			c, err = runcue.New(wrapped, cfg)
		} else {
			c, err = runcue.Open(path, cfg)
		}
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Service("api", runcue.Service{RateLimit: 100, RateWindow: time.Hour, CircuitThreshold: 3, CircuitTimeout: time.Minute}))
		require.NoError(t, c.Task("slow", runcue.Task{Services: []string{"api"}, Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			started <- w.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		}}))
		require.NoError(t, c.Task("fast", runcue.Task{Services: []string{"api"}, Handler: func(_ context.Context, w *runcue.Work) (any, error) {
			started <- w.ID
			return "ok", nil
		}}))
		return c
	}
	clk0, clk1, clk2 := clock.NewFake(t0), clock.NewFake(t0), clock.NewFake(t0)
	c0 := open(clk0, false, 10*time.Minute) // g's lease ends at 11 minutes
	require.NoError(t, c0.Start(ctx))
	_, err := c0.Submit(ctx, runcue.Submission{ID: "g", Task: "slow"})
	require.NoError(t, err)
	assert.Equal(t, "g", <-started)

	c1 := open(clk1, true, time.Hour) // s's deadline is at an hour
	require.NoError(t, c1.Start(ctx))
	events, stopEvents, err := c1.Subscribe(ctx, runcue.SubscribeOptions{After: runcue.SeqNow})
	require.NoError(t, err)
	defer stopEvents()
	for _, s := range []runcue.Submission{{ID: "done", Task: "fast"}, {ID: "s", Task: "slow"}} {
		_, err := c1.Submit(ctx, s)
		require.NoError(t, err)
	}
	got := []string{<-started, <-started}
	slices.Sort(got)
	assert.Equal(t, []string{"done", "s"}, got)
	wi, err := c1.Wait(ctx, "done")
	require.NoError(t, err)
	require.Equal(t, runcue.StateCompleted, wi.State)
	owner1 := c1.Owner()
	g, err := c1.Get(ctx, "g")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateRunning, g.State, "c0 may be alive: its run waits for its lease")

	c2 := open(clk2, true, time.Hour)
	require.NoError(t, c2.Start(ctx))
	taken, err := c2.LastSeq(ctx)
	require.NoError(t, err)

	// c1 goes on as if it owned the database.
	drained := make(chan error, 1)
	go func() { drained <- c1.Drain(ctx) }()
	for { // until the Drain waits in c1's engine (each look is a round trip to its loop)
		st, err := runcue.Inspect(ctx, c1)
		require.NoError(t, err)
		if st.Drains == 1 {
			break
		}
	}
	mark := rec.mark()
	claim := held.Hold(testutil.HasOp(func(op store.Op) bool { _, ok := op.(*store.Claim); return ok }))
	_, err = c1.Submit(ctx, runcue.Submission{ID: "new", Task: "fast"})
	require.NoError(t, err, "a client write through a deposed owner")
	<-claim.Entered
	clk1.Advance(30 * time.Minute) // past g's lease and the retention of "done", before s's deadline
	require.NoError(t, runcue.SyncDispatcher(ctx, c1), "the timers fired: the recovery and the retention pass are queued")
	claim.Release()
	_, err = c1.Settle(ctx)
	require.NoError(t, err)

	assert.ErrorIs(t, <-causes, runcue.ErrNotOwner, "its handler is cancelled, saying why")
	require.NoError(t, c1.Stop(ctx), "it has stopped")
	assert.ErrorIs(t, <-drained, runcue.ErrNotOwner, "a Drain waiting in it says why it ended")
	assert.Empty(t, c1.Owner())
	notOwner := false
	for !notOwner {
		select {
		case ev := <-events:
			notOwner = ev.Type == runcue.EventStoreFailed && ev.ErrorKind == "not_owner"
		case <-ctx.Done():
			t.Fatal("no store_failed event of kind not_owner")
		}
	}

	// c1 made those writes, and each failed alone. Its Finish of the
	// cancelled run, decided once it knew it was deposed, is failed by
	// its writer without reaching the store (writer.Fence), or fails
	// there.
	outs := rec.since(mark)
	for _, op := range []string{"*store.Claim", "*store.Recover", "*store.Prune", "*store.Finish"} {
		if op != "*store.Finish" {
			require.NotEmpty(t, outs[op], "c1 tried a %s", op)
		}
		for _, err := range outs[op] {
			assert.ErrorIs(t, err, runcue.ErrNotOwner, op)
		}
	}
	assert.NoError(t, outs["*store.Insert"][0], "the submission through it was stored")

	// Nothing c1 wrote as owner after the takeover is stored.
	st, err := sqlite.Open(path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	unit := func(id string) *store.Unit {
		u, err := st.GetUnit(ctx, id)
		require.NoError(t, err, id)
		return u
	}
	assert.Equal(t, store.Running, unit("g").State, "c1's recovery of g was not stored")
	assert.NotEqual(t, owner1, unit("g").LeasedBy)
	assert.Equal(t, store.Completed, unit("done").State, "c1's retention pass was not stored")
	n := unit("new")
	assert.Equal(t, store.Queued, n.State, "c1's claim was not stored")
	assert.Zero(t, n.Runs)
	s := unit("s")
	assert.Equal(t, store.Running, s.State, "c1's finish of s was not stored")
	assert.Equal(t, owner1, s.LeasedBy)
	assert.Empty(t, s.Attempts)
	log, err := st.ServiceLog(ctx, "api", time.Time{})
	require.NoError(t, err)
	assert.Len(t, log, 3, "g, done, s: no entry for c1's claim of new")
	evs, err := st.EventsAfter(ctx, taken, 1000)
	require.NoError(t, err)
	for _, ev := range evs {
		assert.Equal(t, store.TypeWorkQueued, ev.Type, "only the client's submission was stored: %+v", ev)
	}
	assert.Equal(t, "new", evs[0].WorkID)

	// Client writes through c1 still work.
	_, err = c1.Submit(ctx, runcue.Submission{ID: "client", Task: "fast"})
	require.NoError(t, err)
	require.NoError(t, c1.Cancel(ctx, "new", runcue.CancelOptions{Reason: "by a client"}))
	assert.Equal(t, store.Cancelled, unit("new").State)
	require.NoError(t, c1.SetService(ctx, "api", runcue.Service{RateLimit: 50, RateWindow: time.Hour, CircuitThreshold: 3,
		CircuitTimeout: time.Minute}))
	_, stop, err := c1.Subscribe(ctx, runcue.SubscribeOptions{Name: "ops", After: 0})
	require.NoError(t, err)
	stop()
	require.NoError(t, c1.Ack(ctx, "ops", 3))
	subs, err := st.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, int64(3), subs[0].Acked)
	recs, err := st.Services(ctx)
	require.NoError(t, err)
	assert.Contains(t, string(recs[0].Override), `"rate_limit":50`)

	// The owner now is c2: it runs what is queued, and the runs of its
	// deposed predecessors once their leases end.
	require.NoError(t, runcue.PollNow(ctx, c2))
	wi, err = c2.Wait(ctx, "client")
	require.NoError(t, err)
	assert.Equal(t, runcue.StateCompleted, wi.State)
	assert.Equal(t, "client", <-started)
	clk2.Advance(2 * time.Hour)
	got = []string{<-started, <-started}
	slices.Sort(got)
	assert.Equal(t, []string{"g", "s"}, got, "run again by c2")
	wi, err = c2.Get(ctx, "s")
	require.NoError(t, err)
	require.Len(t, wi.Attempts, 1)
	assert.Equal(t, "abandoned", wi.Attempts[0].Outcome)
}
