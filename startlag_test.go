package runcue_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/internal/testutil"
	"github.com/runcue/runcue/store"
)

// startRecorder is a handler that records every run's Work.Started.
type startRecorder struct {
	mu      sync.Mutex
	started []time.Time
}

func (r *startRecorder) handler(_ context.Context, w *runcue.Work) (any, error) {
	r.mu.Lock()
	r.started = append(r.started, w.Started)
	r.mu.Unlock()
	return nil, nil
}

func (r *startRecorder) all() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.started)
}

// TestLateStartRequeued: a rate-limited run whose claim commits more than
// MaxStartDelay after its dispatch was decided does not start; it is
// requeued without spending budget (outcome late_start) and runs again.
// Handlers see the instant they started as Work.Started.
func TestLateStartRequeued(t *testing.T) {
	const lag = time.Second
	e, hs := newHeldEnv(t, runcue.Config{MaxStartDelay: lag})
	var rec startRecorder
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 5, RateWindow: time.Minute}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: rec.handler}))
	hold := hs.Hold(testutil.HasOp(func(op store.Op) bool { _, ok := op.(*store.Claim); return ok }))
	e.start()
	id := e.submit("t")
	<-hold.Entered
	e.clk.Advance(lag + time.Millisecond) // the claim commits too late
	hold.Release()
	wi := e.wait(id)
	require.Equal(t, runcue.StateCompleted, wi.State)
	require.Len(t, wi.Attempts, 2)
	assert.Equal(t, "late_start", wi.Attempts[0].Outcome)
	assert.Equal(t, "completed", wi.Attempts[1].Outcome)
	assert.Zero(t, wi.Failures, "no budget spent")
	started := rec.all()
	require.Len(t, started, 1, "the late run never called its handler")
	assert.True(t, started[0].Equal(epoch.Add(lag+time.Millisecond)), "Work.Started is the handler's start: %v", started[0])
	st, err := e.c.ServiceStatus(e.ctx, "api")
	require.NoError(t, err)
	assert.Equal(t, 1, st.InWindow, "the run that never started left no entry in the window")
}

// TestWindowCountsStartsNotDecisions: with every claim's commit delayed,
// the window holds a place for each decided dispatch until its handler
// starts, so starts never crowd: at most RateLimit start instants lie in
// any RateWindow, though decisions and starts are apart.
func TestWindowCountsStartsNotDecisions(t *testing.T) {
	e, hs := newHeldEnv(t, runcue.Config{MaxStartDelay: time.Hour})
	var rec startRecorder
	require.NoError(t, e.c.Service("api", runcue.Service{RateLimit: 2, RateWindow: time.Second}))
	require.NoError(t, e.c.Task("t", runcue.Task{Services: []string{"api"}, Handler: rec.handler}))
	isClaim := testutil.HasOp(func(op store.Op) bool { _, ok := op.(*store.Claim); return ok })
	first := hs.Hold(isClaim)
	e.start()
	_, err := e.c.SubmitBatch(e.ctx, batchOf("t", 6))
	require.NoError(t, err)
	<-first.Entered // the first claims (decided at 0) wait in the writer
	e.clk.Advance(900 * time.Millisecond)
	first.Release() // they start at 0.9s
	e.quiesce(e.c)
	// Decided at 0, started at 0.9: the window (and its margin) is full
	// until 1.91s.
	e.clk.Advance(200 * time.Millisecond) // 1.1s
	e.quiesce(e.c)
	assert.Len(t, rec.all(), 2, "nothing more starts before 1.91s")
	e.clk.Advance(800*time.Millisecond + runcue.DefaultMargin) // 1.91s
	e.quiesce(e.c)
	e.clk.Advance(time.Second + runcue.DefaultMargin)
	e.quiesce(e.c)
	e.clk.Advance(time.Second + runcue.DefaultMargin)
	e.quiesce(e.c)
	require.NoError(t, e.c.Drain(e.ctx))
	started := rec.all()
	require.Len(t, started, 6)
	checkWindows(t, "api (starts)", started, 2, time.Second)
}
