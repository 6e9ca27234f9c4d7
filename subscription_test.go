package runcue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A named subscription resumes after its last acknowledgement, in a new
// subscription, another Cue, or after a restart; a position never moves
// back; Subscriptions reports its lag.
func TestDurableSubscriptionResumes(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	c := e.c
	require.NoError(t, c.Task("t", runcue.Task{Handler: noop}))
	first := e.submit("t") // before the subscription exists: its events count (After 0)
	sub, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "follow", Types: []runcue.EventType{runcue.EventWorkQueued}})
	require.NoError(t, err)
	ev := recv(e, sub, "the first work_queued")
	assert.Equal(t, first, ev.WorkID)
	second := e.submit("t")
	ev2 := recv(e, sub, "the second")
	assert.Equal(t, second, ev2.WorkID)
	require.NoError(t, c.Ack(e.ctx, "follow", ev.Seq))
	stop()

	// Resumed in another process: after the acknowledged first.
	other := e.open(runcue.Config{})
	sub, stop, err = other.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "follow", After: runcue.SeqNow,
		Types: []runcue.EventType{runcue.EventWorkQueued}})
	require.NoError(t, err)
	assert.Equal(t, second, recv(e, sub, "the unacknowledged second, again").WorkID)
	require.NoError(t, other.Ack(e.ctx, "follow", ev2.Seq))
	require.NoError(t, other.Ack(e.ctx, "follow", ev.Seq), "an older position is ignored")
	stop()
	subs, err := c.Subscriptions(e.ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, ev2.Seq, subs[0].Acked)
	assert.Zero(t, subs[0].Lag)
	e.submit("t")
	subs, err = c.Subscriptions(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), subs[0].Lag)

	// A new name with SeqNow starts at the present.
	sub, stop, err = c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "late", After: runcue.SeqNow,
		Types: []runcue.EventType{runcue.EventWorkQueued}})
	require.NoError(t, err)
	fourth := e.submit("t")
	assert.Equal(t, fourth, recv(e, sub, "only what came after").WorkID)
	stop()

	assert.ErrorIs(t, c.Ack(e.ctx, "nobody", 1), runcue.ErrUnknownSubscription)
	require.NoError(t, c.DeleteSubscription(e.ctx, "late"))
	assert.ErrorIs(t, c.DeleteSubscription(e.ctx, "late"), runcue.ErrUnknownSubscription)
	_, _, err = c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "has space"})
	assert.ErrorIs(t, err, runcue.ErrInvalid)
}

// Retention keeps what a named subscription has not acknowledged past
// EventRetention, up to SubscriptionRetention; beyond, it resumes with a
// gap.
func TestDurableSubscriptionRetention(t *testing.T) {
	cfg := runcue.Config{EventRetention: time.Hour, SubscriptionRetention: 24 * time.Hour}
	e := newEnv(t, cfg)
	c := e.c
	require.NoError(t, c.Task("t", runcue.Task{Handler: noop}))
	_, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "slow"})
	require.NoError(t, err)
	stop()
	e.start()
	id := e.submit("t")
	e.wait(id)
	e.clk.Advance(2 * time.Hour) // retention passes run every minute
	e.settle()
	sub, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "slow"})
	require.NoError(t, err)
	ev := recv(e, sub, "an event older than EventRetention, kept")
	assert.Equal(t, runcue.EventWorkQueued, ev.Type)
	assert.Equal(t, id, ev.WorkID)
	stop()

	e.clk.Advance(23 * time.Hour)
	e.settle()
	sub, stop, err = c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "slow"})
	require.NoError(t, err)
	defer stop()
	ev = recv(e, sub, "the gap")
	assert.Equal(t, runcue.EventGap, ev.Type)
	assert.Positive(t, ev.MissedTo)
}

// Drain waits for a durable subscription's consumer: follow-ups it submits
// from events keep Drain from returning until they are done and their
// events acknowledged.
func TestDrainWaitsForFollowUps(t *testing.T) {
	e := newEnv(t, runcue.Config{DrainSubscriptions: []string{"pages"}})
	c := e.c
	require.NoError(t, c.Task("split", runcue.Task{Handler: noop}))
	require.NoError(t, c.Task("page", runcue.Task{Handler: noop}))
	sub, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "pages", After: runcue.SeqNow})
	require.NoError(t, err)
	defer stop()
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for ev := range sub {
			if ev.Type == runcue.EventWorkCompleted && ev.Task == "split" {
				var subs []runcue.Submission
				for i := range 3 {
					// Keys derived from the event: a redelivery stores nothing new.
					subs = append(subs, runcue.Submission{Task: "page", IdempotencyKey: fmt.Sprintf("page:%s:%d", ev.WorkID, i)})
				}
				if _, err := c.SubmitBatch(e.ctx, subs); err != nil {
					t.Errorf("follow-ups: %v", err)
					return
				}
			}
			if ev.Seq > 0 {
				if err := c.Ack(e.ctx, "pages", ev.Seq); err != nil {
					t.Errorf("ack: %v", err)
					return
				}
			}
		}
	}()
	e.start()
	for range 4 {
		e.submit("split")
	}
	require.NoError(t, c.Drain(e.ctx))
	s, err := c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[runcue.State]int{runcue.StateCompleted: 16}, s.States, "4 splits and their 12 pages, all done when Drain returned")
	subs, err := c.Subscriptions(e.ctx)
	require.NoError(t, err)
	assert.Zero(t, subs[0].Lag, "every event acknowledged")
	stop()
	<-consumed
}

// A filtered durable subscription's consumer never receives the events its
// filter skips, so it cannot acknowledge them: its position passes them
// once every earlier match is acknowledged. Drain returns (it waited for
// ever: acked 3, last 6, in an outside trial), Subscriptions reports the
// position, and retention deletes what it passed.
func TestFilteredSubscriptionPassesSkippedEvents(t *testing.T) {
	e := newEnv(t, runcue.Config{DrainSubscriptions: []string{"fu"}, EventRetention: time.Minute, SubscriptionRetention: 24 * time.Hour})
	c := e.c
	require.NoError(t, c.Task("src", runcue.Task{Handler: noop}))
	require.NoError(t, c.Task("follow", runcue.Task{Handler: noop}))
	sub, stop, err := c.Subscribe(e.ctx, runcue.SubscribeOptions{Name: "fu", After: runcue.SeqNow,
		Types: []runcue.EventType{runcue.EventWorkCompleted}, Tasks: []string{"src"}})
	require.NoError(t, err)
	defer stop()
	consumed := make(chan struct{})
	var acked []int64
	go func() {
		defer close(consumed)
		for ev := range sub {
			if _, err := c.Submit(e.ctx, runcue.Submission{Task: "follow", IdempotencyKey: "follow:" + ev.WorkID}); err != nil {
				t.Errorf("follow-up: %v", err)
				return
			}
			if err := c.Ack(e.ctx, "fu", ev.Seq); err != nil {
				t.Errorf("ack: %v", err)
				return
			}
			acked = append(acked, ev.Seq)
		}
	}()
	e.start()
	src := e.submit("src")
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second) // the trial's deadline; a guard, not a figure
	defer cancel()
	require.NoError(t, c.Drain(ctx), "Drain returns once the consumer acknowledged every event it receives")
	stop()
	<-consumed
	require.Len(t, acked, 1)
	last, err := c.LastSeq(e.ctx)
	require.NoError(t, err)
	require.Greater(t, last, acked[0], "the follow-up's events came after the acknowledged one")
	subs, err := c.Subscriptions(e.ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	assert.Equal(t, acked[0], subs[0].Acked)
	assert.Equal(t, last, subs[0].Position, "past the follow-up's events, which the filter skips")
	assert.Zero(t, subs[0].Lag)
	assert.Equal(t, []runcue.EventType{runcue.EventWorkCompleted}, subs[0].Types)
	assert.Equal(t, []string{"src"}, subs[0].Tasks)

	// Another src unit: its completion is a match not yet acknowledged, so
	// the position stops just before it.
	src2 := e.submit("src")
	e.wait(src2)
	subs, err = c.Subscriptions(e.ctx)
	require.NoError(t, err)
	evs, err := c.WorkEvents(e.ctx, src2, 0, 0)
	require.NoError(t, err)
	completed := evs[len(evs)-1]
	require.Equal(t, runcue.EventWorkCompleted, completed.Type)
	assert.Equal(t, completed.Seq-1, subs[0].Position)
	assert.Positive(t, subs[0].Lag)

	// Retention, a day later: the log past the position's events go; the
	// unacknowledged match and what follows stay.
	e.clk.Advance(2 * time.Hour) // retention passes run every minute
	e.settle()
	evs, err = c.WorkEvents(e.ctx, src, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, evs, "the first src unit's events, before the position, are gone")
	evs, err = c.WorkEvents(e.ctx, src2, 0, 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	assert.Equal(t, completed.Seq, evs[len(evs)-1].Seq, "the match not yet acknowledged is kept")
}
