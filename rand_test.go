package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// TestRandSeedsRetryJitter: with a fake clock and one handler at a time
// (so that runs end in the same order), Cues given equally seeded
// Config.Rand sources retry their failed units at the same instants, and a
// differently seeded one does not.
func TestRandSeedsRetryJitter(t *testing.T) {
	retryTimes := func(seed uint64) []time.Time {
		e := newEnv(t, runcue.Config{MaxConcurrent: 1, Rand: rand.NewPCG(seed, 1)})
		require.NoError(t, e.c.Task("t", runcue.Task{
			Retry:   runcue.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Minute, Jitter: runcue.JitterFull},
			Handler: func(context.Context, *runcue.Work) (any, error) { return nil, errors.New("boom") }}))
		rec := record(t, e.c)
		var ids []string
		for i := range 8 {
			ids = append(ids, e.submit("t", func(s *runcue.Submission) { s.ID = fmt.Sprint("u", i) }))
		}
		e.start()
		rec.waitFor(t, len(ids), ofType(runcue.EventWorkFailed, ""))
		e.settle()
		var out []time.Time
		for _, id := range ids {
			wi := e.get(id)
			require.Equal(t, runcue.StateQueued, wi.State)
			out = append(out, wi.RunAt)
		}
		return out
	}
	a, b, c := retryTimes(7), retryTimes(7), retryTimes(8)
	assert.Equal(t, a, b, "the same seed, the same retry times")
	assert.NotEqual(t, a, c, "another seed, other retry times")
}
