package runcue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runcue/runcue"
)

// seqRecorder records, per sequence key, the handler starts in order and
// whether two ever overlapped.
type seqRecorder struct {
	mu      sync.Mutex
	starts  map[string][]string // key -> unit IDs, one per start
	running map[string]int
	overlap []string
}

func newSeqRecorder() *seqRecorder {
	return &seqRecorder{starts: map[string][]string{}, running: map[string]int{}}
}

func (r *seqRecorder) start(key, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts[key] = append(r.starts[key], id)
	if r.running[key]++; r.running[key] > 1 {
		r.overlap = append(r.overlap, key)
	}
}

func (r *seqRecorder) end(key string) {
	r.mu.Lock()
	r.running[key]--
	r.mu.Unlock()
}

// inOrder reports whether starts, collapsed (a unit's retries are one
// entry), equal want.
func inOrder(starts, want []string) bool {
	var got []string
	for _, id := range starts {
		if len(got) == 0 || got[len(got)-1] != id {
			got = append(got, id)
		}
	}
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestSequence: 5 keys x 12 units submitted interleaved, a third of the
// runs failing and retried after a backoff: per key, the units start in
// submission order, each one's retries before the next's first start,
// never two at once; units of other keys run meanwhile.
func TestSequence(t *testing.T) {
	seed := testSeed(t, "RUNCUE_SEQUENCE_SEED")
	e := newEnv(t, runcue.Config{MaxConcurrent: 20})
	rec := newSeqRecorder()
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, seed))
	require.NoError(t, e.c.Task("sync", runcue.Task{Sequence: &runcue.Sequence{},
		Retry: runcue.RetryPolicy{MaxAttempts: 10, BaseDelay: time.Second, MaxDelay: time.Second},
		Handler: func(ctx context.Context, w *runcue.Work) (any, error) {
			rec.start(w.Target, w.ID)
			defer rec.end(w.Target)
			mu.Lock()
			fail := rnd.IntN(3) == 0
			mu.Unlock()
			if fail {
				return nil, errors.New("transient")
			}
			return nil, nil
		}}))
	want := map[string][]string{}
	var subs []runcue.Submission
	for i := range 12 {
		for k := range 5 {
			id := fmt.Sprintf("k%d-%02d", k, i)
			key := fmt.Sprintf("acct-%d", k)
			subs = append(subs, runcue.Submission{ID: id, Task: "sync", Target: key})
			want[key] = append(want[key], id)
		}
	}
	_, err := e.c.SubmitBatch(e.ctx, subs)
	require.NoError(t, err)
	e.start()
	deadline := time.Now().Add(wait)
	for {
		st, err := e.c.Stats(e.ctx)
		require.NoError(t, err)
		if st.States[runcue.StateCompleted]+st.States[runcue.StateFailed] == len(subs) {
			break
		}
		require.True(t, time.Now().Before(deadline), "%+v", st.States)
		_, err = e.c.Settle(e.ctx)
		require.NoError(t, err)
		e.clk.Advance(time.Second)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Empty(t, rec.overlap, "two runs of one key at once")
	for key, ids := range want {
		assert.True(t, inOrder(rec.starts[key], ids), "%s: started %v", key, rec.starts[key])
	}
}

// TestSequenceHoldOnFailure: a unit that fails for good holds its key
// under HoldOnFailure (Explain names it), and the next units wait until
// it is retried and completes; without HoldOnFailure the next goes on. A
// new owner holds the key of the failure an earlier one left.
func TestSequenceHoldOnFailure(t *testing.T) {
	e := newEnv(t, runcue.Config{})
	var mu sync.Mutex
	fails := map[string]bool{"a-1": true, "b-1": true}
	var ran []string
	handler := func(ctx context.Context, w *runcue.Work) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, w.ID)
		if fails[w.ID] {
			return nil, runcue.Permanent(errors.New("bad record"))
		}
		return nil, nil
	}
	register := func(c *runcue.Cue) {
		require.NoError(t, c.Task("hold", runcue.Task{Sequence: &runcue.Sequence{HoldOnFailure: true}, Handler: handler}))
		require.NoError(t, c.Task("go-on", runcue.Task{Sequence: &runcue.Sequence{Key: func(string) string { return "all" }}, Handler: handler}))
	}
	register(e.c)
	e.start()
	_, err := e.c.SubmitBatch(e.ctx, []runcue.Submission{
		{ID: "a-1", Task: "hold", Target: "acct"}, {ID: "a-2", Task: "hold", Target: "acct"}, {ID: "a-3", Task: "hold", Target: "acct"},
		{ID: "b-1", Task: "go-on", Target: "x"}, {ID: "b-2", Task: "go-on", Target: "y"},
	})
	require.NoError(t, err)
	assert.Equal(t, runcue.StateFailed, e.wait("a-1").State)
	assert.Equal(t, runcue.StateFailed, e.wait("b-1").State)
	assert.Equal(t, runcue.StateCompleted, e.wait("b-2").State, "without HoldOnFailure the next goes on")
	e.settle()
	ex, err := e.c.Explain(e.ctx, "a-2")
	require.NoError(t, err)
	require.NotEmpty(t, ex.Reasons)
	assert.Equal(t, runcue.ReasonSequence, ex.Reasons[0].Kind)
	assert.Equal(t, []string{"a-1"}, ex.Reasons[0].Dependencies)
	assert.Contains(t, ex.Reasons[0].Detail, "a-1 failed and holds it")
	ex, err = e.c.Explain(e.ctx, "a-3")
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonSequence, ex.Reasons[0].Kind)
	assert.Equal(t, runcue.StateQueued, e.get("a-2").State)
	st, err := e.c.Stats(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, runcue.PatternStats{Sequences: 1, SequenceWaiting: 2, SequencesHeld: 1, Live: true}, st.Patterns)

	// A new owner: the failure an earlier owner left still holds the key.
	require.NoError(t, e.c.Stop(e.ctx))
	next := e.open(runcue.Config{})
	register(next)
	require.NoError(t, next.Start(e.ctx))
	require.NoError(t, runcue.Settle(e.ctx, next))
	ex, err = next.Explain(e.ctx, "a-2")
	require.NoError(t, err)
	assert.Equal(t, runcue.ReasonSequence, ex.Reasons[0].Kind, "%+v", ex.Reasons)
	assert.Equal(t, runcue.StateQueued, e.get("a-2").State)

	mu.Lock()
	fails["a-1"] = false
	mu.Unlock()
	require.NoError(t, next.Retry(e.ctx, "a-1"))
	for _, id := range []string{"a-1", "a-2", "a-3"} {
		wi, err := next.Wait(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, runcue.StateCompleted, wi.State, id)
	}
	mu.Lock()
	defer mu.Unlock()
	var order []string
	for _, id := range ran {
		if id[0] == 'a' {
			order = append(order, id)
		}
	}
	assert.Equal(t, []string{"a-1", "a-1", "a-2", "a-3"}, order)
}
