//go:build unix

package runcue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/runcue/runcue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFollowUpsAcrossKills: the spec's split-then-pages pattern, run by an
// owner whose consumer submits the pages from a durable subscription, is
// SIGKILLed at least 10 times at random moments. In the end every page
// of every split exists exactly once, and the last owner's Drain (which
// waits for the consumer) returned only when all of them were done.
func TestFollowUpsAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	seed := testSeed(t, "RUNCUE_FOLLOWUP_SEED")
	rnd := rand.New(rand.NewPCG(seed, 11))
	db := filepath.Join(t.TempDir(), "runcue.db")
	const splits = 300
	c, err := runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, c.Task("split", runcue.Task{Handler: noop}))
	var subs []runcue.Submission
	for i := range splits {
		subs = append(subs, runcue.Submission{Task: "split", ID: fmt.Sprintf("split-%02d", i), Target: fmt.Sprintf("doc-%d", i)})
	}
	_, err = c.SubmitBatch(context.Background(), subs)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	// Kill until 12 kills landed before the owner was done (a child that
	// printed "drained" first does not count).
	kills, tries := 0, 0
	for kills < 12 {
		tries++
		require.Less(t, tries, 100, "the work ends too fast for the kills")
		cmd, out := child(t, "followups", db)
		for out.Scan() && out.Text() != "ready" {
		}
		time.Sleep(time.Duration(rnd.IntN(30_000)) * time.Microsecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		drained := false
		for out.Scan() {
			drained = drained || out.Text() == "drained"
		}
		_ = cmd.Wait()
		if !drained {
			kills++
		}
	}
	runToEnd(t, "followups", db, 2*time.Minute)

	c, err = runcue.Open(db, runcue.Config{Logger: quietLogger})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	pages := map[string]int{}
	cursor := ""
	for {
		page, err := c.List(ctx, runcue.ListOptions{Tasks: []string{"page"}, Limit: 1000, Cursor: cursor})
		require.NoError(t, err)
		for _, u := range page.Units {
			require.Equal(t, runcue.StateCompleted, u.State, "page %s of %s: Drain returned before it was done", u.ID, u.Target)
			pages[u.Target]++
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	for i := range splits {
		id := fmt.Sprintf("split-%02d", i)
		wi, err := c.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, runcue.StateCompleted, wi.State, id)
		assert.Equal(t, 2+i%4, pages[id], "every page of %s exactly once", id)
	}
	subsNow, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subsNow, 1)
	assert.Zero(t, subsNow[0].Lag, "the consumer acknowledged everything")
	total := 0
	for _, n := range pages {
		total += n
	}
	t.Logf("%d splits, %d pages, %d kills while the work ran (%d children)", splits, total, kills, tries+1)
}
