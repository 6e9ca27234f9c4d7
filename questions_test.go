//go:build unix

package runcue_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// TestQuestionsLeaveNoEvent polls Stats and Explain 100 times each from a
// process that does not own the database, against a live owner in a
// child process: every answer is the owner's live one, and no event is
// appended to the log, so neither a subscription from the present nor a
// named one delivers anything; the questions are gone from the store
// afterwards.
func TestQuestionsLeaveNoEvent(t *testing.T) {
	db := filepath.Join(t.TempDir(), "runcue.db")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Service("one", runcue.Service{MaxConcurrent: 1}))
	require.NoError(t, c.Task("hold", runcue.Task{Services: []string{"one"}, Handler: noop}))
	running, err := c.Submit(ctx, runcue.Submission{Task: "hold"})
	require.NoError(t, err)
	queued, err := c.Submit(ctx, runcue.Submission{Task: "hold"})
	require.NoError(t, err)

	cmd, out := child(t, "hold", db, "RUNCUE_POLL=10ms")
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	for out.Scan() && out.Text() != "started "+running.ID {
	}
	// A named subscription, its position at the log's end.
	named, stopNamed, err := c.Subscribe(ctx, runcue.SubscribeOptions{Name: "ui", After: runcue.SeqNow})
	require.NoError(t, err)
	defer stopNamed()
	fresh, stopFresh, err := c.Subscribe(ctx, runcue.SubscribeOptions{After: runcue.SeqNow})
	require.NoError(t, err)
	defer stopFresh()
	st, err := sqlite.Open(db, sqlite.Options{})
	require.NoError(t, err)
	defer st.Close()
	before, err := st.LastSeq(ctx)
	require.NoError(t, err)

	// An answer that misses its asker's deadline (the owner's poll late
	// on a loaded machine) is a fallback to the database, Live false: the
	// poll is asked again, and every one must be answered by the owner
	// before ctx ends.
	late := 0
	for i := range 100 {
		for {
			s, err := c.Stats(ctx)
			require.NoError(t, err)
			require.NoError(t, ctx.Err(), "poll %d: the owner never answered", i)
			if s.Live && s.Patterns.Live {
				break
			}
			late++
		}
		for {
			ex, err := c.Explain(ctx, queued.ID)
			require.NoError(t, err)
			require.NoError(t, ctx.Err(), "poll %d: the owner never answered", i)
			if !ex.Live {
				late++
				continue
			}
			require.NotEmpty(t, ex.Reasons)
			assert.Equal(t, runcue.ReasonServiceBusy, ex.Reasons[0].Kind)
			break
		}
	}
	t.Logf("100 polls; %d answers came too late and were asked again", late)
	after, err := st.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the log did not grow")
	// The owner's next events would come now: whatever a subscription
	// received is delivered by then.
	require.NoError(t, runcue.PollNow(ctx, c))
	// (Events up to before, the child's own, may come: this Cue's present
	// was behind the log's end when it subscribed.)
	quiet := time.After(300 * time.Millisecond)
	for done := false; !done; {
		select {
		case ev := <-named:
			require.LessOrEqual(t, ev.Seq, before, "the named subscription delivered %s", ev.Type)
		case ev := <-fresh:
			require.LessOrEqual(t, ev.Seq, before, "a subscription delivered %s", ev.Type)
		case <-quiet:
			done = true
		}
	}
	open, err := st.Questions(ctx)
	require.NoError(t, err)
	assert.Empty(t, open)
	_, answered, err := st.Answered(ctx, "any")
	require.NoError(t, err)
	assert.False(t, answered)
	var _ store.Questioner = st
}
