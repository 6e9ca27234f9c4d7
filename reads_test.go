package runcue_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// The loop does not wait for the store: while the reads it asked for are
// held (the units another process submitted; the state of a dependency it
// does not hold, queued behind them), it goes on dispatching; when they are
// answered, in order, the loaded unit runs and the dependent waits for it.
func TestStoreReadsOffTheLoop(t *testing.T) {
	e, hs := newHeldEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: g.handler}))
	e.start()
	other := e.open(runcue.Config{})
	x, err := other.Submit(e.ctx, runcue.Submission{Task: "t"})
	require.NoError(t, err)

	load := hs.HoldRead("ListUnits")
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	recv(e, load.Entered, "the load")
	states := hs.HoldRead("UnitStates")
	z := e.submit("t", func(s *runcue.Submission) { s.DependsOn = []string{x.ID} })
	y := e.submit("t")
	assert.Equal(t, y, g.next(t), "the loop dispatches while its reads wait")
	g.none(t)

	load.Release()
	recv(e, states.Entered, "the dependency read") // asked after the load, answered after it
	states.Release()
	assert.Equal(t, x.ID, g.next(t), "the unit another process submitted is loaded and runs")
	e.settle()
	g.none(t) // z waits for x
	g.release <- nil
	g.release <- nil
	assert.Equal(t, z, g.next(t), "the dependent runs once its dependency completed")
	g.release <- nil
	require.NoError(t, e.c.Drain(e.ctx))
}

// A service changed by another process is re-read off the loop; a change
// made here is applied before SetService returns, and a read of an older
// change still in flight cannot overtake it.
func TestServiceReloadOffTheLoop(t *testing.T) {
	e, hs := newHeldEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Service("api", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: g.handler}))
	e.start()
	for range 4 {
		e.submit("t")
	}
	g.next(t)
	other := e.open(runcue.Config{})
	require.NoError(t, other.SetService(e.ctx, "api", runcue.Service{MaxConcurrent: 2}))
	held := hs.HoldRead("Services")
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	recv(e, held.Entered, "the service read")
	done := make(chan error, 1)
	go func() { done <- e.c.SetService(e.ctx, "api", runcue.Service{MaxConcurrent: 3}) }()
	select {
	case err := <-done:
		t.Fatalf("SetService returned (%v) before the owner applied it", err)
	default:
	}
	g.none(t)
	held.Release()
	require.NoError(t, recv(e, done, "SetService"))
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 3, st.Limits.MaxConcurrent, "the newer change wins")
	g.next(t)
	g.next(t)
	close(g.release)
	require.NoError(t, e.c.Drain(e.ctx))
}

// TestWorkEvents: a unit's events are its own, oldest first, paged with
// after and limit, from the owner or from a reader in another Cue on the
// file, and they outlive the unit's success; a unit unknown has none.
func TestWorkEvents(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	calls := 0
	require.NoError(t, e.c.Task("t", runcue.Task{Retry: runcue.RetryPolicy{MaxAttempts: 2, Backoff: runcue.BackoffFixed, BaseDelay: time.Millisecond},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			if w.Target == "flaky" {
				calls++
				if calls == 1 {
					return nil, errors.New("first try fails")
				}
			}
			return nil, nil
		}}))
	e.start()
	a := e.submit("t", func(s *runcue.Submission) { s.Target = "flaky" })
	b := e.submit("t")
	e.settle()
	e.clk.Advance(time.Second) // the retry's backoff
	e.wait(a)
	e.wait(b)
	types := func(evs []runcue.Event) []string {
		var out []string
		for _, ev := range evs {
			assert.Contains(t, []string{a, "later"}, ev.WorkID)
			out = append(out, string(ev.Type))
		}
		return out
	}
	evs, err := e.c.WorkEvents(e.ctx, a, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"work_queued", "work_started", "work_failed", "work_retrying", "work_started", "work_completed"}, types(evs))
	for i := 1; i < len(evs); i++ {
		assert.Greater(t, evs[i].Seq, evs[i-1].Seq)
	}
	page, err := e.c.WorkEvents(e.ctx, a, evs[1].Seq, 2)
	require.NoError(t, err)
	assert.Equal(t, []string{"work_failed", "work_retrying"}, types(page), "paged after the second, two")

	reader, err := runcue.Open(e.path, runcue.Config{Clock: e.clk})
	require.NoError(t, err)
	defer reader.Close()
	other, err := reader.WorkEvents(e.ctx, a, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, types(evs), types(other), "from a second Cue on the file")

	// The owner's answers about a unit, which a runcue before this one
	// stored with the unit's ID (the dashboard's unit page listed them in
	// red, raw), are not its events; a page is filled past them.
	st, err := sqlite.Open(e.path, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	var asked []store.Op
	for range 5 {
		for _, typ := range []runcue.EventType{runcue.EventOwnerAsked, runcue.EventOwnerAnswered} {
			asked = append(asked, &store.AppendEvent{Event: store.Event{Type: string(typ), WorkID: "later", Time: epoch, Data: []byte(`{}`)}})
		}
	}
	_, err = st.Apply(e.ctx, asked)
	require.NoError(t, err)
	later := e.submit("t", func(s *runcue.Submission) { s.ID = "later" })
	e.wait(later)
	page, err = e.c.WorkEvents(e.ctx, later, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, []string{"work_queued"}, types(page), "the page of one skipped ten answers to find it")
	evs, err = e.c.WorkEvents(e.ctx, later, 0, 0)
	require.NoError(t, err)
	assert.Len(t, evs, 3, "queued, started, completed")

	none, err := e.c.WorkEvents(e.ctx, "no-such-unit", 0, 0)
	require.NoError(t, err)
	assert.Empty(t, none)
	_, err = e.c.WorkEvents(e.ctx, a, -2, 0)
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}

// TestListMaxScan: a bounded List examines a stretch of the database at a
// time; following Next through short and empty pages gives exactly the
// units an unbounded List gives, in order, newest or oldest first, from
// any cursor.
func TestListMaxScan(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 1))
	e := newEnv(t, runcue.Config{})
	require.NoError(t, e.c.Task("t", runcue.Task{Handler: noop}))
	var subs []runcue.Submission
	for i := range 300 {
		target := "other"
		if rnd.IntN(7) == 0 {
			target = "match-" + strconv.Itoa(i)
		}
		subs = append(subs, runcue.Submission{Task: "t", Target: target})
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	all := func(o runcue.ListOptions) (ids []string, pages int) {
		for {
			page, err := e.c.List(e.ctx, o)
			require.NoError(t, err)
			pages++
			for _, u := range page.Units {
				ids = append(ids, u.ID)
			}
			if o.MaxScan > 0 && !page.Partial {
				assert.True(t, len(page.Units) == o.Limit || page.Next == "", "a page short of its limit is partial or the last")
			}
			if page.Next == "" {
				return ids, pages
			}
			o.Cursor = page.Next
		}
	}
	for _, newest := range []bool{true, false} {
		for range 10 {
			o := runcue.ListOptions{Newest: newest, TargetPrefix: "match-", Limit: 1 + rnd.IntN(6)}
			want, _ := all(o)
			require.NotEmpty(t, want)
			o.MaxScan = 1 + rnd.IntN(80)
			got, pages := all(o)
			assert.Equal(t, want, got, "newest %v, limit %d, max scan %d", newest, o.Limit, o.MaxScan)
			assert.GreaterOrEqual(t, pages, 300/o.MaxScan, "at most MaxScan units examined per call")
		}
	}
	_, err = e.c.List(e.ctx, runcue.ListOptions{MaxScan: -1})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}
