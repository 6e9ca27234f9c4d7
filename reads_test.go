package runcue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
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
