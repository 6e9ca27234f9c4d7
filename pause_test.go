package runcue_test

import (
	"testing"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func reasonKinds(ex runcue.Explanation) []runcue.ReasonKind {
	var out []runcue.ReasonKind
	for _, r := range ex.Reasons {
		out = append(out, r.Kind)
	}
	return out
}

// A task type and the whole queue are paused and resumed, from the owner
// and from another process; running units continue, queued ones wait and
// Explain says why, in both processes; the changes are events.
func TestPauseTaskAndQueue(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	ga, gb := newGate(), newGate()
	require.NoError(t, e.c.Task("a", runcue.Task{Handler: ga.handler}))
	require.NoError(t, e.c.Task("b", runcue.Task{Handler: gb.handler}))
	rec := record(t, e.c)
	e.start()
	other := e.open(runcue.Config{}) // registers nothing, owns nothing
	require.NoError(t, other.PauseTask(e.ctx, "a"))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	e.settle()

	a1, a2, b1 := e.submit("a"), e.submit("a"), e.submit("b")
	require.Equal(t, b1, gb.next(t))
	e.settle()
	ga.none(t)
	for _, c := range []*runcue.Cue{e.c, other} {
		ex, err := c.Explain(e.ctx, a1)
		require.NoError(t, err)
		assert.Contains(t, reasonKinds(ex), runcue.ReasonTaskPaused)
	}

	// The whole queue: b1 keeps running, b2 waits.
	require.NoError(t, e.c.PauseQueue(e.ctx))
	b2 := e.submit("b")
	e.settle()
	gb.none(t)
	for _, c := range []*runcue.Cue{e.c, other} {
		ex, err := c.Explain(e.ctx, b2)
		require.NoError(t, err)
		assert.Contains(t, reasonKinds(ex), runcue.ReasonQueuePaused)
	}
	gb.release <- nil
	assert.Equal(t, runcue.StateCompleted, e.wait(b1).State, "a running unit finishes under a pause")

	require.NoError(t, other.ResumeQueue(e.ctx))
	require.NoError(t, runcue.PollNow(e.ctx, e.c))
	require.Equal(t, b2, gb.next(t))
	ga.none(t)
	require.NoError(t, e.c.ResumeTask(e.ctx, "a"))
	started := []string{ga.next(t), ga.next(t)}
	assert.ElementsMatch(t, []string{a1, a2}, started)
	close(ga.release)
	close(gb.release)
	require.NoError(t, e.c.Drain(e.ctx))

	// The events reach the subscriber after the commits: wait for the four.
	var changes []string
	for _, ev := range rec.waitFor(t, 4, func(ev runcue.Event) bool {
		return ev.Type == runcue.EventTaskChanged || ev.Type == runcue.EventQueueChanged
	}) {
		changes = append(changes, string(ev.Type)+":"+ev.Task+":"+ev.Reason)
	}
	assert.Equal(t, []string{"task_changed:a:paused", "queue_changed::paused", "queue_changed::resumed", "task_changed:a:resumed"}, changes)
	assert.ErrorIs(t, e.c.PauseTask(e.ctx, "ghost"), runcue.ErrUnknownTask)
}

// A pause is stored: a new owner starts paused.
func TestPauseSurvivesRestart(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	g := newGate()
	require.NoError(t, e.c.Task("a", runcue.Task{Handler: g.handler}))
	require.NoError(t, e.c.PauseQueue(e.ctx))
	id := e.submit("a")
	e.start()
	e.settle()
	g.none(t)
	require.NoError(t, e.c.Close())

	c := e.open(runcue.Config{})
	require.NoError(t, c.Task("a", runcue.Task{Handler: g.handler}))
	require.NoError(t, c.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, c))
	g.none(t)
	require.NoError(t, c.ResumeQueue(e.ctx))
	require.Equal(t, id, g.next(t))
	close(g.release)
	require.NoError(t, c.Drain(e.ctx))
}
